"""What to time for a ground truth: closures that launch the kernel alone (plan() and copies outside).

    gt = get_ground_truth("flashinfer", d, device="cuda")
    prepared = prepare(gt, generate_inputs(d, "medium", device="cuda"))   # fn, setup = prepared
    t = time_device(prepared.fn, setup=prepared.setup)                      # timing/timers.py
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .timers import require_cuda

if TYPE_CHECKING:
    from ..groundtruth import GroundTruth
    from ..groundtruth.base import Call
    from ..inputs import Inputs

__all__ = ["PREPARERS", "Prepared", "prepare"]

# -- closures that launch only the kernel ----------------------------------------------------------------
@dataclass(frozen=True)
class Prepared:
    """What to time: `fn()` launches the kernel; `setup()` (or None) restores what fn mutates.
    Unpacks as `fn, setup = prepare(...)`."""

    fn: Callable[[], Any]
    setup: Callable[[], Any] | None
    includes_setup: bool  # True: fn is the whole adapter call (plan(), allocations, conversions included)
    note: str
    timer: str = "auto"  # what time_device should use (auto handles a setup: cupti, else events)

    def __iter__(self):
        return iter((self.fn, self.setup))


Preparer = Callable[["Call"], tuple[Callable[[], Any], "Callable[[], Any] | None", str]]


def _workspace(torch: Any, device: Any) -> Any:
    """A workspace of the adapters' size, owned by one prepared wrapper: FlashInfer keeps its plan in
    the workspace, so two wrappers planned on one shared buffer would overwrite each other's plans."""
    from ..groundtruth import flashinfer as fgt

    return torch.empty(fgt.WORKSPACE_BYTES, dtype=torch.uint8, device=device)


# The FlashInfer attention adapters expose their plan step (groundtruth/flashinfer.py plan_*): it is
# called once here, on a workspace of its own, and only the run() it returns is timed. The adapters'
# post-processing of outputs (the empty-request lse sentinel) is not a kernel and is left out.
def _planned(plan_step: Callable[..., Callable[[], Any]]):
    def prep(call: Call):
        import torch

        return plan_step(call, _workspace(torch, call.inputs.device)), None, "wrapper and plan() once, run() timed"

    return prep


def _prep_fused_add_rmsnorm(kernel: Callable[[Any], Callable]):
    """In place (input <- norm(input + residual) * w, residual <- the sum): fn runs on clones that
    setup restores from the pristine inputs before every call, outside the timed region."""

    def prep(call: Call):
        from .. import semantics as sem

        x = call.inputs.values
        op = kernel(call.module)
        eps = sem.eps(call.definition, x)
        h0, r0, weight = x["hidden_states"], x["residual"], x["weight"]
        h, r = h0.clone(), r0.clone()

        def setup():
            h.copy_(h0)
            r.copy_(r0)

        return (lambda: op(h, r, weight, eps=eps)), setup, "in place: setup restores the inputs (not timed)"

    return prep


def _prep_rmsnorm(kernel: Callable[[Any], Callable]):
    def prep(call: Call):
        from .. import semantics as sem

        x = call.inputs.values
        op, eps = kernel(call.module), sem.eps(call.definition, x)
        hs, weight = x["hidden_states"], x["weight"]
        return (lambda: op(hs, weight, eps=eps)), None, "eps read once, the kernel call timed"

    return prep


def _prep_fi_silu_and_mul(call: Call):
    op, x = call.module.activation.silu_and_mul, call.inputs.values["input"]
    return (lambda: op(x)), None, "the kernel call timed"


def _prep_sgl_silu_and_mul(call: Call):
    import torch

    op, x = call.module.silu_and_mul, call.inputs.values["input"]
    out = torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype, device=x.device)
    return (lambda: op(x, out)), None, "output allocated once, the kernel call timed"


def _prep_fi_rope(call: Call):
    from .. import semantics as sem

    x = call.inputs.values
    op = call.module.rope.apply_rope_with_cos_sin_cache
    q, k = x["query"], x["key"]
    tokens, _, head_dim = q.shape
    qf, kf = q.reshape(tokens, -1), k.reshape(tokens, -1)
    neox = sem.rope_is_neox(call.definition)
    pos, cache = x["positions"], x["cos_sin_cache"]
    return (lambda: op(pos, qf, kf, head_dim, cache, is_neox=neox)), None, "the kernel call timed"


def _prep_sgl_rope(call: Call):
    """In place on query/key: clones restored by setup before every call, outside the timed region."""
    from .. import semantics as sem

    x = call.inputs.values
    op = call.module.apply_rope_with_cos_sin_cache_inplace
    q0, k0 = x["query"], x["key"]
    q, k = q0.clone(), k0.clone()
    tokens, _, head_dim = q.shape
    qf, kf = q.view(tokens, -1), k.view(tokens, -1)
    neox = sem.rope_is_neox(call.definition)
    pos, cache = x["positions"], x["cos_sin_cache"]

    def setup():
        q.copy_(q0)
        k.copy_(k0)

    return ((lambda: op(pos, qf, kf, head_dim, cache, is_neox=neox)), setup,
            "in place: setup restores query/key (not timed)")


def _prep_fi_mamba_ssu(call: Call):
    """In place on a cloned state cache: setup copies the pristine cache back before every call (not
    timed); the tied-parameter views are made once."""
    from ..groundtruth import flashinfer as fgt

    run, restore = fgt.plan_selective_state_update(call)
    return run, restore, "in place: setup restores the state cache (not timed)"


def _prep_direct(adapter_fn: Callable):
    """Adapters whose whole body is the kernel call (mm_bf16: a transposed view and the call)."""

    def prep(call: Call):
        return (lambda: adapter_fn(call)), None, "the adapter's body is the kernel call"

    return prep


def _sampling_generator(call: Call, offset: int) -> Any:
    import torch

    probs = call.inputs.values["probs"]
    return torch.Generator(device=probs.device).manual_seed(call.inputs.seed + offset)


def _prep_fi_sampling(call: Call):
    """One call of the FlashInfer sampler on the whole batch, probs [batch, vocab] with the per-row
    top_k / top_p tensors, one draw per row: what a serving step launches. (The adapter instead
    draws `draws` samples per row, one call per row of repeated rows, for the statistical check.)
    The same keywords as the adapter: deterministic, a seeded generator, FlashInfer's filter order."""
    from ..groundtruth import flashinfer as fgt

    d, x = call.definition, call.inputs.values
    name = fgt.SAMPLERS.get(frozenset(k for k in ("top_k", "top_p") if k in d.inputs))
    if name is None:
        raise LookupError("no top_k / top_p input")
    op = getattr(call.module.sampling, name)
    extra = fgt.keywords(op, deterministic=True, generator=_sampling_generator(call, 0xF1))
    if "top_k" in x and "top_p" in x:
        extra.update(fgt.keywords(op, filter_apply_order="top_k_first"))
    probs = x["probs"]
    rest = [x[k] for k in ("top_k", "top_p") if k in x]
    return ((lambda: op(probs, *rest, **extra)), None,
            f"one {name} call on the whole batch {list(probs.shape)}, one draw per row")


def _prep_sgl_sampling(call: Call):
    """One call of sgl_kernel's top_k_top_p_sampling_from_probs on the whole batch (a missing filter
    disabled as the adapter does: top_k = vocab, top_p = 1), keywords as the adapter passes them."""
    import torch

    x = call.inputs.values
    probs = x["probs"]
    batch, vocab = probs.shape
    top_k = x.get("top_k")
    top_k = torch.full((batch,), vocab, dtype=torch.int32, device=probs.device) if top_k is None else top_k
    top_p = x.get("top_p")
    top_p = torch.ones(batch, dtype=torch.float32, device=probs.device) if top_p is None else top_p
    op, g = call.module.top_k_top_p_sampling_from_probs, _sampling_generator(call, 0x56)
    return ((lambda: op(probs, top_k, top_p, deterministic=True, generator=g)), None,
            f"one top_k_top_p_sampling_from_probs call on the whole batch {list(probs.shape)}, one draw per row")


def _prep_fi_samplers(launch: Callable[[Call], Callable[[], Any]]):
    """min-p, plain and logits samplers (flashinfer_samplers.py): one call on the whole batch in the definition's
    form, one draw per row, deterministic with a seeded generator, as `_prep_fi_sampling`."""
    def prep(call: Call):
        x = call.inputs.values
        dist = x["logits"] if "logits" in x else x["probs"]
        return launch(call), None, f"one call on the whole batch {list(dist.shape)}, one draw per row"

    return prep


def _prep_fi_chain(call: Call):
    """chain_speculative_sampling (flashinfer_speculative.py): one call on the whole batch, the plain form
    (deterministic, a seeded generator), one chain per request."""
    from ..groundtruth import flashinfer_speculative as fspec

    shape = list(call.inputs.values["target_probs"].shape)
    return fspec.plan_batch(call), None, f"one call on the whole batch (target_probs {shape}), one chain per request"


def _preparers() -> dict[Callable, Preparer]:
    from ..groundtruth import flashinfer as fgt
    from ..groundtruth import flashinfer_gemma_norm as fgemma
    from ..groundtruth import flashinfer_samplers as fsm
    from ..groundtruth import flashinfer_speculative as fspec
    from ..groundtruth import sglang as sgt
    from ..groundtruth import sglang_gemma_norm as sgemma

    direct = {a.fn: _prep_direct(a.fn) for a in fgt.ADAPTERS if a.api.startswith("flashinfer.mm_bf16")}
    samplers = {a.fn: _prep_fi_samplers(fsm.plan_batch(a.api.rsplit(".", 1)[-1])) for a in fsm.ADAPTERS}
    return {
        **direct,
        **samplers,
        fspec.run: _prep_fi_chain,
        fgt.segment_gemm: _planned(fgt.plan_segment_gemm),
        fgt.gqa_decode: _planned(fgt.plan_gqa_decode),
        fgt.gqa_decode_tc: _planned(fgt.plan_gqa_decode_tc),
        fgt.gqa_prefill_paged: _planned(fgt.plan_gqa_prefill_paged),
        fgt.gqa_prefill_ragged: _planned(fgt.plan_gqa_prefill_ragged),
        fgt.mla: _planned(fgt.plan_mla),
        fgt.fused_add_rmsnorm: _prep_fused_add_rmsnorm(lambda m: m.norm.fused_add_rmsnorm),
        fgt.rmsnorm: _prep_rmsnorm(lambda m: m.norm.rmsnorm),
        fgt.silu_and_mul: _prep_fi_silu_and_mul,
        fgt.rope: _prep_fi_rope,
        fgt.sampling: _prep_fi_sampling,
        fgt.mamba_ssu: _prep_fi_mamba_ssu,
        sgt.sampling: _prep_sgl_sampling,
        sgt.fused_add_rmsnorm: _prep_fused_add_rmsnorm(lambda m: m.fused_add_rmsnorm),
        sgt.rmsnorm: _prep_rmsnorm(lambda m: m.rmsnorm),
        sgt.silu_and_mul: _prep_sgl_silu_and_mul,
        sgt.rope: _prep_sgl_rope,
        fgemma.run_fused: _prep_fused_add_rmsnorm(lambda m: m.norm.gemma_fused_add_rmsnorm),
        fgemma.run: _prep_rmsnorm(lambda m: m.norm.gemma_rmsnorm),
        sgemma.gemma_fused_add_rmsnorm: _prep_fused_add_rmsnorm(lambda m: m.gemma_fused_add_rmsnorm),
        sgemma.gemma_rmsnorm: _prep_rmsnorm(lambda m: m.gemma_rmsnorm),
    }


# adapter function (Adapter.fn) -> preparer(call) -> (fn, setup or None, note). Adapters not here are
# timed whole (Prepared.includes_setup True).
PREPARERS: dict[Callable, Preparer] = _preparers()


def prepare(ground_truth: GroundTruth, inputs: Inputs) -> Prepared:
    """A closure to time for this ground truth on these inputs.

    The adapter runs once first (it compiles FlashInfer's JIT kernels and proves the call works;
    GroundTruthUnavailable from it propagates). Adapters with a preparer in PREPARERS get a closure
    that launches only the kernel (the attention wrappers are planned once, outside; the samplers
    are one call on the whole batch, not the adapter's call per row); the others are timed as the
    whole adapter call, `includes_setup=True` (for the torch ground truth, the float64 conversions
    and Python loops too). A preparer that fails (API drift in another version) falls back the same
    way, its error in `note`.
    """
    torch = require_cuda("prepare")
    from ..groundtruth.base import Call

    gt = ground_truth
    if not str(gt.device).startswith("cuda"):
        raise RuntimeError(f"prepare times CUDA kernels; this ground truth runs on {gt.device!r}")
    inputs = inputs.on(gt.device)
    call = Call(gt.definition, inputs, gt.module, gt.version, 1)
    gt.adapter.fn(call)  # JIT compile, allocate, and fail here rather than in the timer
    torch.cuda.synchronize()
    preparer = PREPARERS.get(gt.adapter.fn)
    failed = ""
    if preparer is not None:
        try:
            fn, setup, note = preparer(call)
            if setup is not None:
                setup()
            fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - fall back to the whole call, and say why
            failed = f"; preparer failed ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
        else:
            return Prepared(fn, setup, includes_setup=False, note=f"{gt.api}: {note}", timer="auto")
    adapter_fn = gt.adapter.fn
    return Prepared(lambda: adapter_fn(call), None, includes_setup=True,
                    note=f"{gt.api}: whole adapter call timed (setup, allocations and conversions included){failed}")

"""FlashInfer ground truth for op_type `gdn`: `gdn_prefill.chunk_gated_delta_rule` (prefill) and
`gdn_decode.gated_delta_rule_decode_pretranspose` / `gated_delta_rule_mtp` (decode, MTP).

What the versions need (read from the 0.6.6 and 0.7.2.post1 sources):

* prefill, 0.6.x: a CUDA JIT module (`gdn_prefill_sm90`, built with sm90a flags: Hopper only).
  It takes the decay g as a *multiplicative* gate (alpha, float32 `[T, HV]`, default ones) and
  beta float32 `[T, HV]`, so this adapter computes g = exp(-exp(A_log) softplus(a + dt_bias)) and
  beta = sigmoid(b) in float32, as the definitions' references do; `initial_state` and the final
  state are k-last `[N, HV, V, K]` float32 (the definitions' layout) and `output_final_state=True`
  returns them. `use_qk_l2norm_in_kernel=False`: the definitions do not normalise q and k.
* prefill, later (0.6.14 and 0.7.x read): every arch runs CuTe-DSL kernels (`gdn_kernels.
  chunk_gated_delta_rule_sm90` is None without nvidia-cutlass-dsl, and the call raises
  NotImplementedError): needs `cutlass`. Which path a release takes is read from `flashinfer.gdn_prefill`
  itself (it imports `chunk_gated_delta_rule_sm90`), not from its number: 0.6.14 has the DSL path, and
  a version bound would have its prefill checks fail instead of skipping (docs/evidence/ground-truth.md).
* decode and MTP, every version: CuTe-DSL kernels. 0.6.x imports `cutlass` at the top of
  `flashinfer.gdn_decode`, 0.7.x inside `gdn_kernels` (the float32-state paths then call None).
  Without nvidia-cutlass-dsl the adapter is a `not-installed` skip that names it, decided before
  any call (`resolve`). Decode uses the *pretranspose* entry point, whose state is k-last
  `[B, HV, V, K]` like the definitions' (`gated_delta_rule_decode` takes k-major `[B, HV, K, V]`),
  float32 state (the legacy T=1 kernel); MTP passes `disable_state_update=True` (0.7.x changed the
  default to None): the definitions' MTP returns the pool unchanged, and the pool the kernel hands
  back is compared with that. Where the definition declares `intermediate_states_buffer` as an
  in-place output, a float32 contiguous clone of it is passed and read back after the call: the
  kernel writes row i's state after token t at [i, t] (its docstring: `[B, T, HV, V, K]`, indexed
  per batch, not per pool slot), the layout the definitions declare.

Kernels that write in place get clones. Arguments after q, k, v go by keyword.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import torch
import torch.nn.functional as F

from .base import Call, GroundTruthUnavailable, accepts, keywords

CUTLASS_DSL = "nvidia-cutlass-dsl (cutlass)"


def _stage(definition) -> str:
    from ..inputs.gdn import stage

    return stage(definition)


def gate_values(x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) float32, contiguous, shaped like `a`: what the prefill kernel takes."""
    g = torch.exp(-torch.exp(x["A_log"].float()) * F.softplus(x["a"].float() + x["dt_bias"].float()))
    return g.contiguous(), torch.sigmoid(x["b"].float()).contiguous()


def _scale(x: dict) -> float | None:
    s = x.get("scale")
    return float(s) if s is not None and float(s) != 0.0 else None  # None: the kernel's 1/sqrt(K)


def needs_cutlass_dsl(module_name: str, attr: str):
    """A `resolve` check: the CuTe-DSL package is importable, then `flashinfer.<module_name>` imports
    and has `attr`. Each failure is its own precise reason."""

    def resolve(fi: ModuleType, version, definition) -> None:
        if importlib.util.find_spec("cutlass") is None:
            raise GroundTruthUnavailable(
                "not-installed", f"{CUTLASS_DSL}: flashinfer {version} runs gdn {_stage(definition)} as CuTe-DSL "
                                 f"kernels (flashinfer.{module_name}.{attr})")
        mod = _import(fi, module_name)
        if getattr(mod, attr, None) is None:
            raise GroundTruthUnavailable("api-missing", f"flashinfer {version} has no {module_name}.{attr}")

    return resolve


DSL_PREFILL = "chunk_gated_delta_rule_sm90"  # what a gdn_prefill module with CuTe-DSL kernels imports


def prefill_is_dsl(fi: ModuleType) -> bool:
    return DSL_PREFILL in vars(_import(fi, "gdn_prefill"))


def needs_jit_prefill(attr: str):
    """A `resolve` check for the CUDA JIT prefill: the release's gdn_prefill has `attr` and no CuTe-DSL path
    (a release with one runs the DSL adapter, whose reason is the telling one: this one says
    `unsupported`, the earliest kind, rather than `api-missing`)."""

    def resolve(fi: ModuleType, version, definition) -> None:
        if prefill_is_dsl(fi):
            raise GroundTruthUnavailable("unsupported", f"flashinfer {version} runs gdn prefill as CuTe-DSL "
                                                        f"kernels ({DSL_PREFILL}): no CUDA JIT path")
        if getattr(_import(fi, "gdn_prefill"), attr, None) is None:
            raise GroundTruthUnavailable("api-missing", f"flashinfer {version} has no gdn_prefill.{attr}")

    return resolve


def needs_dsl_prefill(attr: str):
    """A `resolve` check for the CuTe-DSL prefill: the release has that path, and nvidia-cutlass-dsl is there."""
    dsl = needs_cutlass_dsl("gdn_prefill", attr)

    def resolve(fi: ModuleType, version, definition) -> None:
        if not prefill_is_dsl(fi):
            raise GroundTruthUnavailable("unsupported", f"flashinfer {version} runs gdn prefill as a CUDA JIT "
                                                        "module: no CuTe-DSL path")
        dsl(fi, version, definition)

    return resolve


def _import(fi: ModuleType, module_name: str) -> ModuleType:
    name = f"{fi.__name__}.{module_name}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] == "cutlass":
            raise GroundTruthUnavailable("not-installed", f"{CUTLASS_DSL}: {name} imports it") from None
        if e.name == name:  # the release has no such module (0.5.3 has no gdn_prefill): its API, not a failed import
            raise GroundTruthUnavailable("api-missing", f"{fi.__name__} {getattr(fi, '__version__', '?')} has no "
                                                        f"module {name}") from None
        raise GroundTruthUnavailable("import-failed", f"{name}: {type(e).__name__}: {e}") from None
    except Exception as e:  # noqa: BLE001 - an extension may fail to load with anything
        text = " ".join(str(e).split())[:300]
        raise GroundTruthUnavailable("import-failed", f"{name}: {type(e).__name__}: {text}") from None


def _kernel(call: Call, module_name: str, attr: str):
    return getattr(_import(call.module, module_name), attr)


def _keywords(fn, **maybe):
    return keywords(fn, **maybe)


# -- the calls ---------------------------------------------------------------------------------------
def prefill(call: Call) -> tuple:
    x = call.inputs.values
    fn = _kernel(call, "gdn_prefill", "chunk_gated_delta_rule")
    g, beta = gate_values(x)
    state = x.get("state")
    kwargs = dict(g=g, beta=beta, scale=_scale(x),
                  initial_state=None if state is None else state.to(torch.float32).contiguous().clone(),
                  output_final_state=True, cu_seqlens=x["cu_seqlens"].to(torch.int64),
                  use_qk_l2norm_in_kernel=False)
    out, final = fn(x["q"].contiguous(), x["k"].contiguous(), x["v"].contiguous(), **_keywords(fn, **kwargs))
    return out, final


def decode(call: Call) -> tuple:
    x = call.inputs.values
    fn = _kernel(call, "gdn_decode", "gated_delta_rule_decode_pretranspose")
    state = x["state"].to(torch.float32).contiguous().clone()  # updated in place
    out, new_state = fn(x["q"], x["k"], x["v"], state, x["A_log"], x["a"], x["dt_bias"], x["b"],
                        **_keywords(fn, scale=_scale(x), use_qk_l2norm=False))
    return out, new_state


BUFFER = "intermediate_states_buffer"


def mtp(call: Call) -> tuple:
    x = call.inputs.values
    fn = _kernel(call, "gdn_decode", "gated_delta_rule_mtp")
    pool = x["initial_state"].to(torch.float32).contiguous().clone()
    wants_buffer = BUFFER in call.definition.outputs
    if wants_buffer and not accepts(fn, BUFFER):
        raise GroundTruthUnavailable("api-missing", f"this gated_delta_rule_mtp takes no {BUFFER}, which the "
                                                    "definition declares as an in-place output")
    buffer = x[BUFFER].to(torch.float32).contiguous().clone() if wants_buffer else None  # written in place
    more = {BUFFER: buffer} if wants_buffer else {}
    out, pool_after = fn(x["q"], x["k"], x["v"], pool, x["initial_state_indices"].to(torch.int32), x["A_log"],
                         x["a"], x["dt_bias"], x["b"],
                         **_keywords(fn, scale=_scale(x), disable_state_update=True, use_qk_l2norm=False, **more))
    return (out, pool_after, buffer) if wants_buffer else (out, pool_after)


# -- which definitions ------------------------------------------------------------------------------
GATES = ("q", "k", "v", "A_log", "a", "dt_bias", "b")


def applies(stage: str, *names: str):
    def check(d) -> str | None:
        if d.op_type != "gdn":
            return "not a gdn definition"
        have = _stage(d)
        if have != stage:
            return f"handles gdn {stage}, not {have}"
        absent = [n for n in (*GATES, *names) if n not in d.inputs]
        if absent:
            return f"needs input(s) {', '.join(absent)}"
        # a file may leave a dtype undeclared ("unknown": FlashInfer 0.7.2.post1's traced prefill does), and then
        # nothing says these kernels' float32 operands fit it
        if any(getattr(d.inputs[n].dtype, "value", None) != "float32" for n in ("A_log", "dt_bias") if n in d.inputs):
            return "takes float32 A_log and dt_bias"
        return None

    return check

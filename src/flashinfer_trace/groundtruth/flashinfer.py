"""FlashInfer ground truth, across 0.5.x, 0.6.x and 0.7.x.

The API drifts (see docs/ground-truth.md): positional arguments shift between versions, defaults
change (q_data_type defaults to float16 everywhere, `backend="auto"` picks fa3 on Hopper), and
some APIs exist only on some versions or archs. So every call passes the stable leading
positionals and the rest by keyword, always names q/kv data types, pins `backend="fa2"` where
the parameter exists, asks for a base-2 lse explicitly where a version lets one choose, and each
adapter states the versions, attributes and compute capabilities it needs as data. In-place
kernels get clones, and every output they write is compared.
"""

from __future__ import annotations

from typing import Any

import torch
from packaging.specifiers import SpecifierSet

from .. import semantics as sem
from . import flashinfer_gdn as gdn
from .base import Adapter, Call, GroundTruthUnavailable, Package, accepts, keywords

PACKAGE = Package("flashinfer", ("flashinfer-python", "flashinfer"), "flashinfer")
# The wrappers' float workspace: split-kv prefill keeps its partial outputs there, and 128 MiB was too
# little for the medium paged prefill (0.6.6 on the H100: batch_prefill_tmp_v needed 130 MiB).
WORKSPACE_BYTES = 512 << 20
HALF = frozenset({"bfloat16", "float16"})
_GDN_DTYPES = frozenset({"bfloat16", "float16", "float32"})  # 16-bit q/k/v/a/b, float32 A_log/dt_bias/state

_workspaces: dict[tuple[str, bool, int], torch.Tensor] = {}


def workspace(device: torch.device, *, zeroed: bool = False, nbytes: int = WORKSPACE_BYTES) -> torch.Tensor:
    """One buffer per (device, kind, size), kept for the process. `zeroed`: trtllm-gen keeps semaphores
    in its workspace, which must be zero on first use (a separate buffer: wrappers leave theirs dirty)."""
    key = (str(device), zeroed, nbytes)
    if key not in _workspaces:
        make = torch.zeros if zeroed else torch.empty
        _workspaces[key] = make(nbytes, dtype=torch.uint8, device=device)
    return _workspaces[key]


def _fa2(cls) -> dict[str, Any]:
    return keywords(cls.__init__, backend="fa2")


def _backend(cls, call: Call) -> dict[str, Any]:
    """fa2 pinned (the default "auto" picks by arch), or FA3 when the path asks for it: Hopper only."""
    if call.mode != "fa3":
        return _fa2(cls)
    if not accepts(cls.__init__, "backend"):
        raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} {cls.__name__} has no backend")
    device = next(v.device for v in call.inputs.values.values() if isinstance(v, torch.Tensor))
    cc = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    if cc != (9, 0):
        raise GroundTruthUnavailable("arch-unsupported", f"{cls.__name__}(backend='fa3') needs sm90, have "
                                                         f"{f'sm{cc[0]}{cc[1]}' if cc else device.type}")
    return {"backend": "fa3"}


# -- norms / activation / rope ----------------------------------------------------------------------
def _mode_keywords(fn, call: Call) -> dict[str, Any]:
    """The keywords a path's mode adds: `pdl` launches with programmatic dependent launch (sm90+)."""
    if call.mode != "pdl":
        return {}
    if not accepts(fn, "enable_pdl"):
        raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} {fn.__name__} has no enable_pdl")
    return {"enable_pdl": True}


def _out(fn, call: Call, like: torch.Tensor) -> dict[str, Any]:
    """`out` mode: the result written into a buffer the caller gives (dirty, as a reused one is)."""
    if call.mode != "out":
        return {}
    if not accepts(fn, "out"):
        raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} {fn.__name__} has no out")
    return {"out": torch.full_like(like, float("nan"))}


def rmsnorm(call: Call) -> tuple:
    fi, x = call.module, call.inputs.values
    fn = fi.norm.rmsnorm
    extra = {**_mode_keywords(fn, call), **_out(fn, call, x["hidden_states"])}
    out = fn(x["hidden_states"], x["weight"], eps=sem.eps(call.definition, x), **extra)
    return (extra.get("out", out),)


def fused_add_rmsnorm(call: Call) -> tuple:
    """In place: the normalised result lands in `input`, the sum in `residual`; both are outputs."""
    fi, x = call.module, call.inputs.values
    hidden, residual = x["hidden_states"].clone(), x["residual"].clone()
    fn = fi.norm.fused_add_rmsnorm
    fn(hidden, residual, x["weight"], eps=sem.eps(call.definition, x), **_mode_keywords(fn, call))
    return sem.norm_outputs(call.definition, hidden, residual)


def silu_and_mul(call: Call) -> tuple:
    fn, x = call.module.activation.silu_and_mul, call.inputs.values["input"]
    like = x.new_empty(*x.shape[:-1], x.shape[-1] // 2) if call.mode == "out" else x
    extra = {**_mode_keywords(fn, call), **_out(fn, call, like)}
    out = fn(x, **extra)
    return (extra.get("out", out),)


def rope(call: Call) -> tuple:
    """Takes query/key flattened to [tokens, heads * head_dim] and returns rotated copies (mode `inplace`:
    the in-place form rotates copies of them where they are)."""
    fi, x = call.module, call.inputs.values
    q, k = (x[n] for n in sem.rope_rotated(call.definition))
    tokens, _, head_dim = q.shape
    if call.mode == "inplace":
        fn = getattr(fi.rope, "apply_rope_with_cos_sin_cache_inplace", None)
        if fn is None:
            raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} has no "
                                                        "apply_rope_with_cos_sin_cache_inplace")
        q_out, k_out = q.clone(), k.clone()
        fn(x["positions"], q_out.view(tokens, -1), k_out.view(tokens, -1), head_dim, x["cos_sin_cache"],
           is_neox=sem.rope_is_neox(call.definition))
        return q_out, k_out
    fn = fi.rope.apply_rope_with_cos_sin_cache
    q_out, k_out = fn(x["positions"], q.reshape(tokens, -1), k.reshape(tokens, -1), head_dim,
                      x["cos_sin_cache"], is_neox=sem.rope_is_neox(call.definition))
    return q_out.reshape(q.shape), k_out.reshape(k.shape)


# -- gemm -------------------------------------------------------------------------------------------
def mm_bf16(backend: str):
    def run(call: Call) -> tuple:
        fi, x = call.module, call.inputs.values
        a, b = x["A"], x["B"]  # C = A @ B^T; mm_bf16 takes b as (k, n) column-major: B.T is exactly that
        return (fi.mm_bf16(a, b.T, out_dtype=torch.bfloat16, backend=backend),)

    return run


# -- attention --------------------------------------------------------------------------------------
def _kv_layout(call: Call):
    d, x = call.definition, call.inputs.values
    page = sem.page_size(d)
    indptr = x["kv_indptr"].to(torch.int32)
    last = sem.last_page_lens(indptr, page, x.get("kv_last_page_len"))
    return page, indptr, x["kv_indices"].to(torch.int32), last


def _lse_base2(run_fn) -> dict[str, Any]:
    return keywords(run_fn, lse_base="log2", return_lse_base_on_e=False)


# Each attention adapter is a plan step (the wrapper, its plan(): what a benchmark keeps outside
# the timed region; `buffer` is the workspace the plan lives in) and a call of its run().
# FlashInfer's CUDA-core decode kernel is instantiated for these query heads per kv head only
# (DISPATCH_GQA_GROUP_SIZE); other group sizes raise "Unsupported group_size". Serving engines run
# those on the tensor-core path (use_tensor_cores=True: the prefill kernel with one query row),
# and so does the second decode adapter: the api recorded in each cell says which path ran.
CUDA_CORE_GROUP_SIZES = frozenset({1, 2, 3, 4, 8})


def group_size(d) -> int | None:
    heads = [d.axes.get(n) for n in ("num_qo_heads", "num_kv_heads")]
    if any(a is None or a.value is None for a in heads) or not heads[1].value:
        return None
    return heads[0].value // heads[1].value


def plan_gqa_decode(call: Call, buffer: torch.Tensor | None = None, *, tensor_cores: bool = False):
    fi, x = call.module, call.inputs.values
    q, kc, vc = x["q"], x["k_cache"], x["v_cache"]
    page, indptr, indices, last = _kv_layout(call)
    cls = fi.decode.BatchDecodeWithPagedKVCacheWrapper
    if tensor_cores and not accepts(cls.__init__, "use_tensor_cores"):
        raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} decode has no use_tensor_cores")
    extra_init = {"use_tensor_cores": True} if tensor_cores else {}
    w = cls(workspace(q.device) if buffer is None else buffer, "NHD", **_fa2(cls), **extra_init)
    w.plan(indptr, indices, last, q.shape[1], kc.shape[2], q.shape[2], page,
           q_data_type=q.dtype, kv_data_type=kc.dtype, sm_scale=sem.sm_scale(x, q.shape[-1]))
    extra = _lse_base2(w.run)
    return lambda: w.run(q, (kc, vc), return_lse=True, **extra)


def finish_decode(call: Call, raw: tuple) -> tuple:
    return tuple(raw)


def gqa_decode(call: Call) -> tuple:
    return finish_decode(call, plan_gqa_decode(call)())


def plan_gqa_decode_tc(call: Call, buffer: torch.Tensor | None = None):
    return plan_gqa_decode(call, buffer, tensor_cores=True)


def gqa_decode_tc(call: Call) -> tuple:
    return finish_decode(call, plan_gqa_decode_tc(call)())


def plan_gqa_prefill_paged(call: Call, buffer: torch.Tensor | None = None):
    fi, x = call.module, call.inputs.values
    q, kc, vc = x["q"], x["k_cache"], x["v_cache"]
    page, indptr, indices, last = _kv_layout(call)
    cls = fi.prefill.BatchPrefillWithPagedKVCacheWrapper
    w = cls(workspace(q.device) if buffer is None else buffer, "NHD", **_backend(cls, call))
    # head_dim is passed positionally: its keyword was renamed head_dim_qk in 0.2.1
    w.plan(x["qo_indptr"].to(torch.int32), indptr, indices, last, q.shape[1], kc.shape[2], q.shape[2], page,
           causal=sem.is_causal(call.definition), sm_scale=sem.sm_scale(x, q.shape[-1]),
           q_data_type=q.dtype, kv_data_type=kc.dtype)
    extra = _lse_base2(w.run)
    return lambda: w.run(q, (kc, vc), return_lse=True, **extra)


def gqa_prefill_paged(call: Call) -> tuple:
    return tuple(plan_gqa_prefill_paged(call)())


def plan_gqa_prefill_ragged(call: Call, buffer: torch.Tensor | None = None):
    fi, x = call.module, call.inputs.values
    q, k, v = x["q"], x["k"], x["v"]
    cls = fi.prefill.BatchPrefillWithRaggedKVCacheWrapper
    vo = {}
    if v.shape[-1] != q.shape[-1]:  # MLA prefill before absorption: qk 192, vo 128
        if not accepts(cls.plan, "head_dim_vo"):
            raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} ragged prefill plan() has no "
                                                        "head_dim_vo (a value head dim unlike the key's)")
        vo = {"head_dim_vo": v.shape[-1]}
    w = cls(workspace(q.device) if buffer is None else buffer, "NHD", **_backend(cls, call))
    w.plan(x["qo_indptr"].to(torch.int32), x["kv_indptr"].to(torch.int32), q.shape[1], k.shape[1], q.shape[2],
           causal=sem.is_causal(call.definition), sm_scale=sem.sm_scale(x, q.shape[-1]),
           q_data_type=q.dtype, kv_data_type=k.dtype, **vo)
    extra = _lse_base2(w.run)
    return lambda: w.run(q, k, v, return_lse=True, **extra)


def gqa_prefill_ragged(call: Call) -> tuple:
    return tuple(plan_gqa_prefill_ragged(call)())


def _mla_qo_indptr(call: Call, kv_indptr: torch.Tensor) -> torch.Tensor:
    x = call.inputs.values
    if "qo_indptr" in x:
        return x["qo_indptr"].to(torch.int32)
    return torch.arange(kv_indptr.numel(), dtype=torch.int32, device=kv_indptr.device)  # decode: one query each


def plan_mla(call: Call, buffer: torch.Tensor | None = None):
    """BatchMLAPagedAttentionWrapper's flat plan: every argument is a required positional from 0.2.1
    to 0.6.x, and 0.7.x still takes that form (deprecated, legacy path)."""
    fi, x = call.module, call.inputs.values
    q_nope, q_pe, ckv, kpe = x["q_nope"], x["q_pe"], x["ckv_cache"], x["kpe_cache"]
    page, indptr, indices, last = _kv_layout(call)
    pages = (indptr[1:] - indptr[:-1]).to(torch.int32)
    kv_len = torch.where(pages > 0, (pages - 1) * page + last, 0).to(torch.int32)
    cls = fi.mla.BatchMLAPagedAttentionWrapper
    w = cls(workspace(q_nope.device) if buffer is None else buffer, **_backend(cls, call))
    w.plan(_mla_qo_indptr(call, indptr), indptr, indices, kv_len, q_nope.shape[1], ckv.shape[-1], kpe.shape[-1],
           page, sem.is_causal(call.definition), sem.sm_scale(x, q_nope.shape[-1] + q_pe.shape[-1]), q_nope.dtype,
           ckv.dtype)
    extra = _lse_base2(w.run)
    return lambda: w.run(q_nope, q_pe, ckv, kpe, return_lse=True, **extra)


def mla(call: Call) -> tuple:
    return finish_mla(call, plan_mla(call)())


def finish_mla(call: Call, raw: tuple) -> tuple:
    return tuple(raw)


# -- sampling ---------------------------------------------------------------------------------------
SAMPLERS = {
    frozenset({"top_k"}): "top_k_sampling_from_probs",
    frozenset({"top_p"}): "top_p_sampling_from_probs",
    frozenset({"top_k", "top_p"}): "top_k_top_p_sampling_from_probs",
}
ROWS_PER_CALL = 4096


def _sampler_name(d) -> str | None:
    return SAMPLERS.get(frozenset(n for n in ("top_k", "top_p") if n in d.inputs))


def sampling(call: Call) -> tuple:
    """draws per row from repeated rows: [batch, draws]. deterministic=True and a seeded generator
    make the draws replay."""
    from ..inputs.sampling import repeat_rows

    fi, d, x = call.module, call.definition, call.inputs.values
    fn = getattr(fi.sampling, _sampler_name(d))
    probs = x["probs"]
    batch = probs.shape[0]
    g = torch.Generator(device=probs.device).manual_seed(call.inputs.seed + 0xF1)
    extra = keywords(fn, deterministic=True, generator=g)
    if "top_k" in x and "top_p" in x:
        extra.update(keywords(fn, filter_apply_order="top_k_first"))
    out = torch.empty(batch, call.draws, dtype=torch.int64, device=probs.device)
    for row in range(batch):
        done = 0
        while done < call.draws:
            n = min(call.draws - done, ROWS_PER_CALL)
            args = repeat_rows(d, call.inputs, n, slice(row, row + 1))
            named = dict(zip(x, args, strict=True))
            rest = [named[k] for k in ("top_k", "top_p") if k in named]
            out[row, done:done + n] = fn(named["probs"], *rest, **extra).to(torch.int64)
            done += n
    return (out,)


# -- moe --------------------------------------------------------------------------------------------
# trtllm-gen's routing method numbers (flashinfer RoutingMethodType): Renormalize 1, DeepSeekV3 2
TRTLLM_ROUTING = {"renormalize": 1, "deepseek": 2}


def trtllm_moe(call: Call) -> tuple:
    """trtllm-gen fp8 block-scale MoE (sm100/sm103): takes the definition's tensors as they are,
    routing included (its DeepSeekV3 or Renormalize method); GEMM1 rows [up; gate] like the definition."""
    fi, d, x = call.module, call.definition, call.inputs.values
    r = sem.moe_routing(d)
    fn = fi.fused_moe.trtllm_fp8_block_scale_moe
    w1 = x["gemm1_weights"]
    local, inter = w1.shape[0], x["gemm2_weights"].shape[-1]
    bias = x.get("routing_bias")
    kwargs = dict(routing_logits=x["routing_logits"].to(torch.float32),
                  routing_bias=None if bias is None else bias.to(torch.bfloat16),
                  hidden_states=x["hidden_states"], hidden_states_scale=x["hidden_states_scale"],
                  gemm1_weights=w1, gemm1_weights_scale=x["gemm1_weights_scale"],
                  gemm2_weights=x["gemm2_weights"], gemm2_weights_scale=x["gemm2_weights_scale"],
                  num_experts=x["routing_logits"].shape[1], top_k=r.top_k, n_group=r.n_group,
                  topk_group=r.topk_group, intermediate_size=inter,
                  local_expert_offset=sem.expert_offset(call.definition, x), local_num_experts=local,
                  routed_scaling_factor=float(x["routed_scaling_factor"]) if "routed_scaling_factor" in x else None,
                  routing_method_type=TRTLLM_ROUTING[r.kind])
    kwargs.update(keywords(fn, use_shuffled_weight=False, tile_tokens_dim=None))
    out = fn(**{k: v for k, v in kwargs.items() if accepts(fn, k)})
    return ((out[0] if isinstance(out, (list, tuple)) else out).to(torch.bfloat16),)


def cutlass_moe(call: Call) -> tuple:
    """cutlass fused MoE with DeepSeek fp8 block scales (sm90, flashinfer >= 0.4, CUDA >= 12.8).

    It takes bf16 activations and quantizes them 1x128 itself, fp8 weights with one float32 scale
    per 128x128 tile ([fc1, fc2], the definition's layouts), fc1 rows [w3 (up); w1 (gate)] (the
    definition's order) and the routing as global expert ids and weights, which this adapter
    computes with the torch ground truth's routing code (the kernel has none of its own).
    """
    from .torch_ref import dequantized_activations, route

    fi, d, x = call.module, call.definition, call.inputs.values
    hs = x["hidden_states"]
    act = dequantized_activations(d, x).to(torch.bfloat16)
    ids, weights = route(d, x)
    w1, w2 = x["gemm1_weights"], x["gemm2_weights"]
    local = w1.shape[0]
    offset = sem.expert_offset(call.definition, x)
    fn = fi.fused_moe.cutlass_fused_moe
    out = torch.zeros(hs.shape[0], hs.shape[1], dtype=torch.bfloat16, device=hs.device)
    result = fn(act, ids.to(torch.int32), weights.to(torch.float32), w1, w2, torch.bfloat16,
                quant_scales=[x["gemm1_weights_scale"].to(torch.float32).contiguous(),
                              x["gemm2_weights_scale"].to(torch.float32).contiguous()],
                ep_size=x["routing_logits"].shape[1] // local, ep_rank=offset // local, output=out,
                use_deepseek_fp8_block_scale=True)
    return ((result[0] if isinstance(result, (list, tuple)) else result),)


def plan_segment_gemm(call: Call, buffer: torch.Tensor | None = None):
    """SegmentGEMMWrapper with one segment is a dense C = A @ B^T (fp16 and bf16, every version)."""
    fi, x = call.module, call.inputs.values
    a, b = x["A"], x["B"]
    w = fi.gemm.SegmentGEMMWrapper(workspace(a.device) if buffer is None else buffer)
    seg_lens = torch.tensor([a.shape[0]], dtype=torch.int64, device=a.device)
    weights = b[None]
    return lambda: w.run(a, weights, 1, True, seg_lens=seg_lens)


def segment_gemm(call: Call) -> tuple:
    return (plan_segment_gemm(call)(),)


# -- mamba ------------------------------------------------------------------------------------------
# selective_state_update (0.6.x, 0.7.x: flashinfer.mamba) takes the per-head parameters tied across
# head_dim ("TIE_HDIM", as Nemotron-H has them) as stride-0 views only: A [nheads, dim, dstate] with
# strides (1, 0, 0), D and dt_bias (1, 0), dt [batch, nheads, dim] with stride 0 on dim; it checks them
# and refuses anything else. It updates `state` in place (a clone here) and skips a request whose slot
# is pad_slot_id, but still writes an output row for it (computed from a zero state); the definitions
# give such rows 0, so the adapter zeroes them, as it reads the kernel's contract. JIT module per dtype
# and (dim, dstate); sm90+ builds the TMA variant (0.7.x: sm100+ its own), older archs the simple kernel.
def _tied(call: Call, name: str, t: torch.Tensor, lead: int) -> torch.Tensor:
    """t's values per leading index (`lead` axes), broadcast back to t's shape as a stride-0 view;
    GroundTruthUnavailable when t varies along its trailing axes (the kernel cannot take that)."""
    head = t[(slice(None),) * lead + (0,) * (t.dim() - lead)].contiguous()
    view = head.reshape(*head.shape, *([1] * (t.dim() - lead))).expand(t.shape)
    if not torch.equal(view, t):
        raise GroundTruthUnavailable("unsupported", f"{call.definition.name}: {name} varies along "
                                     f"{'its trailing axes' if lead else 'head_dim'}; flashinfer.mamba."
                                     "selective_state_update takes per-head (TIE_HDIM) values only")
    return view


def plan_selective_state_update(call: Call):
    """(run, restore): run() launches the kernel on a cloned state and returns (output, state);
    restore() puts the pristine state back (for timing: the update is in place)."""
    fi, d, x = call.module, call.definition, call.inputs.values
    fn = fi.mamba.selective_state_update
    for kw in ("dt_bias", "dt_softplus", "state_batch_indices", "pad_slot_id"):
        if not accepts(fn, kw):
            raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} mamba.selective_state_update "
                                                        f"has no {kw}")
    dt = x["dt"]
    weight = dt.dtype
    a = _tied(call, "A", x["A"].to(torch.float32), 1)
    dt_v = _tied(call, "dt", dt, 2)
    heads, dim = x["x"].shape[1], x["x"].shape[2]
    d_v = _tied(call, "D", x["D"], 1) if "D" in x else torch.zeros(heads, 1, dtype=weight,
                                                                    device=dt.device).expand(heads, dim)
    extra: dict[str, Any] = {}
    if "dt_bias" in x:
        extra["dt_bias"] = _tied(call, "dt_bias", x["dt_bias"], 1)
    for name, t in (("D", d_v), ("dt_bias", extra.get("dt_bias"))):
        if t is not None and t.dtype != weight:
            raise GroundTruthUnavailable("unsupported", f"{d.name}: {name} is {t.dtype}, dt {weight}: the kernel "
                                                        "takes D and dt_bias in dt's dtype")
    if "z" in x:
        extra["z"] = x["z"].contiguous()
    if "state_batch_indices" in x:
        extra["state_batch_indices"] = x["state_batch_indices"].contiguous()
        extra["pad_slot_id"] = sem.MAMBA_PAD_SLOT_ID
    pristine = x["state"]
    state = pristine.clone()
    xs, b, c = x["x"].contiguous(), x["B"].contiguous(), x["C"].contiguous()
    softplus = sem.mamba_dt_softplus(d, x)

    def run():
        out = fn(state, xs, dt_v, a, b, c, d_v, dt_softplus=softplus, **extra)
        return out, state

    return run, (lambda: state.copy_(pristine))


def mamba_ssu(call: Call) -> tuple:
    out, state = plan_selective_state_update(call)[0]()
    x = call.inputs.values
    if "state_batch_indices" in x:
        padded = x["state_batch_indices"] == sem.MAMBA_PAD_SLOT_ID
        out = out.masked_fill(padded[:, None, None], 0)
    return (out,) if len(call.definition.outputs) == 1 else (out, state)


# -- the adapters -----------------------------------------------------------------------------------
def _stage(want: str, *names: str):
    def applies(d) -> str | None:
        if sem.stage(d) != want:
            return f"handles {want}, not {sem.stage(d)}"
        return sem.missing_inputs(d, names)

    return applies


def _decode_applies(tensor_cores: bool):
    base = _stage("decode", "q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "sm_scale")

    def applies(d) -> str | None:
        why = base(d)
        if why:
            return why
        g = group_size(d)
        if not tensor_cores and g not in CUDA_CORE_GROUP_SIZES:
            return f"the CUDA-core decode kernel has no group size {g} (the tensor-core path runs it)"
        return None

    return applies


def _rope_applies(d) -> str | None:
    missing = sem.missing_inputs(d, ("positions", "cos_sin_cache"))
    if missing:
        return missing
    rotated = sem.rope_rotated(d)
    if len(rotated) != 2:
        return f"rotates a query and a key; the definition rotates {len(rotated)} tensor(s) ({', '.join(rotated)})"
    query = d.inputs[rotated[0]].dtype.value
    if query not in HALF:  # the cache is float32, the rotated tensors 16-bit
        return f"rotates float16/bfloat16 only, not {query}"
    return None


def _sampler_applies(d) -> str | None:
    """The *_sampling_from_probs kernels: a definition with probs and a top_k / top_p input (fi_trace's
    logits-side sampling ops, `top_k_mask_logits` and friends, are not these)."""
    return sem.missing_inputs(d, ("probs",)) or (None if _sampler_name(d) else "no top_k / top_p input") or (
        None if d.is_sampler else "the first output is not sampled token ids (a filter: flashinfer_topk.py)")


_ATTN = dict(package=PACKAGE, dtypes=HALF, needs_cuda=True)
_REUSE = ("plan-reuse", "graph")  # modes.py: plan once, run on new data; CUDA-graph replay
_PREFILL = dict(_ATTN, modes=("fa3", *_REUSE), finish=lambda call, raw: tuple(raw))
ADAPTERS = [
    Adapter("flashinfer", "rmsnorm", "flashinfer.norm.rmsnorm", rmsnorm, package=PACKAGE,
            requires=("norm.rmsnorm",), applies=sem.plain_rmsnorm, dtypes=HALF, needs_cuda=True, params=(sem.eps,),
            modes=("out", "pdl")),
    Adapter("flashinfer", "rmsnorm", "flashinfer.norm.fused_add_rmsnorm", fused_add_rmsnorm, package=PACKAGE,
            requires=("norm.fused_add_rmsnorm",), applies=sem.fused_add_rmsnorm, dtypes=HALF, needs_cuda=True,
            params=(sem.eps,), modes=("pdl",)),
    # mm_bf16: 0.6.1-0.6.17 only through cudnn/cutlass/tgv on sm100/103; cublaslt on sm80+ from 0.6.18
    Adapter("flashinfer", "gemm", "flashinfer.mm_bf16(backend=cublaslt)", mm_bf16("cublaslt"), package=PACKAGE,
            versions=SpecifierSet(">=0.6.18"), requires=("mm_bf16",), dtypes=frozenset({"bfloat16"}),
            needs_cuda=True, min_cc=(8, 0)),
    Adapter("flashinfer", "gemm", "flashinfer.mm_bf16(backend=cudnn)", mm_bf16("cudnn"), package=PACKAGE,
            versions=SpecifierSet(">=0.6.1,<0.6.18"), requires=("mm_bf16",), dtypes=frozenset({"bfloat16"}),
            needs_cuda=True, min_cc=(10, 0), max_cc=(10, 3)),
    Adapter("flashinfer", "gemm", "flashinfer.gemm.SegmentGEMMWrapper", segment_gemm, package=PACKAGE,
            requires=("gemm.SegmentGEMMWrapper",), applies=lambda d: sem.missing_inputs(d, ("A", "B")),
            dtypes=HALF, needs_cuda=True, min_cc=(8, 0)),
    # decode: the CUDA-core kernel (group sizes it is instantiated for) and the tensor-core path (every
    # group size; what engines run for the others) are two paths, both checked where both apply
    Adapter("flashinfer", "gqa_paged", "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper", gqa_decode,
            requires=("decode.BatchDecodeWithPagedKVCacheWrapper",), applies=_decode_applies(False), modes=_REUSE,
            plan=plan_gqa_decode, finish=finish_decode, races=True, **_ATTN),
    Adapter("flashinfer", "gqa_paged", "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)",
            gqa_decode_tc, requires=("decode.BatchDecodeWithPagedKVCacheWrapper",), applies=_decode_applies(True),
            path="tensor-cores", modes=_REUSE, plan=plan_gqa_decode_tc, finish=finish_decode, races=True, **_ATTN),
    Adapter("flashinfer", "gqa_paged", "flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper",
            gqa_prefill_paged, requires=("prefill.BatchPrefillWithPagedKVCacheWrapper",),
            applies=_stage("prefill", "q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices",
                           "sm_scale"), plan=plan_gqa_prefill_paged, races=True, **_PREFILL),
    Adapter("flashinfer", "gqa_ragged", "flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper",
            gqa_prefill_ragged, requires=("prefill.BatchPrefillWithRaggedKVCacheWrapper",),
            applies=_stage("prefill", "q", "k", "v", "qo_indptr", "kv_indptr", "sm_scale"),
            plan=plan_gqa_prefill_ragged, races=True, **_PREFILL),
    Adapter("flashinfer", "mla_ragged", "flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper(head_dim_vo)",
            gqa_prefill_ragged, requires=("prefill.BatchPrefillWithRaggedKVCacheWrapper",),
            applies=_stage("prefill", "q", "k", "v", "qo_indptr", "kv_indptr", "sm_scale"),
            plan=plan_gqa_prefill_ragged, races=True, **_PREFILL),
    Adapter("flashinfer", "mla_paged", "flashinfer.mla.BatchMLAPagedAttentionWrapper", mla,
            requires=("mla.BatchMLAPagedAttentionWrapper",),
            applies=lambda d: sem.missing_inputs(d, ("q_nope", "q_pe", "ckv_cache", "kpe_cache", "kv_indptr",
                                                     "kv_indices", "sm_scale")),
            plan=plan_mla, races=True, **dict(_PREFILL, finish=finish_mla)),
    Adapter("flashinfer", "rope", "flashinfer.rope.apply_rope_with_cos_sin_cache", rope, package=PACKAGE,
            requires=("rope.apply_rope_with_cos_sin_cache",), versions=SpecifierSet(">=0.2.1"),
            applies=_rope_applies, dtypes=frozenset({"bfloat16", "float16", "float32"}), needs_cuda=True,
            params=(sem.rope_is_neox,), modes=("inplace",)),
    Adapter("flashinfer", "activation", "flashinfer.activation.silu_and_mul", silu_and_mul, package=PACKAGE,
            requires=("activation.silu_and_mul",),
            applies=lambda d: None if "silu" in d.name and "input" in d.inputs else "only silu_and_mul",
            dtypes=HALF, needs_cuda=True, modes=("out", "pdl")),
    Adapter("flashinfer", "sampling", "flashinfer.sampling.*_sampling_from_probs", sampling, package=PACKAGE,
            versions=SpecifierSet(">=0.2.3"), requires=("sampling.top_k_top_p_sampling_from_probs",),
            applies=_sampler_applies, needs_cuda=True, kind="sampler"),
    Adapter("flashinfer", "moe", "flashinfer.fused_moe.trtllm_fp8_block_scale_moe", trtllm_moe,
            package=PACKAGE, requires=("fused_moe.trtllm_fp8_block_scale_moe",), applies=sem.fp8_moe_applies,
            params=(sem.moe_routing,), needs_cuda=True, races=True, min_cc=(10, 0), max_cc=(10, 3)),
    Adapter("flashinfer", "moe", "flashinfer.fused_moe.cutlass_fused_moe(use_deepseek_fp8_block_scale)",
            cutlass_moe, package=PACKAGE, versions=SpecifierSet(">=0.4"),
            requires=("fused_moe.cutlass_fused_moe",), applies=sem.fp8_moe_applies,
            params=(sem.moe_routing,), needs_cuda=True, races=True, min_cc=(9, 0), max_cc=(9, 0)),
    Adapter("flashinfer", "mamba_ssu", "flashinfer.mamba.selective_state_update", mamba_ssu, package=PACKAGE,
            requires=("mamba.selective_state_update",), applies=sem.mamba_applies,
            params=(sem.mamba_dt_softplus,), dtypes=frozenset({"bfloat16", "float16", "float32"}),
            needs_cuda=True, min_cc=(8, 0)),
    # gdn (flashinfer_gdn.py): early prefill is a CUDA JIT module built for sm90a only; later prefill (read
    # from the module) and every decode / MTP kernel are CuTe-DSL (nvidia-cutlass-dsl), checked before any call
    Adapter("flashinfer", "gdn", "flashinfer.gdn_prefill.chunk_gated_delta_rule", gdn.prefill, package=PACKAGE,
            resolve=gdn.needs_jit_prefill("chunk_gated_delta_rule"),
            applies=gdn.applies("prefill", "cu_seqlens"), dtypes=_GDN_DTYPES, needs_cuda=True, min_cc=(9, 0),
            max_cc=(9, 0)),
    Adapter("flashinfer", "gdn", "flashinfer.gdn_prefill.chunk_gated_delta_rule(CuTe-DSL)", gdn.prefill,
            package=PACKAGE, resolve=gdn.needs_dsl_prefill("chunk_gated_delta_rule"),
            applies=gdn.applies("prefill", "cu_seqlens"), dtypes=_GDN_DTYPES, needs_cuda=True, min_cc=(9, 0)),
    Adapter("flashinfer", "gdn", "flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose", gdn.decode,
            package=PACKAGE, resolve=gdn.needs_cutlass_dsl("gdn_decode", "gated_delta_rule_decode_pretranspose"),
            applies=gdn.applies("decode", "state"), dtypes=_GDN_DTYPES, needs_cuda=True, min_cc=(9, 0)),
    Adapter("flashinfer", "gdn", "flashinfer.gdn_decode.gated_delta_rule_mtp", gdn.mtp, package=PACKAGE,
            resolve=gdn.needs_cutlass_dsl("gdn_decode", "gated_delta_rule_mtp"),
            applies=gdn.applies("mtp", "initial_state", "initial_state_indices"), dtypes=_GDN_DTYPES,
            needs_cuda=True, min_cc=(9, 0)),
]

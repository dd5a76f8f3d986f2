"""SGLang's Triton kernels as ground truth: where each lives per sglang release, and the attention adapters.

The full `sglang` package moves its kernels between releases (read from the wheels of 0.5.10.post1,
0.5.11, 0.5.13-0.5.17):

| callable | sglang | module |
|---|---|---|
| `decode_attention_fwd` | 0.5.10 - 0.5.15 | `sglang.srt.layers.attention.triton_ops.decode_attention` |
| | 0.5.16, 0.5.17 | `sglang.kernels.ops.attention.decode_attention` |
| `extend_attention_fwd` | the same releases | the same packages, module `extend_attention` |
| `fused_experts` | 0.5.10 | `sglang.srt.layers.moe.fused_moe_triton.fused_moe` |
| | 0.5.11 - 0.5.17 | `sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe` |
| `StandardTopKOutput` | 0.5.10 - 0.5.17 | `sglang.srt.layers.moe.topk` |
| `MoeRunnerConfig` | 0.5.10 - 0.5.17 | `sglang.srt.layers.moe.moe_runner` |

A `Located` holds that table as `packaging` specifiers; an adapter's `resolve` imports the module its
installed sglang has (any exception there is an `import-failed` reason naming the module, with the
exception's message) and finds the callable (else `api-missing`). Versions outside the table are
`api-missing` too: nothing is guessed for a release whose files were not read.

The attention kernels take KV as token slots into one `[slots, kv_heads, head_dim]` buffer
(`kv_indices` are slots: sglang's page size 1). A paged cache `[pages, page_size, kv_heads, head_dim]`
is that buffer reshaped, the slot of token t of page p being p * page_size + t, so every page size
maps to slots and no kernel is asked to page (0.5.15+ take `page_size` and compute exactly this
slot arithmetic for 4-D buffers). Both kernels compute a natural-log LSE; the definitions' lse is
base 2 (FlashInfer's), so the adapters multiply by log2(e).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .. import semantics as sem
from .base import Adapter, Call, GroundTruthUnavailable, Package, accepts, import_package

SGLANG = Package("sglang", ("sglang",), "sglang")
HALF = frozenset({"bfloat16", "float16"})
LOG2E = 1.0 / math.log(2.0)
# sglang's default --triton-attention-num-kv-splits; any count gives the same result up to rounding
KV_SPLITS = 8
# the MLA latent split (ckv + kpe) both Triton kernels special-case (BLOCK_DMODEL + BLOCK_DPE)
MLA_SPLITS = ((512, 64), (256, 32))


@dataclass(frozen=True)
class Located:
    """Where one sglang callable lives: (specifier, module) pairs, the first that holds wins."""

    name: str
    places: tuple[tuple[str, str], ...]

    def module_for(self, version: Version | None) -> str | None:
        if version is None:
            return None
        for spec, module in self.places:
            if SpecifierSet(spec).contains(version, prereleases=True):  # a dev build of 0.5.17 is 0.5.17's
                return module
        return None

    def get(self, version: Version | None) -> Any:
        """The callable for this sglang; GroundTruthUnavailable (api-missing / import-failed) otherwise."""
        path = self.module_for(version)
        if path is None:
            known = "; ".join(f"{spec}: {module}" for spec, module in self.places)
            raise GroundTruthUnavailable("api-missing", f"sglang {version}: no known location of {self.name} "
                                                        f"(read from the wheels: {known})")
        try:
            module = import_package(Package(path, SGLANG.distributions, path))
        except GroundTruthUnavailable as e:
            raise GroundTruthUnavailable(e.kind, f"{path}: {e.detail}") from None
        fn = getattr(module, self.name, None)
        if fn is None:
            raise GroundTruthUnavailable("api-missing", f"sglang {version}: {path} has no {self.name}")
        return fn


_ATTN_OLD, _ATTN_NEW = "sglang.srt.layers.attention.triton_ops", "sglang.kernels.ops.attention"
DECODE = Located("decode_attention_fwd", ((">=0.5.16", f"{_ATTN_NEW}.decode_attention"),
                                          (">=0.5.10,<0.5.16", f"{_ATTN_OLD}.decode_attention")))
EXTEND = Located("extend_attention_fwd", ((">=0.5.16", f"{_ATTN_NEW}.extend_attention"),
                                          (">=0.5.10,<0.5.16", f"{_ATTN_OLD}.extend_attention")))
FUSED_EXPERTS = Located("fused_experts", (
    (">=0.5.11", "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"),
    (">=0.5.10,<0.5.11", "sglang.srt.layers.moe.fused_moe_triton.fused_moe")))
# sglang's own RoPE kernel (a JIT module; sgl_kernel 0.4.5 dropped apply_rope_with_cos_sin_cache_inplace):
# rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox), in place on [tokens, heads * dim]
ROPE = Located("rotary_embedding", ((">=0.5.17", "sglang.kernels.ops.attention.rope"),
                                    (">=0.5.10,<0.5.17", "sglang.jit_kernel.rope")))
TOPK_OUTPUT = Located("StandardTopKOutput", ((">=0.5.10", "sglang.srt.layers.moe.topk"),))
RUNNER_CONFIG = Located("MoeRunnerConfig", ((">=0.5.10", "sglang.srt.layers.moe.moe_runner"),))


def needs(*located: Located, lse_from: Located | None = None):
    """An Adapter.resolve: every callable must be found for this version. `lse_from`: a kernel whose
    `lse_extend` keyword (0.5.15+) must exist when the definition has an lse output."""

    def resolve(module, version, definition) -> None:
        for loc in located:
            loc.get(version)
        if lse_from is not None and "lse" in definition.outputs and not accepts(lse_from.get(version), "lse_extend"):
            raise GroundTruthUnavailable("api-missing", f"sglang {version}: {lse_from.name} has no lse_extend (no "
                                                        "LSE before 0.5.15); the definition has an lse output")

    return resolve


# -- the KV layout ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Requests:
    """The definition's batch as sglang's kernels want it."""

    q: torch.Tensor  # [rows, Hq, Dqk]: the query rows of every request, in order
    k: torch.Tensor  # [slots, Hk, Dqk]: the KV buffer the token slots index
    v: torch.Tensor  # [slots, Hk, Dv]
    rows: list[tuple[int, int]]  # per request, its query rows [start, end) in q
    slots: list[torch.Tensor]  # per request, its kv tokens' slots, in sequence order (int64)


def _requests(call: Call) -> Requests:
    d, x = call.definition, call.inputs.values
    kv_indptr = x["kv_indptr"].to(torch.int64)
    n = kv_indptr.numel() - 1
    qo = x["qo_indptr"].to(torch.int64).cpu().tolist() if "qo_indptr" in x else list(range(n + 1))
    if "q_nope" in x:  # absorbed MLA: one latent kv head, keys [ckv | kpe], values ckv
        q = torch.cat([x["q_nope"], x["q_pe"]], dim=-1)
        ckv, kpe = x["ckv_cache"].flatten(0, 1), x["kpe_cache"].flatten(0, 1)
        k = torch.cat([ckv, kpe], dim=-1)[:, None, :]
        v = k[..., : ckv.shape[-1]]  # a view, as sglang's MLA pool hands its value buffer over
    elif "k_cache" in x:
        q, k, v = x["q"], x["k_cache"].flatten(0, 1), x["v_cache"].flatten(0, 1)
    else:
        q, k, v = x["q"], x["k"], x["v"]
    if "kv_indices" in x:
        page = sem.page_size(d)
        last = sem.last_page_lens(kv_indptr, page, x.get("kv_last_page_len"))
        slots = sem.request_token_slots(kv_indptr, x["kv_indices"], page, last)
    else:  # ragged: request b's kv are rows kv_indptr[b]:kv_indptr[b+1]
        kv = kv_indptr.cpu().tolist()
        slots = [torch.arange(kv[b], kv[b + 1], device=q.device) for b in range(n)]
    return Requests(q, k, v, [(qo[b], qo[b + 1]) for b in range(n)], [s.to(torch.int64) for s in slots])


def _csr(lists: list[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(indptr int32 [n + 1], indices int64): the lists concatenated; at least one index element (a
    zero-size tensor has no device pointer for Triton; the kernels read only indptr's ranges)."""
    lens = torch.tensor([0, *(t.numel() for t in lists)], dtype=torch.int64)
    indptr = lens.cumsum(0).to(torch.int32).to(device)
    flat = torch.cat(lists).to(device=device, dtype=torch.int64) if lists else torch.empty(0, dtype=torch.int64)
    if flat.numel() == 0:
        flat = torch.zeros(1, dtype=torch.int64, device=device)
    return indptr, flat


def _in_order(call: Call, out: torch.Tensor, lse: torch.Tensor) -> tuple:
    return (out, lse) if "lse" in call.definition.outputs else (out,)


def _scale(call: Call) -> float:
    return float(call.inputs.values["sm_scale"])


# -- decode -------------------------------------------------------------------------------------------
def decode(call: Call) -> tuple:
    """decode_attention_fwd over the requests with kv tokens; rows of a request without any keep the
    definitions' empty-softmax result (output 0, lse -inf): the kernel would divide 0 by 0 there, and
    sglang never decodes an empty request. decode_attention_fwd returns no final LSE: it leaves each
    kv split's natural-log LSE in attn_lse and leaves splits without tokens unwritten; those are
    filled with -inf first (as sglang's own decode-context-parallel path does), so the logsumexp over
    splits is the request's LSE."""
    fn = DECODE.get(call.version)
    r = _requests(call)
    q = r.q
    batch, heads = q.shape[0], q.shape[1]
    dv = r.v.shape[-1]
    out = torch.zeros(batch, heads, dv, dtype=q.dtype, device=q.device)
    lse = torch.full((batch, heads), -math.inf, dtype=torch.float32, device=q.device)
    live = [b for b in range(batch) if r.slots[b].numel() > 0]
    if not live:
        return _in_order(call, out, lse)
    n = len(live)
    pick = torch.tensor(live, dtype=torch.int64, device=q.device)
    q_live = q.index_select(0, pick).contiguous()
    indptr, indices = _csr([r.slots[b] for b in live], q.device)
    o = torch.empty(n, heads, dv, dtype=q.dtype, device=q.device)
    logits = torch.empty(n, heads, KV_SPLITS, dv, dtype=torch.float32, device=q.device)
    split_lse = torch.full((n, heads, KV_SPLITS), -math.inf, dtype=torch.float32, device=q.device)
    splits = torch.full((n,), KV_SPLITS, dtype=torch.int32, device=q.device)
    extra = {"has_mla": True} if "q_nope" in call.inputs.values and accepts(fn, "has_mla") else {}
    # q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits, max_kv_splits,
    # sm_scale, k_scale, v_scale: positional in every release read (0.5.10-0.5.17)
    fn(q_live, r.k, r.v, o, indptr, indices, logits, split_lse, splits, KV_SPLITS, _scale(call), 1.0, 1.0, **extra)
    out[pick] = o
    lse[pick] = torch.logsumexp(split_lse, dim=-1) * LOG2E
    return _in_order(call, out, lse)


# -- prefill (extend) ------------------------------------------------------------------------------------
def extend(call: Call) -> tuple:
    """extend_attention_fwd: each request's queries are its last qo_len kv tokens (the definitions'
    bottom-right causal alignment), which is sglang's extend: the first kv_len - qo_len tokens are the
    cached prefix (token slots into the buffer, all visible), the last qo_len the new tokens, passed as
    contiguous k_extend / v_extend (causal among themselves when the definition is). Requests without
    queries are left out (they own no output rows)."""
    fn = EXTEND.get(call.version)
    r = _requests(call)
    q = r.q
    heads, dv = q.shape[1], r.v.shape[-1]
    out = torch.zeros(q.shape[0], heads, dv, dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[0], heads), -math.inf, dtype=torch.float32, device=q.device)
    live = [b for b, (q0, q1) in enumerate(r.rows) if q1 > q0]
    if not live:
        return _in_order(call, out, lse)
    prefixes, news, rows = [], [], []
    for b in live:
        q0, q1 = r.rows[b]
        slots = r.slots[b]
        cut = slots.numel() - (q1 - q0)
        if cut < 0:
            raise GroundTruthUnavailable("unsupported", f"{call.definition.name}: request {b} has {q1 - q0} queries "
                                                        f"but {slots.numel()} kv tokens (qo_len <= kv_len)")
        prefixes.append(slots[:cut])
        news.append(slots[cut:])
        rows.append(torch.arange(q0, q1, device=q.device))
    rows_t = torch.cat(rows)
    new = torch.cat(news).to(q.device)
    q_ext = q.index_select(0, rows_t).contiguous()
    k_ext = r.k.index_select(0, new).contiguous()
    v_ext = r.v.index_select(0, new).contiguous()
    qo_indptr, _ = _csr(rows, q.device)
    kv_indptr, kv_indices = _csr(prefixes, q.device)
    o = torch.empty(q_ext.shape[0], heads, dv, dtype=q.dtype, device=q.device)
    extra = {}
    lse_ext = None
    if "lse" in call.definition.outputs:
        lse_ext = torch.full((q_ext.shape[0], heads), -math.inf, dtype=torch.float32, device=q.device)
        extra["lse_extend"] = lse_ext
    max_len = max(int(t.numel()) for t in rows)
    # q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
    # custom_mask, is_causal, mask_indptr, max_len_extend, k_scale, v_scale: positional in 0.5.10-0.5.17
    fn(q_ext, k_ext, v_ext, o, r.k, r.v, qo_indptr, kv_indptr, kv_indices, None, sem.is_causal(call.definition),
       None, max_len, 1.0, 1.0, sm_scale=_scale(call), **extra)
    out[rows_t] = o
    if lse_ext is not None:
        lse[rows_t] = lse_ext * LOG2E
    return _in_order(call, out, lse)


# -- which definitions ---------------------------------------------------------------------------------
def _outputs(d) -> str | None:
    names = list(d.outputs)
    if names not in (["output", "lse"], ["output"]):
        return f"expects outputs output[, lse], not {', '.join(names)}"
    return None


def _applies(stage: str, *names: str, mla: bool = False):
    def applies(d) -> str | None:
        if sem.stage(d) != stage:
            return f"handles {stage}, not {sem.stage(d)}"
        why = sem.missing_inputs(d, names) or _outputs(d)
        if why or not mla:
            return why
        ckv, kpe = d.inputs["ckv_cache"].shape[-1], d.inputs["kpe_cache"].shape[-1]
        dims = tuple(d.const_axes.get(a) if isinstance(a, str) else a for a in (ckv, kpe))
        if dims not in MLA_SPLITS:
            known = " or ".join(f"{a} + {b}" for a, b in MLA_SPLITS)
            return f"the Triton kernels split MLA keys as ckv + kpe = {known}, not {dims[0]} + {dims[1]}"
        return None

    return applies


_PAGED = ("kv_indptr", "kv_indices", "sm_scale")
_MLA = ("q_nope", "q_pe", "ckv_cache", "kpe_cache")
_COMMON = dict(package=SGLANG, dtypes=HALF, needs_cuda=True, min_cc=(8, 0))
# api names the function; where it lives depends on the release (DECODE / EXTEND above)
_DECODE_API, _EXTEND_API = "sglang Triton decode_attention_fwd", "sglang Triton extend_attention_fwd"
ADAPTERS = [
    Adapter("sglang", "gqa_paged", _DECODE_API, decode, resolve=needs(DECODE),
            applies=_applies("decode", "q", "k_cache", "v_cache", *_PAGED), **_COMMON),
    Adapter("sglang", "gqa_paged", _EXTEND_API, extend, resolve=needs(EXTEND, lse_from=EXTEND),
            applies=_applies("prefill", "q", "k_cache", "v_cache", "qo_indptr", *_PAGED), **_COMMON),
    Adapter("sglang", "gqa_ragged", _EXTEND_API, extend, resolve=needs(EXTEND, lse_from=EXTEND),
            applies=_applies("prefill", "q", "k", "v", "qo_indptr", "kv_indptr", "sm_scale"), **_COMMON),
    # MLA before absorption (qk 192 = 128 + 64 rope, vo 128): the kernel's BLOCK_DMODEL 128 + BLOCK_DPE 64 case
    Adapter("sglang", "mla_ragged", _EXTEND_API, extend, resolve=needs(EXTEND, lse_from=EXTEND),
            applies=_applies("prefill", "q", "k", "v", "qo_indptr", "kv_indptr", "sm_scale"), **_COMMON),
    Adapter("sglang", "mla_paged", _DECODE_API + " (has_mla)", decode, resolve=needs(DECODE),
            applies=_applies("decode", *_MLA, *_PAGED, mla=True), **_COMMON),
    Adapter("sglang", "mla_paged", _EXTEND_API, extend, resolve=needs(EXTEND, lse_from=EXTEND),
            applies=_applies("prefill", *_MLA, "qo_indptr", *_PAGED, mla=True), **_COMMON),
]

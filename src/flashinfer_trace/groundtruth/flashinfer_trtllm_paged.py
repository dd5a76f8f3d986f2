"""FlashInfer ground truth of `trtllm_paged`: TensorRT-LLM's attention kernels that run on sm90.

    flashinfer.prefill.trtllm_fmha_v2_prefill(qkv, input_layout, workspace_buffer, seq_lens, max_q_len, max_kv_len,
        bmm1_scale, bmm2_scale, batch_size, cum_seq_lens_q, cum_seq_lens_kv, block_tables=None, out=None,
        out_dtype=None, ..., mask_mode="causal", window_left=-1, ...) -> out
    flashinfer.decode.trtllm_batch_decode_with_kv_cache(query, kv_cache, workspace_buffer, block_tables, seq_lens,
        max_seq_len, bmm1_scale=1.0, bmm2_scale=1.0, window_left=-1, out=None, ..., kv_layout="HND", ...,
        backend="auto", ...) -> out

Read in flashinfer/prefill.py and decode.py of the 0.7.2.post1 wheel and at the release tags of FlashInfer's
repository. Releases: trtllm_fmha_v2_prefill is first in v0.6.7 (PR #2446, "TRTLLM fmha_v2 library for SM90");
its JIT module builds for majors 9 and 12 only (jit/attention/modules.py:2602 of 0.7.2.post1,
`supported_major_versions=[9, 12]`): sm90 and sm120/121, arch-unsupported elsewhere (two adapters, one per range).
The separate (k_cache, v_cache) form with pre-expanded [B, 2, M] block offsets is 0.7.0 on (PR #4124; absent in
0.6.17). trtllm_batch_decode_with_kv_cache is in v0.2.6 (the trtllm-gen kernels, sm100 only); from v0.5.0 its
backend "auto" picks XQA on every major but 10 (decode.py:4132 of 0.7.2.post1), which runs on sm90, 100 and 120
(xqa.py:402 raises elsewhere): sm90 from 0.5.0, before that sm100 / 103 only.

The definitions' k_cache / v_cache are stacked into the kernels' [num_pages, 2, ...] tensor inside the launch (so a
CUDA graph and plan-reuse see the live data); bmm1_scale is sm_scale, bmm2_scale 1.0 (no fp8 scales); max_q_len /
max_kv_len / max_seq_len are the inputs' own maxima. Paths, paged prefill: plain ('Q_PAGED_KV_<layout>'),
`other-kv-layout` (the cache transposed into the other layout first), `separate-kv` (>= 0.7.0: k and v as views of
one allocation, V's block offsets shifted by num_pages), `out` (a preallocated out=); ragged prefill: plain
('SEPARATE_Q_K_V'), `contiguous-q-kv` (k and v stacked [tokens, 2, kv_heads, dim]), `packed-qkv` ([tokens, 3, heads,
dim]: MHA only, unsupported otherwise), `out`; decode: plain (backend auto), `tuple-kv` ((k_cache, v_cache)),
`other-kv-layout`, `out`, `xqa` (backend="xqa" named). Every kind: `plan-reuse` and `graph` (modes.py).
"""

from __future__ import annotations

from typing import Any

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .. import semantics as sem
from ..inputs.trtllm_paged import kind, kv_layout
from .base import Adapter, Call, GroundTruthUnavailable
from .flashinfer import HALF, PACKAGE, workspace
from .torch_trtllm_paged import applies as _torch_applies

PREFILL_API = "flashinfer.prefill.trtllm_fmha_v2_prefill"
DECODE_API = "flashinfer.decode.trtllm_batch_decode_with_kv_cache"
PAGED_MODES = ("other-kv-layout", "separate-kv", "out", "plan-reuse", "graph")
RAGGED_MODES = ("contiguous-q-kv", "packed-qkv", "out", "plan-reuse", "graph")
DECODE_MODES = ("tuple-kv", "other-kv-layout", "out", "xqa", "plan-reuse", "graph")
SEPARATE_KV = Version("0.7.0")
WORKSPACE = 256 << 20  # XQA keeps 8 MiB of semaphores at its start, zero on first use: a zeroed buffer


def _applies(want: str, other: str):
    def check(d) -> str | None:
        return _torch_applies(d) or (None if kind(d) == want else f"a {kind(d)} definition: {other}")
    return check


def _unavailable(call: Call, what: str) -> GroundTruthUnavailable:
    return GroundTruthUnavailable("unsupported", f"{call.definition.name}: {what}")


def _other(layout: str) -> str:
    return "HND" if layout == "NHD" else "NHD"


def plan_prefill(call: Call):
    fi, x, mode, d = call.module, call.inputs.values, call.mode, call.definition
    q, k = x["query"], kind(d)
    dev = q.device
    scale = sem.sm_scale(x, q.shape[-1])
    ws = workspace(dev, zeroed=True, nbytes=WORKSPACE)
    if k == "ragged":
        cum = x["cum_seq_lens"].to(device=dev, dtype=torch.int32)
        seq_lens = (cum[1:] - cum[:-1]).contiguous()
        cum_q = cum_kv = cum
        max_q = max_kv = int(seq_lens.max())
        table = None
        if mode == "packed-qkv" and x["key"].shape[1] != q.shape[1]:
            raise _unavailable(call, "PACKED_QKV needs as many kv heads as query heads (MHA)")
    else:
        if mode == "separate-kv" and call.version is not None and call.version < SEPARATE_KV:
            raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version}: trtllm_fmha_v2_prefill takes "
                                                        f"separate (k_cache, v_cache) from {SEPARATE_KV}")
        seq_lens = x["seq_lens"].to(device=dev, dtype=torch.int32)
        cum_q = x["cum_seq_lens_q"].to(device=dev, dtype=torch.int32)
        cum_kv = torch.cat([seq_lens.new_zeros(1), seq_lens.cumsum(0, dtype=torch.int32)])
        max_q, max_kv = int((cum_q[1:] - cum_q[:-1]).max()), int(seq_lens.max())
        table = x["block_tables"].to(device=dev, dtype=torch.int32)
    batch = int(seq_lens.numel())
    out = torch.empty_like(q) if mode == "out" else None
    fn = fi.prefill.trtllm_fmha_v2_prefill

    def operands() -> tuple[Any, str, Any]:
        """(qkv, input_layout, block_tables), made from the live tensors at launch time."""
        if k == "ragged":
            if mode == "contiguous-q-kv":
                return (q, torch.stack([x["key"], x["value"]], 1)), "CONTIGUOUS_Q_KV", None
            if mode == "packed-qkv":
                return torch.stack([q, x["key"], x["value"]], 1), "PACKED_QKV", None
            return (q, x["key"], x["value"]), "SEPARATE_Q_K_V", None
        layout = kv_layout(d)
        kc, vc = x["k_cache"], x["v_cache"]
        if mode == "other-kv-layout":
            layout = _other(layout)
            kc, vc = kc.transpose(1, 2), vc.transpose(1, 2)
        if mode == "separate-kv":  # one allocation: V's pages num_pages blocks after K's
            both = torch.cat([kc, vc]).contiguous()
            pages = kc.shape[0]
            return (q, (both[:pages], both[pages:])), f"Q_PAGED_KV_{layout}", torch.stack([table, table + pages], 1)
        return (q, torch.stack([kc, vc], 1)), f"Q_PAGED_KV_{layout}", table

    def launch():
        qkv, layout, tables = operands()
        return fn(qkv, layout, ws, seq_lens, max_q, max_kv, scale, 1.0, batch, cum_q, cum_kv, block_tables=tables,
                  out=out, mask_mode="causal")

    return launch


def plan_decode(call: Call):
    fi, x, mode, d = call.module, call.inputs.values, call.mode, call.definition
    q = x["query"]
    dev = q.device
    scale = sem.sm_scale(x, q.shape[-1])
    ws = workspace(dev, zeroed=True, nbytes=WORKSPACE)
    seq_lens = x["seq_lens"].to(device=dev, dtype=torch.int32)
    table = x["block_tables"].to(device=dev, dtype=torch.int32)
    max_seq = int(seq_lens.max())
    extra: dict[str, Any] = {}
    if mode == "out":
        extra["out"] = torch.empty_like(q)
    if mode == "xqa":
        extra["backend"] = "xqa"
    fn = fi.decode.trtllm_batch_decode_with_kv_cache

    def launch():
        layout, kc, vc = kv_layout(d), x["k_cache"], x["v_cache"]
        if mode == "other-kv-layout":
            layout, kc, vc = _other(layout), kc.transpose(1, 2), vc.transpose(1, 2)
        cache = (kc, vc) if mode == "tuple-kv" else torch.stack([kc, vc], 1)
        return fn(q, cache, ws, table, seq_lens, max_seq, bmm1_scale=scale, bmm2_scale=1.0, kv_layout=layout,
                  **extra)

    return launch


def finish(call: Call, raw: Any) -> tuple:
    out = raw[0] if isinstance(raw, (tuple, list)) else raw
    return (out,)


def _run(plan):
    return lambda call: finish(call, plan(call)())


_COMMON = dict(package=PACKAGE, dtypes=HALF, needs_cuda=True, finish=finish, races=True)
_PREFILL = dict(_COMMON, requires=("prefill.trtllm_fmha_v2_prefill",), plan=plan_prefill)
_DECODE = dict(_COMMON, requires=("decode.trtllm_batch_decode_with_kv_cache",), plan=plan_decode, modes=DECODE_MODES,
               applies=_applies("decode", "trtllm_fmha_v2_prefill's"))
ADAPTERS = [
    # fmha_v2: 0.6.7 on, sm90 and sm120 / 121 (its JIT module builds for majors 9 and 12); paged and ragged
    Adapter("flashinfer", "trtllm_paged", PREFILL_API, _run(plan_prefill), versions=SpecifierSet(">=0.6.7"),
            min_cc=lo, max_cc=hi, modes=modes, applies=_applies(k, other), **_PREFILL)
    for k, modes, other in (("prefill", PAGED_MODES, "the ragged paths"), ("ragged", RAGGED_MODES, "the paged paths"))
    for lo, hi in (((9, 0), (9, 0)), ((12, 0), (12, 1)))
] + [
    # decode: XQA on sm90 / sm120 (and trtllm-gen on sm100) from 0.5.0; 0.2.6 - 0.4.x trtllm-gen only, sm100 / 103
    Adapter("flashinfer", "trtllm_paged", DECODE_API, _run(plan_decode), versions=SpecifierSet(">=0.5.0"),
            min_cc=(9, 0), max_cc=(12, 1), **_DECODE),
    Adapter("flashinfer", "trtllm_paged", DECODE_API, _run(plan_decode), versions=SpecifierSet(">=0.2.6,<0.5.0"),
            min_cc=(10, 0), max_cc=(10, 3), **_DECODE),
]

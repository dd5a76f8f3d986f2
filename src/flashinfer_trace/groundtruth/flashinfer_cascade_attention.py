"""FlashInfer ground truth of `cascade_attention`: `flashinfer.cascade.MultiLevelCascadeAttentionWrapper`.

    w = MultiLevelCascadeAttentionWrapper(num_levels, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                                          ...)
    w.plan(qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len, num_qo_heads,
           num_kv_heads, head_dim, page_size, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
           sm_scale=None, window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None,
           q_data_type="float16", kv_data_type=None)
    w.run(q, paged_kv_cache) -> out

Read from flashinfer/cascade.py in the 0.6.6 and 0.7.2.post1 wheels: one BatchPrefillWithPagedKVCacheWrapper per
level; plan() passes `causal` to the last level only (False to the others); run() runs the last level with
return_lse=True, then each other level, folding it in with merge_state_in_place (base-2 lse). run() returns the
output only (no lse), what the definitions declare. 0.7.2.post1 adds prewarm_paged_kv_stride_variant() ("call
before CUDA graph capture"), which loads the variant for K and V of different data strides and only for an fa2
plan: on sm90 the levels' wrappers plan fa3 and it raises. It is called only where k_cache's and
v_cache's strides differ, the case it exists for (never for the cases here, whose caches have one layout).

Releases: plan() / run() replaced begin_forward() / forward() in 0.2.0 (`VERSIONS`; the old names stay as aliases).
The wrapper has no backend switch and no arch check of its own (FlashInfer's fa2 prefill: sm80+ as every paged
prefill here). Paths: plain, and the generic modes `plan-reuse` and `graph` (modes.py: plan once, run on other
data, then on the case's; graph replays a captured run()). The page tables are planned from the case's own
tensors, as int32 on the device; paged_kv_cache is passed as the tuple (k_cache, v_cache), NHD.
Left out: the use_cuda_graph=True constructor with its fixed buffers, HND, the 5-D single-tensor cache.
"""

from __future__ import annotations

import torch
from packaging.specifiers import SpecifierSet

from .. import semantics as sem
from .base import Adapter, Call, keywords
from .flashinfer import HALF, PACKAGE, workspace
from .torch_cascade_attention import applies as _torch_applies
from .torch_cascade_attention import is_causal, num_levels

VERSIONS = SpecifierSet(">=0.2.0")  # plan() / run() (begin_forward / forward before)
MODES = ("plan-reuse", "graph")


def applies(d) -> str | None:
    why = _torch_applies(d)
    if why:
        return why
    if set(d.outputs) != {"output"}:
        return "the wrapper's run() returns the output only"
    if len(d.inputs["k_cache"].shape or ()) != 4:
        return "k_cache / v_cache must be [num_pages, page_size, num_kv_heads, head_dim] (NHD)"
    return None


def plan(call: Call, buffer: torch.Tensor | None = None):
    fi, d, x = call.module, call.definition, call.inputs.values
    q, kc, vc = x["q"], x["k_cache"], x["v_cache"]
    levels = num_levels(d)
    w = fi.cascade.MultiLevelCascadeAttentionWrapper(levels, workspace(q.device) if buffer is None else buffer, "NHD")

    def arr(prefix: str) -> list[torch.Tensor]:
        return [x[f"{prefix}_{lv}"].to(device=q.device, dtype=torch.int32) for lv in range(levels)]

    w.plan(arr("qo_indptr"), arr("kv_indptr"), arr("kv_indices"), arr("kv_last_page_len"), q.shape[1], kc.shape[2],
           q.shape[2], int(d.const_axes["page_size"]), causal=is_causal(d), sm_scale=sem.sm_scale(x, q.shape[-1]),
           **keywords(w.plan, q_data_type=q.dtype, kv_data_type=kc.dtype))
    prewarm = getattr(w, "prewarm_paged_kv_stride_variant", None)
    if prewarm is not None and kc.stride() != vc.stride():
        prewarm()
    return lambda: w.run(q, (kc, vc))


def _tuple(raw) -> tuple:
    return tuple(raw) if isinstance(raw, (tuple, list)) else (raw,)


def run(call: Call) -> tuple:
    return _tuple(plan(call)())


ADAPTERS = [
    Adapter("flashinfer", "cascade_attention", "flashinfer.cascade.MultiLevelCascadeAttentionWrapper", run,
            package=PACKAGE, versions=VERSIONS, requires=("cascade.MultiLevelCascadeAttentionWrapper",),
            applies=applies, dtypes=HALF, needs_cuda=True, modes=MODES, plan=plan,
            finish=lambda call, raw: _tuple(raw), races=True),
]

"""FlashInfer ground truth of `pod`: `flashinfer.pod.PODWithPagedKVCacheWrapper` (POD-Attention: a single-request
prefill and a paged batch decode fused in one launch).

    w = PODWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, ...)
    w.plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
           pos_encoding_mode="NONE", window_left=-1, q_data_type="float16", kv_data_type=None, data_type=None,
           sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True)
    w.run(q_p, k_p, v_p, q_d, paged_kv_cache_d, custom_mask_p=None, packed_custom_mask_p=None, causal_p=False,
          kv_layout_p="NHD", ..., sm_scale_p=None, ..., return_lse_p=False, ..., sm_scale_d=None, ...,
          enable_pdl=None) -> (out_p, out_d)

Read in flashinfer/pod.py of the 0.6.6 and 0.7.2.post1 wheels (the two differ in docstrings, the trace hook and
the buffer names of the constructor's docs only). plan() is the decode half's (its sm_scale is the decode's:
run's sm_scale_d is ignored, the docstring says so); run() takes the prefill's scale as sm_scale_p and its mask
as causal_p (causal is bottom-right aligned, FlashInfer's MaskMode.CAUSAL). run() returns (out_p, out_d) only:
return_lse_p / return_lse_d allocate lse tensors it never hands back, so the definitions declare no lse.
`BatchPODWithPagedKVCacheWrapper` (both halves paged, a batch of prefills; ((out_p, out_d), (lse_p, lse_d)) with
return_lse) is in both wheels too and has no definitions yet.

Releases: `PODWithPagedKVCacheWrapper` >= 0.2.3 by reading of the release history (POD-Attention landed in
early 2025), not checked tag by tag: `requires` decides where the module lacks the class (api-missing). plan's
sm_scale / q_data_type / kv_data_type and run's causal_p / sm_scale_p are passed through `keywords`; a release
whose run() has no causal_p cannot state the causal prefill (api-missing). Arch: the FA2 kernels it builds need
sm80+ (min_cc).

Paths: plain (the cache as the tuple (k_cache, v_cache)), `single-tensor` (the cache stacked into one
[num_pages, 2, page_size, kv_heads, head_dim] tensor, made before the launch), and the generic modes
`plan-reuse` and `graph` (modes.py: plan once, run on other data, then on the case's; the graph path replays a
captured run(), warmed up first so that run()'s cached prefill buffer exists before capture).
"""

from __future__ import annotations

from typing import Any

import torch
from packaging.specifiers import SpecifierSet

from .. import semantics as sem
from .base import Adapter, Call, GroundTruthUnavailable, accepts, keywords
from .flashinfer import HALF, PACKAGE, workspace
from .torch_pod import applies as _torch_applies

VERSIONS = SpecifierSet(">=0.2.3")  # flashinfer.pod.PODWithPagedKVCacheWrapper
MODES = ("single-tensor", "plan-reuse", "graph")


def applies(d) -> str | None:
    why = _torch_applies(d)
    if why:
        return why
    if len(d.inputs["k_cache"].shape or ()) != 4:
        return "k_cache / v_cache must be [num_pages, page_size, num_kv_heads, head_dim] (NHD)"
    return None


def plan(call: Call, buffer: torch.Tensor | None = None):
    fi, x = call.module, call.inputs.values
    q_p, k_p, v_p, q_d = x["q_p"], x["k_p"], x["v_p"], x["q_d"]
    kc, vc = x["k_cache"], x["v_cache"]
    scale = sem.sm_scale(x, q_p.shape[-1])
    cls = fi.pod.PODWithPagedKVCacheWrapper
    w = cls(workspace(q_p.device) if buffer is None else buffer, kv_layout="NHD")
    if not accepts(w.run, "causal_p"):
        raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} {cls.__name__}.run has no causal_p")
    planned = keywords(w.plan, q_data_type=q_d.dtype, kv_data_type=kc.dtype, sm_scale=scale)
    # without plan(sm_scale=) the decode takes 1 / sqrt(head_dim): the same scale, float32-rounded, is no loss
    if "sm_scale" not in planned and abs(scale - q_d.shape[-1] ** -0.5) > 1e-6 * scale:
        raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} {cls.__name__}.plan has no sm_scale")
    dev = q_p.device
    w.plan(x["kv_indptr"].to(device=dev, dtype=torch.int32), x["kv_indices"].to(device=dev, dtype=torch.int32),
           x["kv_last_page_len"].to(device=dev, dtype=torch.int32), q_d.shape[1], kc.shape[2], q_d.shape[2],
           kc.shape[1], **planned)
    extra: dict[str, Any] = {"causal_p": True, **keywords(w.run, sm_scale_p=scale)}
    if call.mode == "single-tensor":
        cache = torch.stack([kc, vc], dim=1)  # [num_pages, 2, page_size, kv_heads, head_dim]

        def launch_single():
            return w.run(q_p, k_p, v_p, q_d, cache, **extra)

        return launch_single
    return lambda: w.run(q_p, k_p, v_p, q_d, (kc, vc), **extra)


def _tuple(raw: Any) -> tuple:
    return tuple(raw) if isinstance(raw, (tuple, list)) else (raw,)


def finish(call: Call, raw: Any) -> tuple:
    out_p, out_d = _tuple(raw)[:2]
    got = {"output_p": out_p, "output_d": out_d}
    return tuple(got[n] for n in call.definition.outputs)


def run(call: Call) -> tuple:
    return finish(call, plan(call)())


ADAPTERS = [
    Adapter("flashinfer", "pod", "flashinfer.pod.PODWithPagedKVCacheWrapper", run, package=PACKAGE,
            versions=VERSIONS, requires=("pod.PODWithPagedKVCacheWrapper",), applies=applies, dtypes=HALF,
            needs_cuda=True, modes=MODES, plan=plan, finish=finish, min_cc=(8, 0), races=True),
]

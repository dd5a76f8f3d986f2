"""FlashInfer ground truth of `block_sparse`: `flashinfer.sparse.BlockSparseAttentionWrapper`.

    w = BlockSparseAttentionWrapper(float_workspace_buffer, backend="auto")
    w.plan(indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, mask=None, packed_mask=None,
           causal=False, ..., sm_scale=None, q_data_type="float16", kv_data_type=None, o_data_type="float16", ...)
    w.run(q, k, v, ..., out=None, lse=None, return_lse=False, enable_pdl=None) -> out | (out, lse)

Read from flashinfer/sparse.py at the release tags (github:flashinfer-ai/flashinfer) and in the 0.6.6 and
0.7.2.post1 wheels: plan() turns the BSR layout into a paged prefill, one "request" per block row (qo offsets
R * i, the last set to M, so M need not be a multiple of R) whose pages are the listed column blocks (page size
C, kv_len C * count); run() reshapes k / v to [N / C, C, heads, dim] pages and calls the batch prefill kernel
(the CUDA-core decode kernel instead when R * group < 4: no definition here has R < 16). The lse is the prefill
kernels' base 2, what the definitions declare; no release has an lse-base switch on this wrapper.

Releases (`packaging` specifiers on the adapter, `keywords` / `accepts` for the rest):
* plan()/run(q, k, v, return_lse=) and the constructor's `backend` ("auto" / "fa2" / "fa3"): >= 0.2.0 (0.1.x has
  begin_forward / forward and no lse);
* run(out=, lse=): >= 0.2.3 (mode `out`: NaN-filled buffers, read back after the call; `api-missing` before);
* plan(o_data_type=): >= 0.2.6 (passed where the signature has it; before, the output takes q's dtype);
* 0.7.x adds backends "cake", "cutile" and the CuTe-DSL "vsa_sm100_blk128" / "vsa_sm100_blk64" /
  "vsa_sm120_blk64" (Blackwell only; cutile has no return_lse): not paths here yet (every definition declares
  lse, and the matrix's GPUs are Hopper). `VariableBlockSparseAttentionWrapper` (>= 0.2.7: per-head block masks
  with variable block sizes) has no definitions yet.

Paths: plain (backend="fa2" pinned: "auto" picks fa3 on Hopper), with modes `out`, `fa3` (backend="fa3", sm90 only:
`arch-unsupported` elsewhere), `plan-reuse` and `graph` (modes.py: plan once, run on other data, then on the
case's; the graph path replays a captured run()). The layout is planned from the case's own indptr / indices (the
generic modes flip only floating tensors), on the device, as int32.
"""

from __future__ import annotations

from typing import Any

import torch
from packaging.specifiers import SpecifierSet

from .. import semantics as sem
from .base import Adapter, Call, GroundTruthUnavailable, accepts, keywords
from .flashinfer import HALF, PACKAGE, workspace
from .torch_block_sparse import applies as _torch_applies

VERSIONS = SpecifierSet(">=0.2.0")  # plan / run(return_lse=) and backend= on the constructor
OUT = SpecifierSet(">=0.2.3")  # run(out=, lse=)
MODES = ("out", "fa3", "plan-reuse", "graph")


def applies(d) -> str | None:
    why = _torch_applies(d)
    if why:
        return why
    extra = [o for o in d.outputs if o not in ("output", "lse")]
    if extra:
        return f"declares output(s) {', '.join(extra)}; the wrapper returns output and lse only"
    if any(len(d.inputs[n].shape or ()) != 3 for n in ("q", "k", "v")):
        return "q, k and v must be [tokens, heads, head_dim] (NHD)"
    return None


def _device_cc(t: torch.Tensor) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(t.device) if t.device.type == "cuda" else None


def _backend(cls, call: Call, q: torch.Tensor) -> dict[str, Any]:
    """fa2 pinned ("auto" picks fa3 on Hopper), fa3 where the mode asks for it: sm90 only."""
    if call.mode != "fa3":
        return keywords(cls.__init__, backend="fa2")
    if not accepts(cls.__init__, "backend"):
        raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} {cls.__name__} has no backend")
    cc = _device_cc(q)
    if cc != (9, 0):
        raise GroundTruthUnavailable("arch-unsupported", f"{cls.__name__}(backend='fa3') needs sm90, have "
                                                         f"{f'sm{cc[0]}{cc[1]}' if cc else q.device.type}")
    return {"backend": "fa3"}


def plan(call: Call, buffer: torch.Tensor | None = None):
    fi, d, x = call.module, call.definition, call.inputs.values
    q, k, v = x["q"], x["k"], x["v"]
    R, C = int(d.const_axes["block_rows"]), int(d.const_axes["block_cols"])
    cls = fi.sparse.BlockSparseAttentionWrapper
    w = cls(workspace(q.device) if buffer is None else buffer, **_backend(cls, call, q))
    w.plan(x["indptr"].to(device=q.device, dtype=torch.int32), x["indices"].to(device=q.device, dtype=torch.int32),
           q.shape[0], k.shape[0], R, C, q.shape[1], k.shape[1], q.shape[2],
           sm_scale=sem.sm_scale(x, q.shape[-1]),
           **keywords(w.plan, q_data_type=q.dtype, kv_data_type=k.dtype, o_data_type=q.dtype))
    lse = "lse" in d.outputs
    extra: dict[str, Any] = {"return_lse": True} if lse else {}
    if call.mode == "out":
        if not accepts(w.run, "out"):
            raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} BlockSparseAttentionWrapper.run "
                                                        f"has no out= / lse= (needs {OUT})")
        bufs = [torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)]
        extra["out"] = bufs[0]
        if lse:
            bufs.append(torch.full(q.shape[:2], float("nan"), dtype=torch.float32, device=q.device))
            extra["lse"] = bufs[1]

        def launch_out():
            w.run(q, k, v, **extra)
            return tuple(bufs)  # what the kernel wrote into the caller's buffers

        return launch_out
    return lambda: w.run(q, k, v, **extra)


def _tuple(raw: Any) -> tuple:
    return tuple(raw) if isinstance(raw, (tuple, list)) else (raw,)


def run(call: Call) -> tuple:
    return _tuple(plan(call)())


ADAPTERS = [
    Adapter("flashinfer", "block_sparse", "flashinfer.sparse.BlockSparseAttentionWrapper", run, package=PACKAGE,
            versions=VERSIONS, requires=("sparse.BlockSparseAttentionWrapper",), applies=applies, dtypes=HALF,
            needs_cuda=True, modes=MODES, plan=plan, finish=lambda call, raw: _tuple(raw), races=True),
]

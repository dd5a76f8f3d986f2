"""FlashInfer ground truth for `segment_gemm`: `flashinfer.SegmentGEMMWrapper(float_workspace_buffer, backend="auto")`
(also `flashinfer.gemm.SegmentGEMMWrapper`) and its `run(x, weights, batch_size, weight_column_major, out=None,
seg_lens=None, seg_indptr=None, weight_indices=None)`.

Read from flashinfer/gemm.py (flashinfer/gemm/gemm_base.py from 0.6.0), csrc/group_gemm.cu, group_gemm_sm90.cu and
include/flashinfer/gemm/group_gemm.cuh (github:flashinfer-ai/flashinfer; the 0.6.6 and 0.7.2.post1 wheels): x
[rows, d_in] fp16 / bf16 (fp8 on sm90 only, output bf16), weights [W, d_in, d_out] row-major or [W, d_out, d_in]
column-major (`weight_column_major`), seg_indptr / seg_lens / weight_indices int64; the output is torch.zeros of x's
dtype, or `out`, and the CUTLASS epilogue is D = acc + 1.0 * C with C the output itself (alpha 1, beta 1): a given
`out` is added to, so the `out` mode passes a zero-filled one. K and N must be multiples of 8 (16-byte alignment
of both kernels). The call modes, each a path:

* plain: `run(x, weights, batch_size, col, seg_indptr=, weight_indices=)` with the default backend ("auto" from
  0.2.0: sm90 on Hopper with CUDA >= 12.3, else sm80; the sm80 kernel before); mode `graph` (modes.py: a CUDA-graph
  replay on other data; the wrapper is made outside the launch);
* mode `out`: `out=` a zero-filled buffer (the keyword from 0.2.6, `api-missing` before: the fifth positional was
  seg_lens then);
* `seg-lens`: `seg_lens=` the segment lengths instead of seg_indptr (run turns them into indptr through
  `seg_lens.to(x)`: x's dtype, so a length past 256 (bf16) or 2048 (fp16) is rounded: see docs/boundary);
* `sm80`, `sm90`: the wrapper built with backend="sm80" / "sm90" (from 0.2.0; sm90 is compiled for sm90a only);
* `other-layout`: the weights handed over in the other layout (transposed, made contiguous, the flag flipped), so
  both the row- and the column-major kernel run on every definition;
* `identity-indices`: only where the definition has no weight_indices (segment i uses W[i]):
  weight_indices = arange(batch_size) given explicitly.

Releases: SegmentGEMMWrapper is in 0.1.0 with `forward` only (python/flashinfer/group_gemm.py); `run` from 0.1.6
(python/flashinfer/gemm.py), `backend` from 0.2.0, `out` from 0.2.6 (read from each tag's source).
"""

from __future__ import annotations

import torch
from packaging.specifiers import SpecifierSet

from ..dtypes import torch_dtype
from .base import Adapter, Call, GroundTruthUnavailable
from .flashinfer import PACKAGE
from .torch_segment_gemm import INPUTS, column_major

DTYPES = frozenset({"float16", "bfloat16"})
OUT_VERSIONS = SpecifierSet(">=0.2.6")  # before, run's fifth positional was seg_lens
WORKSPACE_BYTES = 128 * 1024 * 1024  # the size FlashInfer's docstring encourages


def applies(d) -> str | None:
    """The API's contract: 2-D x, 3-D weights, int64 offsets / indices, K and N multiples of 8, the output in x's
    dtype."""
    missing = [n for n in INPUTS if n not in d.inputs]
    if missing:
        return f"needs inputs {', '.join(missing)}"
    if len(d.inputs["x"].shape or ()) != 2 or len(d.inputs["weights"].shape or ()) != 3:
        return "x must be [rows, K] and weights 3-D"
    for n in ("seg_indptr", "weight_indices"):
        if n in d.inputs and d.inputs[n].dtype.value != "int64":
            return f"{n} must be int64 (the binding reads int64)"
    out = d.outputs.get("output")
    if out is None or out.dtype != d.inputs["x"].dtype:
        return "output `output` in x's dtype only (the wrapper allocates it so)"
    for i in (1, 2):
        axis = d.inputs["weights"].shape[i]
        n = d.const_axes.get(axis)
        if n is not None and n % 8:
            return f"{axis} = {n} is no multiple of 8 (the kernels' 16-byte alignment)"
    return None


def _no_indices(d) -> str | None:
    return applies(d) or ("the definition has weight_indices" if "weight_indices" in d.inputs else None)


def plan(backend: str | None = None, *, seg_lens: bool = False, flip: bool = False, identity: bool = False):
    def make(call: Call):
        out = call.mode == "out"
        if out and call.version is not None and call.version not in OUT_VERSIONS:
            raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version}: SegmentGEMMWrapper.run has no "
                                                        f"out= (needs {OUT_VERSIONS})")
        x = call.inputs.values
        col = column_major(call.definition)
        ws = torch.empty(WORKSPACE_BYTES, dtype=torch.int8, device=x["x"].device)
        wrapper = (call.module.SegmentGEMMWrapper(ws) if backend is None
                   else call.module.SegmentGEMMWrapper(ws, backend=backend))
        indptr = x["seg_indptr"]
        batch = indptr.shape[0] - 1
        extra = {}
        if "weight_indices" in x:
            extra["weight_indices"] = x["weight_indices"]
        elif identity:
            extra["weight_indices"] = torch.arange(batch, dtype=torch.int64, device=indptr.device)
        n = x["weights"].shape[1 if col else 2]
        buf = torch.zeros(x["x"].shape[0], n, dtype=torch_dtype(call.definition.outputs["output"].dtype),
                          device=x["x"].device) if out else None

        def launch():
            w, c = x["weights"], col
            if flip:  # the same values in the other layout, made inside the launch (a graph follows new data)
                w, c = w.transpose(1, 2).contiguous(), not col
            where = {"seg_lens": indptr[1:] - indptr[:-1]} if seg_lens else {"seg_indptr": indptr}
            if buf is not None:
                buf.zero_()  # the kernel adds to a given out (beta 1)
                where["out"] = buf
            return wrapper.run(x["x"], w, batch, c, **where, **extra)

        return launch

    return make


def run(*args, **kwargs):
    make = plan(*args, **kwargs)

    def call_it(call: Call) -> tuple:
        return (make(call)(),)

    return call_it


_FI = dict(package=PACKAGE, requires=("SegmentGEMMWrapper",), applies=applies, dtypes=DTYPES, needs_cuda=True,
           min_cc=(8, 0))
_RUN = SpecifierSet(">=0.1.6")
API = "flashinfer.SegmentGEMMWrapper.run"
ADAPTERS = [
    Adapter("flashinfer", "segment_gemm", API, run(), versions=_RUN, modes=("out", "graph"), plan=plan(),
            finish=lambda call, raw: tuple(raw), **_FI),
    Adapter("flashinfer", "segment_gemm", f"{API}(seg_lens=)", run(seg_lens=True), path="seg-lens", versions=_RUN,
            **_FI),
    Adapter("flashinfer", "segment_gemm", f"{API} (weights in the other layout)", run(flip=True),
            path="other-layout", versions=_RUN, **_FI),
    Adapter("flashinfer", "segment_gemm", f"{API}(weight_indices=arange)", run(identity=True),
            path="identity-indices", versions=_RUN, **{**_FI, "applies": _no_indices}),
    Adapter("flashinfer", "segment_gemm", "flashinfer.SegmentGEMMWrapper(backend=sm80).run", run("sm80"),
            path="sm80", versions=SpecifierSet(">=0.2.0"), **_FI),
    Adapter("flashinfer", "segment_gemm", "flashinfer.SegmentGEMMWrapper(backend=sm90).run", run("sm90"),
            path="sm90", versions=SpecifierSet(">=0.2.0"), **{**_FI, "min_cc": (9, 0)}, max_cc=(9, 0)),
]

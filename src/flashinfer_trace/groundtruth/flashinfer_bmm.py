"""FlashInfer ground truths for `bmm_fp8` and (at the end) `bmm_bf16`. bmm_fp8: `flashinfer.bmm_fp8(A, B, A_scale,
B_scale, dtype, out=None, backend="cublas") -> Tensor` (also `flashinfer.gemm.bmm_fp8`).

Read from flashinfer/gemm.py (flashinfer/gemm/gemm_base.py from 0.6.0), csrc/bmm_fp8.cu and its tests
(github:flashinfer-ai/flashinfer): A [b, m, k] and B [b, k, n] fp8 (e4m3 or e5m2, not both e5m2), B column-major
(the cuBLASLt call reads its data pointer as a [b, n, k] row-major matrix: no stride is passed, so a row-major B
would be read transposed); A_scale and B_scale float32 with exactly one element, on the device (checked from
0.6.x); dtype bfloat16 or float16; out, when given, [b, m, n] of that dtype; the scales are cuBLASLt's per-tensor
A / B scale pointers, applied to the float32 accumulator. The adapter passes B as the column-major copy of the
definition's row-major values (copied inside the launch, so a captured graph follows new data) and dtype from the
definition's output. The paths:

* plain: `bmm_fp8(A, B, A_scale, B_scale, dtype)` (backend left at its default, cuBLASLt, in every release);
  modes `out` (a NaN-filled buffer given as out=) and `graph` (modes.py: a CUDA-graph replay on other data);
* `cudnn`: backend="cudnn" (the keyword from 0.2.9; needs the cudnn Python package);
* `auto`: backend="auto" (from 0.2.12: the autotuner's choice among the backends the GPU has; cublas / cudnn
  on sm90);
* `cutlass`: backend="cutlass" (from 0.2.11): sm100 and later only (its requirement lists 100, 103, 107, 110,
  120, 121), so `arch-unsupported` on Hopper.

Releases: bmm_fp8 is in 0.1.6 (python/flashinfer/gemm.py) and every release since; cuBLASLt fp8 GEMMs need sm89
(the requirement functions list 89, 90, ...).
"""

from __future__ import annotations

import importlib.util

import torch
from packaging.specifiers import SpecifierSet

from ..dtypes import torch_dtype
from .base import Adapter, Call, GroundTruthUnavailable
from .flashinfer import PACKAGE
from .torch_bmm import INPUTS

DTYPES = frozenset({"float8_e4m3fn", "float8_e5m2", "float32"})
OUT_DTYPES = ("bfloat16", "float16")


def applies(d) -> str | None:
    """The API's contract: 3-D A and B, one-element scales, a bf16 or fp16 output."""
    missing = [n for n in INPUTS if n not in d.inputs]
    if missing:
        return f"needs inputs {', '.join(missing)}"
    if len(d.inputs["A"].shape or ()) != 3 or len(d.inputs["B"].shape or ()) != 3:
        return "A and B must be 3-D ([batch, m, k], [batch, k, n])"
    if any(d.inputs[n].shape not in ([], [1]) for n in ("A_scale", "B_scale")):
        return "per-tensor scales only (one element each)"
    if {d.inputs["A"].dtype.value, d.inputs["B"].dtype.value} == {"float8_e5m2"}:
        return "A and B both e5m2 is no combination the kernels take"
    out = d.outputs.get("C")
    if out is None or out.dtype is None or out.dtype.value not in OUT_DTYPES:
        return f"output C in {' or '.join(OUT_DTYPES)} only"
    return None


def _needs_cudnn(module, version, definition) -> None:
    if importlib.util.find_spec("cudnn") is None:
        raise GroundTruthUnavailable("not-installed", "cudnn (nvidia-cudnn-frontend), bmm_fp8's cudnn backend")


def plan(backend: str | None):
    def make(call: Call):
        x, d = call.inputs.values, call.definition
        fn = call.module.bmm_fp8
        a, b, sa, sb = (x[n] for n in INPUTS)
        dtype = torch_dtype(d.outputs["C"].dtype)
        extra = {} if backend is None else {"backend": backend}
        out = None
        if call.mode == "out":
            out = torch.full((a.shape[0], a.shape[1], b.shape[2]), float("nan"), dtype=dtype, device=a.device)
            extra["out"] = out

        def launch():
            col = b.transpose(-2, -1).contiguous().transpose(-2, -1)  # [b, k, n], stride 1 along k
            return fn(a, col, sa, sb, dtype, **extra)

        return launch

    return make


def run(backend: str | None):
    make = plan(backend)

    def call_it(call: Call) -> tuple:
        raw = make(call)()
        return (raw,)

    return call_it


# -- bmm_bf16 -------------------------------------------------------------------------------------------------
# flashinfer.bmm_bf16(A, B, out=None, out_dtype=torch.bfloat16, backend=...) (gemm_base.py, 0.6.1 on): A [b, m, k],
# B [b, k, n] column-major, bf16 only; out_dtype bf16, fp16 or fp32. Backends: cutlass (0.6.1 on; sm100 / 103, 107
# added in 0.6.16), cudnn (0.6.3 on; sm100 / 103 only until 0.6.11, sm80 .. sm121 from 0.6.12), cutile (0.6.14 on:
# sm90 on; needs the cuda-tile package), tgv (by 0.6.16, sm100 / 103). The default was cutlass until 0.6.4, cudnn
# since, so every path names its backend. On Hopper only cudnn (>= 0.6.12) and cutile run.
def applies_bf16(d) -> str | None:
    if "A" not in d.inputs or "B" not in d.inputs:
        return "needs inputs A and B"
    if len(d.inputs["A"].shape or ()) != 3 or len(d.inputs["B"].shape or ()) != 3:
        return "A and B must be 3-D ([batch, m, k], [batch, k, n])"
    out = d.outputs.get("C")
    if out is None or out.dtype is None or out.dtype.value not in ("bfloat16", "float16", "float32"):
        return "output C in bfloat16, float16 or float32 only"
    return None


def _needs_cutile(module, version, definition) -> None:
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.tile") is None:
        raise GroundTruthUnavailable("not-installed", "cuda-tile (cuda.tile), bmm_bf16's cutile backend")


def plan_bf16(backend: str):
    def make(call: Call):
        x, d = call.inputs.values, call.definition
        fn = call.module.bmm_bf16
        a, b = x["A"], x["B"]
        dtype = torch_dtype(d.outputs["C"].dtype)
        extra = {"out_dtype": dtype, "backend": backend}
        if call.mode == "out":
            extra["out"] = torch.full((a.shape[0], a.shape[1], b.shape[2]), float("nan"), dtype=dtype,
                                      device=a.device)

        def launch():
            col = b.transpose(-2, -1).contiguous().transpose(-2, -1)  # [b, k, n], stride 1 along k
            return fn(a, col, **extra)

        return launch

    return make


def run_bf16(backend: str):
    make = plan_bf16(backend)
    return lambda call: (make(call)(),)


_FI = dict(package=PACKAGE, requires=("bmm_fp8",), applies=applies, dtypes=DTYPES, needs_cuda=True)
ADAPTERS = [
    Adapter("flashinfer", "bmm_fp8", "flashinfer.bmm_fp8", run(None), versions=SpecifierSet(">=0.1.6"),
            min_cc=(8, 9), modes=("out", "graph"), plan=plan(None), finish=lambda call, raw: tuple(raw), **_FI),
    Adapter("flashinfer", "bmm_fp8", "flashinfer.bmm_fp8(backend=cudnn)", run("cudnn"), path="cudnn",
            versions=SpecifierSet(">=0.2.9"), min_cc=(8, 9), resolve=_needs_cudnn, **_FI),
    Adapter("flashinfer", "bmm_fp8", "flashinfer.bmm_fp8(backend=auto)", run("auto"), path="auto",
            versions=SpecifierSet(">=0.2.12"), min_cc=(8, 9), **_FI),
    Adapter("flashinfer", "bmm_fp8", "flashinfer.bmm_fp8(backend=cutlass)", run("cutlass"), path="cutlass",
            versions=SpecifierSet(">=0.2.11"), min_cc=(10, 0), **_FI),
]
_BF = dict(package=PACKAGE, requires=("bmm_bf16",), applies=applies_bf16, dtypes=frozenset({"bfloat16"}),
           needs_cuda=True)
ADAPTERS += [
    # plain: cudnn, on sm80+ from 0.6.12; 0.6.3 - 0.6.11 only on sm100 / 103 (the alternative on the same path)
    Adapter("flashinfer", "bmm_bf16", "flashinfer.bmm_bf16(backend=cudnn)", run_bf16("cudnn"),
            versions=SpecifierSet(">=0.6.12"), min_cc=(8, 0), modes=("out", "graph"), plan=plan_bf16("cudnn"),
            finish=lambda call, raw: tuple(raw), resolve=_needs_cudnn, **_BF),
    Adapter("flashinfer", "bmm_bf16", "flashinfer.bmm_bf16(backend=cudnn)", run_bf16("cudnn"),
            versions=SpecifierSet(">=0.6.3,<0.6.12"), min_cc=(10, 0), max_cc=(10, 3), modes=("out", "graph"),
            plan=plan_bf16("cudnn"), finish=lambda call, raw: tuple(raw), resolve=_needs_cudnn, **_BF),
    Adapter("flashinfer", "bmm_bf16", "flashinfer.bmm_bf16(backend=cutile)", run_bf16("cutile"), path="cutile",
            versions=SpecifierSet(">=0.6.14"), min_cc=(9, 0), resolve=_needs_cutile, **_BF),
    Adapter("flashinfer", "bmm_bf16", "flashinfer.bmm_bf16(backend=cutlass)", run_bf16("cutlass"), path="cutlass",
            versions=SpecifierSet(">=0.6.1"), min_cc=(10, 0), max_cc=(10, 7), **_BF),
]

"""FlashInfer ground truth for `gemm_bf16`: FlashInfer's bf16 GEMMs that run on sm90 (Hopper).

Read from the wheels' flashinfer/gemm/gemm_base.py and routergemm.py (routergemm_dsv3.py before 0.6.5), 0.6.0 to
0.7.2.post1 (line numbers of 0.7.2.post1), and FlashInfer's tests (github:flashinfer-ai/flashinfer,
tests/gemm/test_mm_bf16.py calls `mm_bf16(input, mat2.T, ...)` with mat2 [n, k]). Three APIs, one definition
form each (inputs/gemm_bf16.py):

* `mm_bf16(a, b, bias=None, pdl=False, out=None, out_dtype=torch.bfloat16, backend="cudnn") -> Tensor`
  (gemm_base.py:677; also `flashinfer.mm_bf16`): a [m, k] row-major bf16, b [k, n] bf16 column-major (the
  transpose of a contiguous [n, k] weight: `b.T.is_contiguous()`), out [m, n] of out_dtype (bf16, fp16, fp32).
  In 0.6.1 (cutlass, tgv; default tgv, sm100 / 103 only); cudnn from 0.6.3 (sm100 / 103), on sm80 .. sm90
  from 0.6.8 (`_cudnn_mm_bf16_requirement` lists 80, 86, 89, 90, 100, 103; 0.6.7 still 100, 103), the default
  backend cudnn from 0.6.8; tinygemm from 0.6.11 (90, 100, 103, 110, 120, 121: bf16 output, N a multiple of 16,
  gemm_base.py:547); cublaslt from 0.6.11 (100, 103 until 0.6.14; 80 .. 121 with 90 from 0.6.15,
  gemm_base.py:380); cutile from 0.6.14 (90 on; needs the cuda-tile package, gemm_base.py:519). cutlass, tgv and
  cute-dsl list 100, 103(, 107) only. The paths: plain backend="cudnn" (modes `out`: a NaN-filled out=, and
  `graph`), `cublaslt`, `tinygemm`, `cutile`, `auto` (0.6.8 on: the backends the GPU and problem allow), and
  `cutlass` (arch-unsupported on Hopper, for completeness).
* `tinygemm_bf16(input, weight, out, bias=None, use_pdl=False) -> None` (routergemm.py:922, from 0.6.5; also
  `flashinfer.gemm.tinygemm_bf16`): out = input @ weight.T + bias (F.linear), input [m, k] and weight [n, k]
  contiguous bf16, out [m, n] bf16 written in place, bias [n] bf16; n a multiple of 16 (routergemm.py:772, which
  lists 90, 100, 103(, 107), 110, 120, 121 in every release since 0.6.5); the docstring asks k a multiple of 64.
  Paths: plain (mode `graph`) and `mm-bf16`: the same inputs through mm_bf16(input, weight.T, bias=bias,
  backend="tinygemm") (0.6.11 on), the kernel mm_bf16's tinygemm backend runs.
* `mm_M1_16_K7168_N256(mat_a, mat_b, out, launch_with_pdl=True)` and `mm_M1_16_K6144_N256` (routergemm.py:432,
  :478): mat_a [m, k] row-major bf16 with 1 <= m <= 16, mat_b [k, n] bf16 dense column-major, out [m, n] float32
  (dense row-major), written in place; the shape is fixed (K 7168 / 6144, N 256). mm_M1_16_K7168_N256 is in 0.5.3
  (gemm/routergemm_dsv3.py; launch_with_pdl defaulted to False there) for sm100 only, sm100 / 103 from 0.6.8;
  mm_M1_16_K6144_N256 from 0.6.12 (100, 103); both list 90 from 0.7.0 (routergemm.py:97, :125: 90, 100, 103, 107),
  where sm90 runs the reference dsv3 kernel (SM100 / 103 the "cake" one). Paths: plain launch_with_pdl=False, modes
  `pdl` (launch_with_pdl=True, the default by 0.6.12, False until 0.6.8 at least; without a preceding PDL launch
  the kernel's grid-dependency wait returns at once) and `graph`.

`tgv_gemm_sm100` is SM100 only (its requirement lists 100, 103, 107): no definition or path here.

Every adapter hands the kernel the weight in the layout it takes, copied inside the launch so a captured CUDA
graph follows new data, and allocates the output itself (NaN-filled, so an element never written shows).
"""

from __future__ import annotations

import torch
from packaging.specifiers import SpecifierSet

from ..dtypes import torch_dtype
from .base import Adapter, Call
from .flashinfer import PACKAGE
from .flashinfer_bmm import _needs_cudnn, _needs_cutile

DTYPES = frozenset({"bfloat16"})
ROUTERS = {(7168, 256): "mm_M1_16_K7168_N256", (6144, 256): "mm_M1_16_K6144_N256"}
MM_OUT_DTYPES = ("bfloat16", "float16", "float32")


def _form(d) -> str | None:
    from ..inputs.gemm_bf16 import form_of

    return form_of(d)


def _only(d) -> tuple[str, object]:
    [(name, spec)] = list(d.outputs.items())
    return name, spec


def _const(d, axis: str) -> int | None:
    return d.const_axes.get(axis)


def applies_mm(d) -> str | None:
    if _form(d) != "mm":
        return "mm_bf16 takes A [M, K] and B [K, N] (this definition has another form)"
    name, out = _only(d) if len(d.outputs) == 1 else (None, None)
    if out is None or out.dtype is None or out.dtype.value not in MM_OUT_DTYPES:
        return "one output, bfloat16, float16 or float32"
    return None


def applies_mm_bf16_out(d) -> str | None:
    """cuBLASLt, TinyGEMM and the CuTeDSL paths: bf16 output only."""
    why = applies_mm(d)
    if why:
        return why
    return None if _only(d)[1].dtype.value == "bfloat16" else "bfloat16 output only"


def applies_mm_tinygemm(d) -> str | None:
    why = applies_mm_bf16_out(d)
    if why:
        return why
    n = _const(d, d.inputs["B"].shape[1])
    return None if n is None or n % 16 == 0 else f"N = {n} is no multiple of 16 (the TinyGEMM backend's tile)"


def applies_tiny(d) -> str | None:
    if _form(d) != "tinygemm":
        return "tinygemm_bf16 takes input [M, K], weight [N, K] and bias [N] (this definition has another form)"
    if len(d.outputs) != 1 or _only(d)[1].dtype is None or _only(d)[1].dtype.value != "bfloat16":
        return "one output, bfloat16"
    n, k = _const(d, d.inputs["weight"].shape[0]), _const(d, d.inputs["weight"].shape[1])
    if n is not None and n % 16:
        return f"N = {n} is no multiple of 16 (tinygemm's tile)"
    if k is not None and k % 64:
        return f"K = {k} is no multiple of 64 (tinygemm's documented input_features)"
    return None


def applies_router(api: str):
    def check(d) -> str | None:
        if _form(d) != "router":
            return "the router GEMMs take mat_a [M, K] and mat_b [K, N] (this definition has another form)"
        k, n = _const(d, d.inputs["mat_a"].shape[1]), _const(d, d.inputs["mat_b"].shape[1])
        if ROUTERS.get((k, n)) != api:
            return f"{api} is fixed to its own K and N (this definition: K {k}, N {n})"
        if len(d.outputs) != 1 or _only(d)[1].dtype is None or _only(d)[1].dtype.value != "float32":
            return "one output, float32 (the router kernels write float32 logits)"
        return None

    return check


def _nan_out(call: Call, shape) -> torch.Tensor:
    _, spec = _only(call.definition)
    dev = next(iter(call.inputs.values.values())).device
    return torch.full(tuple(shape), float("nan"), dtype=torch_dtype(spec.dtype), device=dev)


def _col(kn: torch.Tensor) -> torch.Tensor:
    """A [K, N] matrix's values, column-major (stride 1 along K): the transpose of a contiguous [N, K] copy."""
    return kn.t().contiguous().t()


def plan_mm(backend: str):
    def make(call: Call):
        x = call.inputs.values
        a, b = x["A"], x["B"]
        dtype = torch_dtype(_only(call.definition)[1].dtype)
        extra = {"out_dtype": dtype, "backend": backend}
        if call.mode == "out":
            extra["out"] = _nan_out(call, (a.shape[0], b.shape[1]))
        fn = call.module.gemm.mm_bf16

        def launch():
            return fn(a, _col(b), **extra)

        return launch

    return make


def plan_tiny(via_mm: bool = False):
    def make(call: Call):
        x = call.inputs.values
        a, w, bias = x["input"], x["weight"], x.get("bias")
        out = _nan_out(call, (a.shape[0], w.shape[0]))
        if via_mm:
            fn = call.module.gemm.mm_bf16

            def launch():
                return fn(a, w.contiguous().t(), bias=bias, backend="tinygemm")
        else:
            fn = call.module.gemm.tinygemm_bf16

            def launch():
                fn(a, w.contiguous(), out, bias=bias)
                return out

        return launch

    return make


def plan_router(api: str):
    def make(call: Call):
        pdl = call.mode == "pdl"
        x = call.inputs.values
        a, b = x["mat_a"], x["mat_b"]
        out = _nan_out(call, (a.shape[0], b.shape[1]))
        fn = getattr(call.module.gemm, api)

        def launch():
            fn(a.contiguous(), _col(b), out, launch_with_pdl=pdl)
            return out

        return launch

    return make


def _run(make):
    return lambda call: (make(call)(),)


def _finish(call, raw) -> tuple:
    return tuple(raw)


_BASE = dict(package=PACKAGE, dtypes=DTYPES, needs_cuda=True)
_MM = dict(_BASE, requires=("gemm.mm_bf16",), applies=applies_mm)
_MM16 = dict(_MM, applies=applies_mm_bf16_out)
MM = "flashinfer.gemm.mm_bf16"
ADAPTERS = [
    # plain: cudnn, on sm80 .. sm90 (and on) from 0.6.8; 0.6.3 - 0.6.7 sm100 / 103 only (the alternative)
    Adapter("flashinfer", "gemm_bf16", f"{MM}(backend=cudnn)", _run(plan_mm("cudnn")), versions=SpecifierSet(">=0.6.8"),
            min_cc=(8, 0), modes=("out", "graph"), plan=plan_mm("cudnn"), finish=_finish, resolve=_needs_cudnn, **_MM),
    Adapter("flashinfer", "gemm_bf16", f"{MM}(backend=cudnn)", _run(plan_mm("cudnn")),
            versions=SpecifierSet(">=0.6.3,<0.6.8"), min_cc=(10, 0), max_cc=(10, 3), modes=("out", "graph"),
            plan=plan_mm("cudnn"), finish=_finish, resolve=_needs_cudnn, **_MM),
    # cublaslt: 0.6.15 on for sm80 .. sm121; 0.6.11 - 0.6.14 sm100 / 103 only
    Adapter("flashinfer", "gemm_bf16", f"{MM}(backend=cublaslt)", _run(plan_mm("cublaslt")), path="cublaslt",
            versions=SpecifierSet(">=0.6.15"), min_cc=(8, 0), **_MM16),
    Adapter("flashinfer", "gemm_bf16", f"{MM}(backend=cublaslt)", _run(plan_mm("cublaslt")), path="cublaslt",
            versions=SpecifierSet(">=0.6.11,<0.6.15"), min_cc=(10, 0), max_cc=(10, 3), **_MM16),
    Adapter("flashinfer", "gemm_bf16", f"{MM}(backend=tinygemm)", _run(plan_mm("tinygemm")), path="tinygemm",
            versions=SpecifierSet(">=0.6.11"), min_cc=(9, 0), **dict(_MM, applies=applies_mm_tinygemm)),
    Adapter("flashinfer", "gemm_bf16", f"{MM}(backend=cutile)", _run(plan_mm("cutile")), path="cutile",
            versions=SpecifierSet(">=0.6.14"), min_cc=(9, 0), resolve=_needs_cutile, **_MM),
    Adapter("flashinfer", "gemm_bf16", f"{MM}(backend=auto)", _run(plan_mm("auto")), path="auto",
            versions=SpecifierSet(">=0.6.8"), min_cc=(8, 0), **_MM),
    Adapter("flashinfer", "gemm_bf16", f"{MM}(backend=cutlass)", _run(plan_mm("cutlass")), path="cutlass",
            versions=SpecifierSet(">=0.6.1"), min_cc=(10, 0), max_cc=(10, 7), **_MM),
]
TINY = "flashinfer.gemm.tinygemm_bf16"
_TINY = dict(_BASE, applies=applies_tiny)
ADAPTERS += [
    Adapter("flashinfer", "gemm_bf16", TINY, _run(plan_tiny()), versions=SpecifierSet(">=0.6.5"), min_cc=(9, 0),
            modes=("graph",), plan=plan_tiny(), finish=_finish, requires=("gemm.tinygemm_bf16",), **_TINY),
    Adapter("flashinfer", "gemm_bf16", f"{MM}(backend=tinygemm, bias=)", _run(plan_tiny(via_mm=True)),
            path="mm-bf16", versions=SpecifierSet(">=0.6.11"), min_cc=(9, 0), requires=("gemm.mm_bf16",), **_TINY),
]
for _api in ROUTERS.values():
    _R = dict(_BASE, applies=applies_router(_api), requires=(f"gemm.{_api}",))
    ADAPTERS += [
        # sm90 from 0.7.0 (90, 100, 103, 107); before, sm100 / 103 only (the alternative; `requires` says which
        # releases have the API at all)
        Adapter("flashinfer", "gemm_bf16", f"flashinfer.gemm.{_api}", _run(plan_router(_api)),
                versions=SpecifierSet(">=0.7.0"), min_cc=(9, 0), max_cc=(10, 7), modes=("pdl", "graph"),
                plan=plan_router(_api), finish=_finish, **_R),
        Adapter("flashinfer", "gemm_bf16", f"flashinfer.gemm.{_api}", _run(plan_router(_api)),
                versions=SpecifierSet("<0.7.0"), min_cc=(10, 0), max_cc=(10, 3), modes=("pdl", "graph"),
                plan=plan_router(_api), finish=_finish, **_R),
    ]


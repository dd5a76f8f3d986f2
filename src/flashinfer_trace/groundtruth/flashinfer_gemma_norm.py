"""FlashInfer ground truth for the Gemma norms (op_type `rmsnorm`, semantics.gemma_norm):
`flashinfer.norm.gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None) -> Tensor` and
`flashinfer.norm.gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None) -> None`.

Read from flashinfer/norm.py (flashinfer/norm/__init__.py from 0.6.7), csrc/norm.cu, include/flashinfer/norm.cuh,
the CuTe-DSL kernels of flashinfer/norm/kernels/ (0.6.7 on) and tests/test_norm.py (tests/utils/test_norm.py
later) at github:flashinfer-ai/flashinfer: input [batch_size, hidden_size] float16 or bfloat16 (the binding
dispatches those two and checks `CHECK_DIM(2, input)`), weight [hidden_size] read as the input's element type (so
a definition whose weight has another dtype is `unsupported`, never a reinterpreted call). The kernels are the
plain RMSNorm ones with `weight_bias = 1`: `x * rsqrt(sum(x^2) / d + eps) * (weight_bias + w)` in float32; the
fused form stores `(T)(input + residual)` into residual and normalises the float32 sum it kept (the CUDA kernel's
shared-memory copy, the CuTe-DSL kernel's register copy), writing the result into input. The calls:

* plain: `gemma_rmsnorm(input, weight, eps=)` (a new output); mode `out`: into a caller's buffer (filled with NaN
  first, as a reused one is dirty); `pdl`: `enable_pdl=True`; `graph` (modes.py): captured in a CUDA graph,
  replayed on other data, then on the case's;
* fused: `gemma_fused_add_rmsnorm(input, residual, weight, eps=)` on clones of input and residual (the case's own
  stay untouched), both read back (output, and residual where the definition lists it); modes `pdl`, `graph`.

Releases: both came in with PR #477 (commit 1a6b17e, "feat: add gemma_rmsnorm and gemma_fused_add_rmsnorm",
Aug 28 2024); v0.1.6 (tagged Aug 27) lacks them and v0.2.0 is the first tag that has them, `out=` included:
`versions` is >= 0.2, an older release `api-missing`. `enable_pdl` came in v0.2.3 (a `bool = False` keyword;
`Optional[bool] = None` from v0.2.7): `pdl` on an older release is `api-missing` by signature. From 0.6.7 a
CuTe-DSL kernel replaces the CUDA one where nvidia-cutlass-dsl imports (FLASHINFER_USE_CUDA_NORM=1 forces the
CUDA kernel; read at import, so not a per-call path); later main takes 3-D input in gemma_rmsnorm too (the 2-D
definitions here do not ask for it).
"""

from __future__ import annotations

import dataclasses

from packaging.specifiers import SpecifierSet

from .. import semantics as sem
from ..inputs.gemma_norm import is_fused, names
from .base import Adapter, Call
from .flashinfer import HALF, PACKAGE, _mode_keywords, _out

VERSIONS = SpecifierSet(">=0.2")


def _contract(d) -> str | None:
    """The API's contract: a Gemma norm over 2-D input, the weight in the input's dtype."""
    if sem.gemma_norm(d) is None:
        return "not a Gemma norm (scale weight + 1): the plain rmsnorm kernels take it"
    try:
        act, _, weight, _ = names(d)
    except KeyError:
        return "needs hidden_states (or input) and weight"
    spec, w = d.inputs[act], d.inputs[weight]
    if len(spec.shape or ()) != 2:
        return f"{act} must be [batch_size, hidden_size] (the kernel takes 2-D input only)"
    if spec.dtype is None or w.dtype is None or w.dtype != spec.dtype:
        return (f"the weight is read in the input's dtype: {weight} {w.dtype.value if w.dtype else 'unknown'} "
                f"with {act} {spec.dtype.value if spec.dtype else 'unknown'}")
    return None


def applies_plain(d) -> str | None:
    return _contract(d) or ("a fused add + norm (gemma_fused_add_rmsnorm's)" if is_fused(d) else None)


def applies_fused(d) -> str | None:
    return _contract(d) or (None if is_fused(d) else "not a fused add + norm (gemma_rmsnorm's)")


def plan(call: Call):
    act, _, weight, _ = names(call.definition)
    x = call.inputs.values
    fn = call.module.norm.gemma_rmsnorm
    h, w, eps = x[act], x[weight], sem.eps(call.definition, x)
    extra = {**_mode_keywords(fn, call), **_out(fn, call, h)}

    def launch():
        y = fn(h, w, eps=eps, **extra)
        return extra.get("out", y)
    return launch


def run(call: Call) -> tuple:
    return (plan(call)(),)


def plan_fused(call: Call):
    """In place on the call's own input and residual (run_fused clones them; modes.py's are its copies)."""
    act, residual, weight, _ = names(call.definition)
    x = call.inputs.values
    fn = call.module.norm.gemma_fused_add_rmsnorm
    h, r, w, eps = x[act], x[residual], x[weight], sem.eps(call.definition, x)
    extra = _mode_keywords(fn, call)

    def launch():
        fn(h, r, w, eps=eps, **extra)
        return h, r
    return launch


def finish_fused(call: Call, raw: tuple) -> tuple:
    return sem.norm_outputs(call.definition, raw[0], raw[1])


def run_fused(call: Call) -> tuple:
    act, residual, _, _ = names(call.definition)
    values = dict(call.inputs.values)
    values[act], values[residual] = values[act].clone(), values[residual].clone()
    cloned = dataclasses.replace(call, inputs=dataclasses.replace(call.inputs, values=values))
    return finish_fused(cloned, plan_fused(cloned)())


_COMMON = dict(package=PACKAGE, versions=VERSIONS, params=(sem.eps,), dtypes=HALF, needs_cuda=True)
ADAPTERS = [
    Adapter("flashinfer", "rmsnorm", "flashinfer.norm.gemma_rmsnorm", run, requires=("norm.gemma_rmsnorm",),
            applies=applies_plain, modes=("out", "pdl", "graph"), plan=plan, finish=lambda call, raw: tuple(raw),
            **_COMMON),
    Adapter("flashinfer", "rmsnorm", "flashinfer.norm.gemma_fused_add_rmsnorm", run_fused,
            requires=("norm.gemma_fused_add_rmsnorm",), applies=applies_fused, modes=("pdl", "graph"),
            plan=plan_fused, finish=finish_fused, **_COMMON),
]

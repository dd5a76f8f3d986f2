"""SGLang ground truth for the Gemma norms (op_type `rmsnorm`, semantics.gemma_norm): `sgl_kernel.gemma_rmsnorm` and
`sgl_kernel.gemma_fused_add_rmsnorm`, the names SGLang's GemmaRMSNorm layer imports.

Read in sgl-kernel/python/sgl_kernel/elementwise.py and __init__.py (sglang main, 2026): `gemma_rmsnorm(input,
weight, eps=1e-6, out=None, enable_pdl=None)` and `gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6,
enable_pdl=None)` (in place: residual += input, input = the norm of the sum), over FlashInfer's vendored norm
kernels, so the API's contract is FlashInfer's (flashinfer_gemma_norm.py: 2-D float16 / bfloat16 input, the weight
in its dtype). Which sgl_kernel releases export them was not pinned down here, so each adapter `requires` its
attribute: a release without it is `api-missing`, never a wrong call. One path each, the plain call with `eps=`
(as the plain rmsnorm adapters of sglang.py call theirs).
"""

from __future__ import annotations

from .. import semantics as sem
from ..inputs.gemma_norm import names
from .base import Adapter, Call
from .flashinfer_gemma_norm import applies_fused, applies_plain
from .sglang import HALF, KERNELS


def gemma_rmsnorm(call: Call) -> tuple:
    act, _, weight, _ = names(call.definition)
    x = call.inputs.values
    return (call.module.gemma_rmsnorm(x[act], x[weight], eps=sem.eps(call.definition, x)),)


def gemma_fused_add_rmsnorm(call: Call) -> tuple:
    """On clones of input and residual: both are written in place and read back."""
    act, residual, weight, _ = names(call.definition)
    x = call.inputs.values
    h, r = x[act].clone(), x[residual].clone()
    call.module.gemma_fused_add_rmsnorm(h, r, x[weight], eps=sem.eps(call.definition, x))
    return sem.norm_outputs(call.definition, h, r)


_COMMON = dict(package=KERNELS, params=(sem.eps,), dtypes=HALF, needs_cuda=True)
ADAPTERS = [
    Adapter("sglang", "rmsnorm", "sgl_kernel.gemma_rmsnorm", gemma_rmsnorm, requires=("gemma_rmsnorm",),
            applies=applies_plain, **_COMMON),
    Adapter("sglang", "rmsnorm", "sgl_kernel.gemma_fused_add_rmsnorm", gemma_fused_add_rmsnorm,
            requires=("gemma_fused_add_rmsnorm",), applies=applies_fused, **_COMMON),
]

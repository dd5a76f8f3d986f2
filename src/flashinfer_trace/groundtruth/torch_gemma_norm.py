"""Independent float64 ground truth for the Gemma norms (op_type `rmsnorm`, semantics.gemma_norm), written from
the math, not from the definitions' references.

Gemma's RMSNorm scales the normalised row by 1 + w (the checkpoint's zero-centred weight): `F.rms_norm` of the row
in float64 with the weight 1 + w formed in float64, eps read from the call (`semantics.eps`: the eps input or the
param:eps tag, never the reference), rounded once to the output's dtype. The fused add is s = hidden_states +
residual in float64 (exact for any two float16 values, and for bfloat16 ones within 2^45 of each other), the
updated residual s rounded once to its dtype (float16 overflow included: past 65520 it is inf, as the definition
says), and the norm reads s unrounded. float64 keeps every boundary case exact where the math is: a zero row is
0, a weight of -1 gives exactly 0, a float16 sum of squares of 1e4-sized values or of two near-max addends stays
finite.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import semantics as sem
from ..dtypes import torch_dtype
from ..inputs.gemma_norm import names
from .base import Adapter, Call

F64 = torch.float64


def applies(definition) -> str | None:
    if sem.gemma_norm(definition) is None:
        return "not a Gemma norm (scale weight + 1): the plain rmsnorm's ground truth takes it"
    try:
        act = names(definition)[0]
    except KeyError:
        return "needs hidden_states (or input) and weight"
    return None if definition.inputs[act].shape else f"{act} must be a tensor"


def gemma_rmsnorm(call: Call) -> tuple:
    d, x = call.definition, call.inputs.values
    act, residual, weight, _ = names(d)
    s = x[act].to(F64)
    if residual is not None:
        s = s + x[residual].to(F64)  # the norm reads the unrounded sum
    out = F.rms_norm(s, (s.shape[-1],), 1.0 + x[weight].to(F64), sem.eps(d, x))
    dtypes = [torch_dtype(spec.dtype) for spec in d.outputs.values()]
    return sem.norm_outputs(d, out.to(dtypes[0]), s.to(dtypes[-1]) if residual is not None else None)


ADAPTERS = [
    Adapter("torch", "rmsnorm", "torch.nn.functional.rms_norm with weight 1 + w (float64)", gemma_rmsnorm,
            applies=applies, params=(sem.eps,)),
]

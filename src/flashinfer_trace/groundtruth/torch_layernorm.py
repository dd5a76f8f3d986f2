"""Independent float64 ground truth for `layernorm`, written from the math, not from the definitions' references.

LayerNorm normalises each row to mean 0 and variance 1 (the population variance, divided by the row's length)
and applies a per-channel scale and bias: `torch.nn.functional.layer_norm` on the row in float64, weight and
bias in float64, eps read from the call (`semantics.eps`: never from the reference), rounded once to the
output's dtype. float64 keeps every boundary case exact where the math is: a row of equal values has variance
0 (the output is the bias), a large offset with deviations of one bf16 ulp keeps them (2^-16 / H of M^2 is far
above float64's rounding), and squares of near-max bf16 values (up to ~2^256 against float64's 2^1024) stay
finite.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import semantics as sem
from ..inputs.layernorm import names
from .base import Adapter, Call

F64 = torch.float64


def applies(definition) -> str | None:
    try:
        act = names(definition)[0]
    except KeyError:
        return "needs hidden_states (or input), weight (or gemma) and bias (or beta)"
    return None if definition.inputs[act].shape else f"{act} must be a tensor"


def layernorm(call: Call) -> tuple:
    d, x = call.definition, call.inputs.values
    act, weight, bias, _ = names(d)
    h = x[act]
    out = F.layer_norm(h.to(F64), (h.shape[-1],), x[weight].to(F64), x[bias].to(F64), sem.eps(d, x))
    return (out.to(h.dtype),)


ADAPTERS = [
    Adapter("torch", "layernorm", "torch.nn.functional.layer_norm (float64)", layernorm, applies=applies,
            params=(sem.eps,)),
]

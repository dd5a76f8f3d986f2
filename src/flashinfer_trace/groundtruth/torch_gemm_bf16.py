"""Independent float64 ground truth for `gemm_bf16`, written from the math, not from the definitions' references.

Each bf16 operand widens exactly to float64; the product is a float64 matmul (53-bit sums: for the shipped K, up to
7168, and bf16 operands, whose products carry 16 significant bits, far finer than the float32 a kernel sums in), the
bias (tinygemm) is added in float64, and the result is rounded once to the output's dtype (bf16, or the router's
float32). The weight's layout is read from the definition's axes: [K, N] (mm_bf16, router) or [N, K] (tinygemm).
"""

from __future__ import annotations

import torch

from ..inputs.gemm_bf16 import FORMS, form_of
from .base import Adapter, Call

F64 = torch.float64


def gemm_bf16(call: Call) -> tuple:
    from ..dtypes import torch_dtype

    d, x = call.definition, call.inputs.values
    act, w, bias, layout = FORMS[form_of(d)]
    a, b = x[act].to(F64), x[w].to(F64)
    out = a @ (b if layout == "KN" else b.T)
    if bias and x.get(bias) is not None:
        out = out + x[bias].to(F64)
    [name] = list(d.outputs)
    return (out.to(torch_dtype(d.outputs[name].dtype)),)


def applies(definition) -> str | None:
    if form_of(definition) is None:
        return "needs A and B, input and weight, or mat_a and mat_b"
    return None if len(definition.outputs) == 1 else "one output only"


ADAPTERS = [Adapter("torch", "gemm_bf16", "torch.matmul (float64)", gemm_bf16, applies=applies)]

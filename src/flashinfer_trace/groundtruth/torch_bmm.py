"""Independent float64 ground truths for `bmm_fp8` and `bmm_bf16`, written from the math, not from the definitions'
references.

Each fp8 code is dequantised on its own in float64 (code * its tensor's scale: 448 * 2^120 is far inside
float64's range, so the scale_overflow case stays finite here whatever order a kernel uses), the batched product
is an einsum over K in float64, rounded once to the output's dtype. A zero scale gives exact zeros (448 * 0).
"""

from __future__ import annotations

import torch

from .base import Adapter, Call

F64 = torch.float64
INPUTS = ("A", "B", "A_scale", "B_scale")


def applies(definition) -> str | None:
    missing = [n for n in INPUTS if n not in definition.inputs]
    return f"needs inputs {', '.join(missing)}" if missing else None


def bmm_fp8(call: Call) -> tuple:
    x = call.inputs.values
    a = x["A"].to(F64) * x["A_scale"].to(F64)
    b = x["B"].to(F64) * x["B_scale"].to(F64)
    out = torch.einsum("bmk,bkn->bmn", a, b)
    dtype = call.definition.outputs["C"].dtype
    from ..dtypes import torch_dtype

    return (out.to(torch_dtype(dtype)),)


def bmm_bf16(call: Call) -> tuple:
    """bmm_bf16: the batched product in float64 (a matmul of the widened operands), rounded once."""
    from ..dtypes import torch_dtype

    x = call.inputs.values
    out = torch.bmm(x["A"].to(F64), x["B"].to(F64))
    return (out.to(torch_dtype(call.definition.outputs["C"].dtype)),)


def applies_bf16(definition) -> str | None:
    missing = [n for n in ("A", "B") if n not in definition.inputs]
    return f"needs inputs {', '.join(missing)}" if missing else None


ADAPTERS = [
    Adapter("torch", "bmm_bf16", "torch.bmm (float64)", bmm_bf16, applies=applies_bf16),
    Adapter("torch", "bmm_fp8", "torch.einsum over float64-dequantised fp8 codes", bmm_fp8, applies=applies),
]

"""Independent float64 ground truth for `gemm_fp8` (block-scaled fp8 GEMM), written from the math, not from the
definitions' references.

Every fp8 code is dequantised on its own in float64 with the scale of the block it lies in (input: its row's scale
of its 128-wide K block; weight: its 128x128 block's, or its row's where a definition gives per-token [N, K/128]
weight scales), then one float64 matmul of the dequantised operands, rounded once to the output's dtype. 448 *
2^120 and 2^-100 are far inside float64's range, so the scale_overflow and tiny_scales cases stay exact here
whatever order a kernel uses; a zero scale gives exact zeros.
"""

from __future__ import annotations

import torch

from ..dtypes import torch_dtype
from .base import Adapter, Call

F64 = torch.float64
INPUTS = ("input", "weight", "input_scale", "weight_scale")
BLOCK = 128


def applies(definition) -> str | None:
    missing = [n for n in INPUTS if n not in definition.inputs]
    return f"needs inputs {', '.join(missing)}" if missing else None


def expand(scale: torch.Tensor, rows: int, cols: int, row_block: int) -> torch.Tensor:
    """A [rows / row_block, cols / 128] scale grid spread over the [rows, cols] elements it scales."""
    return scale.to(F64).repeat_interleave(row_block, dim=0)[:rows].repeat_interleave(BLOCK, dim=1)[:, :cols]


def dequantize(x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    a, w = x["input"], x["weight"]
    (m, k), n = a.shape, w.shape[0]
    per_token = x["weight_scale"].shape[0] == n and n > 1
    a64 = a.to(F64) * expand(x["input_scale"], m, k, 1)
    w64 = w.to(F64) * expand(x["weight_scale"], n, k, 1 if per_token else BLOCK)
    return a64, w64


def gemm_fp8(call: Call) -> tuple:
    a, w = dequantize(call.inputs.values)
    out = a @ w.T
    (spec,) = call.definition.outputs.values()
    return (out.to(torch_dtype(spec.dtype)),)


ADAPTERS = [
    Adapter("torch", "gemm_fp8", "float64 matmul of block-dequantised fp8 codes", gemm_fp8, applies=applies),
]

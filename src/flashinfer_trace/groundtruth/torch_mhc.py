"""Independent float64 ground truth for `mhc_post`, written from the math, not from the definitions' references.

mHC's post mapping writes hc new residual streams per token: new stream n is the layer output x weighted by
post_layer_mix[t, n] plus the old streams o weighted by comb_res_mix[t, o, n]. Here that is a batched matrix
product in float64: the [hc, hc] matrix transposed (rows the new streams) times the [hc, H] old streams, plus the
outer product of post_layer_mix with x, rounded once to the output's dtype. float64 holds every boundary case
exactly where the math is: the products of two bfloat16-exact values times a float32 weight (8 + 24 significant
bits) and their five-term sums lose nothing that a bfloat16 output could show, from 2^-120 to 2^126, and a
permutation matrix moves the streams bit for bit.
"""

from __future__ import annotations

import torch

from ..inputs.mhc import INPUTS
from .base import Adapter, Call

F64 = torch.float64


def applies(definition) -> str | None:
    missing = [n for n in INPUTS if n not in definition.inputs]
    return f"needs {', '.join(missing)}" if missing else None


def post_mapping(x: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """float64 [T, hc, H]: comb^T @ residual + post (outer) x, per token; post may be [T, hc] or [T, hc, 1]."""
    t, hc, h = residual.shape
    mixed = torch.bmm(comb.to(F64).transpose(1, 2), residual.to(F64))  # [T, new, old] @ [T, old, H]
    return mixed + post.to(F64).reshape(t, hc, 1) * x.to(F64).reshape(t, 1, h)


def mhc_post(call: Call) -> tuple:
    x = call.inputs.values
    out = post_mapping(x["x"], x["residual"], x["post_layer_mix"], x["comb_res_mix"])
    return (out.to(x["residual"].dtype),)


ADAPTERS = [
    Adapter("torch", "mhc_post", "comb^T @ residual + post x^T per token (float64)", mhc_post, applies=applies),
]

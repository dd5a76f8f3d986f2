"""Gated activation inputs (op_type `activation`): `silu_and_mul` and its kin take one tensor
[num_tokens, 2 * intermediate] whose halves are the gate and the up projection.

Standard normal covers both signs of the gate (silu's negative lobe); `large_values` (x100) puts
the gate where exp(-x) overflows float32, which an overflow-safe sigmoid must survive (in float16 the
values are capped at CAP(dtype), so that silu(gate) * up itself stays inside float16's range).

The boundary cases (docs/boundary/dense.md says why each exists): `zero_rows` (silu(0) * up = 0), and
`saturated_gates`: gates of magnitude 8 and up, where sigmoid is 0 or 1 in float32 and exp(-g) or
exp(g) overflows; negative gates up to a quarter of the dtype's max, positive ones only up to where
silu(g) * up stays representable.
"""

from __future__ import annotations

import math

import torch

from .common import Builder, bind_rows, float_tensor_inputs, log_uniform, randint, random_tensor

OP_TYPES = ("activation",)
ROWS = {"small": 4, "medium": 64, "large": 2048}
BOUNDARY_CASES = ("zero_rows", "saturated_gates")
CASES = ("single_token", "large_values", *BOUNDARY_CASES)
BOUNDARY_ROWS = {"small": 4, "medium": 16, "large": 2048}  # 16 at medium: the point is the values, not the rows
LARGE = 100.0
UP_SCALE = 8.0  # `saturated_gates`: the up half is N(0, 8^2), |up| <= 32 (the normal's tails are cut at 4 sigma)
GATE_MIN_LOG2 = 3  # |gate| >= 8: past where float32's sigmoid rounds to 1 (g > 17) or exp(-g) overflows (g < -88.7)
GATE_MAX_LOG2 = 64  # negative gates up to 2^64 where the dtype allows (float32 exp overflows long before)


def edge_cases(definition) -> list[str]:
    return list(CASES)


def cap(dtype: torch.dtype) -> float:
    """The largest |value| of each half at `large_values`: a power of two with cap^2 <= max / 4, so that
    silu(g) * up (|silu(g)| <= |g|) stays below the output dtype's max. No-op for bfloat16 (2^63)."""
    return 2.0 ** math.floor(math.log2(math.sqrt(torch.finfo(dtype).max / 4)))


def _saturated(b: Builder, name: str) -> torch.Tensor:
    """[gate | up]: |gate| log-uniform in [8, G] with random signs, G = dtype max / 4 for negative gates (and
    at most 2^64) and max / (8 * 32) for positive ones, whose silu(g) = g multiplies up (|up| <= 32)."""
    rows, width = b.shape(name)
    half = width // 2
    dtype = b.torch_dtype(name)
    big = torch.finfo(dtype).max
    neg_log2 = min(GATE_MAX_LOG2, math.floor(math.log2(big / 4)))
    pos_log2 = min(GATE_MAX_LOG2, math.floor(math.log2(big / (8 * 4 * UP_SCALE))))
    negative = randint(0, 2, (rows, half), b.rng(f"{name}:sign"), device=b.device) == 1
    below = log_uniform((rows, half), b.rng(f"{name}:negative"), GATE_MIN_LOG2, neg_log2, device=b.device)
    above = log_uniform((rows, half), b.rng(f"{name}:positive"), GATE_MIN_LOG2, pos_log2, device=b.device)
    gate = torch.where(negative, -below, above)  # table gathers and a select: the same bits on every device
    up = random_tensor((rows, width - half), torch.float32, b.rng(f"{name}:up"), scale=UP_SCALE, device=b.device)
    return torch.cat([gate, up], dim=-1).to(dtype)


def generate(b: Builder) -> None:
    floats = float_tensor_inputs(b)
    other = [n for n in b.definition.inputs if n not in floats]
    if other or not floats:
        raise b.error(f"the activation generator makes float tensors only; cannot make {', '.join(other)}")
    rows = 1 if b.case == "single_token" else (BOUNDARY_ROWS[b.size] if b.case in BOUNDARY_CASES
                                               else b.count(ROWS[b.size]))
    bind_rows(b, floats, rows)
    for name in floats:
        if b.case == "saturated_gates":
            b.put(name, _saturated(b, name))
            continue
        t = b.put_random(name, scale=LARGE if b.case == "large_values" else 1.0)
        if b.case == "large_values":
            limit = cap(t.dtype)
            b.put(name, t.clamp(-limit, limit))
        elif b.case == "zero_rows":  # even rows all zero: gate and up
            rows = t.shape[0]
            b.put(name, torch.where((torch.arange(rows, device=b.device) % 2 == 0)[:, None], torch.zeros_like(t), t))

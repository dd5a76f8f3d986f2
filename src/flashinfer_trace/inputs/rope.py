"""Rotary embedding inputs (op_type `rope`): positions, query, key and a cos/sin cache.

Positions are random (not sorted, not arange): a kernel that indexes the cache by token index
instead of by position passes on arange positions and fails here. The cache is built the way
models build it (inv_freq = theta^(-2i/rotary_dim); cos in the first half of each row, sin in
the second) so outputs are real rotations with norms preserved, which a test can check.

The boundary cases (docs/boundary/dense.md says why each exists): `cache_ends` (positions 0 and
max_position - 1 only), `large_positions` (a LONG_CONTEXT-row cache, positions in its last 4096
rows), and, for a definition with rotary_dim < head_dim, `partial_rotary`: the dimensions past
rotary_dim, which must come back unchanged, hold magnitudes up to 2^20 (past float16's range).
"""

from __future__ import annotations

import math

import torch

from .common import Builder, bind_rows, log_uniform, randint

OP_TYPES = ("rope",)
ROWS = {"small": 4, "medium": 64, "large": 2048}
MAX_POSITION = {"small": 256, "medium": 4096, "large": 32768}  # only when the definition leaves it var
BOUNDARY_CASES = ("cache_ends", "large_positions", "partial_rotary")
CASES = ("single_token", "large_values", "cache_ends", "large_positions")
BOUNDARY_ROWS = {"small": 4, "medium": 16, "large": 2048}  # 16 at medium: the point is the positions and values
LARGE = 100.0
LONG_CONTEXT = 131072  # `large_positions`: a 128k-token cache (Llama-3.1's context) where max_position is var
LATE = 4096  # `large_positions`: positions in the cache's last LATE rows
TAIL_MAX_LOG2 = 20  # `partial_rotary`: pass-through magnitudes up to 2^20 (or a quarter of the dtype's max)
POSITIONS = ("positions", "pos_ids")
ACTIVATIONS = ("query", "key", "q", "k")
CACHE = "cos_sin_cache"
# query and key heads where a definition leaves them var (the public `..._d128_rd64` does)
HEADS = {"small": (4, 2), "medium": (32, 8), "large": (32, 8)}


def edge_cases(definition) -> list[str]:
    """`partial_rotary` only where the definition fixes rotary_dim < head_dim (const axes)."""
    consts = definition.const_axes
    partial = "rotary_dim" in consts and "head_dim" in consts and consts["rotary_dim"] < consts["head_dim"]
    return [*CASES, "partial_rotary"] if partial else list(CASES)


def rope_theta(definition) -> float:
    """Llama 3.x uses theta 5e5; everything else here gets the classic 1e4 (any theta is valid:
    the cache is an input, so reference and kernel see the same one)."""
    return 5e5 if any(m.startswith("llama-3") for m in definition.models) else 1e4


def cos_sin_cache(max_position: int, rotary_dim: int, theta: float) -> torch.Tensor:
    """[max_position, rotary_dim] float32: cos(p * f_i) | sin(p * f_i), computed in float64."""
    half = rotary_dim // 2
    inv_freq = 1.0 / theta ** (torch.arange(half, dtype=torch.float64) * 2 / rotary_dim)
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float64), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(torch.float32)


def generate(b: Builder) -> None:
    d = b.definition
    known = POSITIONS + ACTIVATIONS + (CACHE,)
    extra = [n for n in d.inputs if n not in known]
    if extra:
        raise b.mismatch(f"the rope generator does not know input(s) {', '.join(extra)}")
    pos = next((n for n in POSITIONS if n in d.inputs), None)
    acts = [n for n in d.inputs if n in ACTIVATIONS]
    if pos is None or not acts:
        raise b.error("a rope definition needs positions and query/key inputs")
    rows = 1 if b.case == "single_token" else (BOUNDARY_ROWS[b.size] if b.case in BOUNDARY_CASES
                                               else b.count(ROWS[b.size]))
    bind_rows(b, [pos, *acts], rows)

    if CACHE in d.inputs:
        max_axis, rd_axis = b.dim_axis(CACHE, 0), b.dim_axis(CACHE, 1)
        if max_axis not in b.axes:
            b.set_axis(max_axis, LONG_CONTEXT if b.case == "large_positions" else MAX_POSITION[b.size])
        rotary_dim = b.axis(rd_axis)
        if rotary_dim % 2:
            raise b.error(f"rotary dim {rotary_dim} is odd; cos|sin halves need it even")
        max_position = b.axis(max_axis)
        cache = cos_sin_cache(max_position, rotary_dim, rope_theta(d)).to(b.torch_dtype(CACHE))
        b.put(CACHE, cache)
    else:
        rotary_dim = None
        max_position = LONG_CONTEXT if b.case == "large_positions" else MAX_POSITION[b.size]

    b.put(pos, _positions(b, pos, max_position))
    for name in acts:
        heads = b.dim_axis(name, 1) if len(b.definition.inputs[name].shape or ()) == 3 else None
        if heads is not None and heads not in b.axes:
            b.set_axis(heads, HEADS[b.size][0 if name in ("query", "q") else 1])
        t = b.put_random(name, scale=LARGE if b.case == "large_values" else 1.0)
        if b.case == "partial_rotary" and rotary_dim is not None:
            b.put(name, _with_large_tail(b, name, t, rotary_dim))


def _positions(b: Builder, name: str, max_position: int) -> torch.Tensor:
    """Random rows of the cache; `cache_ends`: max_position - 1 on even tokens, 0 on odd ones;
    `large_positions`: the last LATE rows."""
    shape, dtype = b.shape(name), b.torch_dtype(name)
    if b.case == "cache_ends":
        even = torch.arange(shape[0]) % 2 == 0
        return torch.where(even, max_position - 1, 0).to(dtype).to(b.device)
    low = max(0, max_position - LATE) if b.case == "large_positions" else 0
    return randint(low, max_position, shape, b.rng(name), dtype=dtype, device=b.device)


def _with_large_tail(b: Builder, name: str, t: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """t with the dimensions past rotary_dim replaced by +-2^U(0, TAIL_MAX_LOG2) (capped at a quarter of
    the dtype's max): values a correct kernel copies unchanged, and a float16 round trip turns into inf."""
    shape = list(t.shape)
    shape[-1] -= rotary_dim
    top = min(TAIL_MAX_LOG2, math.floor(math.log2(torch.finfo(t.dtype).max / 4)))
    magnitude = log_uniform(shape, b.rng(f"{name}:tail"), 0, top, device=b.device)
    negative = randint(0, 2, shape, b.rng(f"{name}:tail-sign"), device=b.device) == 1
    tail = torch.where(negative, -magnitude, magnitude).to(t.dtype)
    return torch.cat([t[..., :rotary_dim], tail], dim=-1)

"""RMSNorm inputs (op_type `rmsnorm`): `rmsnorm` (hidden_states, weight, eps) and `fused_add_rmsnorm`
(hidden_states, residual, weight, eps), told apart by input name.

Activations are standard normal (bf16 activations of a real model are O(1) after the previous
layer's norm); the weight is 1 + 0.1 * N(0, 1), so a wrong broadcast or a dropped weight shows.
eps, a scalar input where the definition declares one (as FlashInfer's `rmsnorm(input, weight, eps)`
takes it), is log-uniform in EPS_RANGE, the models' rms_norm_eps values (1e-6: Qwen3, DeepSeek; 1e-5:
Llama, Mixtral, Nemotron-H); `eps_min` / `eps_max` pin it to the ends.

The boundary cases (docs/boundary/dense.md says why each exists): rows that are all zero (the rsqrt(eps)
path: 0 in, 0 out), subnormal activations, one element per row at SPIKE (placed from the last column to
the first, so a reduction that drops a row's tail misses it), and activations as large as the format
allows (NEAR_MAX).
"""

from __future__ import annotations

import math

import torch

from .common import Builder, bind_rows, float_tensor_inputs, log_uniform, random_tensor, uniform, unknown_inputs

OP_TYPES = ("rmsnorm",)
ROWS = {"small": 4, "medium": 64, "large": 2048}
BOUNDARY_CASES = ("zero_rows", "denormal_values", "dominant_element", "near_max", "eps_min", "eps_max")
CASES = ("single_token", "large_values", "tiny_values", *BOUNDARY_CASES)
# the boundary cases use 16 rows at the medium size: each keeps its point (even / odd rows, spikes from the
# last column to the first), and a case's CPU cost is mostly its rows (about 0.4 s each at 64)
BOUNDARY_ROWS = {"small": 4, "medium": 16, "large": 2048}
LARGE = 100.0  # `large_values`: activations * 100, so x**2 summed over 4096 channels needs float32
# `tiny_values`: activations * 1e-3, so mean(x**2) ~ 1e-6 is of the order of eps and a wrong eps shows
# (the planted eps 1e-6-for-1e-5 bug passed every other case: mutants.py); `eps_min` / `eps_max` use it too
TINY = 1e-3
EPS_RANGE = (1e-6, 1e-5)
SPIKE = 1e4  # `dominant_element`: one value per row; its square, 1e8, overflows float16 (max 65504)
# `near_max`: |x| up to this share of the dtype's largest finite value, or up to where the float32 sum of
# squares of a row stays below a quarter of float32's range, whichever is smaller: the definition
# accumulates in float32 (as FlashInfer's kernel does), so a row whose sum of squares overflows float32 is
# outside what any float32-accumulating implementation, the reference included, can normalise
NEAR_MAX = 0.9
WEIGHTS = ("weight", "gamma")
ACTIVATIONS = ("hidden_states", "residual", "input", "x")
EPS_INPUTS = ("eps", "epsilon")


def edge_cases(definition) -> list[str]:
    return list(CASES)


def _rows(b: Builder, name: str) -> tuple[int, int]:
    shape = b.shape(name)
    return shape[0], shape[-1]


def near_max_limit(dtype: torch.dtype, hidden: int) -> float:
    """The largest |x| of `near_max`: NEAR_MAX of the dtype's max, capped where a row of `hidden` such
    values would bring the float32 sum of squares within 4x of float32's max."""
    f32 = torch.finfo(torch.float32).max
    return min(NEAR_MAX * torch.finfo(dtype).max, math.sqrt(f32 / (4 * hidden)))


def put_activation(b: Builder, name: str, index: int, count: int) -> None:
    """One activation input (`index` of `count`: a fused add's second input shares the rows' limits), drawn for
    this family's cases (any other case: typical rows). The Gemma norms (gemma_norm.py) draw theirs here too."""
    dtype = b.torch_dtype(name)
    rows, hidden = _rows(b, name)
    if b.case == "denormal_values":  # a quarter of the smallest normal: most values subnormal in the dtype
        b.put_random(name, scale=torch.finfo(dtype).tiny / 4)
        return
    if b.case == "near_max":  # uniform in (-L, L) / count: many values close to L, the sum of a fused add too
        limit = near_max_limit(dtype, hidden) / count
        u = uniform((rows, hidden), b.rng(name), device=b.device)
        b.put(name, ((u * 2.0 - 1.0) * limit).to(dtype))
        return
    scale = {"large_values": LARGE, "tiny_values": TINY, "eps_min": TINY, "eps_max": TINY}.get(b.case, 1.0)
    t = random_tensor((rows, hidden), dtype, b.rng(name), scale=scale, device=b.device)
    if b.case == "zero_rows":  # even rows 0; a fused add's residual is minus its hidden_states there: sum 0
        even = (torch.arange(rows, device=b.device) % 2 == 0)[:, None]
        if index:
            t = torch.where(even, -b.values[next(n for n in b.definition.inputs if n in ACTIVATIONS)], t)
        elif count == 1:
            t = torch.where(even, torch.zeros_like(t), t)
    elif b.case == "dominant_element" and index == 0:  # row r: SPIKE at column (H-1) (rows-1-r) / (rows-1)
        cols = [(hidden - 1) * (rows - 1 - r) // max(rows - 1, 1) for r in range(rows)]
        signs = [SPIKE if r % 2 == 0 else -SPIKE for r in range(rows)]
        t[torch.arange(rows, device=b.device), torch.tensor(cols, device=b.device)] = torch.tensor(
            signs, dtype=dtype, device=b.device)
    b.put(name, t)


def put_eps(b: Builder, name: str) -> None:
    """A norm's eps: the ends of EPS_RANGE in the eps cases, else log-uniform inside it (norm and layernorm)."""
    if b.case == "eps_min":
        b.put_scalar(name, EPS_RANGE[0])
    elif b.case == "eps_max":
        b.put_scalar(name, EPS_RANGE[1])
    else:
        lo, hi = (math.log2(e) for e in EPS_RANGE)
        b.put_scalar(name, log_uniform((1,), b.rng(name), lo, hi).item())


def generate(b: Builder) -> None:
    unknown_inputs(b, WEIGHTS + ACTIVATIONS + EPS_INPUTS, "rmsnorm")
    scalars = [n for n in b.definition.inputs if n in EPS_INPUTS and b.spec(n).shape in (None, [])]
    floats = [n for n in float_tensor_inputs(b) if n not in scalars]
    if len(floats) + len(scalars) != len(b.definition.inputs):
        raise b.error("rmsnorm inputs must be float tensors and a scalar eps")
    acts = [n for n in floats if n in ACTIVATIONS]
    rows = 1 if b.case == "single_token" else (BOUNDARY_ROWS[b.size] if b.case in BOUNDARY_CASES
                                               else b.count(ROWS[b.size]))
    bind_rows(b, acts, rows)
    for name in floats:
        if name in WEIGHTS:
            b.put_random(name, scale=0.1, mean=1.0)
    for i, name in enumerate(acts):
        put_activation(b, name, i, len(acts))
    for name in scalars:
        put_eps(b, name)

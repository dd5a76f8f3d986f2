"""Gemma-style RMSNorm inputs: FlashInfer's `gemma_rmsnorm(input, weight, eps)`, output = x * rsqrt(mean(x^2) +
eps) * (1 + w), and `gemma_fused_add_rmsnorm(input, residual, weight, eps)` (residual += input in place, then the
same norm of the sum written into input).

FlashInfer's trace templates file both under op_type `rmsnorm` (name prefixes `gemma_rmsnorm`,
`gemma_fused_add_rmsnorm`; inputs hidden_states, residual, weight), and so do the definitions; `claims` routes a
`rmsnorm` definition here when it is a Gemma norm (semantics.gemma_norm: a `fi_api:` tag naming a gemma API, or
the name), the plain norms stay norm.py's. Activations and eps are drawn by norm.py's own helpers (put_activation,
put_eps): the same typical rows, eps range and shared cases, so the two families read alike. The weight is
Gemma's zero-centred one, 0.1 * N(0, 1): the scale 1 + w is near 1, so a dropped +1 (the output times ~0.1)
shows in every element, and 1 + w never comes near 0 on typical rows (|w| > 0.75 is 7.5 sigma).

The cases (docs/boundary/gemma_norm.md says why each exists): norm.py's `single_token`, `large_values`,
`tiny_values`, `zero_rows`, `denormal_values`, `dominant_element`, `near_max`, `eps_min`, `eps_max`, and Gemma's
own:

* `minus_one_weight`: w = -1 at even channels (the scale 1 + w is exactly 0: the output there is exactly 0) and
  w = -(1 - eps_dtype / 2) at odd ones (the smallest scale a weight near -1 holds exactly: 2^-8 in bfloat16, 2^-11
  in float16); every row has one SPIKE at an odd channel (placed as dominant_element's, from the last odd column
  to the first), so its normalised value is near sqrt(H) and its output near sqrt(H) * 2^-8: a scale applied as
  x^ + x^ * w in the activations' dtype loses it to cancellation (one rounding of x^ * w is 2^-9 of x^).
* `residual_overflow` (fused add, float16 only): on even rows a sixteenth of the columns (at least one) hold
  hidden_states and residual of one sign, each 0.55 to 0.9 of float16's max: their sum passes 65520, so the
  updated residual is +-inf in float16 (the definition's rounding of s), while the norm reads the float32 sum
  and stays finite; an add done in float16 before the norm turns the row into NaN. bfloat16 has float32's range:
  a sum past it overflows the float32 sum of squares too, outside what any float32 kernel promises.
"""

from __future__ import annotations

import torch

from .. import semantics as sem
from . import norm
from .common import Builder, bind_rows, normal, permutation, uniform, unknown_inputs

OP_TYPES = ("rmsnorm",)  # shared with norm.py; `claims` decides (registry.py)
ACTIVATIONS = ("hidden_states", "input")  # FlashInfer's template names hidden_states the API's `input`
RESIDUAL, WEIGHT = "residual", "weight"
GEMMA_CASES = ("minus_one_weight",)
FUSED_FP16_CASES = ("residual_overflow",)
CASES = (*norm.CASES, *GEMMA_CASES)
BOUNDARY_CASES = (*norm.BOUNDARY_CASES, *GEMMA_CASES, *FUSED_FP16_CASES)
WEIGHT_STD = 0.1  # zero-centred: the scale 1 + w is 1 + 0.1 N(0, 1)
OVERFLOW_SHARE = 16  # residual_overflow: one column in 16 of an even row overflows
OVERFLOW_RANGE = (0.55, 0.9)  # ... with each addend this share of the dtype's max (their sum > 1.1 max)


def claims(definition) -> bool:
    """A `rmsnorm` definition this generator makes inputs for (norm.py makes the plain norms')."""
    return definition.op_type in OP_TYPES and sem.gemma_norm(definition) is not None


def is_fused(definition) -> bool:
    return RESIDUAL in definition.inputs


def names(definition) -> tuple[str, str | None, str, str | None]:
    """(activation, residual or None, weight, eps or None); KeyError when the activation or weight is absent."""
    act = [n for n in ACTIVATIONS if n in definition.inputs]
    if len(act) != 1 or WEIGHT not in definition.inputs:
        raise KeyError("gemma norm inputs")
    eps = sem.scalar_input(definition, sem.EPS_INPUTS)
    return act[0], (RESIDUAL if is_fused(definition) else None), WEIGHT, eps


def edge_cases(definition) -> list[str]:
    fp16 = any(s.dtype is not None and s.dtype.value == "float16" for s in definition.inputs.values())
    return list(CASES) + (list(FUSED_FP16_CASES) if is_fused(definition) and fp16 else [])


def cancelling_weight(hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """-1 at even channels, -(1 - eps / 2) at odd ones: scales 1 + w of exactly 0 and the dtype's least near -1."""
    w = torch.full((hidden,), -1.0, dtype=torch.float64)
    w[1::2] = -(1.0 - torch.finfo(dtype).eps / 2)
    return w.to(dtype)


def spike_columns(rows: int, hidden: int) -> list[int]:
    """Row r's odd column: dominant_element's (H - 1) (rows - 1 - r) / (rows - 1), moved to an odd neighbour."""
    out = []
    for r in range(rows):
        c = (hidden - 1) * (rows - 1 - r) // max(rows - 1, 1)
        out.append(c if c % 2 else (c + 1 if c + 1 < hidden else c - 1))
    return out


def _spike_rows(b: Builder, name: str, rows: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    t = normal((rows, hidden), b.rng(name), device=b.device, dtype=dtype)
    cols = torch.tensor(spike_columns(rows, hidden), device=b.device)
    signs = torch.tensor([norm.SPIKE if r % 2 == 0 else -norm.SPIKE for r in range(rows)], dtype=dtype,
                         device=b.device)
    t[torch.arange(rows, device=b.device), cols] = signs
    return t


def _overflowing_pair(b: Builder, act: str, rows: int, hidden: int, dtype: torch.dtype):
    """hidden_states and residual: typical rows, but on even rows a 1/OVERFLOW_SHARE of the columns (random, at
    least one) hold both addends of one sign at OVERFLOW_RANGE of the dtype's max."""
    x = normal((rows, hidden), b.rng(act), device=b.device, dtype=dtype)
    r = normal((rows, hidden), b.rng(RESIDUAL), device=b.device, dtype=dtype)
    order = permutation(hidden, b.rng("overflow:cols"), rows=rows).to(b.device)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(hidden, device=b.device).expand(rows, hidden).contiguous())
    even = (torch.arange(rows, device=b.device) % 2 == 0)[:, None]
    chosen = (rank < max(1, hidden // OVERFLOW_SHARE)) & even
    sign = torch.where(uniform((rows, hidden), b.rng("overflow:sign"), device=b.device) < 0.5, -1.0, 1.0)
    top = torch.finfo(dtype).max
    lo, hi = OVERFLOW_RANGE

    def big(tag: str) -> torch.Tensor:
        u = uniform((rows, hidden), b.rng(tag), device=b.device).to(torch.float64)
        return (sign * (lo + (hi - lo) * u) * top).to(dtype)

    return torch.where(chosen, big("overflow:x"), x), torch.where(chosen, big("overflow:r"), r)


def generate(b: Builder) -> None:
    unknown_inputs(b, ACTIVATIONS + (RESIDUAL, WEIGHT) + sem.EPS_INPUTS, "gemma rmsnorm")
    try:
        act, residual, weight, eps = names(b.definition)
    except KeyError:
        raise b.mismatch("a Gemma norm needs one activation (hidden_states / input) and a weight") from None
    if len(b.spec(act).shape or ()) != 2:
        raise b.mismatch(f"{act} must be [rows, hidden] (the API takes 2-D input)")
    if b.case is not None and b.case not in (cases := edge_cases(b.definition)):
        raise b.error(f"unknown case {b.case!r} (cases: {', '.join(cases)})")
    acts = [act] + ([residual] if residual else [])
    rows = 1 if b.case == "single_token" else (norm.BOUNDARY_ROWS[b.size] if b.case in BOUNDARY_CASES
                                               else b.count(norm.ROWS[b.size]))
    bind_rows(b, acts, rows)
    dtype, hidden = b.torch_dtype(act), b.shape(act)[1]
    if b.case == "minus_one_weight":
        b.put(weight, cancelling_weight(hidden, b.torch_dtype(weight)))
        b.put(act, _spike_rows(b, act, rows, hidden, dtype))
        if residual:
            b.put_random(residual)
    elif b.case == "residual_overflow":
        b.put_random(weight, scale=WEIGHT_STD)
        x, r = _overflowing_pair(b, act, rows, hidden, dtype)
        b.put(act, x)
        b.put(residual, r)
    else:
        b.put_random(weight, scale=WEIGHT_STD)
        for i, name in enumerate(acts):
            norm.put_activation(b, name, i, len(acts))
    if eps is not None:
        norm.put_eps(b, eps)

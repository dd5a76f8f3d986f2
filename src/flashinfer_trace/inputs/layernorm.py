"""LayerNorm inputs (op_type `layernorm`): FlashInfer's `flashinfer.norm.layernorm(input, gemma, beta, eps)`,
output = (x - mean) * rsqrt(var + eps) * weight + bias per row, with x bfloat16 and weight / bias float32 (the
API's only dtypes). The definitions name the inputs as FlashInfer's trace template does (hidden_states, weight,
bias; the API's own names input, gemma, beta are taken too) and add eps, a scalar input.

Typical rows are standard normal activations (their mean is O(1 / sqrt(H)), so dropping the centring still
shows; large row means are a boundary case of their own, `large_mean`); the weight is 1 + 0.25 * N(0, 1) and
the bias 0.25 * N(0, 1), so a dropped bias, a dropped weight, or the affine applied in the wrong order
((x^ + b) * w) shows in most elements.
eps is log-uniform in EPS_RANGE, the models' layer_norm_eps (1e-6: DeepSeek-V3.2's indexer k_norm; 1e-5: GPT-2,
Phi-2, Falcon); `eps_min` / `eps_max` pin it to the ends.

The boundary cases (docs/boundary/layernorm.md says why each exists and what the API promises):

* `single_token`: one row (one block of the kernel's grid).
* `constant_rows`: even rows are one value repeated (row 0 all zeros, the others a value of magnitude 2^-4 to
  2^12): the variance is exactly 0, so the output is rsqrt(eps) * 0 * weight + bias = the bias, exactly; a
  kernel without eps divides 0 by 0 (NaN), one that anchors on E[x^2] sees rounding noise there.
* `large_mean`: each row is a large offset M (|M| = 2^6 to 2^14, a bf16 value) with a few elements one bf16 ulp
  of M above or below it (row r % 4: one element, H / 64, H / 8 or H / 2 of them): the variance is tiny against
  M^2 (down to 2^-16 / H of it), so E[x^2] - E[x]^2 in float32 is catastrophic cancellation once H > 256
  (rounding noise, negative or many times off; at H <= 256 the sums of bf16 squares are exact in float32 and
  the error stays small), and a mean rounded to bf16 before the subtraction misses the deviations; the two-pass
  float32 computation of the definitions (and of FlashInfer's kernel) keeps them. It also holds the row's mean
  far from 0, where elements a kernel pads a row with (a hidden size no vector width divides) or drops from it
  move the mean and the variance by far more than their share.
* `near_max`: magnitudes as large as a float32 computation allows. Odd rows are uniform in (-L, L), L =
  min(0.9 * the dtype's max, sqrt(float32 max / (4 H))): the float32 sum of squared deviations stays within a
  quarter of float32's range (beyond it no float32-accumulating LayerNorm, FlashInfer's and the reference
  included, can normalise). Even rows are one value C repeated, |C| between 2^66 and float32 max / (4 H): the
  float32 sum of the row stays finite, but C^2 overflows float32, so a kernel that squares x rather than x -
  mean gets inf - inf; the true output is the bias.
* `eps_min` / `eps_max`: activations * 1e-3 (variance ~1e-6, the order of eps) with eps at each end of
  EPS_RANGE: a wrong eps, or eps added outside the square root, shows.

A hidden size that no vector width divides is a definition of its own (`layernorm_h129`): the axis is
const, so no case can vary it.
"""

from __future__ import annotations

import math

import torch

from .common import Builder, bind_rows, log_uniform, normal, permutation, randint, uniform, unknown_inputs
from .norm import put_eps

OP_TYPES = ("layernorm",)
ROWS = {"small": 4, "medium": 64, "large": 2048}
# the boundary cases use 16 rows at medium: their point is the values of each row, not the number of rows
BOUNDARY_ROWS = {"small": 4, "medium": 16, "large": 2048}
BOUNDARY_CASES = ("constant_rows", "large_mean", "near_max", "eps_min", "eps_max")
CASES = ("single_token", *BOUNDARY_CASES)
ACTIVATIONS = ("hidden_states", "input")
WEIGHTS = ("weight", "gemma", "gamma")
BIASES = ("bias", "beta")
EPS_INPUTS = ("eps", "epsilon")
WEIGHT_STD, BIAS_STD = 0.25, 0.25
TINY = 1e-3  # eps_min / eps_max: activations * 1e-3, variance ~1e-6, of the order of eps
CONSTANT_LOG2 = (-4, 12)  # constant_rows: |value| = 2^U(-4, 12) (row 0: zeros)
LARGE_MEAN_LOG2 = (6, 14)  # large_mean: |M| = 2^U(6, 14)
NEAR_MAX = 0.9  # near_max: at most this share of the dtype's largest finite value
SQUARE_OVERFLOW_LOG2 = 66  # near_max constant rows start here: (2^66)^2 overflows float32 (max ~2^128)


def edge_cases(definition) -> list[str]:
    return list(CASES)


def names(definition) -> tuple[str, str, str, str | None]:
    """(activation, weight, bias, eps or None) input names; raises KeyError if one of the first three is absent."""
    def pick(options):
        found = [n for n in options if n in definition.inputs]
        if len(found) != 1:
            raise KeyError(options)
        return found[0]
    eps = next((n for n in EPS_INPUTS if n in definition.inputs), None)
    return pick(ACTIVATIONS), pick(WEIGHTS), pick(BIASES), eps


def float32_square_limit(hidden: int) -> float:
    """The largest |x - mean| whose float32 sum of squares over a row of `hidden` stays within a quarter of
    float32's max."""
    return math.sqrt(torch.finfo(torch.float32).max / (4 * hidden))


def float32_sum_limit(hidden: int) -> float:
    """The largest |x| whose float32 sum over a row of `hidden` stays within a quarter of float32's max."""
    return torch.finfo(torch.float32).max / (4 * hidden)


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype` at each of `values` (nonzero, normal): 2^(exponent) * eps of the dtype."""
    exp = torch.floor(torch.log2(values.abs().to(torch.float64)))
    return torch.exp2(exp) * torch.finfo(dtype).eps


def _signs(shape, b: Builder, tag: str) -> torch.Tensor:
    return (randint(0, 2, shape, b.rng(tag), device=b.device) * 2 - 1).to(torch.float64)


def _constant_rows(b: Builder, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    rows = t.shape[0]
    mag = log_uniform((rows, 1), b.rng("x:const"), *CONSTANT_LOG2, device=b.device).to(torch.float64)
    value = (mag * _signs((rows, 1), b, "x:const-sign")).to(dtype)
    value[0] = 0  # the all-zero row: mean 0, variance 0
    even = (torch.arange(rows, device=b.device) % 2 == 0)[:, None]
    return torch.where(even, value.expand_as(t), t)


def _large_mean(b: Builder, rows: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """M + k * ulp(M), k in {-1, 0, 1}: row r deviates at 1, H / 64, H / 8 or H / 2 random columns (r % 4)."""
    mag = log_uniform((rows, 1), b.rng("x:mean"), *LARGE_MEAN_LOG2, device=b.device).to(torch.float64)
    m = (mag * _signs((rows, 1), b, "x:mean-sign")).to(dtype).to(torch.float64)
    step = ulp(m, dtype)
    counts = [(1, max(2, hidden // 64), max(2, hidden // 8), max(2, hidden // 2))[r % 4] for r in range(rows)]
    order = permutation(hidden, b.rng("x:cols"), rows=rows).to(b.device)  # [rows, hidden]
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(hidden, device=b.device).expand(rows, hidden).contiguous())
    chosen = rank < torch.tensor(counts, device=b.device)[:, None]
    k = _signs((rows, hidden), b, "x:dev-sign") * chosen
    return (m + k * step).to(dtype)


def _near_max(b: Builder, rows: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    top = NEAR_MAX * torch.finfo(dtype).max
    limit = min(top, float32_square_limit(hidden))
    u = uniform((rows, hidden), b.rng("x:near-max"), device=b.device).to(torch.float64)
    spread = (u * 2.0 - 1.0) * limit
    hi = min(top, float32_sum_limit(hidden))
    lo = min(2.0 ** SQUARE_OVERFLOW_LOG2, hi / 4)
    mag = log_uniform((rows, 1), b.rng("x:near-max-const"), math.log2(lo), math.log2(hi),
                      device=b.device).to(torch.float64)
    const = (mag * _signs((rows, 1), b, "x:near-max-sign")).expand(rows, hidden)
    even = (torch.arange(rows, device=b.device) % 2 == 0)[:, None]
    # rounding to the dtype may round up past its max (an inf): clamp to the dtype's largest finite value
    big = torch.finfo(dtype).max
    return torch.where(even, const, spread).clamp(-big, big).to(dtype)


def _activation(b: Builder, name: str) -> None:
    dtype = b.torch_dtype(name)
    rows, hidden = b.shape(name)
    if b.case == "large_mean":
        b.put(name, _large_mean(b, rows, hidden, dtype))
        return
    if b.case == "near_max":
        b.put(name, _near_max(b, rows, hidden, dtype))
        return
    scale = TINY if b.case in ("eps_min", "eps_max") else 1.0
    t = normal((rows, hidden), b.rng(name), scale=scale, device=b.device, dtype=dtype)
    if b.case == "constant_rows":
        t = _constant_rows(b, t, dtype)
    b.put(name, t)


def generate(b: Builder) -> None:
    unknown_inputs(b, ACTIVATIONS + WEIGHTS + BIASES + EPS_INPUTS, "layernorm")
    try:
        act, weight, bias, eps = names(b.definition)
    except KeyError:
        raise b.mismatch("layernorm needs one activation (hidden_states / input), one weight (weight / gemma) "
                         "and one bias (bias / beta)") from None
    if eps is not None and b.spec(eps).shape not in (None, []):
        raise b.mismatch(f"eps input {eps!r} must be a scalar (shape null)")
    if len(b.spec(act).shape or ()) != 2:
        raise b.mismatch(f"{act} must be [rows, hidden] (the API takes 2-D input)")
    if b.case is not None and b.case not in CASES:
        raise b.error(f"unknown case {b.case!r} (cases: {', '.join(CASES)})")
    rows = 1 if b.case == "single_token" else (BOUNDARY_ROWS[b.size] if b.case in BOUNDARY_CASES
                                               else b.count(ROWS[b.size]))
    bind_rows(b, [act], rows)
    b.put_random(weight, scale=WEIGHT_STD, mean=1.0)
    b.put_random(bias, scale=BIAS_STD)
    _activation(b, act)
    if eps is not None:
        put_eps(b, eps)

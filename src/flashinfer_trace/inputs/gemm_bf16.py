"""bf16 GEMM inputs (op_type `gemm_bf16`): FlashInfer's GEMMs over bfloat16 operands with a float32 sum over K.
Three call forms share the op type, told apart by their input names (FlashInfer's own parameter names):

* `A` [M, K], `B` [K, N] -> `C` (bf16): `flashinfer.gemm.mm_bf16(a, b, ...)`, C = A @ B;
* `input` [M, K], `weight` [N, K], `bias` [N] (optional) -> `out` (bf16): `flashinfer.gemm.tinygemm_bf16`,
  out = input @ weight^T + bias (F.linear);
* `mat_a` [M, K], `mat_b` [K, N] -> `out` (float32): the fixed-shape router GEMMs `mm_M1_16_K7168_N256` /
  `mm_M1_16_K6144_N256`, 1 to 16 tokens.

The weight is always generated row-major as the definition states it; the adapter hands each kernel the layout it
wants. Typical operands: activations N(0, 1), weights N(0, 1 / K) (outputs of variance ~1 whatever K is), bias
N(0, 1).

The boundary cases (docs/boundary/gemm_bf16.md says why each exists):

* `single_token`: M = 1 (a decode step).
* `max_tokens`: router definitions only: M = 16, the largest the router kernels take (two 8-row tiles).
* `zero_rows`: even rows of the activations are exactly 0: those output rows are exactly 0 (the bias, for
  tinygemm).
* `long_k_positive`: every activation U(0.5, 1) and every weight U(0.5, 1) / K: all products positive, outputs ~0.56.
  A float32 sum is exact to ~2^-24 K; a bfloat16 running sum stops growing once it is 2^8 times a term (its 8-bit
  significand: the next product is below half an ulp), so at K = 4096 it stalls near a tenth of the result.
* `near_bf16_max`: activations and weights N(0, 1) * 2^59 (weights / sqrt(K)): outputs ~2^118, the sum of
  |products| ~2^124.5, within 2^4 of bfloat16's (and float32's) largest value 2^128; past float16's 65504 by far
  (a float16 epilogue or accumulator gives inf) and products ~2^112 are still finite in float32.
* `subnormal`: activations k * 2^-130 (k = 1..7: bfloat16 subnormals, below the smallest normal 2^-126) and weights
  U(0.5, 1) * 2^122, both positive: each product ~2^-8 k, outputs ~K / 100. A kernel that flushes subnormal inputs
  to zero returns 0.
"""

from __future__ import annotations

import math

import torch

from .common import Builder, normal, random_tensor, uniform, unknown_inputs

OP_TYPES = ("gemm_bf16",)
FORMS = {  # activation, weight, bias (None: none), the weight's layout ("KN" or "NK")
    "mm": ("A", "B", None, "KN"),
    "tinygemm": ("input", "weight", "bias", "NK"),
    "router": ("mat_a", "mat_b", None, "KN"),
}
ROWS = {"small": 4, "medium": 32, "large": 256}
ROUTER_ROWS = {"small": 4, "medium": 8, "large": 16}
ROUTER_MAX_TOKENS = 16  # routergemm.py's _router_gemm_shape_checks: 1 <= M <= 16
CASES = ("single_token", "zero_rows", "long_k_positive", "near_bf16_max", "subnormal")
ROUTER_CASES = ("single_token", "max_tokens", "zero_rows", "long_k_positive", "near_bf16_max", "subnormal")
NEAR_MAX = 2.0 ** 59  # near_bf16_max: activations and weights (before / sqrt(K)) scaled by this
SUBNORMAL_STEP = 2.0 ** -130  # subnormal: activations k * 2^-130, k = 1..7 (bf16 normals start at 2^-126)
SUBNORMAL_WEIGHT = 2.0 ** 122  # subnormal: weights U(0.5, 1) * 2^122, so each product is ~2^-8 k


def form_of(definition) -> str | None:
    """Which call form a definition has: 'mm', 'tinygemm' or 'router' (by its activation's name), None if none."""
    for name, (act, w, _, _) in FORMS.items():
        if act in definition.inputs and w in definition.inputs:
            return name
    return None


def edge_cases(definition) -> list[str]:
    return list(ROUTER_CASES if form_of(definition) == "router" else CASES)


def _rows(b: Builder, form: str) -> int:
    if b.case == "single_token":
        return 1
    if b.case == "max_tokens":
        return ROUTER_MAX_TOKENS
    if form == "router":
        return b.count(ROUTER_ROWS[b.size], most=ROUTER_MAX_TOKENS)
    return b.count(ROWS[b.size])


def _activation(b: Builder, name: str) -> torch.Tensor:
    shape, dtype = b.shape(name), b.torch_dtype(name)
    if b.case == "long_k_positive":
        return (uniform(shape, b.rng(name), device=b.device) * 0.5 + 0.5).to(dtype)
    if b.case == "subnormal":
        k = torch.floor(uniform(shape, b.rng(name), device=b.device) * 7) + 1
        return (k * SUBNORMAL_STEP).to(dtype)
    t = random_tensor(shape, dtype, b.rng(name), scale=NEAR_MAX if b.case == "near_bf16_max" else 1.0,
                      device=b.device)
    if b.case == "zero_rows":
        t = torch.where((torch.arange(shape[0], device=b.device) % 2 == 0)[:, None], torch.zeros_like(t), t)
    return t


def _weight(b: Builder, name: str, k: int) -> torch.Tensor:
    shape, dtype = b.shape(name), b.torch_dtype(name)
    if b.case == "long_k_positive":
        return ((uniform(shape, b.rng(name), device=b.device) * 0.5 + 0.5) / k).to(dtype)
    if b.case == "subnormal":
        return ((uniform(shape, b.rng(name), device=b.device) * 0.5 + 0.5) * SUBNORMAL_WEIGHT).to(dtype)
    scale = (NEAR_MAX if b.case == "near_bf16_max" else 1.0) / math.sqrt(k)
    return normal(shape, b.rng(name), scale=scale, dtype=dtype, device=b.device)


def _bias(b: Builder, name: str) -> torch.Tensor:
    shape, dtype = b.shape(name), b.torch_dtype(name)
    if b.case == "long_k_positive":
        return (uniform(shape, b.rng(name), device=b.device) * 0.5 + 0.5).to(dtype)
    big = NEAR_MAX * NEAR_MAX if b.case == "near_bf16_max" else 1.0
    return random_tensor(shape, dtype, b.rng(name), scale=big, device=b.device)


def generate(b: Builder) -> None:
    form = form_of(b.definition)
    if form is None:
        raise b.mismatch("gemm_bf16 needs A and B (mm_bf16), input and weight (tinygemm_bf16) or mat_a and mat_b "
                         "(the router GEMMs)")
    act, w, bias, layout = FORMS[form]
    unknown_inputs(b, tuple(n for n in (act, w, bias) if n), f"gemm_bf16 ({form})")
    if len(b.spec(act).shape or ()) != 2 or len(b.spec(w).shape or ()) != 2:
        raise b.mismatch(f"{act} and {w} must be 2-D")
    k_axis = b.dim_axis(act, 1)
    if b.dim_axis(w, 0 if layout == "KN" else 1) != k_axis:
        want = "[K, N]" if layout == "KN" else "[N, K]"
        raise b.mismatch(f"{w} must be {want} with K = {act}'s last axis ({k_axis})")
    cases = ROUTER_CASES if form == "router" else CASES
    if b.case is not None and b.case not in cases:
        raise b.error(f"unknown case {b.case!r} (cases: {', '.join(cases)})")
    m_axis = b.dim_axis(act, 0)
    if m_axis not in b.definition.const_axes:
        b.set_axis(m_axis, _rows(b, form))
    k = b.axis(k_axis)
    b.put(act, _activation(b, act))
    b.put(w, _weight(b, w, k))
    if bias and b.has(bias):
        b.put(bias, _bias(b, bias))

"""GEMM inputs (op_type `gemm`): C = A @ B.T with A [M, K] (activations) and B [N, K] (weights).

A is N(0, 1) and B is N(0, 1/K), so every output element has variance ~1 whatever K is: fp16
outputs stay far from overflow and a wrong accumulation order shows as a real error, not noise.

The boundary cases (docs/boundary/dense.md says why each exists): rows of A that are zero, rows of A
that are one-hot (C's row is then a column of B times a power of two, exactly, so any rounding of the
operands shows in spite of the operand-scale error model), and `accumulator_range`, where each row of
A is +a on the first half of K and -a on the second against a positive B: the running sum passes
twice float16's largest value halfway through K and cancels back to a representable result.
"""

from __future__ import annotations

import math

import torch

from .common import Builder, bind_rows, float_tensor_inputs, random_tensor, uniform, unknown_inputs

OP_TYPES = ("gemm",)
ROWS = {"small": 4, "medium": 64, "large": 1024}
CASES = ("single_token", "large_values")
BOUNDARY_CASES = ("zero_rows", "one_hot_rows", "accumulator_range")
# The boundary cases are about A's rows and K; N only multiplies the work. They run where N <= this (every
# projection; not the vocabulary-wide lm_head or fused projections wider than 8192, whose weights, up to
# 1 GiB in fp16 and 4 GiB in the float64 ground truth, would add minutes of CPU per case for no new path),
# with 16 rows at the medium size: each keeps its point (zero, one-hot or cancelling rows at both ends).
BOUNDARY_MAX_N = 8192
BOUNDARY_ROWS = {"small": 4, "medium": 16, "large": 1024}
LARGE = 100.0  # `large_values` scales A only: outputs ~100, still finite in fp16
ACTIVATIONS = ("A", "a", "x", "input")
WEIGHTS = ("B", "b", "weight", "w")
FP16_MAX = 65504.0
PARTIAL_SUM = 2 * FP16_MAX  # `accumulator_range`: the expected running sum at K / 2


def edge_cases(definition) -> list[str]:
    n = definition.const_axes.get("N")
    return [*CASES, *BOUNDARY_CASES] if n is None or n <= BOUNDARY_MAX_N else list(CASES)


def one_hot_value(k: int) -> float:
    """The power of two nearest 16 sqrt(K): C = value * B[:, k] is ~16 (B is N(0, 1/K)), exact in fp16."""
    return 2.0 ** round(math.log2(16 * math.sqrt(k)))


def _activations(b: Builder, name: str) -> None:
    rows, k = b.shape(name)
    dtype = b.torch_dtype(name)
    if b.case == "one_hot_rows":  # row r: one_hot_value at column (K-1) (rows-1-r) / (rows-1): last to first
        t = torch.zeros(rows, k, dtype=dtype, device=b.device)
        cols = [(k - 1) * (rows - 1 - r) // max(rows - 1, 1) for r in range(rows)]
        t[torch.arange(rows, device=b.device), torch.tensor(cols, device=b.device)] = one_hot_value(k)
        b.put(name, t)
        return
    if b.case == "accumulator_range":  # a * U(0.5, 1), + on the first half of K, - on the second
        sign = torch.where(torch.arange(k, device=b.device) < k // 2, 1.0, -1.0)
        u = uniform((rows, k), b.rng(name), device=b.device)
        b.put(name, ((u * 0.5 + 0.5) * sign * _accumulator_scale(k)).to(dtype))
        return
    t = random_tensor((rows, k), dtype, b.rng(name), scale=LARGE if b.case == "large_values" else 1.0,
                      device=b.device)
    if b.case == "zero_rows":  # even rows of A are zero: C's rows are 0
        t = torch.where((torch.arange(rows, device=b.device) % 2 == 0)[:, None], torch.zeros_like(t), t)
    b.put(name, t)


def _accumulator_scale(k: int) -> float:
    """a = b with a * b * E[U(0.5, 1)]^2 * K / 2 = PARTIAL_SUM: A's and B's magnitude in `accumulator_range`."""
    return math.sqrt(PARTIAL_SUM / (0.5625 * max(k // 2, 1)))


def generate(b: Builder) -> None:
    unknown_inputs(b, ACTIVATIONS + WEIGHTS, "gemm")
    floats = float_tensor_inputs(b)
    if len(floats) != len(b.definition.inputs):
        raise b.error("gemm inputs must all be float tensors")
    acts = [n for n in floats if n in ACTIVATIONS]
    rows = 1 if b.case == "single_token" else (BOUNDARY_ROWS[b.size] if b.case in BOUNDARY_CASES
                                               else b.count(ROWS[b.size]))
    bind_rows(b, acts, rows)
    for name in floats:
        if name not in WEIGHTS:
            _activations(b, name)
            continue
        k = b.dim(name, -1)  # [N, K]: the contraction dimension is last
        if b.case == "accumulator_range":  # positive: the halves of K cancel only through A's signs
            u = uniform(b.shape(name), b.rng(name), device=b.device)
            b.put(name, ((u * 0.5 + 0.5) * _accumulator_scale(k)).to(b.torch_dtype(name)))
        else:
            b.put_random(name, scale=1.0 / math.sqrt(max(k, 1)))

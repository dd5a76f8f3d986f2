"""GEMM inputs (op_type `gemm`): C = A @ B.T with A [M, K] (activations) and B [N, K] (weights).

A is N(0, 1) and B is N(0, 1/K), so every output element has variance ~1 whatever K is: fp16
outputs stay far from overflow and a wrong accumulation order shows as a real error, not noise.
"""

from __future__ import annotations

import math

from .common import Builder, bind_rows, float_tensor_inputs, unknown_inputs

OP_TYPES = ("gemm",)
ROWS = {"small": 4, "medium": 64, "large": 1024}
CASES = ("single_token", "large_values")
LARGE = 100.0  # `large_values` scales A only: outputs ~100, still finite in fp16
ACTIVATIONS = ("A", "a", "x", "input")
WEIGHTS = ("B", "b", "weight", "w")


def edge_cases(definition) -> list[str]:
    return list(CASES)


def generate(b: Builder) -> None:
    unknown_inputs(b, ACTIVATIONS + WEIGHTS, "gemm")
    floats = float_tensor_inputs(b)
    if len(floats) != len(b.definition.inputs):
        raise b.error("gemm inputs must all be float tensors")
    acts = [n for n in floats if n in ACTIVATIONS]
    bind_rows(b, acts, 1 if b.case == "single_token" else ROWS[b.size])
    for name in floats:
        if name in WEIGHTS:
            k = b.dim(name, -1)  # [N, K]: the contraction dimension is last
            b.put_random(name, scale=1.0 / math.sqrt(max(k, 1)))
        else:
            b.put_random(name, scale=LARGE if b.case == "large_values" else 1.0)

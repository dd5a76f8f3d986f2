"""Gated activation inputs (op_type `activation`): `silu_and_mul` and its kin take one tensor
[num_tokens, 2 * intermediate] whose halves are the gate and the up projection.

Standard normal covers both signs of the gate (silu's negative lobe); `large_values` (x100) puts
the gate where exp(-x) overflows float32, which an overflow-safe sigmoid must survive.
"""

from __future__ import annotations

from .common import Builder, bind_rows, float_tensor_inputs

OP_TYPES = ("activation",)
ROWS = {"small": 4, "medium": 64, "large": 2048}
CASES = ("single_token", "large_values")
LARGE = 100.0


def edge_cases(definition) -> list[str]:
    return list(CASES)


def generate(b: Builder) -> None:
    floats = float_tensor_inputs(b)
    other = [n for n in b.definition.inputs if n not in floats]
    if other or not floats:
        raise b.error(f"the activation generator makes float tensors only; cannot make {', '.join(other)}")
    bind_rows(b, floats, 1 if b.case == "single_token" else ROWS[b.size])
    for name in floats:
        b.put_random(name, scale=LARGE if b.case == "large_values" else 1.0)

"""RMSNorm inputs (op_type `rmsnorm`): `rmsnorm` (hidden_states, weight, eps) and `fused_add_rmsnorm`
(hidden_states, residual, weight, eps), told apart by input name.

Activations are standard normal (bf16 activations of a real model are O(1) after the previous
layer's norm); the weight is 1 + 0.1 * N(0, 1), so a wrong broadcast or a dropped weight shows.
eps, a scalar input where the definition declares one (as FlashInfer's `rmsnorm(input, weight, eps)`
takes it), is log-uniform in EPS_RANGE, the models' rms_norm_eps values (1e-6: Qwen3, DeepSeek; 1e-5:
Llama, Mixtral, Nemotron-H).
"""

from __future__ import annotations

import math

from .common import Builder, bind_rows, float_tensor_inputs, log_uniform, unknown_inputs

OP_TYPES = ("rmsnorm",)
ROWS = {"small": 4, "medium": 64, "large": 2048}
CASES = ("single_token", "large_values", "tiny_values")
LARGE = 100.0  # `large_values`: activations * 100, so x**2 summed over 4096 channels needs float32
# `tiny_values`: activations * 1e-3, so mean(x**2) ~ 1e-6 is of the order of eps and a wrong eps shows
# (the planted eps 1e-6-for-1e-5 bug passed every other case: mutants.py)
TINY = 1e-3
EPS_RANGE = (1e-6, 1e-5)
WEIGHTS = ("weight", "gamma")
ACTIVATIONS = ("hidden_states", "residual", "input", "x")
EPS_INPUTS = ("eps", "epsilon")


def edge_cases(definition) -> list[str]:
    return list(CASES)


def generate(b: Builder) -> None:
    unknown_inputs(b, WEIGHTS + ACTIVATIONS + EPS_INPUTS, "rmsnorm")
    scalars = [n for n in b.definition.inputs if n in EPS_INPUTS and b.spec(n).shape in (None, [])]
    floats = [n for n in float_tensor_inputs(b) if n not in scalars]
    if len(floats) + len(scalars) != len(b.definition.inputs):
        raise b.error("rmsnorm inputs must be float tensors and a scalar eps")
    acts = [n for n in floats if n in ACTIVATIONS]
    rows = 1 if b.case == "single_token" else ROWS[b.size]
    bind_rows(b, acts, rows)
    scale = {"large_values": LARGE, "tiny_values": TINY}.get(b.case, 1.0)
    for name in floats:
        if name in WEIGHTS:
            b.put_random(name, scale=0.1, mean=1.0)
        else:
            b.put_random(name, scale=scale)
    for name in scalars:
        lo, hi = (math.log2(e) for e in EPS_RANGE)
        b.put_scalar(name, log_uniform((1,), b.rng(name), lo, hi).item())

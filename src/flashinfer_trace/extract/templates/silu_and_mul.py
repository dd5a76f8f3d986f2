"""SwiGLU activation: `silu_and_mul_i{intermediate_size}`, op_type activation
(flashinfer.activation.silu_and_mul: silu on the FIRST half)."""

from __future__ import annotations

from typing import Any

from ._common import STATUS, const_axis, definition, positive_int, tensor, var_axis

REFERENCE = """import torch


@torch.no_grad()
def run(input):
    x = input.to(torch.float32)
    half = x.shape[-1] // 2
    gate = x[:, :half]  # first half: gate projection
    up = x[:, half:]  # second half: up projection
    silu_gate = gate * torch.sigmoid(gate)  # silu(g) = g * sigmoid(g)
    return (silu_gate * up).to(input.dtype)
"""


def silu_and_mul(intermediate_size: int) -> dict[str, Any]:
    i = positive_int("intermediate_size", intermediate_size)
    return definition(
        name=f"silu_and_mul_i{i}",
        op_type="activation",
        description=(
            "SwiGLU activation of a gated MLP: the fused gate_up projection output [num_tokens, 2 * I] is split in "
            f"half along the last dimension and output = silu(x[:, :I]) * x[:, I:], with I = {i}. The GATE is the "
            "FIRST half and silu is applied to it (the FlashInfer / vLLM / SGLang convention for silu_and_mul; note "
            "the trtllm MoE kernels use the opposite order). silu(g) = g * sigmoid(g), computed in float32; the "
            "result is rounded to bfloat16 once."
        ),
        tags=[STATUS, "fi_api:flashinfer.activation.silu_and_mul"],
        axes={
            "num_tokens": var_axis("Number of tokens (rows)."),
            "intermediate_size": const_axis(i, "MLP intermediate size (per tensor-parallel rank)."),
            "gate_up_size": const_axis(2 * i, "Width of the fused gate_up projection output, 2 * intermediate_size."),
        },
        constraints=["gate_up_size == 2 * intermediate_size"],
        inputs={
            "input": tensor(["num_tokens", "gate_up_size"], "bfloat16",
                            "Concatenated [gate, up] projections: columns [0, I) are the gate, [I, 2I) the up "
                            "projection."),
        },
        outputs={"output": tensor(["num_tokens", "intermediate_size"], "bfloat16", "silu(gate) * up.")},
        reference=REFERENCE,
    )

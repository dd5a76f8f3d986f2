"""Residual add fused with RMSNorm: `fused_add_rmsnorm_h{hidden_size}`, op_type rmsnorm
(flashinfer.norm.fused_add_rmsnorm).

The public dataset's contract for these names: run(hidden_states, residual, weight) returning the
normalised result only, no eps input. The model's rms_norm_eps is a `param:eps=<value>` tag (what a
ground truth reads) and a constant of the reference (docs/definitions.md, "Public names keep the public
contract"). The residual the kernel writes in place is checked by the hand-written
`fused_add_rmsnorm_h4096_fp16`, which keeps it as a second output and takes eps per call."""

from __future__ import annotations

from typing import Any

from ._common import (
    STATUS,
    const_axis,
    definition,
    format_float,
    positive_float,
    positive_int,
    replace_once,
    tensor,
    var_axis,
)

REFERENCE = """import torch

EPS = {eps}  # the model's rms_norm_eps, as the param:eps tag declares it


@torch.no_grad()
def run(hidden_states, residual, weight):
    # Residual add in float32; the norm reads this unrounded sum (the kernel stores a bf16 copy of it
    # in residual, which is not an output of this definition).
    s = hidden_states.to(torch.float32) + residual.to(torch.float32)
    inv_rms = torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return (s * inv_rms * weight.to(torch.float32)).to(hidden_states.dtype)
"""


def fused_add_rmsnorm(hidden_size: int, eps: float) -> dict[str, Any]:
    """`eps` (the model's rms_norm_eps) is written as a `param:eps` tag and the reference's constant."""
    hidden_size = positive_int("hidden_size", hidden_size)
    text = format_float(positive_float("eps", eps))
    row = ["batch_size", "hidden_size"]
    return definition(
        name=f"fused_add_rmsnorm_h{hidden_size}",
        op_type="rmsnorm",
        description=(
            f"Residual add fused with RMSNorm over the hidden dimension (hidden_size = {hidden_size}), the pattern "
            "between the sublayers of a pre-norm transformer decoder: s = hidden_states + residual (in float32); "
            f"output = s * rsqrt(mean(s^2) + eps) * weight, rounded to bfloat16 once; eps = {text}, the model's "
            f"rms_norm_eps, is fixed by the definition (a param:eps={text} tag), not an input, and output is the "
            "only output: the public dataset's contract for this name. The kernel "
            "(flashinfer.norm.fused_add_rmsnorm(input, residual, weight, eps)) returns nothing: it writes output "
            "into hidden_states and s, rounded to bfloat16, into residual, in place; an adapter reads output back "
            "from its (copied) hidden_states. The norm uses the UNROUNDED float32 sum. The residual write is "
            "checked by fused_add_rmsnorm_h4096_fp16, which lists it as a second output."
        ),
        tags=[STATUS, "fi_api:flashinfer.norm.fused_add_rmsnorm", "fused", f"param:eps={text}"],
        axes={
            "batch_size": var_axis("Number of rows (tokens)."),
            "hidden_size": const_axis(hidden_size, "Model hidden size."),
        },
        constraints=[],
        inputs={
            "hidden_states": tensor(row, "bfloat16",
                                    "Sublayer output to add to the residual stream (the kernel overwrites it with "
                                    "output)."),
            "residual": tensor(row, "bfloat16",
                               "Residual stream before the add (the kernel overwrites it with the sum)."),
            "weight": tensor(["hidden_size"], "bfloat16", "Learned per-channel scale (gamma)."),
        },
        outputs={
            "output": tensor(row, "bfloat16", "RMSNorm of the float32 sum hidden_states + residual, times weight."),
        },
        reference=replace_once(REFERENCE, "{eps}", text),
    )

"""Residual add fused with RMSNorm: `fused_add_rmsnorm_h{hidden_size}`, op_type rmsnorm
(flashinfer.norm.fused_add_rmsnorm), with the normalised result and the updated residual as outputs."""

from __future__ import annotations

from typing import Any

from ._common import STATUS, const_axis, definition, positive_float, positive_int, tensor, var_axis

REFERENCE = """import torch


@torch.no_grad()
def run(hidden_states, residual, weight, eps):
    # Residual add in float32; the updated residual stream is rounded to bfloat16 for storage ...
    s = hidden_states.to(torch.float32) + residual.to(torch.float32)
    residual_out = s.to(residual.dtype)
    # ... but the norm reads the unrounded float32 sum.
    inv_rms = torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps)
    output = (s * inv_rms * weight.to(torch.float32)).to(hidden_states.dtype)
    return output, residual_out
"""


def fused_add_rmsnorm(hidden_size: int, eps: float) -> dict[str, Any]:
    """`eps` (the model's rms_norm_eps) is checked but not written: the definition takes eps per call."""
    hidden_size = positive_int("hidden_size", hidden_size)
    positive_float("eps", eps)
    row = ["batch_size", "hidden_size"]
    return definition(
        name=f"fused_add_rmsnorm_h{hidden_size}",
        op_type="rmsnorm",
        description=(
            f"Residual add fused with RMSNorm over the hidden dimension (hidden_size = {hidden_size}), the pattern "
            "between the sublayers of a pre-norm transformer decoder: s = hidden_states + residual (in float32); "
            "residual_out = s rounded to bfloat16; output = s * rsqrt(mean(s^2) + eps) * weight, rounded to "
            "bfloat16; eps is an input, as the kernel takes it (flashinfer.norm.fused_add_rmsnorm(input, residual, "
            "weight, eps)); the models here call it with their config's rms_norm_eps, 1e-6 or 1e-5. The norm uses "
            "the UNROUNDED float32 sum s, not residual_out, so output can differ in the last bf16 bit from "
            "rmsnorm(residual_out). The kernel "
            "(flashinfer.norm.fused_add_rmsnorm) returns nothing: it writes the normalised result into "
            "hidden_states and the updated residual into residual, in place. Both are results the model consumes "
            "(output feeds the next projection, residual_out is the residual stream the next layer adds to), so "
            "this definition lists both as outputs; an adapter for the in-place kernel reads them back from its "
            "(copied) input buffers."
        ),
        tags=[STATUS, "fi_api:flashinfer.norm.fused_add_rmsnorm", "fused"],
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
                               "Residual stream before the add (the kernel overwrites it with residual_out)."),
            "weight": tensor(["hidden_size"], "bfloat16", "Learned per-channel scale (gamma)."),
            "eps": tensor(None, "float32", "Added to mean(s^2) before the reciprocal square root (the model's "
                                           "rms_norm_eps)."),
        },
        outputs={
            "output": tensor(row, "bfloat16", "RMSNorm of the float32 sum hidden_states + residual, times weight."),
            "residual_out": tensor(row, "bfloat16",
                                   "Updated residual stream hidden_states + residual, rounded to bfloat16."),
        },
        reference=REFERENCE,
    )

"""RMSNorm: `rmsnorm_h{hidden_size}`, op_type rmsnorm (flashinfer.norm.rmsnorm)."""

from __future__ import annotations

from typing import Any

from ._common import STATUS, const_axis, definition, positive_float, positive_int, tensor, var_axis

REFERENCE = """import torch


@torch.no_grad()
def run(hidden_states, weight, eps):
    x = hidden_states.to(torch.float32)
    # 1 / RMS of each row, in float32
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    y = x * inv_rms * weight.to(torch.float32)
    return y.to(hidden_states.dtype)
"""

EPS_TEXT = ("eps is an input, as the kernel takes it (flashinfer.norm.rmsnorm(input, weight, eps)); the models here "
            "call it with their config's rms_norm_eps, 1e-6 or 1e-5")


def rmsnorm(hidden_size: int, eps: float) -> dict[str, Any]:
    """`eps` (the model's rms_norm_eps) is checked but not written: the definition takes eps per call, so
    models with another eps share the kernel."""
    hidden_size = positive_int("hidden_size", hidden_size)
    positive_float("eps", eps)
    row = ["batch_size", "hidden_size"]
    return definition(
        name=f"rmsnorm_h{hidden_size}",
        op_type="rmsnorm",
        description=(
            f"Root-mean-square layer normalisation over the hidden dimension (hidden_size = {hidden_size}), as in "
            "the decoder layers of Llama-style models (input_layernorm, post_attention_layernorm) and their final "
            f"norm: output = x * rsqrt(mean(x^2) + eps) * weight; {EPS_TEXT}. Each row (token) is "
            "normalised on its own; the reduction, scaling and weight multiply are done in float32 and the result "
            "is rounded to bfloat16 once. There is no bias and no mean subtraction (this is not LayerNorm), and "
            "the weight is applied as-is (not 1 + weight as in Gemma)."
        ),
        tags=[STATUS, "fi_api:flashinfer.norm.rmsnorm"],
        axes={
            "batch_size": var_axis("Number of rows (tokens) normalised independently."),
            "hidden_size": const_axis(hidden_size, "Model hidden size."),
        },
        constraints=[],
        inputs={
            "hidden_states": tensor(row, "bfloat16", "Input activations, one row per token."),
            "weight": tensor(["hidden_size"], "bfloat16", "Learned per-channel scale (gamma)."),
            "eps": tensor(None, "float32", "Added to mean(x^2) before the reciprocal square root (the model's "
                                           "rms_norm_eps)."),
        },
        outputs={"output": tensor(row, "bfloat16", "Normalised and scaled activations.")},
        reference=REFERENCE,
    )

"""RMSNorm: `rmsnorm_h{hidden_size}`, op_type rmsnorm (flashinfer.norm.rmsnorm).

The public dataset's contract for these names: run(hidden_states, weight), no eps input. The model's
rms_norm_eps is a `param:eps=<value>` tag (what a ground truth reads) and a constant of the reference
(docs/definitions.md, "Public names keep the public contract")."""

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
def run(hidden_states, weight):
    x = hidden_states.to(torch.float32)
    # 1 / RMS of each row, in float32
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)
    y = x * inv_rms * weight.to(torch.float32)
    return y.to(hidden_states.dtype)
"""


def eps_text(eps: str) -> str:
    return (f"eps = {eps}, the model's rms_norm_eps, is fixed by the definition (a param:eps={eps} tag), not an "
            "input: the public dataset's contract for this name (flashinfer.norm.rmsnorm takes it per call)")


def rmsnorm(hidden_size: int, eps: float) -> dict[str, Any]:
    """`eps` (the model's rms_norm_eps) is written as a `param:eps` tag and the reference's constant; a
    model with another eps gets another definition (extract reports the conflict and versions it)."""
    hidden_size = positive_int("hidden_size", hidden_size)
    text = format_float(positive_float("eps", eps))
    row = ["batch_size", "hidden_size"]
    return definition(
        name=f"rmsnorm_h{hidden_size}",
        op_type="rmsnorm",
        description=(
            f"Root-mean-square layer normalisation over the hidden dimension (hidden_size = {hidden_size}), as in "
            "the decoder layers of Llama-style models (input_layernorm, post_attention_layernorm) and their final "
            f"norm: output = x * rsqrt(mean(x^2) + eps) * weight; {eps_text(text)}. Each row (token) is "
            "normalised on its own; the reduction, scaling and weight multiply are done in float32 and the result "
            "is rounded to bfloat16 once. There is no bias and no mean subtraction (this is not LayerNorm), and "
            "the weight is applied as-is (not 1 + weight as in Gemma)."
        ),
        tags=[STATUS, "fi_api:flashinfer.norm.rmsnorm", f"param:eps={text}"],
        axes={
            "batch_size": var_axis("Number of rows (tokens) normalised independently."),
            "hidden_size": const_axis(hidden_size, "Model hidden size."),
        },
        constraints=[],
        inputs={
            "hidden_states": tensor(row, "bfloat16", "Input activations, one row per token."),
            "weight": tensor(["hidden_size"], "bfloat16", "Learned per-channel scale (gamma)."),
        },
        outputs={"output": tensor(row, "bfloat16", "Normalised and scaled activations.")},
        reference=replace_once(REFERENCE, "{eps}", text),
    )

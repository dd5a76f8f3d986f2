"""Independent float64 ground truth for `moe_routing` (DeepSeek-V3's grouped top-k, noaux_tc), written from the
math, not from the definitions' references.

The routing itself is torch_ref.deepseek_routing, the float64 routing the MoE family's truth already uses
(written from DeepSeek-V3's description: s = sigmoid(logits); biased = s + bias; group score = sum of the two
largest biased scores of each contiguous group; the topk_group best groups kept; the topk best biased scores
inside them; weights = s of the chosen experts / their sum * routed_scaling_factor). It matches FlashInfer's
documented contract step by step (fused_topk_deepseek's docstring, 0.6.0 .. 0.7.2.post1); the kernel's extra
`+ 1e-20` in the normalising sum is below float32's resolution of any sum it divides by (every s is > 0 for a
finite logit: float32's sigmoid of -40 is 4e-18, a normal number), so the truth leaves it out. Equal scores go to
the lowest id (a stable sort): one valid selection; verdict/moe_routing.py accepts any the contract allows.

n_group, topk_group and routed_scaling_factor come from the definition's param: tags (inputs/moe_routing.py's
params); outputs are (topk_values in the dtype of scores, topk_indices int32), rounded once.
"""

from __future__ import annotations

import torch

from ..dtypes import torch_dtype
from ..inputs.moe_routing import params
from .base import Adapter, Call, GroundTruthUnavailable
from .torch_ref import deepseek_routing

F64 = torch.float64
INPUTS = ("scores", "bias")
PARAMS = ("n_group", "topk_group", "routed_scaling_factor")
OUTPUTS = ("topk_values", "topk_indices")


def applies(definition) -> str | None:
    missing = [n for n in INPUTS if n not in definition.inputs]
    if missing:
        return f"needs inputs {', '.join(missing)}"
    if tuple(definition.outputs) != OUTPUTS:
        return f"outputs must be {', '.join(OUTPUTS)}"
    if "topk" not in definition.const_axes:
        return "needs a const axis topk"
    p = params(definition)
    absent = [n for n in PARAMS if n not in p]
    return f"needs param: tags {', '.join(absent)}" if absent else None


def config(definition) -> tuple[int, int, int, float]:
    """(n_group, topk_group, topk, routed_scaling_factor)."""
    why = applies(definition)
    if why is not None:
        raise GroundTruthUnavailable("unsupported", f"{definition.name}: {why}")
    p = params(definition)
    return (int(p["n_group"]), int(p["topk_group"]), int(definition.const_axes["topk"]),
            float(p["routed_scaling_factor"]))


def sigmoid_scores(values: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, biased) in float64 on the CPU: what every selection and weight is judged by."""
    s = torch.sigmoid(values["scores"].detach().cpu().to(F64))
    return s, s + values["bias"].detach().cpu().to(F64)[None, :]


def route(definition, values: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 weights [T, topk], int64 ids [T, topk]) of one valid selection."""
    n_group, topk_group, topk, scale = config(definition)
    ids, w = deepseek_routing(values["scores"].detach().cpu(), values["bias"].detach().cpu(), topk, n_group,
                              topk_group, scale)
    return w, ids


def moe_routing(call: Call) -> tuple:
    d = call.definition
    w, ids = route(d, call.inputs.values)
    return w.to(torch_dtype(d.outputs["topk_values"].dtype)), ids.to(torch.int32)


ADAPTERS = [
    Adapter("torch", "moe_routing", "torch_ref.deepseek_routing (float64 grouped top-k)", moe_routing,
            applies=applies),
]

"""DeepSeek-V3 grouped top-k routing inputs (op_type `moe_routing`): FlashInfer's
`fused_topk_deepseek(scores, bias, n_group, topk_group, topk, routed_scaling_factor, topk_values, topk_indices)`.
`scores` [num_tokens, num_experts] are router logits, `bias` [num_experts] the per-expert correction bias; n_group,
topk_group and routed_scaling_factor come from the definition's `param:` tags (semantics: params()).

Typical rows: logits N(0, 2) (a trained gate's spread: the chosen experts' sigmoids lie well inside (0, 1)) and a
bias N(0, 0.05), the size of the load-balancing corrections: large enough to change some selections, small
enough that the weights (unbiased) and the selection scores (biased) differ by a few percent.

The boundary cases (docs/boundary/moe_routing.md says why each exists and what the API promises):

* `single_token`: one token (the kernel's grid is one block per token; a path that squeezes the token axis).
* `expert_ties`: logits on a coarse grid (multiples of 1/2 in [-2, 2]) and a zero bias: many experts share one
  biased score exactly, so the topk-th and (topk+1)-th experts tie in most rows: several selections are right,
  each with its own weights (recomputed from the selection by the verdict).
* `group_ties` (n_group > 1 only): every group of a row holds the same multiset of logits (a per-group
  permutation of one draw) and the bias is one value for every expert: every group scores the same exactly,
  so which topk_group groups are kept is a pure tie-break, and the experts straddling the topk cut tie across
  groups.
* `bias_flips`: a bias of +-0.5 on alternate experts, as large as the sigmoid's range: it decides the selection
  against the raw scores (an expert with a low logit but a large bias is chosen), and the weights, taken from
  the unbiased sigmoids, are far from the biased scores: a kernel that selects by s, or weighs by s + bias, is
  off by the bias itself.
* `bias_cancels`: bias = -0.5 for every expert; even rows have every logit exactly 0, so s = 0.5 and the biased
  score is exactly 0 for every expert (every group score 0: the whole row is one tie, and each weight is exactly
  routed_scaling_factor / topk); odd rows are typical logits made negative (s < 0.5), so every biased score lies
  in (-0.5, 0): negative selection scores (a kernel that pads with 0 instead of -inf picks a padded lane).
* `saturated_high`: logits in [16, 40]: float32's sigmoid is 1.0 for all of them (1 - 2^-24 below ~16.6), so
  selection is decided by the bias alone and the weights are routed_scaling_factor / topk to float32 precision.
* `saturated_low`: logits in [-40, -20] for every expert: s is 2e-9 .. 4e-18, exact in float32 (not flushed:
  its normal range goes to 1.2e-38), so the weights s / sum(s) are well defined and dominated by the largest
  logit; a sigmoid written as 0.5 * tanh(x / 2) + 0.5 in float32 returns exactly 0 below about -17 and with it
  weights of 0 (the documented formula has no such floor).
* `many_tokens`: 4096 tokens (a prefill batch): one block per token, so a grid-stride or indexing error past
  the first few blocks shows here.
"""

from __future__ import annotations

import torch

from ..definition import param_tag
from .common import Builder, normal, permutation, uniform, unknown_inputs

OP_TYPES = ("moe_routing",)
INPUTS = ("scores", "bias")
TOKENS = {"small": 4, "medium": 64, "large": 1024}
BOUNDARY_TOKENS = 16
MANY_TOKENS = 4096
LOGIT_STD = 2.0
BIAS_STD = 0.05
CASES = ("single_token", "expert_ties", "group_ties", "bias_flips", "bias_cancels", "saturated_high",
         "saturated_low", "many_tokens")


def params(definition) -> dict[str, float | int]:
    """n_group, topk_group, routed_scaling_factor from the definition's param: tags (missing ones absent)."""
    found: dict[str, float | int] = {}
    for tag in definition.tags or ():
        p = param_tag(tag)
        if p is not None and p[0] in ("n_group", "topk_group", "routed_scaling_factor"):
            found[p[0]] = p[1]
    return found


def edge_cases(definition) -> list[str]:
    grouped = int(params(definition).get("n_group", 1)) > 1
    return [c for c in CASES if c != "group_ties" or grouped]


def _scores(b: Builder, shape: tuple[int, int], n_group: int) -> torch.Tensor:
    tokens, experts = shape
    dev = b.device
    if b.case == "expert_ties":
        return torch.round(normal(shape, b.rng("scores"), scale=1.0, device=dev).clamp(-2, 2) * 2) / 2
    if b.case == "group_ties":
        per = experts // n_group
        one = normal((tokens, per), b.rng("scores"), scale=LOGIT_STD, device=dev)
        order = permutation(per, b.rng("scores:perm"), rows=tokens * n_group, device=dev)
        order = order.view(tokens, n_group, per)
        return torch.gather(one[:, None, :].expand(tokens, n_group, per), 2, order).reshape(tokens, experts)
    if b.case == "bias_cancels":  # odd rows: negative logits (s < 0.5); even rows: all 0 (s = 0.5 exactly)
        x = -normal(shape, b.rng("scores"), scale=LOGIT_STD, device=dev).abs()
        x[0::2] = 0.0
        return x
    if b.case == "saturated_high":
        return 16.0 + 24.0 * uniform(shape, b.rng("scores"), device=dev)
    if b.case == "saturated_low":
        return -40.0 + 20.0 * uniform(shape, b.rng("scores"), device=dev)
    return normal(shape, b.rng("scores"), scale=LOGIT_STD, device=dev)


def _bias(b: Builder, experts: int, n_group: int) -> torch.Tensor:
    dev = b.device
    if b.case == "expert_ties":
        return torch.zeros(experts, device=dev)
    if b.case == "group_ties":  # one value for every expert: the groups' multisets stay equal after the bias
        return normal((1,), b.rng("bias"), scale=BIAS_STD, device=dev).expand(experts).contiguous()
    if b.case == "bias_flips":
        return 0.5 * (1.0 - 2.0 * (torch.arange(experts, device=dev) % 2).to(torch.float32))
    if b.case == "bias_cancels":
        return torch.full((experts,), -0.5, device=dev)
    return normal((experts,), b.rng("bias"), scale=BIAS_STD, device=dev)


def generate(b: Builder) -> None:
    unknown_inputs(b, INPUTS, "moe_routing")
    missing = [n for n in INPUTS if n not in b.definition.inputs]
    if missing:
        raise b.mismatch(f"moe_routing needs inputs {', '.join(INPUTS)} (missing {', '.join(missing)})")
    if len(b.spec("scores").shape or ()) != 2 or len(b.spec("bias").shape or ()) != 1:
        raise b.mismatch("scores must be [num_tokens, num_experts] and bias [num_experts]")
    p = params(b.definition)
    if "n_group" not in p or "topk_group" not in p:
        raise b.mismatch("moe_routing needs param:n_group and param:topk_group tags")
    n_group = int(p["n_group"])
    if b.case is not None and b.case not in edge_cases(b.definition):
        raise b.error(f"unknown case {b.case!r} (cases: {', '.join(edge_cases(b.definition))})")
    tokens_axis, experts_axis = b.dim_axis("scores", 0), b.dim_axis("scores", 1)
    if experts_axis not in b.definition.const_axes:
        raise b.mismatch(f"{experts_axis} must be a const axis (the expert count)")
    experts = int(b.definition.const_axes[experts_axis])
    if n_group < 1 or experts % n_group:
        raise b.mismatch(f"num_experts {experts} is no multiple of n_group {n_group}")
    if tokens_axis not in b.definition.const_axes:
        tokens = {"single_token": 1, "many_tokens": MANY_TOKENS}.get(b.case or "", b.count(TOKENS[b.size])
                                                                       if b.case is None else BOUNDARY_TOKENS)
        b.set_axis(tokens_axis, tokens)
    shape = b.shape("scores")
    b.put("scores", _scores(b, shape, n_group).to(b.torch_dtype("scores")))
    b.put("bias", _bias(b, experts, n_group).to(b.torch_dtype("bias")))

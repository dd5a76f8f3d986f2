"""Planted bugs of the `moe_routing` family (flashinfer.fused_moe.fused_topk_deepseek: docs/boundary/moe_routing.md),
one or more per boundary class and the plain ones, each a text edit of a shipped definition's reference: a
boundary mutant is right on typical rows and caught by the case its comment names; a plain one is caught
everywhere. mutants.py appends them to its MUTANTS; tests/unit/test_moe_routing.py checks each."""

from __future__ import annotations

from .mutants_model import Mutant, _m, _writes

DS = "fused_topk_deepseek_e256_k8"
BF16 = "fused_topk_deepseek_e256_k8_bf16"
ALL8 = "fused_topk_deepseek_e128_k8_ng8_kg8_bf16"
K1 = "fused_topk_deepseek_e384_k1_fp16"
_S = "    s = torch.sigmoid(scores.to(torch.float32))\n"
_BIASED = "    biased = s + bias.to(torch.float32)[None, :]\n"
_GROUPS = "    grouped = biased.view(tokens, n_group, experts // n_group)\n"
_GSCORE = "    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)\n"
_KEPT = "    kept = group_scores.topk(topk_group, dim=-1).indices\n"
_MASK = '    candidates = grouped.masked_fill(~keep[:, :, None], float("-inf")).view(tokens, experts)\n'
_PICK = "    topk_indices = candidates.topk(topk, dim=-1).indices\n"
_W = "    w = s.gather(1, topk_indices)\n"
_NORM = "    topk_values = w / w.sum(dim=-1, keepdim=True) * routed_scaling_factor\n"
_RET = "    return topk_values.to(scores.dtype), topk_indices.to(torch.int32)\n"

MUTANTS: tuple[Mutant, ...] = (
    # saturated_low: the sigmoid as 0.5 * tanh(x / 2) + 0.5 in float32 (the CUDA kernel's sigmoid_accurate) is
    # exactly 0 below about -17: every weight of such a row is 0 / 0
    _m(DS, "tanh-sigmoid", "sigmoid as 0.5 * tanh(x / 2) + 0.5 in float32 (0 below x ~ -17, not exp(x))",
       (_S, "    s = 0.5 * torch.tanh(0.5 * scores.to(torch.float32)) + 0.5\n"), cls="boundary-magnitude"),
    # bias_cancels: the dropped groups padded with 0 rather than -inf: right while every biased score is
    # positive, wrong once the bias makes them negative (a padded expert outranks every kept one)
    _m(DS, "zero-padded-groups", "experts of the dropped groups padded with 0, not -inf (biased scores < 0)",
       (_MASK, _MASK.replace('float("-inf")', "0.0")), cls="boundary-magnitude"),
    # expert_ties: the k ids found by value, each as the first expert holding it: a tie at the cut gives one
    # expert twice
    _m(DS, "tie-duplicates", "each chosen value mapped back to the first expert with that value (a tie: twice)",
       (_PICK, "    vals = candidates.topk(topk, dim=-1).values\n"
               "    topk_indices = (candidates[:, None, :] == vals[:, :, None]).int().argmax(dim=-1)\n"),
       cls="boundary-ties"),
    # group_ties: the kept groups found by score the same way: equal group scores keep one group several times,
    # so fewer than topk_group groups are searched
    _m(DS, "group-tie-duplicates", "each kept group score mapped back to the first group with it (a tie: twice)",
       (_KEPT, "    gvals = group_scores.topk(topk_group, dim=-1).values\n"
               "    kept = (group_scores[:, None, :] == gvals[:, :, None]).int().argmax(dim=-1)\n"),
       cls="boundary-ties"),
    # single_token: a decode path that squeezes the token axis: [topk] rather than [1, topk]
    _m(BF16, "token-axis-squeezed", "the token axis squeezed away for one token",
       (_RET, "    return topk_values.to(scores.dtype).squeeze(0), topk_indices.to(torch.int32).squeeze(0)\n"),
       cls="boundary-structure"),
    # many_tokens: a grid capped at 1024 blocks: tokens past it keep whatever the buffer held (expert 0)
    _m(DS, "grid-capped-at-1024", "tokens past the first 1024 never routed (their ids left 0)",
       (_PICK, _PICK + "    topk_indices[1024:] = 0\n"), cls="boundary-structure"),
    # plain bugs: caught on typical rows
    _m(DS, "weights-from-biased", "weights from the biased scores s + bias (the selection score), not s",
       (_W, "    w = biased.gather(1, topk_indices)\n")),
    _m(DS, "bias-ignored", "experts and groups selected by s alone, the correction bias never added",
       (_BIASED, "    biased = s\n")),
    _m(DS, "group-score-max", "a group scored by its best expert alone, not the sum of its best two",
       (_GSCORE, "    group_scores = grouped.max(dim=-1).values\n")),
    _m(DS, "group-score-sum-all", "a group scored by the sum of all its experts",
       (_GSCORE, "    group_scores = grouped.sum(dim=-1)\n")),
    _m(DS, "strided-groups", "group g taken as experts g, g + n_group, ... (strided), not a contiguous block",
       (_GROUPS, "    grouped = biased.view(tokens, experts // n_group, n_group).transpose(1, 2).contiguous()\n"),
       (_MASK, _MASK.replace(".view(tokens, experts)", ".transpose(1, 2).reshape(tokens, experts)"))),
    _m(DS, "one-group-short", "topk_group - 1 groups kept (an off-by-one in the group count)",
       (_KEPT, "    kept = group_scores.topk(topk_group - 1, dim=-1).indices\n")),
    _m(ALL8, "groups-capped-at-4", "at most 4 groups kept (group registers sized for DeepSeek's topk_group 4)",
       (_KEPT, "    kept = group_scores.topk(min(topk_group, 4), dim=-1).indices\n")),
    _m(DS, "no-renormalisation", "the chosen s times routed_scaling_factor, never divided by their sum",
       (_NORM, "    topk_values = w * routed_scaling_factor\n")),
    _m(K1, "no-scaling", "routed_scaling_factor never applied (the weights sum to 1)",
       (_NORM, "    topk_values = w / w.sum(dim=-1, keepdim=True)\n")),
    _m(DS, "normalised-over-all-experts", "the chosen s divided by the sum of s over every expert",
       (_NORM, "    topk_values = w / s.sum(dim=-1, keepdim=True) * routed_scaling_factor\n")),
    _m(BF16, "softmax-scores", "scores from a softmax over the experts (Mixtral's gate), not a sigmoid",
       (_S, "    s = torch.softmax(scores.to(torch.float32), dim=-1)\n")),
    _writes(DS, "writes-bias", "right outputs, but the caller's bias zeroed in place afterwards", _RET, "bias.zero_()",
            result=None),
)

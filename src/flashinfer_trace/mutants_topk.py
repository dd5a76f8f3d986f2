"""Planted bugs of the deterministic sampling filters (top_k_renorm_probs, top_p_renorm_probs,
top_k_mask_logits: docs/boundary/topk.md), one or more per boundary class, each a text edit of a shipped
definition's reference. mutants.py appends them to its MUTANTS; tests/unit/test_topk.py checks that each
passes a typical case and fails its boundary case (or, for plain wrong math, the typical one)."""

from __future__ import annotations

from .mutants_model import Mutant, _m

_KEEP_K = "kept = torch.where(p >= kth, p, torch.zeros_like(p))"
# exactly k kept, by position in a stable descending sort (the rank rule): splits a tie at the cut
_RANK = "torch.argsort(torch.argsort({x}, dim=-1, descending=True, stable=True), dim=-1) < k[:, None]"

MUTANTS: tuple[Mutant, ...] = (
    _m("top_k_renorm_probs_v128256", "ties-by-rank", "exactly k tokens kept by sort position: a tie at the k-th "
       "probability is split, not kept whole", (_KEEP_K, "kept = torch.where(" + _RANK.format(x="p")
                                                + ", p, torch.zeros_like(p))"), cls="boundary-ties"),
    _m("top_k_renorm_probs_v128256", "whole-row-mass", "renormalised by the whole row's mass, not the kept mass",
       ("return (kept / kept.sum(dim=-1, keepdim=True))", "return (kept / p.sum(dim=-1, keepdim=True))")),
    _m("top_k_renorm_probs_v151936_bf16", "last-token-dropped", "the last token id never read (a loop bound of "
       "vocab_size - 1)", ("    p = probs.to(torch.float32)\n",
                           "    p = probs.to(torch.float32).clone()\n    p[:, -1] = 0\n"), cls="boundary-index"),
    _m("top_p_renorm_probs_v151936", "le-top-p", "a token kept when the mass before it is <= top_p, not <",
       ("keep_sorted = (mass_greater < tp)", "keep_sorted = (mass_greater <= tp)"), cls="boundary-parameter"),
    _m("top_p_renorm_probs_v32000", "ties-by-rank", "each token reads its own mass before it in sort order: a tie "
       "at the cut is split", ("mass_greater = mass_before.gather(1, first)", "mass_greater = mass_before"),
       cls="boundary-ties"),
    _m("top_p_renorm_probs_v32000", "crossing-token-dropped", "the token whose mass crosses top_p is dropped (the "
       "running sum including it compared, not the mass before it)",
       ("mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs",
        "mass_before = torch.cumsum(sorted_probs, dim=-1)")),
    _m("top_k_mask_logits_v128256", "lowest-not-inf", "masked logits set to float32's lowest value, not -inf",
       ('torch.full_like(x, float("-inf"))', "torch.full_like(x, torch.finfo(torch.float32).min)")),
    _m("top_k_mask_logits_v32000_bf16", "float16-compute", "the logits handled in float16 (exact for typical "
       "bfloat16 logits, overflowing past 65504)", ("x = logits.to(torch.float32)", "x = logits.to(torch.float16)"),
       cls="boundary-magnitude"),
    _m("top_k_mask_logits_v32000_bf16", "ties-by-rank", "exactly k logits kept by sort position: a tie at the k-th "
       "value is split", ("masked = torch.where(x >= kth,", "masked = torch.where(" + _RANK.format(x="x") + ","),
       cls="boundary-ties"),
)

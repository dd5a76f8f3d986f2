"""Planted bugs of the `cascade_merge` family (attention partial-state merges), one per boundary class of
docs/boundary/cascade.md and a few plain ones: each passes on typical states (lse a few binades apart, every
state non-empty, every row merged) unless it is `wrong-math`, and is caught by the case its comment names."""

from __future__ import annotations

from .mutants_model import Mutant, _m

PAIR = "merge_state_h32_d128"
IN_PLACE = "merge_state_in_place_h32_d128"
MULTI = "merge_states_h32_d128"
_LSE = "    s = shift + torch.log2(total)"
_W_A, _W_B = "torch.exp2(s_a - shift)", "torch.exp2(s_b - shift)"
# FlashInfer's state_t: an online merge from m = -inf, d = 1; exp2(-inf - -inf) is NaN when the first state is empty
_ONLINE = '''    m = torch.full_like(s[:, 0], float("-inf"))
    d = torch.ones_like(m)
    o = torch.zeros(v[:, 0].shape, dtype=torch.float32)
    for i in range(s.shape[1]):
        m_new = torch.maximum(m, s[:, i])
        d = d * torch.exp2(m - m_new) + torch.exp2(s[:, i] - m_new)
        o = o * torch.exp2(m - m_new)[..., None] + v[:, i].to(torch.float32) * torch.exp2(s[:, i] - m_new)[..., None]
        m = m_new
    merged, lse = o / d[..., None], m + torch.log2(d)
    return merged.to(v.dtype), lse
'''
_MULTI_BODY = '''    s_max = s.amax(dim=1)
    shift = torch.where(torch.isneginf(s_max), 0.0, s_max)  # every state empty: output 0, lse -inf
    w = torch.exp2(s - shift[:, None])
    total = w.sum(dim=1)
    merged = (v.to(torch.float32) * w[..., None]).sum(dim=1) / torch.where(total > 0, total, 1.0)[..., None]
    lse = shift + torch.log2(total)
    return merged.to(v.dtype), lse
'''

MUTANTS: tuple[Mutant, ...] = (
    # large_lse: exp2(1e4) overflows float32, exp2(-1e4) is 0: inf / inf and 0 / 0
    _m(PAIR, "no-max", "weights exp2(s) without subtracting the larger lse",
       (_W_A, "torch.exp2(s_a)"), (_W_B, "torch.exp2(s_b)"), (_LSE, "    s = torch.log2(total)"),
       cls="boundary-magnitude"),
    # both_empty: -inf - -inf is NaN (FlashInfer's kernels and trace template before a guard: issue #4051)
    _m(PAIR, "nan-on-both-empty", "shifted by the max lse even where both states are empty",
       ("    shift = torch.where(torch.isneginf(s_max), 0.0, s_max)\n", "    shift = s_max\n"),
       cls="boundary-structure"),
    # far_apart: s_b - s_a up to 512 binades: exp2 overflows to inf, inf / inf
    _m(PAIR, "relative-to-a", "weights taken relative to state A's lse, not the larger one",
       ("s_max = torch.maximum(s_a, s_b)", "s_max = s_a"), cls="boundary-magnitude"),
    # empty_state: s_a = -inf makes -inf + log2(inf): NaN where the other state alone must come back
    _m(PAIR, "lse-from-a", "merged lse written as s_a + log2(1 + 2^(s_b - s_a))",
       (_LSE, "    s = s_a + torch.log2(1 + torch.exp2(s_b - s_a))"), cls="boundary-structure"),
    # equal_lse: exact ties only (never drawn at random): the two states taken for one segment seen twice
    _m(PAIR, "equal-lse-dedup", "states with equal lse taken for the same segment: state A returned as it is",
       ("    return v.to(v_a.dtype), s",
        "    same = s_a == s_b\n    v = torch.where(same[..., None], v_a.to(torch.float32), v)\n"
        "    s = torch.where(same, s_a, s)\n    return v.to(v_a.dtype), s"), cls="boundary-ties"),
    _m(PAIR, "natural-exp", "the base-2 lse read as a natural one (exp, not exp2)",
       (_W_A, "torch.exp(s_a - s_max)"), (_W_B, "torch.exp(s_b - s_max)")),
    _m(PAIR, "swapped-weights", "each state weighted by the other's mass",
       ("* w_a[..., None] + v_b.to(torch.float32) * w_b[..., None]",
        "* w_b[..., None] + v_b.to(torch.float32) * w_a[..., None]")),
    # masked_rows: rows with mask False must come back unchanged
    _m(IN_PLACE, "mask-ignored", "every row merged, the mask not read",
       ("    keep = ~mask.to(torch.bool)", "    keep = torch.zeros_like(mask, dtype=torch.bool)"),
       cls="boundary-structure"),
    _m(IN_PLACE, "skipped-rows-zeroed", "rows left out written as 0 (the kernel writes every row)",
       ("torch.where(keep[:, None, None], v.to(torch.float32), merged_v)",
        "torch.where(keep[:, None, None], 0.0, merged_v)"), cls="boundary-structure"),
    # mostly_empty: most rows' first state is empty
    _m(MULTI, "online-from-neg-inf", "states merged one by one from m = -inf, d = 1 (an online softmax state)",
       (_MULTI_BODY, _ONLINE), cls="boundary-structure"),
    # large_lse: rows near -1e4 weighed against the +1e4 rows' max: every weight 0, 0 / 0
    _m(MULTI, "global-max", "the max lse taken over the whole tensor, not per (token, head)",
       ("    s_max = s.amax(dim=1)\n", "    s_max = s.amax().expand(s[:, 0].shape)\n"), cls="boundary-magnitude"),
)

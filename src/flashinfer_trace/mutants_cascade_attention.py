"""Planted bugs of the `cascade_attention` family (docs/boundary/cascade_attention.md), each a realistic slip of a
multi-level cascade kernel written as a text edit of a definition's reference (which computes one state per level
and merges them, as the wrapper does). The boundary ones are right on a typical random batch and caught by the case
their comment names; the wrong-math ones are caught everywhere. mutants.py appends `MUTANTS` to its own;
tests/unit/test_cascade_attention.py checks each against its case."""

from __future__ import annotations

from .mutants_model import Mutant, _m

DEF = "cascade_attention_l2_causal_h32_kv8_d128_ps16"
DEF3 = "cascade_attention_l3_h32_kv8_d128_ps16"
_GUARD = "            continue  # no queries or no keys in this segment"
_PAGES = "        pages = kv_indices[p0:p1].long()\n"

MUTANTS: tuple[Mutant, ...] = (
    # empty_shared / no_own_kv: a segment without keys computes 0 / 0 instead of keeping the state (0, -inf)
    _m(DEF, "empty-level-nan", "a segment with no keys gets 0 / 0: NaN state, merged into every query it holds",
       (_GUARD, "            if q1 > q0:\n                out[q0:q1] = float('nan')\n"
                "                lse[q0:q1] = float('nan')\n" + _GUARD), cls="boundary-structure"),
    # empty_shared: an empty level's lse taken as 0 (log 1) instead of -inf: it gets weight in the merge
    _m(DEF, "empty-level-lse-zero", "an empty segment's state starts at lse 0, not -inf: the merge gives it weight",
       ("    lse = torch.full((total, num_qo_heads), -math.inf,", "    lse = torch.full((total, num_qo_heads), 0.0,"),
       cls="boundary-structure"),
    # long_shared: a level read through a fixed 8-page split with no merge of the rest (the shared prefix cut short)
    _m(DEF, "shared-truncated", "a segment's pages read up to 8 (a split-kv chunk kept, the others dropped)",
       (_PAGES, "        pages = kv_indices[p0:min(p1, p0 + 8)].long()\n"), cls="boundary-structure"),
    # scores_large (exp overflows) / scores_far_negative (exp underflows): no max subtracted in a level's softmax
    _m(DEF, "no-max-subtraction", "each level's softmax without subtracting the row max",
       ("        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)\n", "        m = torch.zeros_like(m)\n"),
       cls="boundary-magnitude"),
    _m(DEF, "drops-shared-level", "the shared level never merged in: each query sees its own KV only",
       ("    for lv in levels[:-1]:", "    for lv in levels[1:-1]:")),
    _m(DEF, "causal-on-shared", "the causal mask applied on the shared level too (the wrapper masks the last only)",
       ("*lv, sm_scale, False)", "*lv, sm_scale, CAUSAL)")),
    _m(DEF, "causal-top-left", "the last level's causal mask aligned top-left (j <= i) instead of bottom-right",
       ("j > kv_len - n + i", "j > i")),
    _m(DEF, "merge-natural-base", "the merge weights exp(lse) of base-2 lse (merging in the wrong base)",
       ("    w_a = torch.exp2(s_a - s_safe)\n    w_b = torch.exp2(s_b - s_safe)\n",
        "    w_a = torch.exp(s_a - s_safe)\n    w_b = torch.exp(s_b - s_safe)\n")),
    _m(DEF, "shared-page-shifted", "a level's pages read one page later (kv_indices off by one page id)",
       (_PAGES, "        pages = (kv_indices[p0:p1].long() + 1) % k_cache.shape[0]\n")),
    _m(DEF, "full-last-page", "every segment's last page taken as full (kv_last_page_len ignored)",
       ("kv_len = (p1 - p0 - 1) * PAGE_SIZE + int(kv_last_page_len[s])", "kv_len = (p1 - p0) * PAGE_SIZE")),
    _m(DEF, "gqa-interleaved", "query head h read against kv head h % num_kv_heads (interleaved, not grouped)",
       ("        k = k.repeat_interleave(group, dim=1)", "        k = k.repeat(1, group, 1)"),
       ("        v = v.repeat_interleave(group, dim=1)", "        v = v.repeat(1, group, 1)")),
    _m(DEF, "sm-scale-dropped", "sm_scale never applied to the logits",
       (" k) * sm_scale", " k)")),
    # three levels: the middle level's state merged with the running lse left unchanged (only the output merged)
    _m(DEF3, "merge-keeps-old-lse", "the merge returns the old lse: the next level is weighed against a stale sum",
       ("    return o, s_safe + torch.log2(tot)", "    return o, s_a")),
)

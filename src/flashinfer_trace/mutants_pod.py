"""Planted bugs of the `pod` family (docs/boundary/pod.md), each a realistic slip of a fused prefill + decode
attention kernel written as a text edit of a definition's reference. The boundary ones are right on typical
inputs (2 <= qo_len < kv_len, decode requests of two or more pages) and caught by the case their comment names;
the wrong-math ones are caught everywhere. mutants.py appends `MUTANTS` to its own; tests/unit/test_pod.py checks
each against its case."""

from __future__ import annotations

from .mutants_model import Mutant, _m

DEF = "pod_h32_kv8_d128_ps16"  # grouped (4 query heads per kv head): a head mix-up shows
_MASK = "visible = cols <= rows + (kv_len - qo_len)"
_LEN = "n = (end - start - 1) * page_size + int(kv_last_page_len[b].item())"
_PAGES = "pages = kv_indices[start:end].long()"

MUTANTS: tuple[Mutant, ...] = (
    # prefill_square: the prefix length clamped to at least 1 (a kernel written for chunked prefill, where a
    # cached prefix always exists): right whenever kv_len > qo_len, one key too many per query when they are equal
    _m(DEF, "square-offset-clamped", "the causal offset kv_len - qo_len clamped to >= 1 (assumes a cached prefix)",
       (_MASK, "visible = cols <= rows + max(kv_len - qo_len, 1)"), cls="boundary-structure"),
    # prefill_one_token: a one-token prefill special-cased with the mask aligned top-left: it sees key 0 only
    _m(DEF, "one-token-top-left", "a one-token prefill masked top-left (its query sees key 0 alone)",
       (_MASK, _MASK + " if qo_len > 1 else cols <= rows"), cls="boundary-structure"),
    # decode_one_key: a request whose first page is its last reads that page whole (kv_last_page_len ignored)
    _m(DEF, "one-page-read-whole", "a one-page decode request reads its whole page (kv_last_page_len ignored)",
       (_LEN, "n = page_size if end - start == 1 else " + _LEN[4:]), cls="boundary-structure"),
    # scores_large: exp() without the row max subtracted overflows float32 (inf / inf) on both halves
    _m(DEF, "no-max-subtraction", "both softmaxes without subtracting the row max",
       ("probs = torch.softmax(logits, dim=-1)", "probs = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)"),
       ("weights = torch.softmax(scores, dim=-1)",
        "weights = torch.exp(scores) / torch.exp(scores).sum(-1, keepdim=True)"), cls="boundary-magnitude"),
    # scores_far_negative: the causal mask as a finite sentinel (-5000): above far-negative scores, so the masked
    # keys take the weight
    _m(DEF, "finite-mask-sentinel", "the prefill's causal mask a finite -5000, not -inf",
       ("logits.masked_fill(~visible, -math.inf)", "logits.masked_fill(~visible, -5000.0)"),
       cls="boundary-magnitude"),
    _m(DEF, "prefill-not-causal", "the prefill half attends every key (causal_p dropped)",
       ("logits = logits.masked_fill(~visible, -math.inf)", "logits = logits  # no mask")),
    _m(DEF, "causal-top-left", "the prefill's causal mask aligned top-left (query i sees keys 0 .. i)",
       (_MASK, "visible = cols <= rows")),
    _m(DEF, "decode-pages-reversed", "a decode request's pages read in reverse order",
       (_PAGES, "pages = kv_indices[start:end].long().flip(0)")),
    _m(DEF, "decode-gqa-interleaved", "a decode query head h read against kv head h % num_kv_heads",
       ("qb = q_d[b].to(torch.float32).view(num_kv_heads, group_size, head_dim)",
        "qb = q_d[b].to(torch.float32).view(group_size, num_kv_heads, head_dim).transpose(0, 1)")),
    _m(DEF, "decode-sm-scale-dropped", "the decode half's logits without sm_scale",
       ("scores = torch.matmul(qb, k) * sm_scale", "scores = torch.matmul(qb, k)")),
    _m(DEF, "halves-swapped-head-group", "the first head group's outputs take the other half's first query",
       ("    return output_p.to(q_p.dtype), output_d.to(q_d.dtype)\n",
        "    first_p = output_p[:1, :group_size].clone()\n"
        "    output_p[:1, :group_size] = output_d[:1, :group_size]\n"
        "    output_d[:1, :group_size] = first_p\n"
        "    return output_p.to(q_p.dtype), output_d.to(q_d.dtype)\n")),
)

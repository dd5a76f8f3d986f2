"""Planted bugs of the `trtllm_paged` family (docs/boundary/trtllm_paged.md), each a realistic slip of a TensorRT-LLM
style paged attention kernel written as a text edit of a definition's reference. The boundary ones are right on
typical inputs (prefill requests with a cached prefix and two or more queries, decode requests of more than one
page, at most 48 keys) and caught by the case their comment names; the wrong-math ones are caught everywhere.
mutants.py appends `MUTANTS` to its own; tests/unit/test_trtllm_paged.py checks each against its case."""

from __future__ import annotations

from .mutants_model import Mutant, _m

PREFILL = "trtllm_fmha_v2_prefill_paged_causal_h32_kv8_d128_ps32"  # HND, grouped 4
PREFILL_NHD = "trtllm_fmha_v2_prefill_paged_causal_nhd_h28_kv4_d128_ps128_fp16"
RAGGED = "trtllm_fmha_v2_prefill_ragged_causal_h32_kv4_d128"
DECODE = "trtllm_batch_decode_h32_kv8_d128_ps16"  # HND
DECODE_NHD = "trtllm_batch_decode_nhd_h64_kv8_d128_ps64_fp16"
_MASK = "visible = cols <= rows + (kv_len - qo_len)"
_KV = "kv_len = int(seq_lens[b].item())"
_PAGES = "pages = block_tables[b, :(kv_len + page_size - 1) // page_size].long()"

MUTANTS: tuple[Mutant, ...] = (
    # causal_square: the prefix length clamped to at least 1 (written for chunked prefill, where a cached prefix
    # always exists): one key too many per query when qo_len == seq_len
    _m(PREFILL, "square-offset-clamped", "the causal offset seq_len - qo_len clamped to >= 1 (assumes a prefix)",
       (_MASK, "visible = cols <= rows + max(kv_len - qo_len, 1)"), cls="boundary-structure"),
    # single_token: a one-query request special-cased with the mask aligned top-left: it sees key 0 only
    _m(PREFILL, "one-query-top-left", "a one-query request masked top-left (its query sees key 0 alone)",
       (_MASK, _MASK + " if qo_len > 1 else cols <= rows"), cls="boundary-structure"),
    # page_edges: the last page's fill taken as seq_len % page_size, 0 for a full page: a request whose last page is
    # full loses it (right whenever the last page is partly filled)
    _m(PREFILL, "full-last-page-dropped", "the last page holds seq_len % page_size tokens (a full one: none)",
       (_PAGES, _PAGES + "\n        kv_len = (pages.numel() - 1) * page_size + kv_len % page_size"),
       cls="boundary-structure"),
    _m(DECODE, "full-last-page-dropped-decode", "the last page holds seq_len % page_size tokens (a full one: none)",
       (_PAGES, _PAGES + "\n        kv_len = (pages.numel() - 1) * page_size + kv_len % page_size"),
       cls="boundary-structure"),
    # single_token (decode): a request whose first page is its last reads that page whole (seq_lens ignored)
    _m(DECODE, "one-page-read-whole", "a one-page decode request reads its whole page (seq_lens ignored)",
       (_PAGES, _PAGES + "\n        kv_len = page_size if pages.numel() == 1 else kv_len"), cls="boundary-structure"),
    # long_kv: one pass over at most 128 keys (the split-kv pass over later tiles, and its merge, missing)
    _m(DECODE_NHD, "keys-capped-at-128", "a request's keys cut to its first 128 (no split-kv pass after them)",
       (_KV, _KV + "\n        kv_len = min(kv_len, 128)"), cls="boundary-structure"),
    # scores_large: exp() without the row max subtracted overflows float32 (inf / inf)
    _m(PREFILL, "no-max-subtraction", "the softmax without subtracting the row max",
       ("probs = torch.softmax(logits, dim=-1)", "probs = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)"),
       cls="boundary-magnitude"),
    # scores_far_negative: the causal mask as a finite sentinel (-5000), above far-negative scores: the masked keys
    # take the weight
    _m(PREFILL, "finite-mask-sentinel", "the causal mask a finite -5000, not -inf",
       ("logits.masked_fill(~visible, -math.inf)", "logits.masked_fill(~visible, -5000.0)"), cls="boundary-magnitude"),
    _m(PREFILL, "causal-top-left", "the causal mask aligned top-left (query i sees keys 0 .. i)",
       (_MASK, "visible = cols <= rows")),
    _m(DECODE, "pages-sorted", "a request's pages read in ascending page-id order, not the table's",
       (_PAGES, "pages = block_tables[b, :(kv_len + page_size - 1) // page_size].long().sort().values")),
    _m(DECODE, "hnd-read-as-nhd", "an HND cache gathered as if NHD (heads and slots swapped)",
       ("k_cache[pages].transpose(1, 2).flatten(0, 1)", "k_cache[pages].flatten(0, 1).reshape(-1, 8, 128)"),
       ("v_cache[pages].transpose(1, 2).flatten(0, 1)", "v_cache[pages].flatten(0, 1).reshape(-1, 8, 128)")),
    _m(DECODE_NHD, "gqa-interleaved", "query head h read against kv head h % num_kv_heads",
       ("q = query[b].to(torch.float32).view(num_kv_heads, group_size, head_dim)",
        "q = query[b].to(torch.float32).view(group_size, num_kv_heads, head_dim).transpose(0, 1)")),
    _m(PREFILL_NHD, "gqa-interleaved-prefill", "query head h read against kv head h % num_kv_heads (group 7)",
       ("q = query[q_start:q_end].to(torch.float32).view(qo_len, num_kv_heads, group_size, head_dim)",
        "q = query[q_start:q_end].to(torch.float32).view(qo_len, group_size, num_kv_heads, head_dim).transpose(1, 2)")),
    _m(RAGGED, "sm-scale-dropped", "the logits without sm_scale",
       ('logits = torch.einsum("ikgd,jkd->kgij", q, k) * sm_scale', 'logits = torch.einsum("ikgd,jkd->kgij", q, k)')),
    _m(RAGGED, "ragged-not-causal", "every token attends its whole request (the causal mask dropped)",
       ("logits = logits.masked_fill(cols > rows, -math.inf)", "logits = logits  # no mask")),
)

"""Planted bugs of the `xqa` family (docs/boundary/xqa.md), each a realistic slip of a paged decode kernel written
as a text edit of a definition's reference. The boundary ones are right on typical inputs (requests of two pages
and more, scales 1 / sqrt(d) and 1, no subnormals) and caught by the case their comment names; the wrong-math ones
are caught everywhere. mutants.py appends `MUTANTS` to its own; tests/unit/test_xqa.py checks each against its
case."""

from __future__ import annotations

from .mutants_model import Mutant, _m

DEF = "xqa_batch_decode_h32_kv8_d128_ps16"  # grouped (4 query heads per kv head), bf16
SWA = "xqa_batch_decode_h64_kv8_d64_ps64_swa128_sinks"  # sinks and a 128-token window
FP8 = "xqa_batch_decode_h32_kv8_d128_ps16_fp8kv"
_LEN = "seq_len = int(seq_lens[b].item())"
_K = "k = k_cache[pages].reshape(-1, num_kv_heads, head_dim)[first:seq_len].to(torch.float32)"
_V = "v = v_cache[pages].reshape(-1, num_kv_heads, head_dim)[first:seq_len].to(torch.float32)"
_SCORES = "scores = torch.matmul(q, k.permute(1, 2, 0)) * bmm1_scale"
_SOFTMAX = "probs = torch.softmax(scores, dim=-1)"
_OUT = "out = torch.matmul(probs, v.permute(1, 0, 2)) * bmm2_scale"
_Q = "q = query[b].to(torch.float32).view(num_kv_heads, group_size, head_dim)"
_FIRST = "first = max(0, seq_len - 1 - window_left)"
_DENOM = "probs = weights / (weights.sum(dim=-1, keepdim=True) + torch.exp(sink - top))"


def _cut(end: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """Both caches read up to `end` instead of seq_len."""
    return (_K, _K.replace("[first:seq_len]", f"[first:{end}]")), (_V, _V.replace("[first:seq_len]", f"[first:{end}]"))


MUTANTS: tuple[Mutant, ...] = (
    # single_token: a request of one key taken as empty (the keys counted before the current token is appended)
    _m(DEF, "single-key-as-empty", "a request of one key skipped (its output left 0)",
       (_LEN, _LEN + "\n        if seq_len == 1:\n            continue"), cls="boundary-structure"),
    # page_edges: the last page's tokens as seq_len % page_size, 0 when the page is full: a full last page dropped
    _m(DEF, "full-last-page-dropped", "the last page's token count seq_len % page_size (a full one read as empty)",
       *_cut("(num_used - 1) * page_size + seq_len % page_size"), cls="boundary-structure"),
    # tail_poison: the running max taken over the whole last page (slots past seq_len too), the mask applied after
    # exp: harmless while the stale slots score like the live ones, 0 / 0 once one scores far above them
    _m(DEF, "max-over-whole-pages", "the softmax's max taken over the request's whole pages, the mask after exp",
       (_SOFTMAX, "k_all = k_cache[pages].reshape(-1, num_kv_heads, head_dim).to(torch.float32)\n"
                  "        top = (torch.matmul(q, k_all.permute(1, 2, 0)) * bmm1_scale).amax(dim=-1, keepdim=True)\n"
                  "        weights = torch.exp(scores - top)\n"
                  "        probs = weights / weights.sum(dim=-1, keepdim=True)"), cls="boundary-structure"),
    # multi_block: the keys past one block of 1024 dropped (a split-KV pass that never runs its second block)
    _m(DEF, "long-kv-capped-1024", "only the first 1024 keys of a request read (the split-KV blocks past one lost)",
       *_cut("min(seq_len, 1024)"), cls="boundary-structure"),
    # kv_scales: bmm2_scale dropped (right while it is 1, as it is without a V scale)
    _m(DEF, "bmm2-scale-dropped", "the output not multiplied by bmm2_scale",
       (_OUT, _OUT.replace(" * bmm2_scale", "")), cls="boundary-magnitude"),
    # scores_large: exp() without the row max subtracted overflows float32 (inf / inf)
    _m(DEF, "no-max-subtraction", "the softmax without subtracting the row max",
       (_SOFTMAX, "probs = torch.exp(scores) / torch.exp(scores).sum(dim=-1, keepdim=True)"), cls="boundary-magnitude"),
    # scores_far_negative: the running max starts at a finite -5000: rows whose every score is below it underflow
    _m(DEF, "finite-max-init", "the softmax's running max initialised to -5000, not -inf",
       (_SOFTMAX, "top = scores.amax(dim=-1, keepdim=True).clamp(min=-5000.0)\n"
                  "        weights = torch.exp(scores - top)\n"
                  "        probs = weights / weights.sum(dim=-1, keepdim=True)"), cls="boundary-magnitude"),
    # subnormal_query: the query's subnormals flushed to zero (FTZ on the load)
    _m(DEF, "query-ftz", "subnormal query elements flushed to zero",
       (_Q, _Q + "\n        q = q * (q.abs() >= 1.1754943508222875e-38)"), cls="boundary-magnitude"),
    # window_edges: the window applied only from seq_len = window_left + 3 (an off-by-one at its edge)
    _m(SWA, "window-edge-off-by-one", "the window applied only once seq_len > window_left + 2",
       (_FIRST, _FIRST.replace("max(0, seq_len - 1 - window_left)",
                               "seq_len - 1 - window_left if seq_len > window_left + 2 else 0")),
       cls="boundary-structure"),
    # the max over the keys alone, the sink's weight exp(sink - max) clamped to at most 1 against overflow: right
    # while a sink scores below the keys' max; typical sinks (N(0, 1)) are above it in some rows already, and
    # sink_dominates in every row
    _m(SWA, "sink-weight-clamped", "the max over the keys alone, the sink's weight clamped to at most 1",
       ("top = torch.maximum(scores.amax(dim=-1, keepdim=True), sink)", "top = scores.amax(dim=-1, keepdim=True)"),
       (_DENOM, _DENOM.replace("torch.exp(sink - top)", "torch.exp(torch.clamp(sink - top, max=0.0))"))),
    _m(DEF, "pages-reversed", "a request's pages read in reverse order",
       ("pages = block_tables[b, :num_used].long()", "pages = block_tables[b, :num_used].long().flip(0)")),
    _m(DEF, "gqa-interleaved", "query head h read against kv head h % num_kv_heads",
       (_Q, "q = query[b].to(torch.float32).view(group_size, num_kv_heads, head_dim).transpose(0, 1)")),
    _m(DEF, "bmm1-scale-dropped", "the scores not multiplied by bmm1_scale",
       (_SCORES, _SCORES.replace(" * bmm1_scale", ""))),
    _m(DEF, "values-from-key-cache", "the values read from the key cache",
       (_V, _V.replace("v_cache[pages]", "k_cache[pages]"))),
    _m(SWA, "sinks-dropped", "the sink logits left out of the softmax's denominator",
       (_DENOM, "probs = weights / weights.sum(dim=-1, keepdim=True)")),
    _m(SWA, "sink-scaled-like-a-score", "the sink multiplied by bmm1_scale, as if it were a raw q . k",
       ("sink = sinks.to(torch.float32).view(num_kv_heads, group_size, 1)",
        "sink = sinks.to(torch.float32).view(num_kv_heads, group_size, 1) * bmm1_scale")),
    _m(SWA, "window-ignored", "the sliding window ignored (every key of the request read)",
       (_FIRST, "first = 0")),
    _m(SWA, "window-one-short", "the window of window_left keys, not window_left + 1",
       (_FIRST, "first = max(0, seq_len - window_left)")),
    _m(FP8, "v-scale-on-scores", "bmm2_scale (the V scale) applied to the scores too, as the raw kernel's kv_scale",
       (_SCORES, _SCORES + " * bmm2_scale")),
)

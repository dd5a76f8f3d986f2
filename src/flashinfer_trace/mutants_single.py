"""Planted bugs of single-request attention (`single_decode`, `single_prefill`): one per boundary class of
docs/boundary/attention.md ("Single-request attention") that applies to one request, each a realistic slip of an
attention kernel written as a text edit of a definition's reference. mutants.py appends `MUTANTS` to its own;
tests/unit/test_single_attention.py checks that each is caught by its case (and, for the boundary ones, that
typical inputs do not catch it)."""

from __future__ import annotations

from .mutants_model import Mutant, _m

DECODE = "single_decode_h32_kv8_d128"
PREFILL = "single_prefill_causal_h32_kv8_d128"
_SOFTMAX = ("probs = torch.softmax(logits, dim=-1)",
            "probs = torch.exp(logits) / torch.exp(logits).sum(dim=-1, keepdim=True)")
_LSE = ("torch.logsumexp(logits, dim=-1) / math.log(2.0)", "torch.log(torch.exp(logits).sum(dim=-1)) / math.log(2.0)")
# a split-kv kernel whose merge keeps only the last chunk's partial state (chunks of 512 keys: only long_kv has more)
_LAST_CHUNK_K = ("kt = k.to(torch.float32).permute(1, 2, 0)", "kt = k[-512:].to(torch.float32).permute(1, 2, 0)")
_LAST_CHUNK_V = ("vt = v.to(torch.float32).permute(1, 0, 2)", "vt = v[-512:].to(torch.float32).permute(1, 0, 2)")

MUTANTS: tuple[Mutant, ...] = (
    # scores_large: exp overflows to inf (inf / inf); scores_far_negative: exp underflows to 0 (0 / 0)
    _m(DECODE, "no-max-subtraction", "softmax and lse without subtracting the row max", _SOFTMAX, _LSE,
       cls="boundary-magnitude"),
    _m(PREFILL, "no-max-subtraction", "softmax and lse without subtracting the row max", _SOFTMAX, _LSE,
       cls="boundary-magnitude"),
    # subnormal_query: a flush-to-zero build scores 0 everywhere and averages the values uniformly
    _m(DECODE, "flush-subnormal-q", "subnormal query elements flushed to zero (FTZ)",
       ("qg = q.to(torch.float32).view(num_kv_heads, group_size, head_dim)",
        "qg = torch.where(q.abs() < 2.0**-126, 0.0, q.to(torch.float32)).view(num_kv_heads, group_size, head_dim)"),
       cls="boundary-magnitude"),
    # empty_kv: the empty softmax's lse is -inf (log 0), the neutral state of merge_state; 0 is a real state
    _m(DECODE, "lse-zero-on-empty", "kv_len 0 returns lse 0, not -inf",
       ("lse = torch.full((num_qo_heads,), -math.inf, dtype=torch.float32, device=q.device)",
        "lse = torch.zeros(num_qo_heads, dtype=torch.float32, device=q.device)"), cls="boundary-structure"),
    # long_kv: 1024+ keys, two chunks; every other case has fewer than 512 keys on the CPU tiers
    _m(DECODE, "last-chunk-only", "the split-kv merge keeps only the last 512-key chunk's partial state",
       _LAST_CHUNK_K, _LAST_CHUNK_V, cls="boundary-structure"),
    # any case with a cached prefix (qo_len < kv_len): the mask aligned top-left, as if the queries came first
    _m(PREFILL, "mask-top-left", "causal mask aligned top-left (query i sees keys 0..i), ignoring the prefix",
       ("allowed = j <= i + (kv_len - qo_len)", "allowed = j <= i")),
    # qo_equals_kv / single_token: the diagonal excluded, the first query sees no key (NaN)
    _m(PREFILL, "mask-strict", "each query's own position masked (j < i + offset, not <=)",
       ("allowed = j <= i + (kv_len - qo_len)", "allowed = j < i + (kv_len - qo_len)")),
)

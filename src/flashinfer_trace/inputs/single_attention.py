"""Single-request attention inputs: `single_decode` (FlashInfer's `single_decode_with_kv_cache`: q
[num_qo_heads, head_dim], one query token) and `single_prefill` (`single_prefill_with_kv_cache`: q
[qo_len, num_qo_heads, head_dim]), both over contiguous k and v [kv_len, num_kv_heads, head_dim] (NHD: the
definitions' layout; HND is a call mode of the ground truth, not another definition).

A single-request definition is the ragged case (`gqa_ragged`) with one request and no indptr, so this
module draws that request's lengths and reuses the attention generator's value shaping
(`attention.shape_scores`, `attention.roles`: q, k and v are the ragged layout's names) and its tiers.

Lengths (`lengths`): the random case draws kv_len in the upper half of the tier's range (a single request
is the `batch1` case) and, for prefill, qo_len in [1, min(kv_len, max_qo)]: the queries are the last qo_len
tokens of the sequence. `qo_len <= kv_len` is part of the single_prefill contract (FlashInfer's
`tests/attention/test_single_prefill.py` skips causal `qo_len > kv_len` as "not supported"), so the
definitions carry that constraint and this generator never makes fully masked rows.

Edge cases (docs/boundary/attention.md, "Single-request attention", gives each one's reason):
  single_token: kv_len 1 (and qo_len 1 for prefill);
  qo_equals_kv (prefill): qo_len == kv_len, a prompt without a cached prefix: the plain lower-triangular
    mask, whose first query sees one key;
  empty_kv (decode): kv_len 0: nothing to attend to, output 0 and lse -inf (the empty softmax);
  the score cases (attention.SCORE_CASES): the softmax's arithmetic at its limits, on the boundary
    tier's lengths;
  long_kv: kv_len tier.long_kv (1-4 queries in prefill): the kernels' split-kv path (single decode
    splits a long kv over blocks and merges the partial states).
Left out, and why: `batch1`/`uneven`/`empty`/`empty_qo` (batch structure: one request has none);
`fully_masked_rows` and prefill `empty_kv` (qo_len > kv_len is outside the contract, above);
`large_offsets` (the one request reads every key: a k past 2**31 elements is a softmax over 2M+ keys
whose float64 truth widens 32+ GiB; a gap, in the docs).
"""

from __future__ import annotations

import math

import torch

from .attention import SCORE_CASES, TIERS, _dominant, _ints, roles, shape_scores
from .common import Builder

OP_TYPES = ("single_decode", "single_prefill")
KNOWN = ("q", "k", "v", "sm_scale")
DECODE_CASES = ("single_token", "empty_kv", *SCORE_CASES, "long_kv")
PREFILL_CASES = ("single_token", "qo_equals_kv", *SCORE_CASES, "long_kv")
LONG_KV_QUERIES = 4  # long_kv's prefill: at most this many queries (a long prefix's append)


def is_prefill(definition) -> bool:
    """single_prefill's q has a token axis ([qo_len, heads, dim]); single_decode's does not."""
    if definition.op_type in OP_TYPES:
        return definition.op_type == "single_prefill"
    q = definition.inputs.get("q")
    return q is not None and q.shape is not None and len(q.shape) == 3


def edge_cases(definition) -> list[str]:
    return list(PREFILL_CASES if is_prefill(definition) else DECODE_CASES)


def lengths(b: Builder, prefill: bool) -> tuple[int, int]:
    """(kv_len, qo_len) of this case's one request; qo_len is 1 for decode."""
    tier = TIERS[b.size]
    case = b.case
    g = b.rng("lengths")
    if case is None:
        kv = tier.max_kv // 2 + _ints(1, tier.max_kv - tier.max_kv // 2, g)[0]
        qo = _ints(1, min(kv, tier.max_qo), g)[0] if prefill else 1
    elif case == "single_token":
        kv, qo = 1, 1
    elif case == "empty_kv":
        kv, qo = 0, 1
    elif case == "qo_equals_kv":
        kv = qo = _ints(1, tier.edge_qo, g)[0]
    elif case == "long_kv":
        kv = tier.long_kv
        qo = _ints(1, LONG_KV_QUERIES, g)[0] if prefill else 1
    else:  # the score cases: the boundary tier's lengths, the values are the point
        kv = _ints(1, tier.edge_kv, g)[0]
        qo = _ints(1, min(kv, tier.edge_qo), g)[0] if prefill else 1
    return kv, qo


def generate(b: Builder) -> None:
    d = b.definition
    extra = [n for n in d.inputs if n not in KNOWN]
    if extra:
        raise b.mismatch(f"the {d.op_type} generator does not know input(s) {', '.join(extra)}")
    missing = [n for n in ("q", "k", "v") if not b.has(n)]
    if missing:
        raise b.error(f"a single-request attention definition needs input(s) {', '.join(missing)}")
    prefill = is_prefill(d)
    kv_len, qo_len = lengths(b, prefill)
    b.set_dim("k", 0, kv_len)
    b.set_dim("v", 0, kv_len)
    if prefill:
        b.set_dim("q", 0, qo_len)
    for name in ("q", "k", "v"):
        b.put_random(name)
    if b.case in SCORE_CASES:
        slots = [torch.arange(kv_len)]  # the one request's key rows of k and v
        shape_scores(b, roles(d), slots, _dominant(b, slots) if b.case == "one_key_dominates" else [])
    if b.has("sm_scale"):
        b.put_scalar("sm_scale", 1.0 / math.sqrt(b.dim("q", -1)))

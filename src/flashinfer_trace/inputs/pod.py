"""POD attention inputs (`pod`: FlashInfer's `PODWithPagedKVCacheWrapper`): a prefill half, q_p [qo_len, heads,
dim] over k_p / v_p [kv_len, kv_heads, dim] (one request, causal, bottom-right aligned), and a decode half, q_d
[batch_size, heads, dim] over the paged cache k_cache / v_cache [num_pages, page_size, kv_heads, dim] through
kv_indptr / kv_indices / kv_last_page_len.

Lengths first, tensors second. A random case has 2 <= qo_len < kv_len (a cached prefix: the bottom-right alignment
differs from the top-left one) and 2 .. BATCH[size] decode requests of more than one page each (a last page that
is partly filled; the page structure is attention._paged_structure's: page ids a shuffled subset of the cache's,
never sorted). Edge cases (docs/boundary/pod.md gives each one's reason):
  prefill_one_token: qo_len 1 over a longer prefix: the one query sees every key (the mask is then no mask; a
    kernel that special-cases one token must still align it bottom-right);
  prefill_square: qo_len == kv_len (no prefix): query i sees keys 0 .. i, the diagonal starts at key 0;
  single_decode: one decode request;
  decode_one_key: one decode request (not the first) holds a single key: one page with kv_last_page_len 1, its
    softmax a single weight 1 (the output is that key's value);
  the score cases (attention.SCORE_CASES) shaped on both halves at once: the prefill's keys as one request, the
    decode's per request (scores_far_negative, scores_large, one_key_dominates in the second half of each
    request's keys, ...).
Left out: no decode request (batch_size 0) and a decode request without keys: whether plan() and the fused
kernel accept them is not established on a GPU, so the definitions require batch_size >= 1 and a key per
request; qo_len > kv_len (rows that see no key: the prefill half's contract is causal attention over a prefix).
"""

from __future__ import annotations

import math

import torch

from .attention import SCORE_CASES, Roles, _dominant, _ints, _paged_structure, _request_slots, shape_scores
from .common import Builder

OP_TYPES = ("pod",)
KNOWN = ("q_p", "k_p", "v_p", "q_d", "k_cache", "v_cache", "kv_indptr", "kv_indices", "kv_last_page_len", "sm_scale")
CASES = ("prefill_one_token", "prefill_square", "single_decode", "decode_one_key", *SCORE_CASES)
QO = {"small": 12, "medium": 96, "large": 1024}  # prefill queries (at most)
PREFIX = {"small": 20, "medium": 160, "large": 2048}  # prefill keys before the first query (at most)
BATCH = {"small": 4, "medium": 12, "large": 64}  # decode requests (at most)
DECODE_KV = {"small": 48, "medium": 300, "large": 4096}  # decode keys per request (at most)
PREFILL_ROLES = Roles(("q_p",), "q_p", "k_p", ("k_p",), "v_p")
DECODE_ROLES = Roles(("q_d",), "q_d", "k_cache", ("k_cache",), "v_cache")


def edge_cases(definition) -> list[str]:
    return list(CASES)


def prefill_lengths(b: Builder) -> tuple[int, int]:
    """(qo_len, kv_len) of the prefill half."""
    g = b.rng("prefill")
    if b.case == "prefill_one_token":
        return 1, 1 + _ints(1, PREFIX[b.size], g)[0]
    qo = 1 + _ints(1, QO[b.size] - 1, g)[0]  # at least 2: a mask to get wrong
    if b.case == "prefill_square":
        return qo, qo
    return qo, qo + _ints(1, PREFIX[b.size], g)[0]


def decode_lengths(b: Builder, page_size: int) -> list[int]:
    """Keys of each decode request: more than one page each, but for the cases that say otherwise."""
    g = b.rng("decode")
    batch = 1 if b.case == "single_decode" else 1 + _ints(1, BATCH[b.size] - 1, g)[0]
    lo = page_size + 1
    hi = max(DECODE_KV[b.size], lo + 1)
    lens = [lo - 1 + n for n in _ints(batch, hi - lo + 1, g)]
    if b.case == "decode_one_key":
        lens[batch // 2 if batch > 1 else 0] = 1
    return lens


def generate(b: Builder) -> None:
    d = b.definition
    extra = [n for n in d.inputs if n not in KNOWN]
    if extra:
        raise b.mismatch(f"the pod generator does not know input(s) {', '.join(extra)}")
    missing = [n for n in KNOWN[:9] if not b.has(n)]
    if missing:
        raise b.mismatch(f"a pod definition needs input(s) {', '.join(missing)}")
    if b.case is not None and b.case not in CASES:
        raise b.error(f"unknown case {b.case!r} (cases: {', '.join(CASES)})")
    page_size = int(d.const_axes.get("page_size", 1))
    qo_len, kv_len = prefill_lengths(b)
    kv_lens = _paged_structure(b, decode_lengths(b, page_size))
    b.set_dim("q_p", 0, qo_len)
    b.set_dim("k_p", 0, kv_len)
    b.set_dim("v_p", 0, kv_len)
    b.set_dim("q_d", 0, len(kv_lens))
    b.set_axis("batch_size", len(kv_lens))
    for name in KNOWN[:6]:
        b.put_random(name)
    if b.case in SCORE_CASES:
        prefill = [torch.arange(kv_len)]
        decode = _request_slots(b, kv_lens, paged=True)
        one_key = b.case == "one_key_dominates"
        shape_scores(b, PREFILL_ROLES, prefill, _dominant(b, prefill) if one_key else [])
        shape_scores(b, DECODE_ROLES, decode, _dominant(b, decode) if one_key else [])
    if b.has("sm_scale"):
        b.put_scalar("sm_scale", 1.0 / math.sqrt(b.dim("q_p", -1)))

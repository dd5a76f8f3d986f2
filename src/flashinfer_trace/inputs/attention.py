"""Attention inputs: `gqa_paged`, `gqa_ragged`, `mla_paged` and `mla_ragged` (MLA prefill before
absorption: q and k of qk_dim, v of vo_dim), decode and prefill.

The stage is read from the inputs: a definition with a `qo_indptr` input is prefill (a variable
number of query tokens per request), one without is decode (one query token per request).

Lengths first, tensors second: per-request kv lengths (and query lengths for prefill, with
qo_len <= kv_len so causal masking is well defined: the queries are the last tokens of the
sequence) decide every var axis, then the data tensors are drawn with those shapes.

Paged KV: pages are allocated for the used ones plus spare pages, and `kv_indices` is a random
permutation of page ids, so a kernel that assumes contiguous or sorted pages, or that reads
pages it was not given, gets a wrong answer. `kv_indptr` counts pages. Without a
`kv_last_page_len` input every page is full (kv_len is a multiple of page_size); with one, the
last page holds 1..page_size tokens (0 for a request without pages).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .common import Builder, Stream, permutation, randint, random_words

OP_TYPES = ("gqa_paged", "gqa_ragged", "mla_paged", "mla_ragged")
CASES = ("single_token", "batch1", "uneven", "empty")

# DeepSeek-V3 scores MLA with the pre-absorption head dim: qk_nope_head_dim 128 + qk_rope_head_dim.
MLA_QK_NOPE_HEAD_DIM = 128


@dataclass(frozen=True)
class Tier:
    batch: int
    max_kv: int
    max_qo: int


# medium is sized so the plain-torch references (a Python loop over requests) finish in ~0.1 s
# on a CPU: 16 requests x 512 kv x 128 queries took ~2 s for the GQA prefill references.
TIERS = {
    "small": Tier(batch=3, max_kv=33, max_qo=17),
    "medium": Tier(batch=16, max_kv=256, max_qo=64),
    "large": Tier(batch=64, max_kv=4096, max_qo=512),
}

QUERIES = ("q", "q_nope", "q_pe")
CACHES = ("k_cache", "v_cache", "ckv_cache", "kpe_cache")
RAGGED_KV = ("k", "v")
STRUCTURE = ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "sm_scale")


def edge_cases(definition) -> list[str]:
    return list(CASES)


def is_prefill(definition) -> bool:
    return "qo_indptr" in definition.inputs


def _ints(n: int, hi: list[int] | int, s: Stream) -> list[int]:
    """n integers, the i-th uniform on [1, hi_i] (exact integer arithmetic)."""
    his = torch.tensor([hi] * n if isinstance(hi, int) else hi, dtype=torch.int64)
    w = random_words(n, s) & 0x7FFFFFFF
    return (1 + w % his.clamp(min=1)).tolist()


def lengths(b: Builder, prefill: bool) -> tuple[list[int], list[int]]:
    """(kv_lens, qo_lens) for this case; qo_lens is all ones for decode.

    Edge cases:
      single_token: every request has kv_len 1 (and qo_len 1 for prefill);
      batch1: a single request, in the upper half of the tier's kv range;
      uneven: lengths spread log-uniformly, including 1 and the tier maximum;
      empty: one request (at a random index, not the last one only) has 0 query tokens
        (prefill) or 0 kv tokens (decode). A decode request with no kv has no keys to attend to:
        the definitions define its output as zeros and its lse as -inf, so the generator makes
        the case and the reference decides what it means.
    """
    tier = TIERS[b.size]
    case = b.case
    g = b.rng("lengths")
    batch = 1 if case == "batch1" else tier.batch
    if case == "single_token":
        kv = [1] * batch
    elif case == "batch1":
        kv = [tier.max_kv // 2 + n for n in _ints(1, tier.max_kv - tier.max_kv // 2, g)]
    elif case == "uneven":
        # log-uniform between 1 and max_kv; the ends pinned so both extremes are always present
        u = ((random_words(batch, g) & 0xFFFFFF).to(torch.float64) / 2**24).tolist()
        kv = [max(1, min(tier.max_kv, round(tier.max_kv ** x))) for x in u]
        kv[0], kv[1] = 1, tier.max_kv
        order = permutation(batch, g).tolist()
        kv = [kv[i] for i in order]
    else:
        kv = _ints(batch, tier.max_kv, g)

    if not prefill:
        qo = [1] * batch
    elif case == "single_token":
        qo = [1] * batch
    else:
        caps = [min(k, tier.max_qo) for k in kv]
        qo = _ints(batch, caps, g)
        if case == "uneven":  # the shortest and the longest request get the extreme query lengths
            qo = [c if k == tier.max_kv else (1 if k == 1 else q)
                  for q, c, k in zip(qo, caps, kv, strict=True)]

    if case == "empty":
        j = int(randint(0, batch, (1,), g))
        if prefill:
            qo[j] = 0
        else:
            kv[j] = 0
    return kv, qo


def _indptr(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *lens], dtype=torch.int64).cumsum(0).to(torch.int32)


def generate(b: Builder) -> None:
    d = b.definition
    paged = d.op_type in ("gqa_paged", "mla_paged")
    known = QUERIES + (CACHES if paged else RAGGED_KV) + STRUCTURE
    extra = [n for n in d.inputs if n not in known]
    if extra:
        raise b.error(f"the {d.op_type} generator does not know input(s) {', '.join(extra)}")
    prefill = is_prefill(d)
    kv_lens, qo_lens = lengths(b, prefill)
    batch = len(kv_lens)

    if paged:
        kv_lens = _paged_structure(b, kv_lens)  # page rounding may lengthen them
    else:
        if not b.has("kv_indptr"):
            raise b.error("a ragged attention definition needs a kv_indptr input")
        b.put("kv_indptr", _indptr(kv_lens).to(b.torch_dtype("kv_indptr")))
        for name in RAGGED_KV:
            if b.has(name):
                b.set_dim(name, 0, sum(kv_lens))

    if prefill:
        b.put("qo_indptr", _indptr(qo_lens).to(b.torch_dtype("qo_indptr")))
    rows = sum(qo_lens) if prefill else batch
    queries = [n for n in QUERIES if b.has(n)]
    if not queries:
        raise b.error("no query input (q, or q_nope and q_pe)")
    for name in queries:
        b.set_dim(name, 0, rows)
    if "batch_size" in d.axes and "batch_size" not in d.const_axes:
        b.set_axis("batch_size", batch)

    for name in (*queries, *(CACHES if paged else RAGGED_KV)):
        if b.has(name):
            b.put_random(name)

    if b.has("sm_scale"):
        if d.op_type == "mla_paged":
            head_dim = MLA_QK_NOPE_HEAD_DIM + b.dim("q_pe", -1)
        else:
            head_dim = b.dim(queries[0], -1)
        b.put_scalar("sm_scale", 1.0 / math.sqrt(head_dim))


def _paged_structure(b: Builder, kv_lens: list[int]) -> list[int]:
    """kv_indptr, kv_indices, kv_last_page_len and the page count, consistent with kv_lens;
    returns the kv lengths the pages hold."""
    d = b.definition
    caches = [n for n in CACHES if b.has(n)]
    if not caches:
        raise b.error("a paged attention definition needs a cache input (k_cache/v_cache, ckv_cache)")
    page_size = d.const_axes.get("page_size", 1)
    if page_size < 1:
        raise b.error(f"page_size {page_size} must be >= 1")
    has_last = b.has("kv_last_page_len")
    if not has_last and page_size > 1:
        # No way to say how full the last page is: every page is full.
        kv_lens = [-(-k // page_size) * page_size for k in kv_lens]
    pages = [-(-k // page_size) for k in kv_lens]
    used = sum(pages)
    spare = max(2, used // 4)
    num_pages = used + spare
    g = b.rng("pages")
    indices = permutation(num_pages, g)[:used]
    if used >= 2 and bool((indices[1:] > indices[:-1]).all()):
        indices[[0, 1]] = indices[[1, 0]]  # sorted by chance: a sorted list would test nothing
    b.put("kv_indptr", _indptr(pages).to(b.torch_dtype("kv_indptr")))
    b.put("kv_indices", indices.to(b.torch_dtype("kv_indices")))
    if has_last:
        last = [k - (p - 1) * page_size if p else 0 for k, p in zip(kv_lens, pages, strict=True)]
        if b.dim_axis("kv_last_page_len", 0) == b.dim_axis("kv_indptr", 0):
            # declared as long as the indptr (public gqa_paged_prefill_*_ps64 files do): one entry per
            # request, as the reference reads it, and a trailing 0 it never reads
            last.append(0)
        b.put("kv_last_page_len", torch.tensor(last, dtype=b.torch_dtype("kv_last_page_len")))
    for name in caches:
        b.set_dim(name, 0, num_pages)
    return kv_lens

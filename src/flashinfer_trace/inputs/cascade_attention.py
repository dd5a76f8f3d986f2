"""Multi-level cascade attention inputs (`cascade_attention`: FlashInfer's `MultiLevelCascadeAttentionWrapper`):
q [num_qo, heads, dim], a paged cache k_cache / v_cache [num_pages, page_size, kv_heads, dim] (run()'s
paged_kv_cache as the tuple), and per level l the page table qo_indptr_l, kv_indptr_l, kv_indices_l,
kv_last_page_len_l. The number of levels is the number of qo_indptr_* inputs.

Structure first, tensors second. A batch of requests, each with its query count n_r and its own KV length L_r
(the last level: one segment per request). Level 0 is one segment over the whole batch (the system prompt); with
three levels, level 1 cuts the batch into contiguous groups (a prefix per group). Every segment's pages are drawn
from one permutation of the cache's pages (spare pages left unread), never sorted; a segment's last page holds
1 .. page_size tokens. Random cases: every level non-empty and, under causal, n_r <= L_r (no query loses all of
its own keys), so the boundary cases below are the only place those structures appear.

Edge cases (docs/boundary/cascade_attention.md gives each one's reason):
  empty_shared: level 0 lists no page (kv_len 0: its state is (0, -inf) and the merge must leave the rest as is);
  no_own_kv: one request (not the last) has no own KV (its last-level segment lists no page): its queries see the
    shared levels only, and under causal nothing of their own;
  single_request: one request: every level has one segment over the same queries;
  long_shared: the shared prefix is far longer than any request's own KV (more pages than a split of a few);
  single_token: one query per request (decode on a shared prefix, the wrapper's documented use);
  scores_far_negative / scores_large / one_key_dominates (attention.SCORE_CASES): the softmax at its limits across
    levels; one_key_dominates puts the dominant key in the second half of level 0, read by every query, so each
    merge must let that level win.
Left out: HND layout, the 5-D single-tensor cache, window_left / soft cap / RoPE (no definition asks for them).
"""

from __future__ import annotations

import math

import torch

from .attention import _dominant, _ints, roles, shape_scores
from .common import Builder, permutation

OP_TYPES = ("cascade_attention",)
SCORE = ("scores_far_negative", "scores_large", "one_key_dominates")
CASES = ("empty_shared", "no_own_kv", "single_request", "long_shared", "single_token", *SCORE)
REQUESTS = {"small": 3, "medium": 6, "large": 32}
MAX_QO = {"small": 4, "medium": 8, "large": 64}
MAX_OWN = {"small": 40, "medium": 96, "large": 1024}
MAX_SHARED = {"small": 40, "medium": 160, "large": 2048}
LONG_SHARED = {"small": 300, "medium": 700, "large": 8192}


def edge_cases(definition) -> list[str]:
    return list(CASES)


def num_levels(definition) -> int:
    return sum(1 for n in definition.inputs if n.startswith("qo_indptr_"))


def is_causal(definition) -> bool:
    return "causal" in definition.name.split("_")


def known(levels: int) -> list[str]:
    per = [f"{p}_{lv}" for lv in range(levels) for p in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len")]
    return ["q", "k_cache", "v_cache", *per, "sm_scale"]


def segments(b: Builder, levels: int) -> list[list[tuple[int, int, int]]]:
    """Per level, its segments as (first request, end request, kv_len)."""
    g = b.rng("batch")
    few = 1 if b.case == "single_request" else _ints(1, REQUESTS[b.size], g)[0]
    if b.case == "no_own_kv":
        few = max(few, 2)
    own = _ints(few, MAX_OWN[b.size], g)
    if b.case == "no_own_kv":
        own[_ints(1, few - 1, g)[0] - 1] = 0
    shared = _ints(1, MAX_SHARED[b.size], g)[0]
    if b.case == "long_shared":
        shared = LONG_SHARED[b.size]
    elif b.case == "empty_shared":
        shared = 0
    out = [[(0, few, shared)]]
    if levels == 3:
        cut = _ints(1, few, g)[0]  # groups [0, cut) and [cut, few) (one group if cut == few)
        bounds = [0, cut, few] if cut < few else [0, few]
        out.append([(a, e, _ints(1, MAX_SHARED[b.size], g)[0]) for a, e in zip(bounds, bounds[1:], strict=False)])
    elif levels != 2:
        raise b.mismatch(f"the cascade_attention generator makes 2 or 3 levels, not {levels}")
    out.append([(r, r + 1, own[r]) for r in range(few)])
    return out


def generate(b: Builder) -> None:
    d = b.definition
    levels = num_levels(d)
    names = known(levels)
    extra = [n for n in d.inputs if n not in names]
    if extra:
        raise b.mismatch(f"the cascade_attention generator does not know input(s) {', '.join(extra)}")
    missing = [n for n in names[:-1] if not b.has(n)]
    if missing:
        raise b.mismatch(f"a cascade_attention definition needs input(s) {', '.join(missing)}")
    if b.case is not None and b.case not in CASES:
        raise b.error(f"unknown case {b.case!r} (cases: {', '.join(CASES)})")
    ps = int(d.const_axes["page_size"])
    segs = segments(b, levels)
    few = segs[-1][-1][1]
    g = b.rng("queries")
    own = [s[2] for s in segs[-1]]
    if b.case == "single_token":
        qo = [1] * few
    else:
        qo = _ints(few, MAX_QO[b.size], g)
        if is_causal(d):  # a random case keeps n_r <= L_r; no_own_kv's empty request keeps its queries
            qo = [min(n, L) if L else n for n, L in zip(qo, own, strict=True)]
    qo_at = [0]
    for n in qo:
        qo_at.append(qo_at[-1] + n)
    pages = [[-(-kv // ps) for _, _, kv in lv] for lv in segs]
    used = sum(sum(p) for p in pages)
    num_pages = used + max(2, used // 4)
    perm = permutation(num_pages, b.rng("pages"))[:used]
    if used >= 2 and bool((perm[1:] > perm[:-1]).all()):
        perm[[0, 1]] = perm[[1, 0]]
    at = 0
    slots = []
    for lv, (level, counts) in enumerate(zip(segs, pages, strict=True)):
        kv_ptr = [0]
        for c in counts:
            kv_ptr.append(kv_ptr[-1] + c)
        idx = perm[at:at + kv_ptr[-1]]
        at += kv_ptr[-1]
        last = [kv - (c - 1) * ps if c else 0 for (_, _, kv), c in zip(level, counts, strict=True)]
        b.put(f"qo_indptr_{lv}", torch.tensor([qo_at[s[0]] for s in level] + [qo_at[-1]], dtype=torch.int32))
        b.put(f"kv_indptr_{lv}", torch.tensor(kv_ptr, dtype=torch.int32))
        b.put(f"kv_indices_{lv}", idx.to(torch.int32))
        b.put(f"kv_last_page_len_{lv}", torch.tensor(last, dtype=torch.int32))
        slots.append([(idx[kv_ptr[s]:kv_ptr[s + 1]].long()[:, None] * ps + torch.arange(ps)).flatten()[:kv]
                      for s, (_, _, kv) in enumerate(level)])
    b.set_dim("q", 0, qo_at[-1])
    for name in ("k_cache", "v_cache"):
        b.set_dim(name, 0, num_pages)
    for name in ("q", "k_cache", "v_cache"):
        b.put_random(name)
    if b.case in SCORE:
        hot = slots[0] if slots[0][0].numel() else slots[-1]
        dominant = _dominant(b, hot[:1]) if b.case == "one_key_dominates" else []
        shape_scores(b, roles(d), [torch.cat([s for lv in slots for s in lv])], dominant)
    if b.has("sm_scale"):
        b.put_scalar("sm_scale", 1.0 / math.sqrt(b.dim("q", -1)))

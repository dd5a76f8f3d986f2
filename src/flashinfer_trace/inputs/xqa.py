"""XQA paged decode inputs (op_type `xqa`), as `flashinfer.decode.xqa_batch_decode_with_kv_cache` takes them:

    query [batch, heads, d]                 one token per request (bf16 / fp16)
    k_cache, v_cache [pages, ps, kv, d]     NHD, the query's dtype or float8_e4m3fn codes
    block_tables [batch, max_pages_per_seq] each request's pages in sequence order; seq_lens [batch] (>= 1)
    max_seq_len                             seq_lens.max()
    bmm1_scale, bmm2_scale                  1 / sqrt(d) and 1; with an fp8 cache (codes of spread 8) or in the
                                            `kv_scales` case k_scale / sqrt(d) and v_scale, each log-uniform in
                                            [2^-5, 2^-2] (not on the score cases: 1 / sqrt(d) and 1 there)
    sinks [heads] (optional)                N(0, 1) logits; window_left (optional): window_size - 1

Every request's pages are distinct ids drawn from a cache with spare pages, in no order (never sorted by
chance); block table entries past a request's pages are random valid ids, which no kernel may read. Typical
lengths span two pages or more, and a window definition's longest request passes its window.

Edge cases (docs/boundary/xqa.md says why each exists):
  single_token: every request holds one key (the softmax of one weight: the output is bmm2_scale times its value);
  batch1: one request;
  page_edges: lengths one short of a page, a page, one past, two pages, 1;
  tail_poison: the slots past each request's length on its last page, and the unread pages, hold keys of 64 and
    values of 256 (a kernel that reads to the page's end, or a stale table entry, takes their weight);
  multi_block: one request of 1100..2047 keys (the split-KV path XQA takes when batch x kv heads is small);
  kv_scales: bmm1_scale and bmm2_scale carry K and V scales as with an fp8 cache (not 1 / sqrt(d) and 1);
  window_edges (window definitions): lengths window - 1 .. window + 2 and 2 x window + 1 around window_left + 1,
    and the last key outside each window (where there is one) scoring ~512 (raw) above the rest: reading it is
    no rounding matter;
  sink_dominates (sink definitions): every sink 40 above its head's largest score (the keys' weights ~ e^-40);
  the score cases of attention.SCORE_CASES (fp8 caches: all but subnormal_query and values_near_max, whose keys
    of 2^133 and values of 2^102 no e4m3 code holds), with the sinks at -2^20 so that the keys' softmax is what
    they judge.
"""

from __future__ import annotations

import math

import torch

from .attention import SCORE_CASES, Roles, _dominant, shape_scores
from .common import Builder, log_uniform, permutation, randint, random_tensor, unknown_inputs

OP_TYPES = ("xqa",)
INPUTS = ("query", "k_cache", "v_cache", "block_tables", "seq_lens", "max_seq_len", "bmm1_scale", "bmm2_scale",
          "sinks", "window_left")
REQUIRED = INPUTS[:8]
CASES = ("single_token", "batch1", "page_edges", "tail_poison", "multi_block", "kv_scales")
WINDOW_CASES = ("window_edges",)
SINK_CASES = ("sink_dominates",)
TIERS = {"small": (4, 48), "medium": (12, 300), "large": (64, 4096)}  # (requests at most, keys at most)
MULTI_BLOCK = (1100, 2048)  # multi_block's one request: keys in [lo, hi), past 1024
SCALE_LOG2 = (-5.0, -2.0)  # K / V dequantization scales of an fp8 cache (amax / 448 of real caches is below 1)
FP8_SIGMA = 8.0  # the spread of an fp8 cache's codes
POISON_KEY, POISON_VALUE = 64.0, 256.0  # exact in bf16, fp16 and e4m3
SINK_ABOVE = 40.0
SINK_NEGLIGIBLE = -2.0**20
# not for an fp8 cache: subnormal_query's keys of 2^133 and values_near_max's 2^102 are no e4m3 codes (its largest
# is 448), and 448 x bmm2_scale is nowhere near an overflow
FP16_ONLY = ("subnormal_query", "values_near_max")
ROLES = Roles(("query",), "query", "k_cache", ("k_cache",), "v_cache")


def fp8_cache(definition) -> bool:
    spec = definition.inputs.get("k_cache")
    return spec is not None and spec.dtype is not None and spec.dtype.value.startswith("float8")


def edge_cases(definition) -> list[str]:
    cases = list(CASES)
    if "window_left" in definition.inputs:
        cases += WINDOW_CASES
    if "sinks" in definition.inputs:
        cases += SINK_CASES
    scores = [c for c in SCORE_CASES if not (fp8_cache(definition) and c in FP16_ONLY)]
    return cases + scores


def window(b: Builder) -> int | None:
    """The visible keys of a window definition (window_left + 1), else None."""
    return b.axis("window_size") if b.has("window_left") else None


def lengths(b: Builder, page: int) -> list[int]:
    batch, longest = TIERS[b.size]
    win = window(b)
    longest = max(longest, 2 * page + 1, (win or 0) + page + 1)
    g = b.rng("lengths")
    n = 1 if b.case in ("batch1", "multi_block") else int(randint(2, batch + 1, (1,), g)[0])
    lens = randint(1, longest + 1, (n,), g).tolist()
    if lens[0] <= 2 * page:  # a request over two pages at least (the last one partly used)
        lens[0] = 2 * page + 1 + int(randint(0, page - 1, (1,), g)[0])
    if win is not None:
        lens[-1] = max(lens[-1], win + 1 + int(randint(1, page + 1, (1,), g)[0]))  # the window cuts it
    if b.case == "single_token":
        lens = [1] * n
    elif b.case == "page_edges":
        lens = [page - 1, page, page + 1, 2 * page, 1]
    elif b.case == "multi_block":
        lens = [int(randint(*MULTI_BLOCK, (1,), g)[0])]
    elif b.case == "window_edges" and win is not None:
        lens = [win - 1, win, win + 1, win + 2, 2 * win + 1]
    return lens


def structure(b: Builder, lens: list[int], page: int) -> tuple[torch.Tensor, int]:
    """block_tables (CPU int64) and num_pages: distinct pages per request in no order, spare pages unread."""
    counts = [-(-n // page) for n in lens]
    used = sum(counts)
    num_pages = used + max(2, used // 4)
    ids = permutation(num_pages, b.rng("pages"))[:used]
    if used >= 2 and bool((ids[1:] > ids[:-1]).all()):
        ids[[0, 1]] = ids[[1, 0]]  # sorted by chance: a sorted list would test nothing
    width = max(counts) + int(randint(0, 2, (1,), b.rng("width"))[0])
    table = randint(0, num_pages, (len(lens), width), b.rng("padding"))  # entries past a request's pages
    start = 0
    for r, c in enumerate(counts):
        table[r, :c] = ids[start:start + c]
        start += c
    return table, num_pages


def request_slots(table: torch.Tensor, lens: list[int], page: int) -> list[torch.Tensor]:
    """Per request, the rows of its keys in the cache flattened over pages (page * page_size + offset), in order."""
    return [(table[r, :-(-n // page)].long()[:, None] * page + torch.arange(page)).flatten()[:n]
            for r, n in enumerate(lens)]


def poison(b: Builder, table: torch.Tensor, lens: list[int], page: int, num_pages: int) -> None:
    """tail_poison: every slot no request reads (past a length on its last page, and the unread pages) gets large
    keys and values; the slots read keep their random values."""
    read = torch.zeros(num_pages * page, dtype=torch.bool)
    read[torch.cat(request_slots(table, lens, page))] = True
    unread = (~read).nonzero().flatten().to(b.device)
    for name, value in (("k_cache", POISON_KEY), ("v_cache", POISON_VALUE)):
        b.values[name].flatten(0, 1)[unread] = torch.tensor(value, dtype=b.torch_dtype(name), device=b.device)


def scales(b: Builder) -> tuple[float, float]:
    """(bmm1_scale, bmm2_scale) of the case: K and V scales folded in for an fp8 cache (and `kv_scales`), but on
    the score cases, which judge the softmax at its limits (a K scale below 1 would pull the scores back in)."""
    d = b.dim("query", -1)
    if b.case in SCORE_CASES or not (fp8_cache(b.definition) or b.case == "kv_scales"):
        return 1.0 / math.sqrt(d), 1.0
    k, v = (float(log_uniform((1,), b.rng(f"{n}:scale"), *SCALE_LOG2)[0]) for n in ("k", "v"))
    return k / math.sqrt(d), v


def cache_values(b: Builder, name: str) -> None:
    """A half-precision cache drawn like any input; an fp8 one as normal values of scale FP8_SIGMA rounded to e4m3
    (|x| < 32 at the tails, far from its 448; K / V scales of 2^-5 .. 2^-2 bring them back to O(1))."""
    if b.torch_dtype(name) != torch.float8_e4m3fn:
        b.put_random(name)
        return
    x = random_tensor(b.shape(name), "float32", b.rng(name), scale=FP8_SIGMA, device=b.device)
    b.put(name, x.to(torch.float8_e4m3fn))


def generate(b: Builder) -> None:
    unknown_inputs(b, INPUTS, "xqa")
    missing = [n for n in REQUIRED if not b.has(n)]
    if missing:
        raise b.mismatch(f"an xqa definition needs input(s) {', '.join(missing)}")
    if b.case is not None and b.case not in edge_cases(b.definition):
        raise b.error(f"unknown case {b.case!r} (cases: {', '.join(edge_cases(b.definition))})")
    page = b.axis("page_size")
    lens = lengths(b, page)
    table, num_pages = structure(b, lens, page)
    b.put("block_tables", table.to(torch.int32))
    b.put("seq_lens", torch.tensor(lens, dtype=torch.int32))
    b.set_axis("num_pages", num_pages)
    b.put_scalar("max_seq_len", max(lens))
    b.put_random("query")
    for name in ("k_cache", "v_cache"):
        cache_values(b, name)
    if b.case in SCORE_CASES:
        slots = request_slots(table, lens, page)
        shape_scores(b, ROLES, slots, _dominant(b, slots) if b.case == "one_key_dominates" else [])
    if b.case == "tail_poison":
        poison(b, table, lens, page, num_pages)
    if b.case == "window_edges":
        edge_key(b, table, lens, page)
    bmm1, bmm2 = scales(b)
    b.put_scalar("bmm1_scale", bmm1)
    b.put_scalar("bmm2_scale", bmm2)
    if b.has("window_left"):
        b.put_scalar("window_left", window(b) - 1)
    if b.has("sinks"):
        sinks = b.put_random("sinks")
        if b.case in SCORE_CASES:
            sinks.fill_(SINK_NEGLIGIBLE)
        elif b.case == "sink_dominates":
            sinks.copy_(top_scores(b, lens, page, bmm1) + SINK_ABOVE)


def edge_key(b: Builder, table: torch.Tensor, lens: list[int], page: int) -> None:
    """window_edges: query coordinate 0 of 16, key coordinate 0 of 0, but 32 on the key just before each window
    (token seq_len - 2 - window_left): the one key an off-by-one at the window's edge lets in dominates."""
    win = window(b)
    v = b.values
    v["query"][..., 0] = 16.0
    k = v["k_cache"].flatten(0, 1)
    for n, slots in zip(lens, request_slots(table, lens, page), strict=True):
        k[slots.to(k.device), ..., 0] = 0.0
        if n > win:
            k[int(slots[n - 1 - win]), ..., 0] = 32.0


def top_scores(b: Builder, lens: list[int], page: int, bmm1: float) -> torch.Tensor:
    """Per query head, its largest scaled score over every request's visible keys (float32)."""
    v = b.values
    q, kc, table = v["query"].float(), v["k_cache"].float().flatten(0, 1), v["block_tables"].long().cpu()
    heads, kv = q.shape[1], kc.shape[1]
    group, win = heads // kv, window(b)
    best = torch.full((heads,), -math.inf, device=q.device)
    for r, (n, slots) in enumerate(zip(lens, request_slots(table, lens, page), strict=True)):
        if win is not None:
            slots = slots[max(0, n - win):]
        k = kc[slots.to(q.device)].repeat_interleave(group, dim=1)  # [keys, heads, d]
        s = torch.einsum("hd,nhd->hn", q[r], k) * bmm1
        best = torch.maximum(best, s.amax(dim=-1))
    return best

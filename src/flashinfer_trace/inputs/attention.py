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

Edge cases: the four of `lengths` (structure at ordinary magnitudes), then boundary-seeking ones
(docs/boundary/attention.md gives each one's reason): scores at the limits of the arithmetic
(`SCORE_CASES`, shaped by `shape_scores` after the random draw), structure that leaves a query no
key or a request nothing (`empty_kv`, `empty_qo`, `fully_masked_rows`), a long kv and a cache whose
offsets pass 2**31 (`large_offsets`: a too-large skip where memory is short).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .common import Builder, CaseTooLarge, Stream, permutation, randint, random_tensor, random_words

OP_TYPES = ("gqa_paged", "gqa_ragged", "mla_paged", "mla_ragged")
CASES = ("single_token", "batch1", "uneven", "empty")
# the softmax's arithmetic at its limits: ordinary lengths, shaped q/k/v (shape_scores)
SCORE_CASES = ("scores_far_negative", "scores_large", "one_key_dominates", "uniform_keys", "zero_query",
               "values_near_max", "subnormal_query")
# a query with no key: prefill only where the definition allows qo_len > kv_len (allows_masked_rows)
MASKED_CASES = ("fully_masked_rows",)

# DeepSeek-V3 scores MLA with the pre-absorption head dim: qk_nope_head_dim 128 + qk_rope_head_dim.
MLA_QK_NOPE_HEAD_DIM = 128

# large_offsets: the cache (or ragged k/v) holds more than this many elements, and the keys read sit past it
INT32_ELEMENTS = 2**31
# the check's copies of a large_offsets cache at its peak: the generated one, the ground truth's and the
# reference's copies, the reference worker's shared arena (4; |v| for the error model on a failure), and
# headroom, since the budget is the machine's whole memory (5 let a 4.5 GiB MLA cache start on a 23 GiB
# CPU and be killed at 18 GiB). The ground truth and the references gather the pages they read, never
# widening the whole cache.
LARGE_OFFSETS_FACTOR = 6


@dataclass(frozen=True)
class Tier:
    batch: int
    max_kv: int
    max_qo: int
    # the boundary cases (boundary_lengths): their point is the values or one structure, not the batch, so
    # they are small on the CPU (medium's lengths still span more than one 128-key tile); the GPUs' large
    # tier makes them as long as the random cases
    few: int = 3  # requests
    edge_kv: int = 33  # kv lengths up to this
    edge_qo: int = 17  # query lengths up to this
    long_kv: int = 1024  # long_kv's longest request


# medium is sized so the plain-torch references (a Python loop over requests) finish in ~0.1 s
# on a CPU: 16 requests x 512 kv x 128 queries took ~2 s for the GQA prefill references.
TIERS = {
    "small": Tier(batch=3, max_kv=33, max_qo=17, few=3, edge_kv=33, edge_qo=17, long_kv=1024),
    "medium": Tier(batch=16, max_kv=256, max_qo=64, few=3, edge_kv=160, edge_qo=24, long_kv=2048),
    "large": Tier(batch=64, max_kv=4096, max_qo=512, few=16, edge_kv=4096, edge_qo=512, long_kv=65536),
}

QUERIES = ("q", "q_nope", "q_pe")
CACHES = ("k_cache", "v_cache", "ckv_cache", "kpe_cache")
RAGGED_KV = ("k", "v")
STRUCTURE = ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "sm_scale")


def edge_cases(definition) -> list[str]:
    cases = [*CASES, *SCORE_CASES]
    prefill = is_prefill(definition)
    if not prefill or allows_masked_rows(definition):
        cases.append("empty_kv")  # in prefill, a request with queries and no kv: only masked rows
    if prefill:
        cases.append("empty_qo")
        if is_causal(definition) and allows_masked_rows(definition):
            cases += MASKED_CASES
    return [*cases, "long_kv", "large_offsets"]


def is_prefill(definition) -> bool:
    return "qo_indptr" in definition.inputs


def is_causal(definition) -> bool:
    """The name says so (`..._prefill_causal_...`), as semantics.is_causal reads it."""
    return is_prefill(definition) and "causal" in definition.name.split("_")


def allows_masked_rows(definition) -> bool:
    """Whether a request may have more queries than keys: no constraint compares the two indptrs'
    per-request lengths (a file that requires qo_len <= kv_len excludes fully masked rows by contract)."""
    return not any("qo_indptr[1:]" in c and "kv_indptr[1:]" in c for c in definition.constraints)


def _ints(n: int, hi: list[int] | int, s: Stream) -> list[int]:
    """n integers, the i-th uniform on [1, hi_i] (exact integer arithmetic)."""
    his = torch.tensor([hi] * n if isinstance(hi, int) else hi, dtype=torch.int64)
    w = random_words(n, s) & 0x7FFFFFFF
    return (1 + w % his.clamp(min=1)).tolist()


def lengths(b: Builder, prefill: bool, unit: int = 1) -> tuple[list[int], list[int]]:
    """(kv_lens, qo_lens) for this case; qo_lens is all ones for decode. `unit`: kv lengths are
    multiples of it (page_size where every page is full); the boundary cases round them themselves.

    Edge cases:
      single_token: every request has kv_len 1 (and qo_len 1 for prefill);
      batch1: a single request, in the upper half of the tier's kv range;
      uneven: lengths spread log-uniformly, including 1 and the tier maximum;
      empty: one request (at a random index, not the last one only) has 0 query tokens
        (prefill) or 0 kv tokens (decode). A decode request with no kv has no keys to attend to:
        the definitions define its output as zeros and its lse as -inf, so the generator makes
        the case and the reference decides what it means.
    The boundary cases' lengths: `boundary_lengths`.
    """
    if b.case not in CASES and b.case is not None:
        return boundary_lengths(b, prefill, unit)
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


def boundary_lengths(b: Builder, prefill: bool, unit: int = 1) -> tuple[list[int], list[int]]:
    """Lengths of the boundary cases (tier.few requests, kv up to tier.edge_kv, queries up to tier.edge_qo;
    kv lengths multiples of `unit`):

      SCORE_CASES, large_offsets: random lengths, qo_len <= kv_len (the values are the point);
      empty_kv: the first and last requests have no kv (and a middle one from 4 requests on); in
        prefill the first keeps its queries (every row of it masked), the last has none;
      empty_qo (prefill): the first and last requests have no queries, a middle one neither queries nor kv;
      fully_masked_rows (causal prefill): every other request has qo_len > kv_len, so its first
        qo_len - kv_len queries see no key; the first has one page (or token) of kv and edge_qo
        queries on top;
      long_kv: a request of tier.long_kv keys (a few queries in prefill: a long prefix's append)
        beside a short one: the split-kv paths and the merge of their partial states.
    """
    tier = TIERS[b.size]
    case = b.case
    g = b.rng("lengths")
    n = 2 if case == "long_kv" else tier.few
    kv = _ints(n, 64 if case == "large_offsets" else tier.edge_kv, g)
    if case == "long_kv":
        kv[0] = tier.long_kv
    kv = [-(-k // unit) * unit for k in kv]
    qo = _ints(n, [min(k, tier.edge_qo) for k in kv], g) if prefill else [1] * n
    if case == "long_kv" and prefill:
        qo[0] = min(4, qo[0])
    elif case == "empty_kv":
        kv[0] = kv[-1] = 0
        if n >= 4:
            kv[n // 2] = 0
        if prefill:
            qo[-1] = 0
            if n >= 4:
                qo[n // 2] = 0
    elif case == "empty_qo":
        qo[0] = qo[-1] = 0
        if n >= 4:
            qo[n // 2] = kv[n // 2] = 0
    elif case == "fully_masked_rows":
        extra = _ints(n, tier.edge_qo, g)
        kv[0], extra[0] = unit, tier.edge_qo
        qo = [k + e if r % 2 == 0 else q for r, (k, e, q) in enumerate(zip(kv, extra, qo, strict=True))]
    return kv, qo


def _indptr(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *lens], dtype=torch.int64).cumsum(0).to(torch.int32)


def generate(b: Builder) -> None:
    d = b.definition
    paged = d.op_type in ("gqa_paged", "mla_paged")
    known = QUERIES + (CACHES if paged else RAGGED_KV) + STRUCTURE
    extra = [n for n in d.inputs if n not in known]
    if extra:
        raise b.mismatch(f"the {d.op_type} generator does not know input(s) {', '.join(extra)}")
    prefill = is_prefill(d)
    page_size = d.const_axes.get("page_size", 1) if paged else 1
    full_pages = paged and not b.has("kv_last_page_len")
    kv_lens, qo_lens = lengths(b, prefill, page_size if full_pages else 1)
    batch = len(kv_lens)
    large = b.case == "large_offsets"

    if paged:
        kv_lens = _paged_structure(b, kv_lens)  # page rounding may lengthen them
    else:
        if not b.has("kv_indptr"):
            raise b.error("a ragged attention definition needs a kv_indptr input")
        if large:  # a first request of keys only (no queries), so that the others' k and v sit past 2**31 elements
            per_token = min(_token_elements(b, n) for n in RAGGED_KV if b.has(n))
            kv_lens, qo_lens = [INT32_ELEMENTS // per_token + 1, *kv_lens], [0, *qo_lens]
            batch += 1
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

    kv_inputs = [n for n in (CACHES if paged else RAGGED_KV) if b.has(n)]
    for name in queries:
        b.put_random(name)
    if large:  # random keys and values only where a request with queries reads them
        slots = _request_slots(b, kv_lens, paged)
        _put_sparse_kv(b, kv_inputs, [s for s, n in zip(slots, qo_lens, strict=True) if n], paged)
    else:
        for name in kv_inputs:
            b.put_random(name)

    if b.case in SCORE_CASES:
        slots = _request_slots(b, kv_lens, paged)
        shape_scores(b, roles(d), slots, _dominant(b, slots) if b.case == "one_key_dominates" else [])

    if b.has("sm_scale"):
        if d.op_type == "mla_paged":
            head_dim = MLA_QK_NOPE_HEAD_DIM + b.dim("q_pe", -1)
        else:
            head_dim = b.dim(queries[0], -1)
        b.put_scalar("sm_scale", 1.0 / math.sqrt(head_dim))


def _token_elements(b: Builder, name: str) -> int:
    """Elements of one token (one page for a paged cache) of a kv input: its const trailing dims."""
    return math.prod(b.dim(name, i) for i in range(1, len(b.spec(name).shape)))


def _paged_structure(b: Builder, kv_lens: list[int]) -> list[int]:
    """kv_indptr, kv_indices, kv_last_page_len and the page count, consistent with kv_lens;
    returns the kv lengths the pages hold. large_offsets: a cache of more than 2**31 elements,
    whose used pages are its last ones (the first request's first page is page 0 instead)."""
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
    g = b.rng("pages")
    if b.case == "large_offsets":
        per_page = max(_token_elements(b, n) for n in caches)  # MLA: the latent's offsets (kpe's stay 8x lower)
        num_pages = INT32_ELEMENTS // per_page + 2 * used + 1
        indices = num_pages - 2 * used + permutation(2 * used, g)[:used]  # every one past 2**31 elements
        if used:
            indices[0] = 0
    else:
        spare = max(2, used // 4)
        num_pages = used + spare
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


def _request_slots(b: Builder, kv_lens: list[int], paged: bool) -> list[torch.Tensor]:
    """Per request, the rows of its keys in the kv inputs seen as [tokens, ...] (a paged cache
    flattened over pages and slots: page * page_size + offset), in sequence order (CPU int64)."""
    indptr = b.values["kv_indptr"].cpu().to(torch.int64).tolist()
    if not paged:
        return [torch.arange(indptr[r], indptr[r + 1]) for r in range(len(kv_lens))]
    page_size = b.definition.const_axes.get("page_size", 1)
    indices = b.values["kv_indices"].cpu().to(torch.int64)
    out = []
    for r, n in enumerate(kv_lens):
        pages = indices[indptr[r]:indptr[r + 1]]
        out.append((pages[:, None] * page_size + torch.arange(page_size)).flatten()[:n])
    return out


def require_large(b: Builder, nbytes: int, what: str) -> None:
    """large_offsets' memory check, and a CPU's: there it is a too-large skip whatever the RAM, since
    making and copying a cache of several GiB four times takes a CPU minutes a case (an idle 16-core
    host with 128 GB ran out of a 9-minute limit on gqa_paged's)."""
    if b.device.type == "cpu":
        raise CaseTooLarge(f"{what} needs {nbytes / 2**30:.1f} GiB (x{LARGE_OFFSETS_FACTOR} for the check's copies): "
                           "a GPU case; on a CPU its copies take minutes", definition=b.definition.name)
    b.require_bytes(nbytes, what, factor=LARGE_OFFSETS_FACTOR)


def _put_sparse_kv(b: Builder, names: list[str], slots: list[torch.Tensor], paged: bool) -> None:
    """large_offsets: kv inputs of zeros with random keys and values at the rows the requests read
    (drawing 2**31 random elements would cost a CPU minutes; an unread row's value changes nothing
    in a correct kernel, and a zero key still draws weight from a kernel that reads the wrong row)."""
    nbytes = sum(math.prod(b.shape(n)) * torch.empty(0, dtype=b.torch_dtype(n)).element_size() for n in names)
    require_large(b, nbytes, "a kv cache past 2**31 elements")
    rows = torch.cat(slots).to(b.device)
    for name in names:
        shape = b.shape(name)
        t = torch.zeros(shape, dtype=b.torch_dtype(name), device=b.device)
        flat = t.flatten(0, 1) if paged else t
        flat[rows] = random_tensor((rows.numel(), *flat.shape[1:]), b.spec(name).dtype, b.rng(name),
                                   device=b.device)
        b.put(name, t)
        b.sparse.add(name)


# -- the boundary cases' values -------------------------------------------------------------------
@dataclass(frozen=True)
class Roles:
    """Which input plays which part in the scores, by layout. `score_query`/`score_key`: a query
    input and a key input that is no value (coordinate 0 of the pair carries a chosen offset);
    `keys`: every input a key is made of; `value`: what the output averages; `value_query`: the
    query part that multiplies the values too (absorbed MLA's latent), scaled against them."""

    queries: tuple[str, ...]
    score_query: str
    score_key: str
    keys: tuple[str, ...]
    value: str
    value_query: str | None = None


def roles(definition) -> Roles:
    if "q_pe" in definition.inputs:  # absorbed MLA (mla_paged, dsa_paged): ckv is key and value, kpe key only
        return Roles(("q_nope", "q_pe"), "q_pe", "kpe_cache", ("ckv_cache", "kpe_cache"), "ckv_cache", "q_nope")
    if "k_cache" in definition.inputs:
        return Roles(("q",), "q", "k_cache", ("k_cache",), "v_cache")
    return Roles(("q",), "q", "k", ("k",), "v")


def _dominant(b: Builder, slots: list[torch.Tensor]) -> list[torch.Tensor]:
    """one_key_dominates: per request, the one key that dominates, in the second half of its kv (a
    later tile than the first: an online softmax must rescale what it summed before; in causal
    prefill its last query sees it at least)."""
    g = b.rng("dominant")
    out = []
    for s in slots:
        n = s.numel()
        if n == 0:
            out.append(s)
            continue
        half = n // 2
        pos = half + int(randint(0, n - half, (1,), g))
        out.append(s[pos:pos + 1])
    return out


def value_scale(dtype: torch.dtype) -> float:
    """values_near_max's value scale, a power of two: a quarter of the dtype's largest power of two,
    capped so that a float32 sum of 2**24 such values cannot overflow. fp16: 2**13 (values to ~35000
    of 65504); bf16 shares float32's range, so near its max two values already overflow a float32
    sum (the definitions compute in float32): 2**102."""
    top = min(torch.finfo(dtype).max, torch.finfo(torch.float32).max / 2**24)
    return 2.0 ** (math.floor(math.log2(top)) - 2)


def subnormal_pair(dtype: torch.dtype) -> tuple[float, float]:
    """subnormal_query's (query magnitude, key magnitude): half the dtype's smallest normal (a subnormal),
    and its inverse, so each product is 1 and the scores are sums of +-1."""
    tiny = torch.finfo(dtype).tiny / 2
    return tiny, 1.0 / tiny


def _to_grid(t: torch.Tensor, step: float) -> None:
    """t rounded, in place, to multiples of `step` (a power of two: exact, the same on every device)."""
    t.copy_(torch.round(t.to(torch.float32) / step) * step)


def _signs(shape, b: Builder, tag: str) -> torch.Tensor:
    """+-1.0 (float32), one random bit each, on the builder's device."""
    bits = random_words(math.prod(shape), b.rng(tag), device=b.device) & 1
    return (bits.to(torch.float32) * 2 - 1).reshape(shape)


def shape_scores(b: Builder, r: Roles, groups: list[torch.Tensor], dominant: list[torch.Tensor]) -> None:
    """Reshape the drawn q/k/v for a SCORE_CASES case, in place, with exact operations only (a case is
    the same bits on every device). `groups`: the key rows (of the kv inputs seen as [tokens, ...]) that
    one request reads; `dominant`: one_key_dominates' key row of each.

      scores_far_negative: raw q . k = -65536 or -81920 (by row) + about N(0, head_dim): every score of a row
        below -5e4 (a finite masking sentinel's range), the softmax itself ordinary;
      scores_large: raw q . k = 4096 + about N(0, head_dim): exp() of a scaled score overflows float32 unless
        the row's max is subtracted first;
        (both on grids that keep float32 products and sums exact: _to_grid)
      one_key_dominates: one key per request scores ~512 (raw) above the others: the softmax is one-hot;
      uniform_keys: every key of a request is its first key (ties everywhere: weights 1 / kv_len);
      zero_query: every query is 0 (scores 0: the weights are 1 / visible keys, lse log2 of their count);
      values_near_max: values of magnitude |N(0, 1)| x value_scale, odd channels negative (absorbed MLA: the
        latent, and q_nope scaled down as much);
      subnormal_query: query elements +-(a subnormal), key elements +-(its inverse): the products are +-1.
    """
    v, case = b.values, b.case

    def rows(name: str) -> torch.Tensor:
        t = v[name]
        return t.flatten(0, 1) if name.endswith("_cache") else t  # paged: [pages * page_size, ...]

    q, k = v[r.score_query], rows(r.score_key)
    if case in ("scores_far_negative", "scores_large"):
        # queries on a grid of 2**-4, keys of 2**-3: every product, and every partial sum below 2**17, is
        # then exact in float32, so a float32 q . k (the reference's or a kernel's) is exact whatever its
        # order, and the scores' offset costs no precision the float64 ground truth would not also have
        for name in r.queries:
            _to_grid(v[name], 2.0**-4)
        for name in r.keys:
            _to_grid(v[name], 2.0**-3)
    if case == "scores_far_negative":
        row = torch.arange(q.shape[0], device=q.device)
        q[..., 0] = (256.0 + 64.0 * (row % 2)).to(q.dtype).view(-1, *[1] * (q.dim() - 2))
        k[..., 0] = -256.0
    elif case == "scores_large":
        q[..., 0] = 64.0
        k[..., 0] = 64.0
    elif case == "one_key_dominates":
        q[..., 0] = 16.0
        k[..., 0] = 0.0
        if dominant:
            k[torch.cat(dominant).to(k.device), ..., 0] = 32.0
    elif case == "uniform_keys":
        for name in r.keys:
            t = rows(name)
            for s in groups:
                if s.numel():
                    s = s.to(t.device)
                    t[s] = t[s[:1]].expand(s.numel(), *t.shape[1:])
    elif case == "zero_query":
        for name in r.queries:
            v[name].zero_()
    elif case == "values_near_max":
        # one sign per channel: the output is a weighted mean of magnitudes near the max, not a sum that
        # cancels to a small result (where an absolute tolerance that scales with nothing would judge
        # float32 rounding of the operands, not the kernel)
        t, scale = v[r.value], value_scale(v[r.value].dtype)
        t.abs_().mul_(scale)
        t[..., 1::2].neg_()
        if r.value_query is not None:
            v[r.value_query].mul_(1.0 / scale)
    elif case == "subnormal_query":
        tiny, big = subnormal_pair(q.dtype)
        q.copy_(_signs(q.shape, b, "subnormal_q").mul_(tiny))
        k.copy_(_signs(k.shape, b, "subnormal_k").mul_(big))
        if r.value_query is not None:  # the scores come from the rope part alone
            v[r.value_query].zero_()

"""Paged KV-cache append inputs (op_type `page_append`): new tokens' rows written into a paged cache, as
`flashinfer.page.append_paged_kv_cache` (k/v) and `append_paged_mla_kv_cache` (MLA ckv/kpe) take them.

    append rows [nnz_kv, ...]           (append_key/append_value [nnz, heads, dim]; append_ckv/append_kpe [nnz, dim])
    batch_indices, positions [nnz_kv]   token i is position positions[i] of request batch_indices[i]
    caches [num_pages, page_size, ...]  (k_cache/v_cache NHD; ckv_cache/kpe_cache), written in place
    kv_indices, kv_indptr, kv_last_page_len   the paging of every request, the appended tokens included

Each request b has `prior[b]` cached tokens and appends `new[b]`; its sequence is seq = prior + new tokens,
held in ceil(seq / page_size) pages (none for an empty one, whose kv_last_page_len is 0). Its appended
tokens are positions prior .. seq - 1, request after request (what get_batch_indices_positions returns
from the append indptr and the sequence lengths). Pages are distinct ids drawn from a cache with spare
pages (a random permutation: scattered, in no order), and every slot holds random data before the call,
so a write anywhere else than the named slots, or a slot left unwritten, differs from the truth.

Edge cases (docs/boundary/page_append.md says why each exists):
  decode: one token per request (the decode step), over more requests with shorter histories;
  page_boundary: appends that start on a page's last slot and cross into the next, that start on a fresh page
    and fill it exactly, that span three pages, and that start mid-page and end on a page's last slot: two
    requests end with a full last page (kv_last_page_len == page_size);
  zero_append: the first, the last and about half of the requests append nothing (their pages must not
    change), and one request has no pages at all (kv_last_page_len 0);
  reversed_pages: every request lists its pages in descending id order, requests interleaved over the cache;
  shuffled_tokens: the appended tokens come in random order (batch_indices not sorted): the API takes each
    token's (request, position) on its own;
  bit_patterns: every value (appended rows and cache) is a uniformly random finite bit pattern of the dtype,
    and the first appended row starts with +-0, +-the smallest subnormal, +-the smallest normal and +-max:
    a copy keeps every code, and a kernel that converts through another type or flushes subnormals does not;
  large_page_index: a cache whose last page starts past 2**31 elements, and the requests' pages include it
    and page 0: an element offset computed in 32 bits wraps (too-large where the memory is not there).
"""

from __future__ import annotations

import torch

from .common import Builder, permutation, randint, random_words, unknown_inputs

OP_TYPES = ("page_append",)
KV = ("append_key", "append_value", "k_cache", "v_cache")
MLA = ("append_ckv", "append_kpe", "ckv_cache", "kpe_cache")
INDEX = ("batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len")
CASES = ("decode", "page_boundary", "zero_append", "reversed_pages", "shuffled_tokens", "bit_patterns",
         "large_page_index")

# (requests, most cached tokens before the append, most appended tokens): the whole cache is compared, so its size
# is what a case costs on a CPU; medium keeps it near a million elements per cache (~70 pages of 16 x 8 x 128)
TIERS = {"small": (3, 40, 24), "medium": (6, 120, 48), "large": (64, 2000, 512)}
DECODE_REQUESTS = {"small": 8, "medium": 16, "large": 256}
SPARE = 3  # pages no request owns, beyond a third more than the requests use
INT32_ELEMENTS = 2**31  # large_page_index: the last page's first element offset reaches this


def edge_cases(definition) -> list[str]:
    return list(CASES)


def roles(b: Builder) -> tuple[str, str, str, str]:
    """(first rows, second rows, first cache, second cache) of this definition's form, KV or MLA."""
    form = KV if b.has("append_key") else MLA
    unknown_inputs(b, (*form, *INDEX), "page_append")
    missing = [n for n in (*form, *INDEX) if not b.has(n)]
    if missing:
        raise b.mismatch(f"a page_append definition needs input(s) {', '.join(missing)}")
    for row, cache in ((form[0], form[2]), (form[1], form[3])):
        rs, cs = b.spec(row).shape, b.spec(cache).shape
        if rs is None or cs is None or len(cs) != len(rs) + 1 or cs[2:] != rs[1:]:
            raise b.mismatch(f"{cache} {cs} is not [num_pages, page_size, *{row}'s row {rs}]")
    return form  # type: ignore[return-value]


def _lengths(b: Builder, page: int) -> tuple[list[int], list[int]]:
    """(prior, new) tokens of each request, by case."""
    requests, prior_max, new_max = TIERS[b.size]
    requests = b.count(requests) if b.case is None else requests
    prior_max, new_max = max(prior_max, 2 * page), max(new_max, page)  # large pages: still several per request
    g = b.rng("lengths")
    if b.case == "decode":
        requests = DECODE_REQUESTS[b.size]  # more requests, shorter histories: the cache stays the tier's size
        return randint(0, prior_max // 2 + 1, (requests,), g).tolist(), [1] * requests
    prior = randint(0, prior_max + 1, (requests,), g).tolist()
    new = randint(1, new_max + 1, (requests,), g).tolist()
    if b.case == "page_boundary":  # (prior, new) at the page edges, then the tier's random requests
        edges = [(page - 1, 2), (page, page), (0, 2 * page + 1), (page // 2, page - page // 2)]
        prior, new = [p for p, _ in edges] + prior, [n for _, n in edges] + new
    elif b.case == "zero_append":
        requests = max(requests, 4)
        prior = randint(1, prior_max + 1, (requests,), g).tolist()
        new = randint(1, new_max + 1, (requests,), g).tolist()
        none = randint(0, 2, (requests,), g).tolist()
        none[0] = none[-1] = 1
        new = [0 if z else n for z, n in zip(none, new, strict=True)]
        new[1] = max(new[1], 1)  # one request appends, whatever the draw
        prior.insert(2, 0)  # one request without pages: nothing cached, nothing appended
        new.insert(2, 0)
    return prior, new


def _pages(b: Builder, counts: list[int], num_pages: int) -> list[list[int]]:
    """Each request's page ids: distinct, from a shuffled cache (reversed_pages: descending per request,
    interleaved; large_page_index: the cache's last page and page 0 among them)."""
    used = sum(counts)
    ids = permutation(num_pages, b.rng("pages"))[:used].tolist()
    if b.case == "large_page_index":
        ids = sorted(set(ids) - {0, num_pages - 1})[:max(used - 2, 0)] + [0, num_pages - 1][:used]
        ids = [ids[i] for i in permutation(len(ids), b.rng("pages:order")).tolist()]
        last = max(range(len(counts)), key=lambda r: counts[r])  # the largest request ends on the last page
        end = sum(counts[:last + 1]) - 1
        at = ids.index(num_pages - 1)
        ids[at], ids[end] = ids[end], ids[at]
    out, start = [], 0
    if b.case == "reversed_pages":  # round-robin over the requests, then each request's list descending
        ids = sorted(ids)
        mine: list[list[int]] = [[] for _ in counts]
        left = list(counts)
        r = 0
        for pid in ids:
            while left[r % len(counts)] == 0:
                r += 1
            mine[r % len(counts)].append(pid)
            left[r % len(counts)] -= 1
            r += 1
        return [sorted(m, reverse=True) for m in mine]
    for c in counts:
        out.append(ids[start:start + c])
        start += c
    return out


def _bit_patterns(b: Builder, name: str, first: bool) -> torch.Tensor:
    """Uniformly random finite codes of the input's dtype (a non-finite code becomes +-max of its sign); the
    first row of an appended tensor starts with the dtype's landmarks."""
    shape, dtype = b.shape(name), b.torch_dtype(name)
    n = 1
    for s in shape:
        n *= s
    bits = torch.finfo(dtype).bits
    words = random_words((n * bits + 63) // 64, b.rng(f"{name}:bits"), device=b.device)
    raw = words.view(torch.uint8)[: n * bits // 8]
    codes = raw.view(torch.int16 if bits == 16 else torch.uint8).view(dtype).reshape(shape)
    big = torch.finfo(dtype).max
    wide = codes.to(torch.float32)
    codes = torch.where(torch.isfinite(wide), wide, torch.where(wide > 0, big, -big)).to(dtype)
    if first and codes.numel():
        fi = torch.finfo(dtype)
        marks = [0.0, -0.0, fi.tiny * fi.eps, -fi.tiny * fi.eps, fi.tiny, -fi.tiny, fi.max, -fi.max]
        flat = codes.reshape(-1)
        k = min(len(marks), flat.numel())
        flat[:k] = torch.tensor(marks[:k], dtype=torch.float32).to(dtype).to(flat.device)
        codes = flat.reshape(shape)
    return codes.contiguous()


def generate(b: Builder) -> None:
    first, second, k_cache, v_cache = roles(b)
    page = b.dim(k_cache, 1)
    if page < 1:
        raise b.error(f"page_size {page}")
    prior, new = _lengths(b, page)
    seq = [p + n for p, n in zip(prior, new, strict=True)]
    counts = [-(-s // page) for s in seq]
    used = sum(counts)
    num_pages = used + used // 3 + SPARE
    if b.case == "large_page_index":  # the widest cache's last page starts at or past element 2**31
        per_page = page * max(_row_elements(b, c) for c in (k_cache, v_cache))
        num_pages = max(num_pages, INT32_ELEMENTS // per_page + 2)
        nbytes = sum(b.torch_dtype(c).itemsize * page * _row_elements(b, c) for c in (k_cache, v_cache)) * num_pages
        b.require_bytes(nbytes, f"a cache of {num_pages} pages (its last page past element 2**31)")
    pages = _pages(b, counts, num_pages)
    last = [0 if c == 0 else s - (c - 1) * page for s, c in zip(seq, counts, strict=True)]
    indptr = [0]
    for c in counts:
        indptr.append(indptr[-1] + c)
    req = [r for r, n in enumerate(new) for _ in range(n)]
    pos = [prior[r] + j for r, n in enumerate(new) for j in range(n)]
    if b.case == "shuffled_tokens" and req:
        order = permutation(len(req), b.rng("tokens")).tolist()
        req, pos = [req[i] for i in order], [pos[i] for i in order]

    def ints(name: str, values: list[int]) -> None:
        b.put(name, torch.tensor(values, dtype=torch.int64).to(b.torch_dtype(name)))

    ints("kv_indptr", indptr)
    ints("kv_indices", [p for mine in pages for p in mine])
    ints("kv_last_page_len", last)
    ints("batch_indices", req)
    ints("positions", pos)
    b.set_dim(k_cache, 0, num_pages)
    b.set_dim(first, 0, len(req))
    for name in (first, second, k_cache, v_cache):
        if b.case == "bit_patterns":
            b.put(name, _bit_patterns(b, name, name == first))
        else:
            b.put_random(name)


def _row_elements(b: Builder, cache: str) -> int:
    n = 1
    for s in b.spec(cache).shape[2:]:
        n *= b.axis(s)
    return n

"""Independent float64 ground truth for `page_append` (paged KV-cache append, k/v and MLA ckv/kpe), written from
the definitions' descriptions and FlashInfer's documented contract, not from their references.

The reference finds each token's page by dividing its position by the page size. Here every request's
token slots are laid out first, as one table of flat slot ids (page * page_size + offset, for every slot of
every page the request lists, in sequence order), and the caches are viewed as [num_pages * page_size, row]:
token i goes to row table[batch_indices[i]][positions[i]], one `index_copy` per cache, in float64. A copy
widened to float64 is exact for every cache dtype, so the truth is the exact answer; the contract is
checked as it goes (a position past its request's sequence, a page out of range, two tokens on one slot are
errors of the inputs, not something to compute).
"""

from __future__ import annotations

import torch

from .base import Adapter, Call

F64 = torch.float64
KV = ("append_key", "append_value", "k_cache", "v_cache")
MLA = ("append_ckv", "append_kpe", "ckv_cache", "kpe_cache")
INDEX = ("batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len")


def form(definition) -> tuple[str, ...] | None:
    """The definition's (rows, rows, cache, cache) names, KV or MLA; None when it has neither set."""
    for names in (KV, MLA):
        if all(n in definition.inputs for n in (*names, *INDEX)):
            return names
    return None


def applies(definition) -> str | None:
    if form(definition) is None:
        return f"needs {', '.join(INDEX)} and either {', '.join(KV)} or {', '.join(MLA)}"
    first = definition.inputs[form(definition)[2]]
    if first.shape is None or len(first.shape) < 3:
        return "the caches are [num_pages, page_size, ...] (NHD)"
    return None


def slot_rows(kv_indices: torch.Tensor, kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int,
              num_pages: int) -> list[torch.Tensor]:
    """Each request's flat cache rows (page * page_size + offset), one per token of its sequence, in order.
    Raises ValueError where the paging is outside the contract."""
    indptr = kv_indptr.to(torch.int64).tolist()
    pages_all = kv_indices.to(torch.int64)
    last = kv_last_page_len.to(torch.int64).tolist()
    if indptr[0] != 0 or any(b < a for a, b in zip(indptr, indptr[1:], strict=False)):
        raise ValueError(f"kv_indptr {indptr[:8]}... is not monotone from 0")
    offsets = torch.arange(page_size, dtype=torch.int64, device=kv_indices.device)
    out = []
    for r in range(len(indptr) - 1):
        pages = pages_all[indptr[r]:indptr[r + 1]]
        if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= num_pages):
            raise ValueError(f"request {r}: a page id outside [0, {num_pages})")
        full = (pages[:, None] * page_size + offsets).reshape(-1)
        length = 0 if pages.numel() == 0 else (pages.numel() - 1) * page_size + last[r]
        if pages.numel() and not 1 <= last[r] <= page_size:
            raise ValueError(f"request {r}: kv_last_page_len {last[r]} outside [1, {page_size}]")
        out.append(full[:length])
    return out


def append(call: Call) -> tuple:
    """Both caches after the append, as float64 [num_pages, page_size, ...]."""
    x = call.inputs.values
    first, second, k_name, v_name = form(call.definition)
    k_cache, v_cache = x[k_name], x[v_name]
    num_pages, page_size = k_cache.shape[:2]
    table = slot_rows(x["kv_indices"], x["kv_indptr"], x["kv_last_page_len"], page_size, num_pages)
    batch = x["batch_indices"].to(torch.int64).tolist()
    pos = x["positions"].to(torch.int64).tolist()
    rows = []
    for i, (r, p) in enumerate(zip(batch, pos, strict=True)):
        if not 0 <= r < len(table):
            raise ValueError(f"token {i}: batch index {r} outside [0, {len(table)})")
        if not 0 <= p < table[r].numel():
            raise ValueError(f"token {i}: position {p} outside request {r}'s sequence of {table[r].numel()}")
        rows.append(int(table[r][p]))
    if len(set(rows)) != len(rows):
        raise ValueError("two appended tokens name the same cache slot")
    where = torch.tensor(rows, dtype=torch.int64, device=k_cache.device)
    out = []
    for cache, new in ((k_cache, x[first]), (v_cache, x[second])):
        flat = cache.to(F64).reshape(num_pages * page_size, -1)
        flat.index_copy_(0, where, new.to(F64).reshape(len(rows), -1))
        out.append(flat.reshape(cache.shape))
    return tuple(out)


ADAPTERS = [
    Adapter("torch", "page_append", "slot table + index_copy (float64)", append, applies=applies),
]

"""Planted bugs of `page_append` (paged KV-cache append): one per boundary class of docs/boundary/page_append.md,
each a realistic slip of an append kernel written as a text edit of a definition's reference. mutants.py appends
`MUTANTS` to its own; tests/unit/test_page_append.py checks that each is caught by its case."""

from __future__ import annotations

from .mutants_model import Mutant, _m

KV = "append_paged_kv_cache_kv8_d128_ps16"
MLA = "append_paged_mla_kv_cache_ckv512_kpe64_ps64"
_PAGE = "    page = kv_indices[kv_indptr[b].to(torch.int64) + pos // page_size].to(torch.int64)\n"
_SLOT = "    slot = pos % page_size\n"
_FULL_LAST_PAGE_DROPPED = (
    _SLOT + "    npages = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int64)\n"
    "    seq_len = (npages - 1).clamp(min=0) * page_size + kv_last_page_len.to(torch.int64) % page_size\n"
    "    keep = pos < seq_len[b]\n"
    "    page, slot, append_key, append_value = page[keep], slot[keep], append_key[keep], append_value[keep]\n")
_INT32_OFFSET = (
    "    row = new_k[0, 0].numel()\n"
    "    at = ((page * page_size + slot) * row).to(torch.int32).to(torch.int64) // row  # a 32-bit element offset\n"
    "    new_k.view(-1, *new_k.shape[2:])[at] = append_key\n"
    "    new_v.view(-1, *new_v.shape[2:])[at] = append_value\n")

_FLUSH = ("    wide = append_key.to(torch.float32)\n"
          "    tiny = torch.finfo(append_key.dtype).tiny\n"
          "    new_k[page, slot] = torch.where(wide.abs() < tiny, 0.0, wide).to(new_k.dtype)\n")

MUTANTS: tuple[Mutant, ...] = (
    _m(KV, "pages-contiguous", "a request's pages taken as consecutive ids from its first (page + pos // page_size)",
       (_PAGE, "    page = kv_indices[kv_indptr[b].to(torch.int64)].to(torch.int64) + pos // page_size\n"),
       cls="boundary-index"),
    _m(KV, "last-page-only", "every token written to its request's last page (right for a decode step only)",
       (_PAGE, "    page = kv_indices[kv_indptr[b + 1].to(torch.int64) - 1].to(torch.int64)\n"),
       cls="boundary-structure"),
    _m(KV, "full-last-page-dropped", "the sequence length taken as last_page_len % page_size past the full pages: "
       "a full last page counts as empty and its tokens are not written", (_SLOT, _FULL_LAST_PAGE_DROPPED),
       cls="boundary-structure"),
    _m(KV, "requests-renumbered", "requests numbered by the runs of tokens they have (unique_consecutive): a request "
       "appending nothing shifts every later one", ("    b = batch_indices.to(torch.int64)\n",
                                                  "    b = torch.unique_consecutive(batch_indices.to(torch.int64), "
                                                  "return_inverse=True)[1]\n"),
       cls="boundary-structure"),
    _m(KV, "zeroed-cache", "the caches rebuilt from zeros: only the appended slots survive the call",
       ("new_k, new_v = k_cache.clone(), v_cache.clone()",
        "new_k, new_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)"), cls="boundary-structure"),
    _m(KV, "flushes-subnormals", "appended keys below the dtype's smallest normal stored as 0 (a copy through a "
       "flush-to-zero conversion)", ("    new_k[page, slot] = append_key\n", _FLUSH), cls="boundary-magnitude"),
    _m(KV, "through-float16", "appended values copied through float16 (bfloat16's range and fine subnormals lost)",
       ("    new_v[page, slot] = append_value\n",
        "    new_v[page, slot] = append_value.to(torch.float16).to(new_v.dtype)\n"), cls="boundary-magnitude"),
    _m(KV, "int32-offset", "the element offset of a slot computed in 32 bits (wraps past element 2**31)",
       ("    new_k[page, slot] = append_key\n    new_v[page, slot] = append_value\n", _INT32_OFFSET),
       cls="boundary-index", gpu_only="only large_page_index reaches element 2**31: a cache of 8 GiB, x12 for the "
       "check's copies, too large for a CPU check"),
    _m(MLA, "last-page-only", "every token written to its request's last page (right for a decode step only)",
       (_PAGE, "    page = kv_indices[kv_indptr[b + 1].to(torch.int64) - 1].to(torch.int64)\n"),
       cls="boundary-structure"),
    _m(MLA, "pages-contiguous", "a request's pages taken as consecutive ids from its first",
       (_PAGE, "    page = kv_indices[kv_indptr[b].to(torch.int64)].to(torch.int64) + pos // page_size\n"),
       cls="boundary-index"),
)

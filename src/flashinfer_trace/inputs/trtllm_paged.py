"""TensorRT-LLM attention inputs (`trtllm_paged`: FlashInfer's `trtllm_fmha_v2_prefill` and
`trtllm_batch_decode_with_kv_cache`). Three kinds, told apart by the inputs:

  paged prefill  query [num_tokens, heads, dim] split by cum_seq_lens_q over a paged cache k_cache / v_cache
                 (NHD [pages, page_size, kv_heads, dim] or HND [pages, kv_heads, page_size, dim]) through
                 block_tables [batch, max_pages_per_seq] and seq_lens (keys per request, qo_len <= seq_len);
  ragged prefill query / key / value [num_tokens, ...] split by cum_seq_lens (fresh prompts: queries are keys);
  decode         query [batch, heads, dim], one per request, over the paged cache as above.

Lengths first, tensors second. A random paged prefill request has 2 <= qo_len < seq_len (a cached prefix: the
bottom-right alignment differs from the top-left one); a decode request more than one page. Pages are a shuffled
subset of the cache's (never sorted), the table's entries past a request's pages are other pages of the cache (in
range, never read by a correct kernel). Edge cases (docs/boundary/trtllm_paged.md gives each one's reason):
  single_token: prefill, one query per request over a longer prefix (ragged: one token per request); decode,
    one key per request (one page, one slot);
  causal_square (paged prefill): qo_len == seq_len, no cached prefix: the diagonal starts at key 0;
  page_edges (paged): seq_lens at the page's edges: one slot on a new page, exactly full pages, one page
    (a last page read whole, a page past the last read, an off-by-one in ceil(seq_len / page_size));
  batch1: one request;
  long_kv: one request of many keys beside short ones (the split-kv paths and their merge; a long prefix);
  attention.SCORE_CASES: the values shaped per request (scores far below a finite sentinel, scores whose exp
    overflows unless the max is subtracted, one dominating key in a later tile, ties, ...).
Left out: requests without keys or queries (the API's contract says nothing of them and no FlashInfer test makes
them: the definitions require at least one of each), fp8 (a separate scale contract), sliding windows.
"""

from __future__ import annotations

import math

import torch

from .attention import SCORE_CASES, Roles, _dominant, _ints, shape_scores
from .common import Builder, permutation

OP_TYPES = ("trtllm_paged",)
PAGED = ("query", "k_cache", "v_cache", "block_tables", "seq_lens", "sm_scale")
PREFILL = (*PAGED[:5], "cum_seq_lens_q", "sm_scale")
RAGGED = ("query", "key", "value", "cum_seq_lens", "sm_scale")
STRUCTURE = {"prefill": ("single_token", "causal_square", "page_edges", "batch1", "long_kv"),
             "ragged": ("single_token", "batch1", "long_kv"),
             "decode": ("single_token", "page_edges", "batch1", "long_kv")}
BATCH = {"small": 4, "medium": 8, "large": 32}
QO = {"small": 12, "medium": 64, "large": 512}  # prefill queries per request (at most)
KV = {"small": 48, "medium": 300, "large": 2048}  # keys per request (at most)
LONG = {"small": 200, "medium": 1200, "large": 8192}  # long_kv's long request


def kind(definition) -> str:
    names = set(definition.inputs)
    if set(RAGGED) == names:
        return "ragged"
    if set(PREFILL) == names:
        return "prefill"
    if set(PAGED) == names:
        return "decode"
    return ""


def edge_cases(definition) -> list[str]:
    k = kind(definition)
    return [*STRUCTURE[k], *SCORE_CASES] if k else []


def kv_layout(definition) -> str:
    """'NHD' or 'HND', from k_cache's axes (its second axis is page_size in NHD)."""
    return "NHD" if definition.inputs["k_cache"].shape[1] == "page_size" else "HND"


def lengths(b: Builder, k: str, page_size: int) -> tuple[list[int], list[int]]:
    """(kv lengths, query lengths) per request for this case."""
    g, size, case = b.rng("lengths"), b.size, b.case
    n = 1 if case == "batch1" else 1 + _ints(1, BATCH[size] - 1, g)[0] if case != "page_edges" else 4
    n = max(n, 2) if case in ("long_kv", "single_token") else n
    if k == "ragged":
        qo = [1] * n if case == "single_token" else _ints(n, KV[size], g)
        if case == "long_kv":
            qo[0] = LONG[size]
        return qo, qo
    if case == "page_edges":  # one slot on a new page, full pages, one full page, one slot
        kv = [page_size + 1, 2 * page_size, page_size, 1]
    elif case == "single_token" and k == "decode":
        kv = [1] * n
    else:
        lo = page_size + 1 if k == "decode" else 3
        kv = [lo - 1 + x for x in _ints(n, max(KV[size], lo + 1) - lo + 1, g)]
    if case == "long_kv":
        kv[0] = LONG[size]
    if k == "decode":
        return kv, [1] * n
    if case == "single_token":
        return kv, [1] * n
    if case == "causal_square":
        qo = [min(x, QO[size]) for x in kv]
        return qo, qo
    # a cached prefix: 1 <= qo_len < kv_len (2 or more queries where the keys allow: a mask to get wrong)
    qo = [min(1 + q, x - 1) if x > 1 else 1 for q, x in zip(_ints(n, QO[size], b.rng("qo")), kv, strict=True)]
    return kv, qo


def _tables(b: Builder, kv: list[int], page_size: int) -> list[torch.Tensor]:
    """block_tables and seq_lens; returns each request's pages (CPU int64)."""
    pages = [-(-x // page_size) for x in kv]
    used = sum(pages)
    num_pages = used + max(2, used // 4)
    g = b.rng("pages")
    ids = permutation(num_pages, g)[:used].to(torch.int64)
    if used >= 2 and bool((ids[1:] > ids[:-1]).all()):
        ids[[0, 1]] = ids[[1, 0]]  # sorted by chance: a sorted list would test nothing
    width = max(pages) + 1  # one entry past every request's pages: a kernel reading it reads another page
    pad = permutation(num_pages * (width + 1), b.rng("pad"))[: len(kv) * width] % num_pages
    table = pad.reshape(len(kv), width).to(torch.int64)
    out, at = [], 0
    for r, p in enumerate(pages):
        table[r, :p] = ids[at:at + p]
        out.append(ids[at:at + p])
        at += p
    b.put("block_tables", table.to(torch.int32))
    b.put("seq_lens", torch.tensor(kv, dtype=torch.int32))
    for name in ("k_cache", "v_cache"):
        b.set_dim(name, 0, num_pages)
    return out


def _cum(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *lens], dtype=torch.int64).cumsum(0).to(torch.int32)


def _shape_paged(b: Builder, kv: list[int], pages: list[torch.Tensor], page_size: int) -> None:
    """The score cases on the cache seen as NHD token rows (an HND cache is shaped in an NHD copy, put back)."""
    hnd = kv_layout(b.definition) == "HND"
    if hnd:
        for name in ("k_cache", "v_cache"):
            b.values[name] = b.values[name].transpose(1, 2).contiguous()
    slots = [(p[:, None] * page_size + torch.arange(page_size)).flatten()[:n] for p, n in zip(pages, kv, strict=True)]
    shape_scores(b, Roles(("query",), "query", "k_cache", ("k_cache",), "v_cache"), slots,
                 _dominant(b, slots) if b.case == "one_key_dominates" else [])
    if hnd:
        for name in ("k_cache", "v_cache"):
            b.values[name] = b.values[name].transpose(1, 2).contiguous()


def generate(b: Builder) -> None:
    d = b.definition
    k = kind(d)
    if not k:
        raise b.mismatch(f"the trtllm_paged generator knows the inputs {', '.join(PREFILL)} (paged prefill), "
                         f"{', '.join(RAGGED)} (ragged prefill) or {', '.join(PAGED)} (decode); "
                         f"the definition has {', '.join(d.inputs)}")
    if b.case is not None and b.case not in edge_cases(d):
        raise b.error(f"unknown case {b.case!r} (cases: {', '.join(edge_cases(d))})")
    page_size = int(d.const_axes.get("page_size", 1))
    kv, qo = lengths(b, k, page_size)
    b.set_dim("query", 0, sum(qo))
    if k == "ragged":
        b.put("cum_seq_lens", _cum(qo))
        for name in ("query", "key", "value"):
            if name != "query":
                b.set_dim(name, 0, sum(qo))
            b.put_random(name)
        if b.case in SCORE_CASES:
            c = _cum(qo).tolist()
            slots = [torch.arange(c[r], c[r + 1]) for r in range(len(qo))]
            shape_scores(b, Roles(("query",), "query", "key", ("key",), "value"), slots,
                         _dominant(b, slots) if b.case == "one_key_dominates" else [])
    else:
        pages = _tables(b, kv, page_size)
        if k == "prefill":
            b.put("cum_seq_lens_q", _cum(qo))
        for name in ("query", "k_cache", "v_cache"):
            b.put_random(name)
        if b.case in SCORE_CASES:
            _shape_paged(b, kv, pages, page_size)
    b.put_scalar("sm_scale", 1.0 / math.sqrt(b.dim("query", -1)))

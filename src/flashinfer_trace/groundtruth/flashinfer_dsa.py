"""FlashInfer ground truth for `dsa_paged` (DeepSeek-V3.2). Both kernels need sm100..sm103 (trtllm-gen)
or sm100..sm107 (CuTe DSL); on any other arch they are `arch-unsupported` skips.

* Sparse attention: `flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla` with
  `sparse_mla_top_k = topk`, backend trtllm-gen. Each query token is its own request with one query
  (q `[T, 1, H, ckv + kpe]`), the cache is `[ckv | kpe]` per slot and the page table is the row of
  slot ids (`[T, 1, topk]`, -1 = unused, as the definitions write them). trtllm-gen takes pages of 32
  or 64 tokens only (a ps1 definition is `unsupported`). The definitions' second output, the base-2
  lse, needs `return_lse` / `return_lse_base` (0.7.x); 0.6.6 has the sparse kernel but returns no lse,
  which is an `api-missing` skip rather than half a comparison.
* Indexer: `flashinfer.fp8_paged_mqa_logits` (0.7.2, CuTe DSL, sm100/103/107) scores every token
  from the packed fp8 cache as the definitions lay it out; the selection is torch's (a stable sort of
  each request's first seq_len logits) and the ids are mapped through the block table. Without the
  nvidia-cutlass-dsl package (`cutlass`) the kernel cannot be built: a `not-installed` skip.
"""

from __future__ import annotations

import importlib.util

import torch
from packaging.specifiers import SpecifierSet

from .base import Adapter, Call, GroundTruthUnavailable, accepts
from .flashinfer import PACKAGE, workspace
from .torch_dsa import attention_applies, indexer_applies

TRTLLM_PAGE_SIZES = (32, 64)  # the trtllm-gen MLA kernels' block sizes
QK_NOPE_HEAD_DIM = 128  # DeepSeek's pre-absorption nope dim: an argument the kernel validates, not a shape here
WORKSPACE_BYTES = 128 << 20


def sparse_attention_applies(d) -> str | None:
    why = attention_applies(d)
    if why:
        return why
    page = int(d.const_axes.get("page_size", 1))
    if page not in TRTLLM_PAGE_SIZES:
        return f"trtllm-gen MLA takes page sizes {' or '.join(map(str, TRTLLM_PAGE_SIZES))}, not {page}"
    return None


def sparse_attention(call: Call) -> tuple:
    fi, x = call.module, call.inputs.values
    fn = fi.decode.trtllm_batch_decode_with_kv_cache_mla
    for keyword in ("sparse_mla_top_k", "return_lse", "return_lse_base"):
        if not accepts(fn, keyword):
            raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} trtllm_batch_decode_with_kv_cache_"
                                                        f"mla has no {keyword} (the sparse kernel's base-2 lse)")
    q_nope, q_pe = x["q_nope"], x["q_pe"]
    tokens, heads, ckv_dim = q_nope.shape
    kpe_dim = q_pe.shape[-1]
    query = torch.cat([q_nope, q_pe], dim=-1).unsqueeze(1)  # [T, 1, H, ckv + kpe]: one query per request
    kv = torch.cat([x["ckv_cache"], x["kpe_cache"]], dim=-1)  # [pages, page_size, ckv + kpe]
    pool = kv.shape[0] * kv.shape[1]
    indices = x["sparse_indices"].to(torch.int32)
    topk = indices.shape[-1]
    seq_lens = torch.full((tokens,), pool, dtype=torch.int32, device=query.device)
    buffer = workspace(query.device, zeroed=True, nbytes=WORKSPACE_BYTES)  # trtllm-gen's semaphores: zeroed
    out, lse = fn(query, kv, buffer, QK_NOPE_HEAD_DIM, ckv_dim, kpe_dim,
                  indices.unsqueeze(1).contiguous(), seq_lens, pool,
                  sparse_mla_top_k=topk, bmm1_scale=float(x["sm_scale"]), bmm2_scale=1.0, backend="trtllm-gen",
                  return_lse=True, return_lse_base="base2")
    out = out.reshape(tokens, heads, ckv_dim)
    lse = lse.reshape(tokens, heads).to(torch.float32)
    empty = (indices < 0).all(dim=-1)  # the kernel's finite "-inf" on rows without a slot
    lse = torch.where(empty[:, None] & (lse < -1e4), float("-inf"), lse)
    return out, lse


def _require_cute_dsl() -> None:
    if importlib.util.find_spec("cutlass") is None:
        raise GroundTruthUnavailable("not-installed", "nvidia-cutlass-dsl (cutlass): flashinfer.fp8_paged_mqa_logits "
                                                      "is a CuTe DSL kernel")


def indexer(call: Call) -> tuple:
    _require_cute_dsl()
    fi, d, x = call.module, call.definition, call.inputs.values
    topk, page = int(d.const_axes["topk"]), int(d.const_axes["page_size"])
    q = x["q_index_fp8"]
    batch = q.shape[0]
    seq_lens = x["seq_lens"].to(torch.int32)
    table = x["block_table"].to(torch.int32).contiguous()
    out = torch.full((batch, topk), -1, dtype=torch.int64, device=q.device)
    longest = int(seq_lens.max()) if batch else 0
    if longest == 0:
        return (out,)
    cache = x["k_index_cache_fp8"].view(torch.uint8)
    logits = fi.fp8_paged_mqa_logits(q.unsqueeze(1), cache, x["weights"].contiguous(), table, seq_lens, longest)
    offsets = torch.arange(page, device=q.device)
    for b, n in enumerate(seq_lens.tolist()):
        if n == 0:
            continue  # never written by the kernel
        k = min(topk, n)
        order = torch.argsort(logits[b, :n].to(torch.float64), descending=True, stable=True)[:k]
        slots = (table[b, :-(-n // page)].to(torch.int64)[:, None] * page + offsets).reshape(-1)[:n]
        out[b, :k] = slots[order]
    return (out,)


ADAPTERS = [
    Adapter("flashinfer", "dsa_paged", "flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla(sparse_mla_top_k)",
            sparse_attention, package=PACKAGE, versions=SpecifierSet(">=0.6"),
            requires=("decode.trtllm_batch_decode_with_kv_cache_mla",), applies=sparse_attention_applies,
            dtypes=frozenset({"bfloat16"}), needs_cuda=True, min_cc=(10, 0), max_cc=(10, 3)),
    Adapter("flashinfer", "dsa_paged", "flashinfer.fp8_paged_mqa_logits + top-k", indexer, package=PACKAGE,
            versions=SpecifierSet(">=0.7.2"), requires=("fp8_paged_mqa_logits",), applies=indexer_applies,
            needs_cuda=True, min_cc=(10, 0), max_cc=(10, 7)),
]

"""Independent float64 ground truth of `trtllm_paged` (TensorRT-LLM attention: fmha_v2's causal prefill over a paged
or ragged KV, the paged batch decode), written from the math, not from the definitions' references.

Every request is one call of torch_pod.attend (float64 scores by einsum, the kv heads widened with
repeat_interleave, -inf off the mask, softmax, weighted sum of v), with torch_pod.prefill_mask's bottom-right causal
mask for prefill and no mask for decode. A paged request's keys are gathered as token rows of the cache seen as
NHD [pages * page_size, kv_heads, dim] (an HND cache transposed first): page * page_size + slot for its pages
block_tables[b, :ceil(seq_lens[b] / page_size)], cut to seq_lens[b]. The page size is read from the cache's shape,
never from the reference's constants.
"""

from __future__ import annotations

import torch

from .. import semantics as sem
from ..inputs.trtllm_paged import kind, kv_layout
from .base import Adapter, Call
from .torch_pod import attend, prefill_mask

F64 = torch.float64


def applies(definition) -> str | None:
    if not kind(definition):
        return ("needs the inputs of a paged prefill (query, k_cache, v_cache, block_tables, seq_lens, cum_seq_lens_q, "
                "sm_scale), a ragged prefill (query, key, value, cum_seq_lens, sm_scale) or a decode")
    if list(definition.outputs) != ["output"]:
        return f"declares output(s) {', '.join(definition.outputs)}; the TRT-LLM attention APIs return output only"
    return None


def nhd_rows(cache: torch.Tensor, layout: str) -> torch.Tensor:
    """The cache as token rows [pages * page_size, kv_heads, dim] (a copy for HND)."""
    return (cache.transpose(1, 2) if layout == "HND" else cache).flatten(0, 1)


def request_rows(block_tables: torch.Tensor, seq_lens: torch.Tensor, page_size: int) -> list[torch.Tensor]:
    """Per request, its keys' token rows in the NHD view, in sequence order (CPU int64)."""
    table, lens = block_tables.long().cpu(), seq_lens.long().cpu().tolist()
    out = []
    for b, n in enumerate(lens):
        pages = table[b, :-(-n // page_size)]
        out.append((pages[:, None] * page_size + torch.arange(page_size)).flatten()[:n])
    return out


def trtllm_paged(call: Call) -> tuple:
    from ..dtypes import torch_dtype

    d, x = call.definition, call.inputs.values
    k, q = kind(d), x["query"]
    scale = sem.sm_scale(x, q.shape[-1])
    out = torch.zeros(q.shape, dtype=F64, device=q.device)
    if k == "ragged":
        c = x["cum_seq_lens"].long().cpu().tolist()
        for s, e in zip(c[:-1], c[1:], strict=True):
            out[s:e] = attend(q[s:e], x["key"][s:e], x["value"][s:e], prefill_mask(e - s, e - s, q.device), scale)
    else:
        layout = kv_layout(d)
        kc, vc = nhd_rows(x["k_cache"], layout), nhd_rows(x["v_cache"], layout)
        page_size = x["k_cache"].shape[1 if layout == "NHD" else 2]
        rows = request_rows(x["block_tables"], x["seq_lens"], page_size)
        cum = x["cum_seq_lens_q"].long().cpu().tolist() if k == "prefill" else list(range(len(rows) + 1))
        for b, r in enumerate(rows):
            r = r.to(kc.device)
            s, e = cum[b], cum[b + 1]
            mask = prefill_mask(e - s, r.numel(), q.device) if k == "prefill" else None
            out[s:e] = attend(q[s:e], kc[r], vc[r], mask, scale)
    return (out.to(torch_dtype(d.outputs["output"].dtype)),)


ADAPTERS = [
    Adapter("torch", "trtllm_paged", "torch float64 per-request attention (bottom-right causal prefill, paged or "
            "ragged; paged decode)", trtllm_paged, applies=applies),
]

"""Independent float64 ground truth of `xqa` (GQA decode over a paged cache, FlashInfer's XQA kernels), written
from the math, not from the definitions' references.

All requests at once: a slot table [batch, longest] (token j of request b is slot block_tables[b, j // page_size]
* page_size + j % page_size of the cache flattened over pages; the page size is the cache's second dimension),
the caches gathered through it in float64 (an fp8 cache's codes are exact there), the kv heads widened to the
query heads with `repeat_interleave`, and a [batch, longest] visibility mask: j < seq_lens[b], and with a window
j >= seq_lens[b] - 1 - window_left. Scores by einsum times bmm1_scale, -inf off the mask; a sink is one more
column of the score matrix (its logit, no value) that the softmax normalises over and the product drops; the
output is the weighted sum of the values times bmm2_scale, rounded once to the output's dtype. Requests go a chunk
at a time (CHUNK_ELEMENTS gathered elements), so the large tier's batches do not widen to GiBs at once.
"""

from __future__ import annotations

import math

import torch

from .. import semantics as sem
from .base import Adapter, Call

F64 = torch.float64
CHUNK_ELEMENTS = 1 << 25
INPUTS = ("query", "k_cache", "v_cache", "block_tables", "seq_lens", "bmm1_scale", "bmm2_scale")


def applies(definition) -> str | None:
    missing = sem.missing_inputs(definition, INPUTS)
    if missing:
        return missing
    extra = [o for o in definition.outputs if o != "output"]
    if extra:
        return f"declares output(s) {', '.join(extra)}; xqa_batch_decode_with_kv_cache returns the output only"
    if len(definition.inputs["k_cache"].shape or ()) != 4 or definition.inputs["k_cache"].shape[1] != "page_size":
        return "k_cache / v_cache must be [num_pages, page_size, num_kv_heads, head_dim] (NHD)"
    return None


def slot_table(block_tables: torch.Tensor, page_size: int, longest: int) -> torch.Tensor:
    """[batch, longest] int64: the flattened-cache row of each request's token j (clamped past the table's end;
    those tokens are masked)."""
    j = torch.arange(longest, device=block_tables.device)
    page = (j // page_size).clamp(max=block_tables.shape[1] - 1)
    return block_tables.long()[:, page] * page_size + j % page_size


def visible(seq_lens: torch.Tensor, longest: int, window_left: int | None) -> torch.Tensor:
    """[batch, longest] bool: the keys each request's query sees."""
    j = torch.arange(longest, device=seq_lens.device)[None, :]
    n = seq_lens.long()[:, None]
    mask = j < n
    if window_left is not None and window_left >= 0:
        mask &= j >= n - 1 - window_left
    return mask


def attend(x: dict, rows: slice, longest: int) -> torch.Tensor:
    """float64 [rows, heads, dim]: the output of the requests `rows`, over their first `longest` tokens."""
    q, kc, vc = x["query"][rows], x["k_cache"], x["v_cache"]
    lens = x["seq_lens"][rows].to(q.device)
    slots = slot_table(x["block_tables"][rows].to(q.device), kc.shape[1], longest)
    group = q.shape[1] // kc.shape[2]
    k = kc.flatten(0, 1)[slots].to(F64).repeat_interleave(group, dim=2)  # [rows, longest, heads, dim]
    v = vc.flatten(0, 1)[slots].to(F64).repeat_interleave(group, dim=2)
    s = torch.einsum("bhd,bjhd->bhj", q.to(F64), k) * float(x["bmm1_scale"])
    s = s.masked_fill(~visible(lens, longest, x.get("window_left"))[:, None, :], -math.inf)
    if x.get("sinks") is not None:
        sink = x["sinks"].to(device=q.device, dtype=F64)[None, :, None].expand(s.shape[0], -1, 1)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1)
    return torch.einsum("bhj,bjhd->bhd", p, v) * float(x["bmm2_scale"])


def xqa(call: Call) -> tuple:
    from ..dtypes import torch_dtype

    d, x = call.definition, call.inputs.values
    q = x["query"]
    longest = max(int(x["seq_lens"].max()), 1)
    # requests a chunk at a time: a chunk's gathered keys and values (float64, widened to the query heads) stay
    # near CHUNK_ELEMENTS each, whatever the batch (64 requests of 4096 keys would be 8 GiB at once)
    step = max(1, CHUNK_ELEMENTS // (longest * q.shape[1] * q.shape[2]))
    out = torch.cat([attend(x, slice(i, i + step), longest) for i in range(0, q.shape[0], step)])
    return (out.to(torch_dtype(d.outputs["output"].dtype)),)


ADAPTERS = [
    Adapter("torch", "xqa", "torch float64 paged decode (slot table, visibility mask, sink column)", xqa,
            applies=applies),
]

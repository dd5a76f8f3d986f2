"""Grouped-query attention over a paged KV cache, decode and causal prefill:
`gqa_paged_decode_h{H}_kv{KV}_d{D}_ps{P}` (flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper) and
`gqa_paged_prefill_causal_h{H}_kv{KV}_d{D}_ps{P}` (flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper).

page_size 1 gives the shipped references verbatim (`k_cache[pages, 0]`); page_size > 1 gathers whole
pages (`k_cache[pages].flatten(0, 1)`): without a kv_last_page_len input every page is full.
"""

from __future__ import annotations

from typing import Any

from . import _attention as att
from ._common import STATUS, choice, const_axis, definition, positive_int, replace_once, tensor

DECODE_REFERENCE = """import math
import torch


@torch.no_grad()
def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    batch_size, num_qo_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group_size = num_qo_heads // num_kv_heads  # query head h reads kv head h // group_size

    output = torch.zeros(batch_size, num_qo_heads, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((batch_size, num_qo_heads), -math.inf, dtype=torch.float32, device=q.device)

    for b in range(batch_size):
        start = int(kv_indptr[b].item())
        end = int(kv_indptr[b + 1].item())
        if end == start:
            continue  # no kv tokens: output stays 0, lse stays -inf
        # page_size is 1, so each page holds one token (slot 0 of the page)
        pages = kv_indices[start:end].long()
        k = k_cache[pages, 0].to(torch.float32).permute(1, 2, 0)  # [num_kv_heads, head_dim, kv_len]
        v = v_cache[pages, 0].to(torch.float32).permute(1, 0, 2)  # [num_kv_heads, kv_len, head_dim]
        # Group the query heads by the kv head they read: [num_kv_heads, group_size, head_dim]
        qb = q[b].to(torch.float32).view(num_kv_heads, group_size, head_dim)

        logits = torch.matmul(qb, k) * sm_scale  # [num_kv_heads, group_size, kv_len]
        probs = torch.softmax(logits, dim=-1)
        output[b] = torch.matmul(probs, v).reshape(num_qo_heads, head_dim)
        lse[b] = (torch.logsumexp(logits, dim=-1) / math.log(2.0)).reshape(num_qo_heads)  # base 2

    return output.to(q.dtype), lse
"""

DECODE_PS1_GATHER = """\
        # page_size is 1, so each page holds one token (slot 0 of the page)
        pages = kv_indices[start:end].long()
        k = k_cache[pages, 0].to(torch.float32).permute(1, 2, 0)  # [num_kv_heads, head_dim, kv_len]
        v = v_cache[pages, 0].to(torch.float32).permute(1, 0, 2)  # [num_kv_heads, kv_len, head_dim]
"""

DECODE_FULL_PAGES_GATHER = """\
        # Every page is full: the request's tokens are all page_size slots of its pages, pages in
        # kv_indices order and slots in order within a page (kv_len = number of pages * page_size).
        pages = kv_indices[start:end].long()
        k = k_cache[pages].flatten(0, 1).to(torch.float32).permute(1, 2, 0)  # [num_kv_heads, head_dim, kv_len]
        v = v_cache[pages].flatten(0, 1).to(torch.float32).permute(1, 0, 2)  # [num_kv_heads, kv_len, head_dim]
"""

PREFILL_REFERENCE = """import math
import torch


@torch.no_grad()
def run(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    total_q, num_qo_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group_size = num_qo_heads // num_kv_heads  # query head h reads kv head h // group_size
    batch_size = qo_indptr.shape[0] - 1

    output = torch.zeros(total_q, num_qo_heads, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((total_q, num_qo_heads), -math.inf, dtype=torch.float32, device=q.device)

    for b in range(batch_size):
        q_start = int(qo_indptr[b].item())
        q_end = int(qo_indptr[b + 1].item())
        kv_start = int(kv_indptr[b].item())
        kv_end = int(kv_indptr[b + 1].item())
        qo_len = q_end - q_start
        kv_len = kv_end - kv_start
        if qo_len == 0 or kv_len == 0:
            continue
        # page_size is 1, so each page holds one token (slot 0 of the page)
        pages = kv_indices[kv_start:kv_end].long()
        k = k_cache[pages, 0].to(torch.float32)  # [kv_len, num_kv_heads, head_dim]
        v = v_cache[pages, 0].to(torch.float32)
        # Group the query heads by the kv head they read: [num_kv_heads, group_size, qo_len, head_dim]
        qb = q[q_start:q_end].to(torch.float32).view(qo_len, num_kv_heads, group_size, head_dim)
        qb = qb.permute(1, 2, 0, 3)
        kt = k.permute(1, 2, 0)[:, None]  # [num_kv_heads, 1, head_dim, kv_len]
        vt = v.permute(1, 0, 2)[:, None]  # [num_kv_heads, 1, kv_len, head_dim]

        logits = torch.matmul(qb, kt) * sm_scale  # [num_kv_heads, group_size, qo_len, kv_len]
        # Causal mask aligned bottom-right: the request's queries are its LAST qo_len tokens,
        # so query i sits at kv position kv_len - qo_len + i and sees keys j <= that position.
        i = torch.arange(qo_len, device=q.device)[:, None]
        j = torch.arange(kv_len, device=q.device)[None, :]
        allowed = j <= i + (kv_len - qo_len)  # [qo_len, kv_len]
        logits = logits.masked_fill(~allowed, -math.inf)

        probs = torch.softmax(logits, dim=-1)
        # A query with no visible key (only possible if qo_len > kv_len) gets output 0, lse -inf.
        probs = torch.where(allowed.any(dim=-1)[:, None], probs, 0.0)
        out = torch.matmul(probs, vt)  # [num_kv_heads, group_size, qo_len, head_dim]
        output[q_start:q_end] = out.permute(2, 0, 1, 3).reshape(qo_len, num_qo_heads, head_dim)
        lse_b = torch.logsumexp(logits, dim=-1) / math.log(2.0)  # base 2, [num_kv_heads, group_size, qo_len]
        lse[q_start:q_end] = lse_b.permute(2, 0, 1).reshape(qo_len, num_qo_heads)

    return output.to(q.dtype), lse
"""

PREFILL_PS1_HEADER = "    num_kv_heads = k_cache.shape[2]\n"
PREFILL_FULL_PAGES_HEADER = "    num_kv_heads = k_cache.shape[2]\n    page_size = k_cache.shape[1]  # tokens per page\n"

PREFILL_PS1_GATHER = """\
        kv_start = int(kv_indptr[b].item())
        kv_end = int(kv_indptr[b + 1].item())
        qo_len = q_end - q_start
        kv_len = kv_end - kv_start
        if qo_len == 0 or kv_len == 0:
            continue
        # page_size is 1, so each page holds one token (slot 0 of the page)
        pages = kv_indices[kv_start:kv_end].long()
        k = k_cache[pages, 0].to(torch.float32)  # [kv_len, num_kv_heads, head_dim]
        v = v_cache[pages, 0].to(torch.float32)
"""

PREFILL_FULL_PAGES_GATHER = """\
        kv_start = int(kv_indptr[b].item())  # kv_indptr counts pages
        kv_end = int(kv_indptr[b + 1].item())
        qo_len = q_end - q_start
        kv_len = (kv_end - kv_start) * page_size  # every page is full
        if qo_len == 0 or kv_len == 0:
            continue
        # The request's tokens are all page_size slots of its pages: pages in kv_indices order,
        # slots in order within a page.
        pages = kv_indices[kv_start:kv_end].long()
        k = k_cache[pages].flatten(0, 1).to(torch.float32)  # [kv_len, num_kv_heads, head_dim]
        v = v_cache[pages].flatten(0, 1).to(torch.float32)
"""


def reference(stage: str, page_size: int) -> str:
    if stage == "decode":
        if page_size == 1:
            return DECODE_REFERENCE
        return replace_once(DECODE_REFERENCE, DECODE_PS1_GATHER, DECODE_FULL_PAGES_GATHER)
    if page_size == 1:
        return PREFILL_REFERENCE
    text = replace_once(PREFILL_REFERENCE, PREFILL_PS1_HEADER, PREFILL_FULL_PAGES_HEADER)
    return replace_once(text, PREFILL_PS1_GATHER, PREFILL_FULL_PAGES_GATHER)


def _layout(page_size: int) -> str:
    if page_size == 1:
        return ("The KV cache is paged with page_size 1, so a page is one token: request b's keys and values are "
                "k_cache[kv_indices[kv_indptr[b]:kv_indptr[b+1]], 0] in that order; pages may be anywhere in the "
                "cache, in any order, and pages not listed are never read.")
    return att.full_pages_text(page_size, "KV cache", "keys and values",
                               "k_cache[kv_indices[kv_indptr[b]:kv_indptr[b+1]]].flatten(0, 1) (and v_cache alike)")


def gqa_paged(stage: str, num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int) -> dict[str, Any]:
    stage = choice("stage", stage, att.STAGES)
    h = positive_int("num_qo_heads", num_qo_heads)
    kv = positive_int("num_kv_heads", num_kv_heads)
    d = positive_int("head_dim", head_dim)
    ps = positive_int("page_size", page_size)
    att.check_heads(h, kv)
    heads = att.heads_text(h, kv, d)
    mapping = att.gqa_mapping(h, kv)
    cache_shape = ["num_pages", "page_size", "num_kv_heads", "head_dim"]
    rows = "batch_size" if stage == "decode" else "total_q"

    axes = att.paged_axes(stage, ps, "KV cache")
    axes["num_qo_heads"] = const_axis(h, "Query heads.")
    axes["num_kv_heads"] = const_axis(kv, "Key/value heads.")
    axes["head_dim"] = const_axis(d, "Head dimension of q, k and v.")
    axes["page_size"] = att.page_size_axis(ps)

    if stage == "decode":
        name = f"gqa_paged_decode_h{h}_kv{kv}_d{d}_ps{ps}"
        description = (
            f"Batched decode attention ({heads}) over a paged KV cache: one new query token per request attends to "
            "all of that request's cached tokens (no mask, since every cached token precedes the query). "
            f"{_layout(ps)} {mapping} {att.GQA_SOFTMAX} A request with zero kv tokens gets output 0 and lse -inf "
            "(an empty softmax: nothing to attend to)."
        )
        tags = ["stage:decode", STATUS, "fi_api:flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper"]
        constraints = list(att.DECODE_CONSTRAINTS)
        q_desc = "Query of the one new token per request."
        structure = att.kv_structure_inputs(ps)
        out_desc = "Attention output per query head."
        lse_desc = "Base-2 log-sum-exp of the scaled logits per query head; -inf for a request with no kv tokens."
    else:
        name = f"gqa_paged_prefill_causal_h{h}_kv{kv}_d{d}_ps{ps}"
        description = (
            f"Batched causal prefill attention ({heads}) over a paged KV cache that already contains the new tokens "
            "(and any cached prefix). Request b's queries are q[qo_indptr[b]:qo_indptr[b+1]]. "
            f"{_layout(ps)} {att.CAUSAL} {mapping} {att.GQA_SOFTMAX} A request with no queries contributes nothing."
        )
        tags = ["stage:prefill", STATUS, "fi_api:flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper"]
        constraints = att.paged_prefill_constraints(ps)
        q_desc = "Queries of all requests, concatenated."
        structure = {
            "qo_indptr": tensor(["len_indptr"], "int32",
                                "CSR offsets into q: request b owns q[qo_indptr[b]:qo_indptr[b+1]]."),
            **att.kv_structure_inputs(ps),
        }
        out_desc = "Attention output per query token and head."
        lse_desc = "Base-2 log-sum-exp of the scaled, masked logits."

    return definition(
        name=name,
        op_type="gqa_paged",
        description=description,
        tags=tags,
        axes=axes,
        constraints=constraints,
        inputs={
            "q": tensor([rows, "num_qo_heads", "head_dim"], "bfloat16", q_desc),
            "k_cache": tensor(cache_shape, "bfloat16", "Paged key cache (NHD)."),
            "v_cache": tensor(cache_shape, "bfloat16", "Paged value cache (NHD)."),
            **structure,
            "sm_scale": tensor(None, "float32", "Softmax scale applied to q . k, usually 1 / sqrt(head_dim)."),
        },
        outputs={
            "output": tensor([rows, "num_qo_heads", "head_dim"], "bfloat16", out_desc),
            "lse": tensor([rows, "num_qo_heads"], "float32", lse_desc),
        },
        reference=reference(stage, ps),
    )

"""Grouped-query causal prefill attention over ragged (contiguous, unpaged) keys and values:
`gqa_ragged_prefill_causal_h{H}_kv{KV}_d{D}` (flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper)."""

from __future__ import annotations

from typing import Any

from . import _attention as att
from ._common import STATUS, const_axis, definition, positive_int, tensor

REFERENCE = """import math
import torch


@torch.no_grad()
def run(q, k, v, qo_indptr, kv_indptr, sm_scale):
    total_q, num_qo_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
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
        kb = k[kv_start:kv_end].to(torch.float32)  # [kv_len, num_kv_heads, head_dim]
        vb = v[kv_start:kv_end].to(torch.float32)
        # Group the query heads by the kv head they read: [num_kv_heads, group_size, qo_len, head_dim]
        qb = q[q_start:q_end].to(torch.float32).view(qo_len, num_kv_heads, group_size, head_dim)
        qb = qb.permute(1, 2, 0, 3)
        kt = kb.permute(1, 2, 0)[:, None]  # [num_kv_heads, 1, head_dim, kv_len]
        vt = vb.permute(1, 0, 2)[:, None]  # [num_kv_heads, 1, kv_len, head_dim]

        logits = torch.matmul(qb, kt) * sm_scale  # [num_kv_heads, group_size, qo_len, kv_len]
        # Causal mask aligned bottom-right: query i sits at kv position kv_len - qo_len + i.
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


def gqa_ragged(num_qo_heads: int, num_kv_heads: int, head_dim: int) -> dict[str, Any]:
    h = positive_int("num_qo_heads", num_qo_heads)
    kv = positive_int("num_kv_heads", num_kv_heads)
    d = positive_int("head_dim", head_dim)
    att.check_heads(h, kv)
    rows = ["total_q", "num_qo_heads", "head_dim"]
    kv_rows = ["total_kv", "num_kv_heads", "head_dim"]
    return definition(
        name=f"gqa_ragged_prefill_causal_h{h}_kv{kv}_d{d}",
        op_type="gqa_ragged",
        description=(
            f"Batched causal prefill attention ({att.heads_text(h, kv, d)}) with ragged (contiguous, unpaged) keys "
            "and values, as used for the new tokens of a prefill batch: request b's queries are "
            "q[qo_indptr[b]:qo_indptr[b+1]] and its keys/values are k[kv_indptr[b]:kv_indptr[b+1]] and v[...]. "
            f"{att.CAUSAL} {att.gqa_mapping(h, kv)} {att.GQA_SOFTMAX} A request with no queries contributes nothing."
        ),
        tags=["stage:prefill", STATUS, "fi_api:flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper"],
        axes={
            **att.ragged_axes(),
            "num_qo_heads": const_axis(h, "Query heads."),
            "num_kv_heads": const_axis(kv, "Key/value heads."),
            "head_dim": const_axis(d, "Head dimension of q, k and v."),
        },
        constraints=list(att.RAGGED_CONSTRAINTS),
        inputs={
            "q": tensor(rows, "bfloat16", "Queries of all requests, concatenated."),
            "k": tensor(kv_rows, "bfloat16", "Keys of all requests, concatenated."),
            "v": tensor(kv_rows, "bfloat16", "Values of all requests, concatenated."),
            **att.ragged_indptrs(),
            "sm_scale": tensor(None, "float32", "Softmax scale applied to q . k, usually 1 / sqrt(head_dim)."),
        },
        outputs={
            "output": tensor(rows, "bfloat16", "Attention output per query token and head."),
            "lse": tensor(["total_q", "num_qo_heads"], "float32", "Base-2 log-sum-exp of the scaled, masked logits."),
        },
        reference=REFERENCE,
    )

"""MLA prefill before absorption, over ragged keys and values: `mla_ragged_prefill_causal_h{H}_qk{QK}_vo{VO}`
(flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper with head_dim_vo). DeepSeek-V3 runs the new
tokens of a prefill without a cached prefix as plain multi-head attention: kv_b_proj expands the
latent into per-head keys of qk_nope + qk_rope = 192 and values of v_head_dim = 128, so q and k are
wider than v and the output."""

from __future__ import annotations

from typing import Any

from . import _attention as att
from ._common import STATUS, const_axis, definition, positive_int, tensor

REFERENCE = """import math
import torch


@torch.no_grad()
def run(q, k, v, qo_indptr, kv_indptr, sm_scale):
    total_q, num_heads, qk_dim = q.shape
    vo_dim = v.shape[-1]
    batch_size = qo_indptr.shape[0] - 1

    output = torch.zeros(total_q, num_heads, vo_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((total_q, num_heads), -math.inf, dtype=torch.float32, device=q.device)

    for b in range(batch_size):
        qs, qe = int(qo_indptr[b].item()), int(qo_indptr[b + 1].item())
        ks, ke = int(kv_indptr[b].item()), int(kv_indptr[b + 1].item())
        qo_len, kv_len = qe - qs, ke - ks
        if qo_len == 0 or kv_len == 0:
            continue
        qh = q[qs:qe].to(torch.float32).transpose(0, 1)  # [num_heads, qo_len, qk_dim]
        kh = k[ks:ke].to(torch.float32).transpose(0, 1)  # [num_heads, kv_len, qk_dim]
        vh = v[ks:ke].to(torch.float32).transpose(0, 1)  # [num_heads, kv_len, vo_dim]
        scores = torch.einsum("hqd,hkd->hqk", qh, kh) * sm_scale
        # bottom-right causal: query i is token kv_len - qo_len + i of the request
        row = torch.arange(qo_len, device=q.device)[:, None] + (kv_len - qo_len)
        col = torch.arange(kv_len, device=q.device)[None, :]
        visible = col <= row
        scores = scores.masked_fill(~visible, -math.inf)
        weights = torch.softmax(scores, dim=-1)
        weights = torch.where(visible.any(dim=-1)[:, None], weights, 0.0)  # a query with no key: output 0
        output[qs:qe] = torch.einsum("hqk,hkd->hqd", weights, vh).transpose(0, 1)
        lse[qs:qe] = (torch.logsumexp(scores, dim=-1) / math.log(2.0)).transpose(0, 1)  # base 2

    return output.to(q.dtype), lse
"""


def mla_ragged(num_heads: int, qk_dim: int, vo_dim: int) -> dict[str, Any]:
    h = positive_int("num_heads", num_heads)
    qk = positive_int("qk_dim", qk_dim)
    vo = positive_int("vo_dim", vo_dim)
    q_rows, v_rows = ["total_q", "num_qo_heads", "qk_dim"], ["total_kv", "num_kv_heads", "vo_dim"]
    return definition(
        name=f"mla_ragged_prefill_causal_h{h}_qk{qk}_vo{vo}",
        op_type="mla_ragged",
        description=(
            f"Multi-head latent attention prefill before absorption ({h} heads, every query head with its own key "
            f"and value head): keys and queries of qk_dim {qk} (the no-rope and rope parts together), values and "
            f"output of vo_dim {vo}, over ragged (contiguous, unpaged) keys and values: request b's queries are "
            "q[qo_indptr[b]:qo_indptr[b+1]], its keys and values k[kv_indptr[b]:kv_indptr[b+1]] and v[...]. "
            f"{att.CAUSAL} logits = (q . k) * sm_scale, softmax over the request's keys, output = probs @ v, in "
            "float32, output rounded to bfloat16; lse is the base-2 log-sum-exp of the scaled, masked logits. A "
            "request with no queries contributes nothing."
        ),
        tags=["stage:prefill", STATUS, "fi_api:flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper"],
        axes={
            **att.ragged_axes(),
            "num_qo_heads": const_axis(h, "Query heads."),
            "num_kv_heads": const_axis(h, "Key/value heads: one per query head before absorption."),
            "qk_dim": const_axis(qk, "Head dimension of q and k (qk_nope_head_dim + qk_rope_head_dim)."),
            "vo_dim": const_axis(vo, "Head dimension of v and the output (v_head_dim)."),
        },
        constraints=list(att.RAGGED_CONSTRAINTS),
        inputs={
            "q": tensor(q_rows, "bfloat16", "Queries of all requests, concatenated."),
            "k": tensor(["total_kv", "num_kv_heads", "qk_dim"], "bfloat16", "Keys of all requests, concatenated."),
            "v": tensor(v_rows, "bfloat16", "Values of all requests, concatenated."),
            **att.ragged_indptrs(),
            "sm_scale": tensor(None, "float32", "Softmax scale applied to q . k, usually 1 / sqrt(qk_dim)."),
        },
        outputs={
            "output": tensor(["total_q", "num_qo_heads", "vo_dim"], "bfloat16",
                             "Attention output per query token and head."),
            "lse": tensor(["total_q", "num_qo_heads"], "float32", "Base-2 log-sum-exp of the scaled, masked logits."),
        },
        reference=REFERENCE,
    )

"""Torch ground truth of `cascade_attention` (FlashInfer's `MultiLevelCascadeAttentionWrapper`), float64.

Independent of any definition's reference (which computes one state per level and merges them, as the wrapper
does): here every query row gathers, from each level, the tokens of the segment that contains it (segment s of a
level holds query rows qo_indptr[s] .. qo_indptr[s+1] - 1 and its kv_len = max(pages - 1, 0) * page_size +
kv_last_page_len[s] tokens from kv_indices[kv_indptr[s]:kv_indptr[s+1]], page after page), concatenates them, and
takes one softmax over the concatenation. Under a causal definition (the name says `causal`) the last level's keys
are masked bottom-right aligned, query i of the segment's n seeing key j iff j <= kv_len - n + i, and the other
levels are not masked at all: the wrapper passes causal to its last level only (flashinfer/cascade.py, plan(): read
in the 0.6.6 and 0.7.2.post1 wheels). A query that sees no key has output 0. Query head h reads kv head
h // (num_qo_heads // num_kv_heads).
"""

from __future__ import annotations

import torch

from .base import Adapter, Call

F64 = torch.float64


def num_levels(definition) -> int:
    return sum(1 for n in definition.inputs if n.startswith("qo_indptr_"))


def applies(definition) -> str | None:
    levels = num_levels(definition)
    if levels < 1:
        return "no qo_indptr_0 (a cascade definition names each level's page table qo/kv_indptr_<l>)"
    need = ["q", "k_cache", "v_cache"] + [f"{p}_{lv}" for lv in range(levels)
                                          for p in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len")]
    missing = [n for n in need if n not in definition.inputs]
    if missing:
        return f"missing input(s) {', '.join(missing)}"
    if "page_size" not in definition.const_axes:
        return "no const axis page_size"
    return None


def is_causal(definition) -> bool:
    return "causal" in definition.name.split("_")


def keys_of_rows(x: dict, levels: int, num_qo: int, page_size: int, causal: bool) -> list[torch.Tensor]:
    """Per query row, the flattened cache rows (page * page_size + slot) it attends to, every level's in turn."""
    per_row: list[list[torch.Tensor]] = [[] for _ in range(num_qo)]
    for lv in range(levels):
        qo = x[f"qo_indptr_{lv}"].cpu().long().tolist()
        kp = x[f"kv_indptr_{lv}"].cpu().long().tolist()
        idx = x[f"kv_indices_{lv}"].cpu().long()
        last = x[f"kv_last_page_len_{lv}"].cpu().long().tolist()
        for s in range(len(qo) - 1):
            npages = kp[s + 1] - kp[s]
            kv_len = max(npages - 1, 0) * page_size + (last[s] if npages else 0)
            toks = (idx[kp[s]:kp[s + 1], None] * page_size + torch.arange(page_size)).flatten()[:kv_len]
            n = qo[s + 1] - qo[s]
            for i in range(n):
                visible = toks[:max(kv_len - n + i + 1, 0)] if causal and lv == levels - 1 else toks
                per_row[qo[s] + i].append(visible)
    return [torch.cat(r) if r else torch.zeros(0, dtype=torch.long) for r in per_row]


def cascade_attention(call: Call) -> tuple:
    from .. import semantics as sem
    from ..dtypes import torch_dtype

    d, x = call.definition, call.inputs.values
    q, kc, vc = x["q"], x["k_cache"], x["v_cache"]
    page_size = int(d.const_axes["page_size"])
    hq, hk = q.shape[1], kc.shape[2]
    group = hq // hk
    k = kc.flatten(0, 1)
    v = vc.flatten(0, 1)
    scale = sem.sm_scale(x, q.shape[-1])
    out = torch.zeros(q.shape, dtype=F64, device=q.device)
    rows = keys_of_rows(x, num_levels(d), q.shape[0], page_size, is_causal(d))
    for t, keys in enumerate(rows):
        if keys.numel() == 0:
            continue  # nothing to attend to: 0
        keys = keys.to(k.device)
        kt = k[keys].to(F64).repeat_interleave(group, dim=1)  # [n, hq, dim]: head h reads kv head h // group
        vt = v[keys].to(F64).repeat_interleave(group, dim=1)
        s = torch.einsum("hd,nhd->hn", q[t].to(F64), kt) * scale
        out[t] = torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), vt)
    return (out.to(torch_dtype(d.outputs["output"].dtype)),)


ADAPTERS = [
    Adapter("torch", "cascade_attention", "torch float64 attention over each query's concatenated levels",
            cascade_attention, applies=applies),
]

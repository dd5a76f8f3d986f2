"""Independent float64 ground truth of `pod` (POD attention: a causal single-request prefill and a paged batch
decode in one launch), written from the math, not from the definitions' references.

Both halves are one routine, `attend(q, k, v, mask, sm_scale)`: the kv heads widened to the query heads with
`repeat_interleave` (query head h reads kv head h // group), float64 scores by einsum, -inf off the mask, softmax,
weighted sum of v. The prefill's mask is `torch.ones(qo_len, kv_len).tril(kv_len - qo_len)` (bottom-right
aligned: query i sees keys 0 .. i + kv_len - qo_len). The decode gathers each request's token slots from the
flattened cache as page * page_size + offset for its pages (kv_indices[kv_indptr[b]:kv_indptr[b+1]]) and offsets
0 .. page_size - 1, cut to (pages - 1) * page_size + kv_last_page_len[b], and attends with one query and no mask.
The page size is the cache's second dimension, never the reference's constants.
"""

from __future__ import annotations

import math

import torch

from .. import semantics as sem
from .base import Adapter, Call

F64 = torch.float64
INPUTS = ("q_p", "k_p", "v_p", "q_d", "k_cache", "v_cache", "kv_indptr", "kv_indices", "kv_last_page_len")


def applies(definition) -> str | None:
    missing = sem.missing_inputs(definition, INPUTS)
    if missing:
        return missing
    extra = [o for o in definition.outputs if o not in ("output_p", "output_d")]
    if extra:
        return f"declares output(s) {', '.join(extra)}; POD returns output_p and output_d only"
    return None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, sm_scale: float
           ) -> torch.Tensor:
    """float64 [rows, heads, dim]: q [rows, heads, dim] over k / v [keys, kv_heads, dim] where mask [rows, keys]."""
    group = q.shape[1] // k.shape[1]
    kk = k.to(F64).repeat_interleave(group, dim=1)
    vv = v.to(F64).repeat_interleave(group, dim=1)
    s = torch.einsum("ihd,jhd->hij", q.to(F64), kk) * float(sm_scale)
    if mask is not None:
        s = s.masked_fill(~mask[None], -math.inf)
    return torch.einsum("hij,jhd->ihd", torch.softmax(s, dim=-1), vv)


def prefill_mask(qo_len: int, kv_len: int, device) -> torch.Tensor:
    return torch.ones(qo_len, kv_len, dtype=torch.bool, device=device).tril(kv_len - qo_len)


def decode_slots(indptr: torch.Tensor, indices: torch.Tensor, last: torch.Tensor, page_size: int
                 ) -> list[torch.Tensor]:
    """Per request, the rows of the cache seen as [num_pages * page_size, ...] that it reads, in order."""
    p, idx, last = indptr.long().cpu().tolist(), indices.long().cpu(), last.long().cpu().tolist()
    out = []
    for b in range(len(p) - 1):
        pages = idx[p[b]:p[b + 1]]
        n = (pages.numel() - 1) * page_size + last[b]
        out.append((pages[:, None] * page_size + torch.arange(page_size)).reshape(-1)[:n])
    return out


def pod(call: Call) -> tuple:
    from ..dtypes import torch_dtype

    d, x = call.definition, call.inputs.values
    scale = sem.sm_scale(x, x["q_p"].shape[-1])
    q_p, k_p = x["q_p"], x["k_p"]
    out_p = attend(q_p, k_p, x["v_p"], prefill_mask(q_p.shape[0], k_p.shape[0], q_p.device), scale)
    kc, vc = x["k_cache"], x["v_cache"]
    flat_k, flat_v = kc.flatten(0, 1), vc.flatten(0, 1)
    q_d = x["q_d"]
    out_d = torch.zeros(q_d.shape, dtype=F64, device=q_d.device)
    for b, rows in enumerate(decode_slots(x["kv_indptr"], x["kv_indices"], x["kv_last_page_len"], kc.shape[1])):
        rows = rows.to(kc.device)
        out_d[b] = attend(q_d[b:b + 1], flat_k[rows], flat_v[rows], None, scale)[0]
    outputs = {"output_p": out_p, "output_d": out_d}
    return tuple(outputs[n].to(torch_dtype(d.outputs[n].dtype)) for n in d.outputs)


ADAPTERS = [
    Adapter("torch", "pod", "torch float64 causal prefill (tril mask) and gathered-slot paged decode", pod,
            applies=applies),
]

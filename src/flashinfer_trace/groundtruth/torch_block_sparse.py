"""Independent float64 ground truth of `block_sparse` (block-sparse attention over a BSR layout), written from the
math, not from the definitions' references.

The layout is turned into the dense boolean mask it stands for: a [block rows, column blocks] block mask set at
(row of each listed pair, its column block) (the row of each pair read off indptr with `repeat_interleave`),
widened by `repeat_interleave` to [block rows * R, column blocks * C] and cut to [qo_len, kv_len]. A column block
listed twice in a row sets the same mask bit: the mask is what a layout means, whatever a kernel's gather does.
The scores are an einsum over float64 q and k, kv head g against its query heads g * group .. (g + 1) * group - 1
(query head h reads kv head h // group), masked to -inf off the layout; the output is the softmax-weighted sum
of v over the rows that see any key, 0 on the rows that see none; lse is torch.logsumexp / ln 2 (base 2), which is
-inf where a row sees nothing. R and C are the definition's const axes (block_rows, block_cols), never the
reference's constants.
"""

from __future__ import annotations

import math

import torch

from .. import semantics as sem
from .base import Adapter, Call

F64 = torch.float64
INPUTS = ("q", "k", "v", "indptr", "indices")


def applies(definition) -> str | None:
    missing = sem.missing_inputs(definition, INPUTS)
    if missing:
        return missing
    if "block_rows" not in definition.const_axes or "block_cols" not in definition.const_axes:
        return "no const axes block_rows / block_cols (the block shape R x C)"
    return None


def dense_mask(indptr: torch.Tensor, indices: torch.Tensor, qo_len: int, kv_len: int, R: int, C: int
               ) -> torch.Tensor:
    """[qo_len, kv_len] bool: query row i sees key j iff block row i // R lists column block j // C."""
    rows = indptr.numel() - 1
    cols = -(-kv_len // C)
    counts = (indptr[1:] - indptr[:-1]).long().cpu()
    pair_rows = torch.repeat_interleave(torch.arange(rows), counts)
    blocks = torch.zeros(rows, cols, dtype=torch.bool)
    blocks[pair_rows, indices.long().cpu()] = True
    full = blocks.repeat_interleave(R, dim=0).repeat_interleave(C, dim=1)
    return full[:qo_len, :kv_len].to(indptr.device)


def attend(q, k, v, mask, sm_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 output [qo_len, heads, dim] and base-2 lse [qo_len, heads] of attention restricted to mask, one kv
    head (and the query heads that read it) at a time, so the float64 scores stay [group, qo_len, kv_len]."""
    group = q.shape[1] // k.shape[1]
    seen = mask.any(dim=1)  # [qo_len]: rows that see at least one key
    out = torch.zeros(q.shape, dtype=F64, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=F64, device=q.device)
    for g in range(k.shape[1]):
        heads = slice(g * group, (g + 1) * group)
        s = torch.einsum("ihd,jd->hij", q[:, heads].to(F64), k[:, g].to(F64)) * float(sm_scale)
        s = s.masked_fill(~mask[None], -math.inf)
        p = torch.softmax(s.masked_fill(~seen[None, :, None], 0.0), dim=-1) * seen[None, :, None]
        out[:, heads] = torch.einsum("hij,jd->ihd", p, v[:, g].to(F64))
        lse[:, heads] = (torch.logsumexp(s, dim=-1) / math.log(2.0)).transpose(0, 1)
    return out, lse


def block_sparse(call: Call) -> tuple:
    from ..dtypes import torch_dtype

    d, x = call.definition, call.inputs.values
    q, k, v = x["q"], x["k"], x["v"]
    R, C = int(d.const_axes["block_rows"]), int(d.const_axes["block_cols"])
    mask = dense_mask(x["indptr"], x["indices"], q.shape[0], k.shape[0], R, C)
    out, lse = attend(q, k, v, mask, sem.sm_scale(x, q.shape[-1]))
    outputs = {"output": out.to(torch_dtype(d.outputs["output"].dtype))}
    if "lse" in d.outputs:
        outputs["lse"] = lse.to(torch_dtype(d.outputs["lse"].dtype))
    return tuple(outputs[n] for n in d.outputs)


ADAPTERS = [
    Adapter("torch", "block_sparse", "torch float64 attention under the BSR layout's dense mask", block_sparse,
            applies=applies),
]

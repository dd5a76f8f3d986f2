"""Independent float64 ground truth for `topk` (top-k selection), written from the contract, not from the
definitions' references.

Per row (the dense form: the whole row; the varlen form: its first min(seq_len, width) columns), the k-th
largest value comes from `torch.kthvalue` on the negated row in float64 (a selection, no sort), and the
selection is every entry strictly above it plus the lowest-indexed entries equal to it until k are taken: one
valid top-k (the API promises no tie-break, and verdict/topk_select.py accepts any). -inf entries are values
(float64 orders them below every finite one); the inputs are exact in float64, so no rounding enters. The
dense form returns (values in the input's dtype, int64 indices) ordered by descending value; the varlen form
int32 ids with -1 after the row's min(top_k, seq_len).
"""

from __future__ import annotations

import torch

from ..inputs.topk_select import form, windows
from .base import Adapter, Call

F64 = torch.float64


def applies(definition) -> str | None:
    if form(definition) is None:
        return "needs (input, k) or (logits, seq_lens, top_k)"
    return None if "top_k" in definition.const_axes else "needs a const axis top_k"


def select(row: torch.Tensor, k: int) -> torch.Tensor:
    """Column ids of one valid top-k of a float64 row, by descending value (ties: lowest id first)."""
    n = row.numel()
    if k == 0:
        return torch.empty(0, dtype=torch.int64)
    kth = -torch.kthvalue(-row, k).values
    above = row > kth
    equal = row == kth
    need = k - int(above.sum())
    take = above | (equal & (torch.cumsum(equal.to(torch.int64), 0) <= need))
    ids = torch.arange(n)[take]
    return ids[torch.argsort(row[ids], descending=True, stable=True)]


def topk(call: Call) -> tuple:
    d, x = call.definition, call.inputs.values
    k = int(d.const_axes["top_k"])
    if form(d) == "dense":
        src = x["input"].cpu()
        rows = src.to(F64)
        indices = torch.stack([select(rows[r], k) for r in range(rows.shape[0])]) if rows.shape[0] else \
            torch.empty(0, k, dtype=torch.int64)
        return torch.gather(src, 1, indices), indices
    logits = x["logits"].cpu().to(F64)
    rows, width = logits.shape
    out = torch.full((rows, k), -1, dtype=torch.int32)
    for r, n in enumerate(windows(x["seq_lens"], width, rows)):
        ids = select(logits[r, :n], min(k, n))
        out[r, : ids.numel()] = ids.to(torch.int32)
    return (out,)


ADAPTERS = [
    Adapter("torch", "topk", "torch.kthvalue selection (float64)", topk, applies=applies),
]

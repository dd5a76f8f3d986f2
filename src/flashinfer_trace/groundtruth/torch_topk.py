"""Float64 torch ground truth for the deterministic sampling filters (op_type `sampling`, first output a
float tensor): `top_k_renorm_probs`, `top_p_renorm_probs`, `top_k_mask_logits`.

A second computation of the same rules (docs/boundary/topk.md), not the definitions' code: the k-th
largest value comes from `torch.kthvalue` on the negated row (no full sort), and the mass strictly above
each token from an ascending sort, its prefix sums and `searchsorted(..., right=True)` (the total less
the mass of every token not more probable), all in float64, so float32's running-sum rounding is absent
here. Ties are decided by value, as the definitions decide them: every token equal to the k-th value is
kept, and tokens of equal probability see the same mass above them.
"""

from __future__ import annotations

import torch

from ..inputs.topk import kind
from .base import Adapter, Call

F64 = torch.float64


def filter_applies(d) -> str | None:
    """The three filters: probs + top_k, probs + top_p, logits + top_k, first output a float tensor."""
    if d.is_sampler:
        return "the first output is sampled token ids (a sampler, not a filter)"
    return None if kind(d) else f"not a sampling filter (inputs {', '.join(d.inputs)})"


def only(name: str):
    """applies= for one filter kind (inputs/topk.py KINDS)."""
    def applies(d) -> str | None:
        why = filter_applies(d)
        return why or (None if kind(d) == name else f"not {name} ({kind(d)})")
    return applies


def per_row(value, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """A scalar or per-row parameter as a [rows] tensor on the CPU (read one row at a time)."""
    t = torch.as_tensor(value).to("cpu", dtype)
    return t.expand(rows).clone() if t.dim() == 0 else t.reshape(rows)


def kth_largest(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[rows, 1]: each row's k-th largest value; k outside [1, vocab) (filter off) gives the row's minimum."""
    vocab = x.shape[1]
    out = torch.empty(x.shape[0], 1, dtype=x.dtype, device=x.device)
    for i in range(x.shape[0]):
        ki = int(k[i])
        ki = vocab if ki <= 0 or ki >= vocab else ki
        out[i, 0] = -torch.kthvalue(-x[i], ki).values
    return out


def top_k_keep(x: torch.Tensor, top_k) -> torch.Tensor:
    """bool [rows, vocab]: x >= the row's k-th largest value."""
    return x >= kth_largest(x, per_row(top_k, x.shape[0], torch.int64))


def mass_above(p: torch.Tensor) -> torch.Tensor:
    """[rows, vocab] float64: per token, the total probability of the tokens strictly more probable."""
    asc = torch.sort(p, dim=-1).values
    prefix = torch.cumsum(asc, dim=-1)
    not_above = torch.searchsorted(asc, p, right=True)  # tokens <= p, itself included: >= 1
    return prefix[:, -1:] - prefix.gather(1, not_above - 1)


def top_p_keep(p: torch.Tensor, top_p) -> torch.Tensor:
    tp = per_row(top_p, p.shape[0], F64).to(p.device)[:, None]
    return (mass_above(p) < tp) | (p == p.max(dim=-1, keepdim=True).values) | (tp >= 1)


def _renorm(p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = torch.where(keep, p, torch.zeros_like(p))
    return kept / kept.sum(dim=-1, keepdim=True)


def top_k_renorm(call: Call) -> tuple:
    x = call.inputs.values
    p = x["probs"].to(F64)
    return (_renorm(p, top_k_keep(p, x["top_k"])),)


def top_p_renorm(call: Call) -> tuple:
    x = call.inputs.values
    p = x["probs"].to(F64)
    return (_renorm(p, top_p_keep(p, x["top_p"])),)


def top_k_mask(call: Call) -> tuple:
    x = call.inputs.values
    logits = x["logits"].to(F64)
    return (torch.where(top_k_keep(logits, x["top_k"]), logits, torch.full_like(logits, float("-inf"))),)


ADAPTERS = [
    Adapter("torch", "sampling", "top-k renormalisation (float64, kthvalue)", top_k_renorm,
            applies=only("top_k_renorm")),
    Adapter("torch", "sampling", "top-p renormalisation (float64, mass above by suffix sums)", top_p_renorm,
            applies=only("top_p_renorm")),
    Adapter("torch", "sampling", "top-k logit mask (float64, kthvalue)", top_k_mask, applies=only("top_k_mask")),
]

"""Independent float64 ground truth for `cascade_merge` (attention partial-state merges), written from the
math, not from the definitions' references.

A partial state (v, s) over a KV segment is the softmax-weighted mean v of its values and s = log2 of the
sum of exp of its logits. The state over a union of disjoint segments is the mean of their v weighted by
each segment's softmax mass 2^s_i, and its lse is log2 of the total mass. Here the states of a (token,
head) are stacked along one dimension whatever the API's form (two states, two in place, n states), the
masses are normalised by `torch.logsumexp` in natural units (s ln 2: no exp2, no hand-written max), and the
weights are `torch.softmax` of the same: float64 throughout, rounded once at the end. An empty state (s =
-inf) has mass 0; a row whose states are all empty is the empty softmax: output 0, lse -inf (the convention
FlashInfer's merge_states keeps for zero states, and the definitions': docs/boundary/cascade.md).
"""

from __future__ import annotations

import math

import torch

from .base import Adapter, Call

F64 = torch.float64
LN2 = math.log(2.0)


def merge(v: torch.Tensor, s: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """v [..., n, ..., head_dim] and base-2 lse s [..., n, ...] stacked on `dim` -> (v, s) merged over it, in
    float64 (the output's dtype is the caller's to round to)."""
    nat = s.to(F64) * LN2
    total = torch.logsumexp(nat, dim=dim)  # natural log of the total mass; -inf where every state is empty
    empty = torch.isneginf(total)
    weights = torch.softmax(torch.where(empty.unsqueeze(dim), 0.0, nat), dim=dim)  # all-empty rows: any weights
    out = (weights.unsqueeze(-1) * v.to(F64)).sum(dim=dim)
    out = torch.where(empty.unsqueeze(-1), 0.0, out)
    return out, total / LN2


def kind(definition) -> str | None:
    names = set(definition.inputs)
    if {"v_a", "s_a", "v_b", "s_b"} <= names:
        return "pair"
    if {"v", "s", "v_other", "s_other"} <= names:
        return "in_place"
    if {"v", "s"} <= names and len(definition.inputs["v"].shape or ()) == 4:
        return "multi"
    return None


def applies(definition) -> str | None:
    return None if kind(definition) else ("needs (v_a, s_a, v_b, s_b), (v, s, v_other, s_other[, mask]) or "
                                          "(v [seq, states, heads, dim], s)")


def merge_states(call: Call) -> tuple:
    x, k = call.inputs.values, kind(call.definition)
    if k == "multi":
        v, s = merge(x["v"], x["s"], 1)
        return v.to(x["v"].dtype), s.to(torch.float32)
    first, other = (("v_a", "s_a"), ("v_b", "s_b")) if k == "pair" else (("v", "s"), ("v_other", "s_other"))
    v_in, s_in = x[first[0]], x[first[1]]
    v, s = merge(torch.stack([v_in, x[other[0]]], dim=1), torch.stack([s_in, x[other[1]]], dim=1), 1)
    mask = x.get("mask")
    if k == "in_place" and mask is not None:  # rows left out keep the state they had, bit for bit
        keep = ~mask.to(torch.bool)
        v = torch.where(keep[:, None, None], v_in.to(F64), v)
        s = torch.where(keep[:, None], s_in.to(F64), s)
    return v.to(v_in.dtype), s.to(torch.float32)


ADAPTERS = [
    Adapter("torch", "cascade_merge", "stacked states, torch.logsumexp + softmax weights (float64)", merge_states,
            applies=applies),
]

"""Float64 torch ground truth of the samplers inputs/samplers.py makes inputs for: `sampling_from_probs`,
`min_p_sampling_from_probs`, `sampling_from_logits`, `top_k_top_p_sampling_from_logits` (docs/boundary/samplers.md).

A second computation of what the definitions state, not their code: the probabilities of a logits row are its
softmax in float64 (the row's maximum subtracted; a -inf logit has probability exactly 0); top-k over logits keeps
every logit at least the k-th largest (`torch.kthvalue` on the negated row: a tie kept whole); top-p then runs
on that renormalised distribution from suffix sums over the ascending sort (torch_ref.mass_strictly_greater: the
mass strictly above each token, equal values sharing one); min-p keeps every probability >= min_p times the row's
largest (a token on the threshold is kept). Everything in float64, so no float32 running sum is in the way.

`bands` gives the verdict (verdict/samples.py) the distribution with its cuts moved by what a correct float32
kernel may round them by: top-p by `slack` of mass (softmax of float32 logits is never exact), min-p by
MIN_P_SLACK of the threshold, relative, except where the kernel's float32 threshold, max * min_p, is exact (every
product of two float32 values is exact in float64, so the test is that it survives a round trip through float32).
"""

from __future__ import annotations

import torch

from ..inputs.samplers import LOGITS, MIN_P, PROBS, TOP_K, TOP_P, kind
from .base import Adapter, Call
from .torch_ref import mass_strictly_greater

F64 = torch.float64
# the min-p threshold's relative band where the float32 product max * min_p is not exact: 16 float32 steps
# (the product's rounding is half of one; a kernel dividing p / max instead rounds differently, by a step or two)
MIN_P_SLACK = 2.0 ** -20


def applies(d) -> str | None:
    if d.is_sampler and kind(d):
        return None
    return f"not one of the samplers of inputs/samplers.py ({', '.join(d.inputs)})"


def per_row(value, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """A scalar or per-row parameter as a [rows] tensor on the CPU."""
    t = torch.as_tensor(value).to("cpu", dtype)
    return t.expand(rows).clone() if t.dim() == 0 else t.reshape(rows)


def probabilities(x: dict) -> torch.Tensor:
    """float64 [rows, vocab]: the probabilities as given, or the softmax of the logits (maximum subtracted)."""
    if PROBS in x:
        return x[PROBS].to("cpu", F64)
    logits = x[LOGITS].to("cpu", F64)
    e = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def _renorm(p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = torch.where(keep, p, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def top_k_kept(values: torch.Tensor, top_k) -> torch.Tensor:
    """bool [rows, vocab]: every value at least the row's k-th largest; k <= 0 or >= vocab keeps all."""
    rows, vocab = values.shape
    k = per_row(top_k, rows, torch.int64)
    kth = torch.empty(rows, 1, dtype=values.dtype)
    for r in range(rows):
        kr = int(k[r])
        kth[r, 0] = -torch.kthvalue(-values[r], vocab if kr <= 0 or kr >= vocab else kr).values
    return values >= kth


def distributions(x: dict, cuts: list[tuple[torch.Tensor | float, torch.Tensor | float]]) -> list[torch.Tensor]:
    """The sampled distribution, float64 [rows, vocab], once per (top-p shift of mass, min-p factor) in `cuts`: the
    top-p cut moved by the shift, the min-p threshold multiplied by the factor (per row, or one for all)."""
    p = probabilities(x)
    rows = p.shape[0]
    if TOP_K in x:  # on the logits where there are logits: the order the kernel masks by
        p = _renorm(p, top_k_kept(x[LOGITS].to("cpu", F64) if LOGITS in x else p, x[TOP_K]))
    greater = mass_strictly_greater(p) if TOP_P in x else None
    out = []
    for shift, factor in cuts:
        keep = torch.ones_like(p, dtype=torch.bool)
        if greater is not None:
            tp = per_row(x[TOP_P], rows, F64)
            cut = (tp + (shift.to(F64) if isinstance(shift, torch.Tensor) else shift))[:, None]
            keep &= (greater < cut) | (greater == 0) | (tp[:, None] >= 1)
        if MIN_P in x:
            mp = per_row(x[MIN_P], rows, F64)
            f = factor.to(F64) if isinstance(factor, torch.Tensor) else torch.full((rows,), float(factor), dtype=F64)
            keep &= p >= (p.max(dim=-1).values * mp * f)[:, None]
        out.append(_renorm(p, keep))
    return out


def distribution(call: Call) -> torch.Tensor:
    return distributions(call.inputs.values, [(0.0, 1.0)])[0]


def exact_threshold(x: dict) -> torch.Tensor:
    """[rows] bool: the float32 min-p threshold max * min_p equals the exact product (then no band is needed)."""
    p = x[PROBS].to("cpu", torch.float32)
    top = p.max(dim=-1).values.to(F64)
    product = top * per_row(x[MIN_P], p.shape[0], torch.float32).to(F64)
    return product.to(torch.float32).to(F64) == product


def bands(x: dict, slack: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, wide, narrow, exact): the distribution, its cuts moved out and in by what float32 rounding may move them
    (the support a correct kernel may draw from, and the tokens every one keeps), and [rows] bool: no band."""
    rows = (x[PROBS] if PROBS in x else x[LOGITS]).shape[0]
    exact = torch.ones(rows, dtype=torch.bool)
    mass = torch.zeros(rows, dtype=F64)
    rel = torch.zeros(rows, dtype=F64)
    if TOP_P in x:  # over a float32 softmax (logits) no running sum is exact
        exact &= PROBS in x
        mass = torch.where(exact, 0.0, slack).to(F64)
    if MIN_P in x:
        exact &= exact_threshold(x)
        rel = torch.where(exact_threshold(x), 0.0, MIN_P_SLACK).to(F64)
    q, wide, narrow = distributions(x, [(0.0, 1.0), (mass, 1.0 - rel), (-mass, 1.0 + rel)])
    return q, wide, narrow, exact


def sampling(call: Call) -> tuple:
    """draws per row from the float64 distribution: [batch, draws] int64."""
    x = call.inputs.values
    device = (x[PROBS] if PROBS in x else x[LOGITS]).device
    q = distribution(call).to(device)
    g = torch.Generator(device=device).manual_seed(call.inputs.seed + 0x5EED)
    return (torch.multinomial(q, call.draws, replacement=True, generator=g),)


ADAPTERS = [
    Adapter("torch", "sampling", "softmax / min-p / top-k / top-p distribution (float64) + torch.multinomial",
            sampling, applies=applies, kind="sampler"),
]

"""Deterministic sampling-filter inputs: `top_k_renorm_probs`, `top_p_renorm_probs`, `top_k_mask_logits`.

FlashInfer files these under op_type `sampling` (its trace templates), as the definitions here do; the
registry routes a `sampling` definition to this generator when its first output is a float tensor (not
drawn token ids: `Definition.is_sampler`) and its inputs are `probs` or `logits` with `top_k` or `top_p`.

Probabilities are sampling.py's Zipf rows (a random permutation, exponent per row; 1.2-2.0 for top-p, so
that the nucleus ends among tokens of real mass); logits are their logarithms plus a per-row shift. The
typical cases hold NO tie at the cut and no top_p near a cumulative boundary: top_k is moved down until
the k-th and (k+1)-th values differ in the input's dtype, and top_p is a midpoint between two cumulative
masses at least 2 * P_MARGIN apart, so rounding (float32 sums in any order, bfloat16 inputs) cannot move
the cut. The API documents no tie rule, so ties live only in their own named boundary cases (EDGE),
whose reasons are in docs/boundary/topk.md. Every filter value stays in the API's documented range
((0, vocab) and (0, 1)) except in `filters_off`, which sends the disabling values engines pass.
"""

from __future__ import annotations

import math

import torch

from . import sampling as smp
from .common import Builder, Stream, log_uniform, permutation, randint, uniform

OP_TYPES = ("sampling",)  # shared with sampling.py; `claims` decides (registry.py)
PROBS, LOGITS, TOP_K, TOP_P = "probs", "logits", "top_k", "top_p"
KINDS = {(PROBS, TOP_K): "top_k_renorm", (PROBS, TOP_P): "top_p_renorm", (LOGITS, TOP_K): "top_k_mask"}
BATCH = {"small": 2, "medium": 4, "large": 16}  # few rows: a vocabulary-wide sort per row is the CPU cost
VOCAB = {"small": 1000, "medium": 32000, "large": 128256}  # only when the definition leaves it var
TOP_K_MAX = 1024  # typical k: log-uniform in [1, min(TOP_K_MAX, vocab - 1)]
TOP_P_RANGE = (0.3, 0.95)  # typical top_p target; the cut moves to the nearest safe boundary
ZIPF_TOP_P = (1.2, 2.0)
P_MARGIN = 1e-4  # the least distance of top_p from any cumulative mass (float32 sums of 152k terms: ~1e-5)
SCALAR_TRIES = 256  # candidate top_p values tried against every row (a scalar top_p)
LOGIT_SHIFT = 5.0
LOWEST_FRACTIONS = (0.5, 0.99)
EXTREME_LOG2 = (-20, 125)  # |logit| log-uniform in 2^[-20, 125] (float32 / bfloat16 max is ~2^128)
INT32_MAX = 2**31 - 1

# case -> the kinds it applies to (docs/boundary/topk.md says why each exists)
EDGE = {
    "ties_at_cut": ("top_k_renorm", "top_p_renorm", "top_k_mask"),
    "uniform": ("top_k_renorm", "top_p_renorm", "top_k_mask"),
    "top_k_1": ("top_k_renorm", "top_k_mask"),
    "top_p_exact": ("top_p_renorm",),
    "one_hot": ("top_k_renorm", "top_p_renorm"),  # as logits: a tie of lowest values at the cut
    "last_token": ("top_k_renorm", "top_p_renorm"),
    "filters_off": ("top_k_renorm", "top_p_renorm", "top_k_mask"),
    "tiny_probs": ("top_k_renorm", "top_p_renorm"),
    "lowest_logits": ("top_k_mask",),
    "extreme_logits": ("top_k_mask",),
}
TIE_CASES = ("ties_at_cut", "uniform")  # outside the documented contract (verdict/contract.toml)


def kind(definition) -> str | None:
    """Which filter a definition computes, from its input names; None where it is none of the three."""
    names = tuple(definition.inputs)
    return KINDS.get(names) if len(names) == 2 else None


def claims(definition) -> bool:
    """A `sampling` definition this generator makes inputs for (sampling.py makes the samplers')."""
    return definition.op_type in OP_TYPES and not definition.is_sampler and kind(definition) is not None


def edge_cases(definition) -> list[str]:
    k = kind(definition)
    return [c for c, kinds in EDGE.items() if k in kinds]


# -- typical rows: no tie at the cut, top_p away from every cumulative mass ------------------------------
def _sorted_rounded(values: torch.Tensor) -> torch.Tensor:
    """Each row's values as the kernel sees them (the input dtype), descending, in float64."""
    return torch.sort(values.to(torch.float64), dim=-1, descending=True).values


def untied_k(values: torch.Tensor, k: int) -> int:
    """The k' nearest k (the smaller on a draw) at which no row has a tie between its k'-th and (k'+1)-th
    values; 1 where every k' ties somewhere (a row's maximum is unique in every case that asks)."""
    s = _sorted_rounded(values)
    free = ~(s[:, :-1] == s[:, 1:]).any(dim=0)  # free[j]: the cut after j + 1 values splits no tie in any row
    ks = torch.nonzero(free).flatten() + 1
    if ks.numel() == 0:
        return 1
    return int(ks[torch.argmin((ks - k).abs() * 2 + (ks > k).long())])


def cut_masses(row: torch.Tensor) -> torch.Tensor:
    """The masses at which a top_p cut can fall in one row (float64, ascending): the running sum before
    each group of equal values, and the total."""
    s = _sorted_rounded(row[None])[0]
    before = torch.cumsum(s, 0) - s
    starts = torch.ones_like(s, dtype=torch.bool)
    starts[1:] = s[1:] != s[:-1]
    return torch.cat([before[starts], before[-1:] + s[-1:]])


def safe(top_p: float, masses: torch.Tensor) -> bool:
    return bool((masses - top_p).abs().min() >= P_MARGIN)


def safe_top_p(rows: torch.Tensor, target: float) -> float:
    """The top_p nearest `target` that is a midpoint between two cut masses >= 2 P_MARGIN apart in the first
    row and at least P_MARGIN from every cut mass of every row; half the smallest top probability (the
    most probable token alone) where there is none."""
    masses = [cut_masses(r) for r in rows]
    m = masses[0]
    gaps = m[1:] - m[:-1]
    mids = ((m[1:] + m[:-1]) / 2)[(gaps >= 2 * P_MARGIN) & (m[1:] < 1 - P_MARGIN)]
    for p in mids[torch.argsort((mids - target).abs())][:SCALAR_TRIES].tolist():
        if all(safe(p, x) for x in masses[1:]):
            return float(p)
    return float(min(float(x[1]) for x in masses)) / 2


def _logits_from(probs: torch.Tensor, gen: Stream) -> torch.Tensor:
    """log(probs) (zeros become -inf) plus a per-row shift in [-LOGIT_SHIFT, LOGIT_SHIFT], float64."""
    shift = (uniform((probs.shape[0], 1), gen).to(torch.float64) * 2 - 1) * LOGIT_SHIFT
    return probs.to(torch.float64).log() + shift


def _typical(b: Builder, k_name: str, batch: int, vocab: int) -> None:
    dist = LOGITS if LOGITS in b.definition.inputs else PROBS
    dtype = b.torch_dtype(dist)
    if k_name == TOP_P:
        probs = smp.zipf_probs(batch, vocab, b.rng(PROBS), ZIPF_TOP_P).to(dtype)
        b.put(PROBS, probs)
        g = b.rng(TOP_P)
        targets = (uniform((batch,), g) * (TOP_P_RANGE[1] - TOP_P_RANGE[0]) + TOP_P_RANGE[0]).tolist()
        if not b.spec(TOP_P).shape:
            b.put_scalar(TOP_P, safe_top_p(probs, targets[0]))
            return
        b.put(TOP_P, torch.tensor([safe_top_p(probs[i:i + 1], targets[i]) for i in range(batch)],
                                  dtype=b.torch_dtype(TOP_P)))
        return
    probs = smp.zipf_probs(batch, vocab, b.rng(PROBS))
    values = (_logits_from(probs, b.rng(LOGITS)) if dist == LOGITS else probs).to(dtype)
    b.put(dist, values)
    g = b.rng(TOP_K)
    hi = max(1, min(TOP_K_MAX, vocab - 1))
    ks = log_uniform((batch,), g, 0, math.log2(hi)).round().clamp(1, hi).to(torch.int64).tolist()
    if not b.spec(TOP_K).shape:
        b.put_scalar(TOP_K, untied_k(values, int(ks[0])))
        return
    b.put(TOP_K, torch.tensor([untied_k(values[i:i + 1], int(ks[i])) for i in range(batch)],
                              dtype=b.torch_dtype(TOP_K)))


# -- boundary rows (float64 values [batch, vocab], top_k [batch], top_p [batch]) --------------------------
def lowest_rows(batch: int, vocab: int, gen: Stream, has_k: bool, has_p: bool):
    """Zipf logits with a fraction (1/2, 99/100 by row) at the dtype's lowest finite value (masked tokens, as
    an engine's grammar or bad-word mask writes them; inputs are finite here); top_k a third of the count
    of the others (row 0) or exactly that count (row 1: the cut falls between the last real logit and the
    lowest block, so the real ones are kept and the lowest become -inf)."""
    probs = smp.zipf_probs(batch, vocab, gen).to(torch.float64)
    ks = []
    for i in range(batch):
        frac = LOWEST_FRACTIONS[i % len(LOWEST_FRACTIONS)]
        dead = permutation(vocab, gen)[:int(vocab * frac)]
        probs[i, dead] = 0.0
        finite = vocab - dead.numel()
        ks.append(max(1, finite // 3) if i % 2 == 0 else finite)
    return probs.log(), torch.tensor(ks, dtype=torch.int64), torch.ones(batch, dtype=torch.float64)


def extreme_rows(batch: int, vocab: int, gen: Stream, has_k: bool, has_p: bool):
    """|logit| log-uniform over 2^[-20, 125] with random signs: a pivot search over the value range
    ((lo + hi) / 2, hi - lo) must not overflow float32, and every magnitude must compare right."""
    mag = log_uniform((batch, vocab), gen, *EXTREME_LOG2).to(torch.float64)
    sign = randint(0, 2, (batch, vocab), gen) * 2 - 1
    k = randint(1, min(TOP_K_MAX, vocab - 1) + 1, (batch,), gen).to(torch.int64)
    return mag * sign, k, torch.ones(batch, dtype=torch.float64)


def top_k_1_rows(batch: int, vocab: int, gen: Stream, has_k: bool, has_p: bool):
    """Zipf rows (a unique most probable token), top_k = 1: greedy, the top token alone with mass 1."""
    probs = smp.zipf_probs(batch, vocab, gen).to(torch.float64)
    return probs, torch.ones(batch, dtype=torch.int64), torch.ones(batch, dtype=torch.float64)


BOUNDARY = {  # case -> (rows builder, default batch); the probability rows are sampling.py's
    "ties_at_cut": (smp.tied_rows, smp.EDGE_ROWS),
    "uniform": (smp.uniform_rows, smp.EDGE_ROWS),
    "top_k_1": (top_k_1_rows, smp.EDGE_ROWS),
    "top_p_exact": (smp.exact_rows, len(smp.EXACT_TOP_P)),
    "one_hot": (smp.one_hot_rows, smp.EDGE_ROWS),
    "last_token": (smp.last_token_rows, smp.EDGE_ROWS),
    "filters_off": (smp.filters_off_rows, 3),
    "tiny_probs": (smp.tiny_rows, 3),
    "lowest_logits": (lowest_rows, 2),
    "extreme_logits": (extreme_rows, 2),
}
LOGIT_ROWS = ("lowest_logits", "extreme_logits")  # rows already logits; the others are probabilities
UNTIED = ("lowest_logits", "extreme_logits")  # k drawn at random inside the row: no tie at it


def _boundary(b: Builder, dist: str, k_name: str, batch: int, vocab: int) -> None:
    build, _ = BOUNDARY[b.case]
    values, k, p = build(batch, vocab, b.rng(b.case), k_name == TOP_K, k_name == TOP_P)
    dtype = b.torch_dtype(dist)
    if dist == LOGITS:
        if b.case not in LOGIT_ROWS:
            values = values.log()  # the same rows as logits: ties stay ties
        # a zero probability is the dtype's lowest finite logit: inputs are finite (Builder), and a kernel
        # must keep it where the k-th value is that low, not treat it as -inf
        values = torch.where(values.isneginf(), torch.finfo(dtype).min, values)
    b.put(dist, values.to(dtype))
    if b.case in UNTIED:  # k drawn inside the row: moved off any tie the dtype's rounding made (in every row
        rounded = values.to(dtype)  # for a scalar top_k, which is the first row's)
        rows = [rounded] if not b.spec(k_name).shape else [rounded[i:i + 1] for i in range(batch)]
        k = torch.tensor([untied_k(r, int(k[i])) for i, r in enumerate(rows)], dtype=torch.int64)
    per_row = k.clamp(max=INT32_MAX) if k_name == TOP_K else p
    if b.spec(k_name).shape:
        b.put(k_name, per_row.to(b.torch_dtype(k_name)))
    else:  # one value for every row: the first row's (each case's rows are built so that it fits them all)
        b.put_scalar(k_name, per_row[0].item())


def generate(b: Builder) -> None:
    d = b.definition
    k = kind(d)
    if k is None or not claims(d):
        raise b.mismatch("the sampling-filter generator makes probs or logits with top_k or top_p, for a "
                         f"definition whose first output is a float tensor (inputs: {', '.join(d.inputs)})")
    dist, k_name = (PROBS if k != "top_k_mask" else LOGITS), (TOP_P if k == "top_p_renorm" else TOP_K)
    batch_axis, vocab_axis = b.dim_axis(dist, 0), b.dim_axis(dist, 1)
    if batch_axis not in b.axes:
        b.set_axis(batch_axis, BOUNDARY[b.case][1] if b.case in BOUNDARY else b.count(BATCH[b.size]))
    if vocab_axis not in b.axes:
        b.set_axis(vocab_axis, VOCAB[b.size])
    batch, vocab = b.axis(batch_axis), b.axis(vocab_axis)
    if b.case in BOUNDARY:
        _boundary(b, dist, k_name, batch, vocab)
    else:
        _typical(b, k_name, batch, vocab)

"""Inputs of the samplers beside top-k / top-p from probabilities (op_type `sampling`): `sampling_from_probs`,
`min_p_sampling_from_probs`, `sampling_from_logits` and `top_k_top_p_sampling_from_logits` (FlashInfer's names).

The registry routes a `sampling` definition here when it draws token ids (`Definition.is_sampler`) and its inputs
are exactly one of KINDS (sampling.py keeps probs with top_k and / or top_p; topk.py the deterministic filters).

Typical rows are sampling.py's Zipf rows (a random permutation, exponent per row in [0.8, 2.0]); as logits they
are their logarithms plus a per-row shift in [-5, 5] (topk.py's). min_p is uniform in [0.02, 0.3] with about a
quarter of the rows at 0 (the filter off); top_k and top_p as sampling.py draws them. The verdict widens and
narrows each cut by the float32 rounding a correct kernel may make (verdict/samples.py), so a typical row needs
no margin around its cut.

The edge cases (EDGE) put rows at the boundaries of the contract: min_p at 0 and at 1, a tie exactly at
min_p * max (every value and product exact in float32), one-hot rows, the last token id, uniform rows (as logits:
all equal), tiny and subnormal probabilities, logits of -inf (masked tokens), logits far past what exp() holds
without the row's maximum subtracted, and, for top-k / top-p over logits, sampling.py's cut cases and rows where
the order of the two filters decides (`filter_order`). Why each exists: docs/boundary/samplers.md.
"""

from __future__ import annotations

import torch

from . import sampling as smp
from .common import Builder, Stream, permutation, randint, uniform
from .topk import _logits_from

OP_TYPES = ("sampling",)  # shared with sampling.py and topk.py; `claims` decides (registry.py)
PROBS, LOGITS, MIN_P, TOP_K, TOP_P = "probs", "logits", "min_p", "top_k", "top_p"
KINDS = {
    frozenset({PROBS}): "probs",  # sampling_from_probs
    frozenset({PROBS, MIN_P}): "min_p",  # min_p_sampling_from_probs
    frozenset({LOGITS}): "logits",  # sampling_from_logits
    frozenset({LOGITS, TOP_K, TOP_P}): "logits_top_k_top_p",  # top_k_top_p_sampling_from_logits
}
BATCH = {"small": 2, "medium": 8, "large": 32}
VOCAB = {"small": 1000, "medium": 32000, "large": 128256}  # only when the definition leaves it var
MIN_P_RANGE = (0.02, 0.3)
ANY_MIN_P = (0.05, 0.9)  # where the case's rows keep what they keep for any min_p (one-hot, uniform)

# case -> the kinds it applies to
EDGE = {
    "min_p_zero": ("min_p",),
    "min_p_one": ("min_p",),
    "min_p_exact": ("min_p",),
    "top_k_1": ("logits_top_k_top_p",),
    "top_p_small": ("logits_top_k_top_p",),
    "ties_at_cut": ("logits_top_k_top_p",),
    "neg_inf_logits": ("logits", "logits_top_k_top_p"),
    "huge_logits": ("logits", "logits_top_k_top_p"),
    "uniform": ("probs", "min_p", "logits", "logits_top_k_top_p"),
    "one_hot": ("probs", "min_p", "logits", "logits_top_k_top_p"),
    "last_token": ("probs", "min_p", "logits", "logits_top_k_top_p"),
    "filter_order": ("logits_top_k_top_p",),
    "filters_off": ("logits_top_k_top_p",),
    "tiny_probs": ("probs", "min_p", "logits", "logits_top_k_top_p"),
}
HUGE_SHIFTS = (1000.0, -1000.0, 1e5)  # past exp()'s float32 range (88.7) both ways, and past float16's max
NEG_INF_FRACTIONS = (0.5, 0.99)
EXACT_ROWS = (  # (max, tokens at exactly max / 2, their value, tokens below, their value): each row sums to 1
    (2.0 ** -3, 13, 2.0 ** -4, 64, 2.0 ** -10),
    (2.0 ** -2, 5, 2.0 ** -3, 8, 2.0 ** -6),
)
EXACT_MIN_P = 0.5  # every row of min_p_exact: the threshold max / 2 is exact in float32, and tokens sit on it
MAX_TIE = (3, 5)
MIN_P_ZERO_ZIPF = (0.8, 1.2)  # tokens sharing the largest probability in min_p_one's tied row


def kind(definition) -> str | None:
    """Which sampler a definition is, from its input names (all of them); None where it is none of KINDS."""
    return KINDS.get(frozenset(definition.inputs))


def claims(definition) -> bool:
    return definition.op_type in OP_TYPES and definition.is_sampler and kind(definition) is not None


def edge_cases(definition) -> list[str]:
    k = kind(definition)
    return [c for c, kinds in EDGE.items() if k in kinds]


# -- boundary rows: (values float64 [batch, vocab] as probabilities, {parameter: float64 [batch]}) ---------
def _min_p_of(case: str, batch: int, gen: Stream) -> torch.Tensor:
    """min_p for the rows sampling.py's builders make, by their row kinds (docs/boundary/samplers.md)."""
    def any_value() -> float:
        return ANY_MIN_P[0] + (ANY_MIN_P[1] - ANY_MIN_P[0]) * float(uniform((1,), gen))

    values = []
    for i in range(batch):
        if case == "tiny_probs":  # rows "all", "subnormal", "past": keep every nonzero token; the tiny normals
            # but no subnormal (threshold 1e-35); 0.4, 0.3 and 0.2 (0.2 is exactly 0.5 * 0.4 in float32)
            values.append((0.0, 2.5e-35, 0.5)[i % 3])
        elif case == "last_token" and i % 2 == 1:  # 3/4 and 1/4: both kept below min_p 1/3
            values.append(0.05 + 0.25 * float(uniform((1,), gen)))
        else:
            values.append(any_value())
    return torch.tensor(values, dtype=torch.float64)


def min_p_zero_rows(batch: int, vocab: int, gen: Stream):
    """min_p = 0 keeps every token: Zipf rows of exponent 0.8-1.2 (at least half the mass on tokens below a tenth
    of the largest probability, so that any positive threshold cuts a visible share), every other one with half
    its tokens at exactly 0 (kept by `p >= 0`, never drawn)."""
    probs = smp.zipf_probs(batch, vocab, gen, MIN_P_ZERO_ZIPF).to(torch.float64)
    for i in range(1, batch, 2):
        probs[i, permutation(vocab, gen)[:vocab // 2]] = 0.0
    probs = probs / probs.sum(dim=1, keepdim=True)
    return probs, torch.zeros(batch, dtype=torch.float64)


def min_p_one_rows(batch: int, vocab: int, gen: Stream):
    """min_p = 1 keeps only the most probable token(s): a Zipf row (a unique maximum: greedy), and a row whose
    3-5 most probable tokens tie (all of them kept, drawn alike)."""
    rows = []
    for i in range(batch):
        if i % 2 == 0:
            rows.append(smp.zipf_probs(1, vocab, gen)[0].to(torch.float64))
            continue
        t = smp._rand(*MAX_TIE, gen)
        ids = smp._ids(vocab, vocab, gen)
        row = torch.zeros(vocab, dtype=torch.float64)
        row[ids[:t]] = 0.15
        smp._tail(row, ids[t:], 1.0 - 0.15 * t, 0.05)
        rows.append(row)
    return torch.stack(rows), torch.ones(batch, dtype=torch.float64)


def min_p_exact_rows(batch: int, vocab: int, gen: Stream):
    """Dyadic rows (EXACT_ROWS) with min_p = 1/2: the threshold max / 2 is exact in float32 and several tokens sit
    exactly on it, holding most of the kept mass; `>=` keeps them, `>` drops them."""
    rows = []
    for i in range(batch):
        top, n_tie, tie, n_low, low = EXACT_ROWS[i % len(EXACT_ROWS)]
        ids = smp._ids(vocab, 1 + n_tie + n_low, gen)
        row = torch.zeros(vocab, dtype=torch.float64)
        row[ids[0]] = top
        row[ids[1:1 + n_tie]] = tie
        row[ids[1 + n_tie:1 + n_tie + n_low]] = low
        rows.append(row)
    return torch.stack(rows), torch.full((batch,), EXACT_MIN_P, dtype=torch.float64)


def neg_inf_rows(batch: int, vocab: int, gen: Stream):
    """Zipf rows with 1/2 and 99/100 of the tokens at probability 0 (as logits: -inf, a grammar or bad-word mask);
    top_k a third of the finite tokens, or past their count (the k-th logit is then -inf)."""
    probs = smp.zipf_probs(batch, vocab, gen).to(torch.float64)
    ks = []
    for i in range(batch):
        dead = permutation(vocab, gen)[:int(vocab * NEG_INF_FRACTIONS[i % len(NEG_INF_FRACTIONS)])]
        probs[i, dead] = 0.0
        finite = vocab - dead.numel()
        ks.append(max(1, finite // 3) if i % 2 == 0 else min(vocab - 1, finite + 5))
    probs = probs / probs.sum(dim=1, keepdim=True)
    return probs, {TOP_K: torch.tensor(ks, dtype=torch.float64)}


def filter_order_rows(batch: int, vocab: int, gen: Stream):
    """Rows spread over the whole vocabulary (Zipf exponent 0.1-0.4), top_k 16-64 and top_p 0.3-0.6: the top-k
    tokens hold a sliver of the raw mass, so top-p on the renormalised top-k distribution keeps about top_p of
    them, where top-p on the raw mass (the two filters intersected) would keep all k."""
    probs = smp.zipf_probs(batch, vocab, gen, (0.1, 0.4)).to(torch.float64)
    top_k = randint(16, min(64, vocab - 1) + 1, (batch,), gen).to(torch.float64)
    top_p = 0.3 + 0.3 * uniform((batch,), gen).to(torch.float64)
    return probs, {TOP_K: top_k, TOP_P: top_p}


# case -> (rows builder over probabilities, default batch, builder signature: "sampling" for sampling.py's)
BOUNDARY = {
    "min_p_zero": (min_p_zero_rows, 2, "min_p"),
    "min_p_one": (min_p_one_rows, 2, "min_p"),
    "min_p_exact": (min_p_exact_rows, len(EXACT_ROWS), "min_p"),
    "neg_inf_logits": (neg_inf_rows, 2, "params"),
    "filter_order": (filter_order_rows, 2, "params"),
    "huge_logits": (None, len(HUGE_SHIFTS), "huge"),
    "top_k_1": (None, smp.EDGE_ROWS, "top_k_1"),
    "top_p_small": (None, smp.EDGE_ROWS, "top_p_small"),
    "ties_at_cut": (smp.tied_rows, smp.EDGE_ROWS, "sampling"),
    "uniform": (smp.uniform_rows, smp.EDGE_ROWS, "sampling"),
    "one_hot": (smp.one_hot_rows, smp.EDGE_ROWS, "sampling"),
    "last_token": (smp.last_token_rows, smp.EDGE_ROWS, "sampling"),
    "filters_off": (smp.filters_off_rows, 3, "sampling"),
    "tiny_probs": (smp.tiny_rows, 3, "sampling"),
}


def _as_logits(probs: torch.Tensor, gen: Stream) -> torch.Tensor:
    """log(probs) plus a per-row shift (topk.py's); a zero probability is a -inf logit."""
    return _logits_from(probs, gen)


def _typical_params(k: str, batch: int, vocab: int, b: Builder) -> dict[str, torch.Tensor]:
    """min_p, top_k, top_p per row, about a quarter of the rows at their disabling value where the definition takes
    a value per row (one value for every row, the first, is never the disabling one: that row would be all)."""
    def off(name: str, g: Stream) -> torch.Tensor:
        if not b.spec(name).shape:
            return torch.zeros(batch, dtype=torch.bool)
        return smp._disabled_rows(batch, g)

    out: dict[str, torch.Tensor] = {}
    if k == "min_p":
        g = b.rng(MIN_P)
        mp = uniform((batch,), g).to(torch.float64) * (MIN_P_RANGE[1] - MIN_P_RANGE[0]) + MIN_P_RANGE[0]
        mp[off(MIN_P, g)] = 0.0
        out[MIN_P] = mp
    if k == "logits_top_k_top_p":
        g = b.rng(TOP_K)
        top_k = randint(1, min(vocab, smp.TOP_K_MAX) + 1, (batch,), g).to(torch.float64)
        top_k[off(TOP_K, g)] = vocab
        g = b.rng(TOP_P)
        top_p = uniform((batch,), g).to(torch.float64) * (smp.TOP_P[1] - smp.TOP_P[0]) + smp.TOP_P[0]
        top_p[off(TOP_P, g)] = 1.0
        out[TOP_K], out[TOP_P] = top_k, top_p
    return out


def _boundary(b: Builder, k: str, batch: int, vocab: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(probabilities or, for huge_logits, logits float64 [batch, vocab], parameters per row)."""
    build, _, how = BOUNDARY[b.case]
    g = b.rng(b.case)
    if how == "sampling":
        probs, top_k, top_p = build(batch, vocab, g, True, True)
        params = {TOP_K: top_k.to(torch.float64), TOP_P: top_p}
        if k == "min_p":
            params[MIN_P] = _min_p_of(b.case, batch, g)
        return probs, params
    if how == "min_p":
        probs, mp = build(batch, vocab, g)
        return probs, {MIN_P: mp}
    if how == "params":
        probs, params = build(batch, vocab, g)
        params.setdefault(TOP_P, smp.TOP_P[0] + (smp.TOP_P[1] - smp.TOP_P[0]) * uniform((batch,), g).to(torch.float64))
        return probs, params
    probs = smp.zipf_probs(batch, vocab, g).to(torch.float64)
    typical = _typical_params(k, batch, vocab, b)
    if how == "top_k_1":
        typical[TOP_K] = torch.ones(batch, dtype=torch.float64)
    elif how == "top_p_small":
        lo, hi = smp.TOP_P_SMALL
        typical[TOP_P] = uniform((batch,), g).to(torch.float64) * (hi - lo) + lo
    elif how == "huge":  # the rows as logits, shifted far past exp()'s range
        logits = probs.log() + torch.tensor(HUGE_SHIFTS, dtype=torch.float64).repeat(batch)[:batch, None]
        return logits, typical
    return probs, typical


def _put_param(b: Builder, name: str, values: torch.Tensor) -> None:
    """Per-row tensor [batch], or (a definition with one value for every row) the first row's value."""
    if name == TOP_K:
        values = values.round().clamp(max=smp.INT32_MAX).to(torch.int64)
    if b.spec(name).shape:
        b.put(name, values.to(b.torch_dtype(name)))
    else:
        b.put_scalar(name, values[0].item())


def generate(b: Builder) -> None:
    d = b.definition
    k = kind(d)
    if k is None or not claims(d):
        raise b.mismatch(f"the samplers generator makes {', '.join(sorted(KINDS.values()))} inputs for a sampler "
                         f"(inputs: {', '.join(d.inputs)})")
    dist = LOGITS if LOGITS in d.inputs else PROBS
    batch_axis, vocab_axis = b.dim_axis(dist, 0), b.dim_axis(dist, 1)
    if batch_axis not in b.axes:
        b.set_axis(batch_axis, BOUNDARY[b.case][1] if b.case in BOUNDARY else BATCH[b.size])
    if vocab_axis not in b.axes:
        b.set_axis(vocab_axis, VOCAB[b.size])
    batch, vocab = b.axis(batch_axis), b.axis(vocab_axis)
    if b.case in BOUNDARY:
        values, params = _boundary(b, k, batch, vocab)
        is_logits = BOUNDARY[b.case][2] == "huge"
    else:
        values, params, is_logits = smp.zipf_probs(batch, vocab, b.rng(PROBS)).to(torch.float64), \
            _typical_params(k, batch, vocab, b), False
    if dist == LOGITS:
        if not is_logits:
            values = _as_logits(values, b.rng(LOGITS))
        b.neg_inf.add(LOGITS)  # a masked token is a -inf logit: the contract's value, not a generator's slip
    b.put(dist, values.to(b.torch_dtype(dist)))
    for name in d.inputs:
        if name != dist:
            _put_param(b, name, params[name])

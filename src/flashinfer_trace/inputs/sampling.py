"""Sampling inputs (op_type `sampling`): probabilities plus per-row top_k and/or top_p.

Probabilities are shaped like a language model's: each row is a Zipf law over a random
permutation of the vocabulary, p(rank r) ~ r^-s with s drawn per row in [0.8, 2.0], so rows
range from flat (top token ~2%) to peaked (top token ~60%). A uniform or randn-softmax row is
so flat that top-k/top-p filtering barely changes the distribution and bugs in it go unseen.
The softmax is taken in float64, so float32 rows sum to 1 within ~1e-7.

top_k is 1..min(vocab, 128) with about a quarter of rows at vocab (filtering off; at least one
such row when batch > 1); top_p is 0.5..0.95 with about a quarter of rows at 1.0.

The edge cases (EDGE) put rows at the filters' boundaries, built from the contract's arithmetic: ties
straddling the cut, uniform rows, top_p exactly at a cumulative mass, one-hot rows, the last token id,
filters at their disabling values, tiny and subnormal probabilities (docs/boundary/sampling.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .common import Builder, Stream, permutation, randint, uniform

if TYPE_CHECKING:
    from ..definition import Definition
    from . import Inputs

OP_TYPES = ("sampling",)
BATCH = {"small": 2, "medium": 8, "large": 32}
VOCAB = {"small": 1000, "medium": 32000, "large": 128256}  # only when the definition leaves it var
ZIPF_S = (0.8, 2.0)
TOP_K_MAX = 128
TOP_P = (0.5, 0.95)
TOP_P_SMALL = (0.001, 0.05)
DISABLED_FRACTION = 0.25
INT32_MAX = 2**31 - 1
PROBS, TOP_K, TOP_P_NAME = "probs", "top_k", "top_p"

# Boundary-seeking cases (docs/boundary/sampling.md), with the filter inputs each needs (any of them):
# their rows are built from the contract's arithmetic, a few per case at every size (the vocabulary, not the
# batch, is what the definition fixes, and a check's cost is its draws, which do not grow with the rows).
EDGE = {
    "top_k_1": (TOP_K,),
    "top_p_small": (TOP_P_NAME,),
    "ties_at_cut": (TOP_K, TOP_P_NAME),
    "uniform": (TOP_K, TOP_P_NAME),
    "top_p_exact": (TOP_P_NAME,),
    "one_hot": (TOP_K, TOP_P_NAME),
    "last_token": (TOP_K, TOP_P_NAME),
    "filters_off": (TOP_K, TOP_P_NAME),
    "tiny_probs": (TOP_K, TOP_P_NAME),
}
EDGE_ROWS = 2  # rows of a boundary case (more where its row kinds are more)
TIE_VALUE = 0.05  # the probability the tied tokens share


def edge_cases(definition) -> list[str]:
    """Each case needs one of its filter inputs (top_k_1 a top_k, top_p_small and top_p_exact a top_p)."""
    return [c for c, need in EDGE.items() if any(n in definition.inputs for n in need)]
def zipf_probs(batch: int, vocab: int, gen: Stream, s_range: tuple[float, float] = ZIPF_S) -> torch.Tensor:
    """[batch, vocab] float32, made on the CPU (log and softmax are not bit-identical across devices)."""
    s = uniform((batch, 1), gen).to(torch.float64) * (s_range[1] - s_range[0]) + s_range[0]
    base = -s * torch.arange(1, vocab + 1, dtype=torch.float64).log()  # [batch, vocab], by rank
    order = permutation(vocab, gen, rows=batch)  # rank -> token
    logits = torch.empty_like(base).scatter_(1, order, base)
    return torch.softmax(logits, dim=-1).to(torch.float32)


def _disabled_rows(batch: int, gen: Stream) -> torch.Tensor:
    off = uniform((batch,), gen) < DISABLED_FRACTION
    if batch > 1:
        off[int(randint(0, batch, (1,), gen))] = True
        if bool(off.all()):
            off[int(randint(0, batch, (1,), gen))] = False
    return off


def generate(b: Builder) -> None:
    d = b.definition
    extra = [n for n in d.inputs if n not in (PROBS, TOP_K, TOP_P_NAME)]
    if extra or PROBS not in d.inputs:
        missing = ", ".join(extra) if extra else "no probs input"
        raise b.mismatch(f"the sampling generator makes probs, top_k and top_p ({missing})")
    batch_axis, vocab_axis = b.dim_axis(PROBS, 0), b.dim_axis(PROBS, 1)
    boundary = BOUNDARY.get(b.case)
    if batch_axis not in b.axes:
        b.set_axis(batch_axis, boundary[1] if boundary else BATCH[b.size])
    if vocab_axis not in b.axes:
        b.set_axis(vocab_axis, VOCAB[b.size])
    batch, vocab = b.axis(batch_axis), b.axis(vocab_axis)
    if boundary:
        probs, k, p = boundary[0](batch, vocab, b.rng(b.case), TOP_K in d.inputs, TOP_P_NAME in d.inputs)
        b.put(PROBS, probs.to(b.torch_dtype(PROBS)))
        if TOP_K in d.inputs:
            _put_per_row(b, TOP_K, k)
        if TOP_P_NAME in d.inputs:
            _put_per_row(b, TOP_P_NAME, p.to(torch.float32))
        return
    b.put(PROBS, zipf_probs(batch, vocab, b.rng(PROBS)).to(b.torch_dtype(PROBS)))

    if TOP_K in d.inputs:
        g = b.rng(TOP_K)
        if b.case == "top_k_1":
            k = torch.ones(batch, dtype=torch.int64)
        else:
            k = randint(1, min(vocab, TOP_K_MAX) + 1, (batch,), g)
            k[_disabled_rows(batch, g)] = vocab
        _put_per_row(b, TOP_K, k)
    if TOP_P_NAME in d.inputs:
        g = b.rng(TOP_P_NAME)
        lo, hi = TOP_P_SMALL if b.case == "top_p_small" else TOP_P
        p = uniform((batch,), g) * (hi - lo) + lo
        if b.case != "top_p_small":
            p[_disabled_rows(batch, g)] = 1.0
        _put_per_row(b, TOP_P_NAME, p)


# -- boundary rows: (probs float64 [batch, vocab], top_k int64 [batch], top_p float64 [batch]) -------------
def _ids(vocab: int, count: int, gen: Stream) -> torch.Tensor:
    """`count` distinct random token ids, then the rest of the vocabulary, in random order."""
    return permutation(vocab, gen)[:count] if count < vocab else permutation(vocab, gen)


def _rand(lo: int, hi: int, gen: Stream) -> int:
    """An integer in [lo, hi]."""
    return int(randint(lo, hi + 1, (1,), gen))


def _rows(batch: int, kinds: list, build) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row i of kind kinds[i % len(kinds)], built by build(kind, i) -> (probs [vocab], top_k, top_p)."""
    made = [build(kinds[i % len(kinds)], i) for i in range(batch)]
    return (torch.stack([m[0] for m in made]), torch.tensor([int(m[1]) for m in made], dtype=torch.int64),
            torch.tensor([float(m[2]) for m in made], dtype=torch.float64))


def _tail(row: torch.Tensor, order: torch.Tensor, mass: float, cap: float) -> None:
    """Spread `mass` over the tokens of `order` (Zipf, exponent 1, in that order), each below `cap`; a flat
    spread where the vocabulary is too small for that."""
    w = 1.0 / torch.arange(1, order.numel() + 1, dtype=torch.float64)
    w = w / w.sum() * mass
    if float(w[0]) >= cap:
        w = torch.full((order.numel(),), mass / order.numel(), dtype=torch.float64)
    row[order] = w


def tied_rows(batch: int, vocab: int, gen: Stream, has_k: bool, has_p: bool):
    """One token of 1.5 TIE_VALUE, then m = 12-16 tokens sharing TIE_VALUE, then a tail below it; the cut falls
    inside the tie, after t = 1-2 of its tokens: top_k = 1 + t, or top_p = 1.5 TIE_VALUE + (t - 1/2) TIE_VALUE
    (half a token from any cumulative boundary, so float32 rounding cannot move it). The definition keeps the
    whole tie (FlashInfer's kernels); breaking it by rank keeps t of the m tokens, which moves at least 0.74
    of the mass across the cut at the top 1 + t tokens: more than the boundary settings' 0.6."""
    kinds = (["k"] if has_k else []) + (["p"] if has_p else [])

    def build(kind, _):
        h, m, t = 1, _rand(12, 16, gen), _rand(1, 2, gen)
        ids = _ids(vocab, vocab, gen)
        row = torch.zeros(vocab, dtype=torch.float64)
        head = [TIE_VALUE * (1.5 + 0.5 * i) for i in reversed(range(h))]
        row[ids[:h]] = torch.tensor(head, dtype=torch.float64)
        row[ids[h:h + m]] = TIE_VALUE
        _tail(row, ids[h + m:], 1.0 - sum(head) - m * TIE_VALUE, TIE_VALUE / 2)
        if kind == "k":
            return row, h + t, 1.0
        return row, vocab, sum(head) + (t - 0.5) * TIE_VALUE

    return _rows(batch, kinds, build)


def uniform_rows(batch: int, vocab: int, gen: Stream, has_k: bool, has_p: bool):
    """Every token 1/vocab: the whole row is one tie, so every filter keeps the whole vocabulary."""
    def build(_, i):
        k = vocab if i == 1 else _rand(1, min(vocab, TOP_K_MAX), gen)
        return torch.full((vocab,), 1.0 / vocab, dtype=torch.float64), k, 0.05 + 0.9 * float(uniform((1,), gen))

    return _rows(batch, [0], build)


EXACT_TOP_P = (0.75, 0.875, 0.5, 0.96875)  # each the mass before a token: 1/2 + 1/4 (+ 1/8 (+ 1/16 ...))


def exact_rows(batch: int, vocab: int, gen: Stream, has_k: bool, has_p: bool):
    """Probabilities 1/2, 1/4, 1/8, 1/16, 1/32 and a tail of 2**-15 each (a power-of-two count, 1/32 in all):
    every sum is exact in float32 and top_p is the mass before a token, so the strict `<` of the contract
    decides alone (the token at the cut is dropped; at 31/32 the whole tied tail is). top_k off."""
    tail = 1 << min(10, max(0, (vocab - 6).bit_length() - 1))

    def build(top_p, _):
        ids = _ids(vocab, 5 + tail, gen)
        row = torch.zeros(vocab, dtype=torch.float64)
        row[ids[:5]] = torch.tensor([2.0 ** -j for j in range(1, 6)], dtype=torch.float64)
        row[ids[5:5 + tail]] = 2.0 ** -5 / tail
        return row, vocab, top_p

    return _rows(batch, list(EXACT_TOP_P), build)


def one_hot_rows(batch: int, vocab: int, gen: Stream, has_k: bool, has_p: bool):
    """All the mass on one token (an interior id, then id 0): every draw must be it, whatever the filters
    (top_k > 1 puts the k-th probability at 0)."""
    def build(kind, _):
        row = torch.zeros(vocab, dtype=torch.float64)
        if kind == "inner":
            row[_rand(1, vocab - 2, gen)] = 1.0
            return row, _rand(2, min(vocab, TOP_K_MAX), gen), 0.05 + 0.9 * float(uniform((1,), gen))
        row[0] = 1.0
        return row, 1, 1.0

    return _rows(batch, ["inner", "first"], build)


def last_token_rows(batch: int, vocab: int, gen: Stream, has_k: bool, has_p: bool):
    """All the mass on the last token id, then 3/4 on it and 1/4 on the one before: index arithmetic at the
    end of the vocabulary (an id clamped to vocab - 2, a bound off by one)."""
    def build(kind, _):
        row = torch.zeros(vocab, dtype=torch.float64)
        if kind == "last":
            row[vocab - 1] = 1.0
            return row, _rand(2, min(vocab, TOP_K_MAX), gen), 0.05 + 0.9 * float(uniform((1,), gen))
        row[vocab - 1], row[vocab - 2] = 0.75, 0.25
        return row, vocab, 1.0

    return _rows(batch, ["last", "pair"], build)


def filters_off_rows(batch: int, vocab: int, gen: Stream, has_k: bool, has_p: bool):
    """Every filter at its disabling value (top_k = vocab, vocab + 1, the int32 maximum; top_p = 1.0) on
    rows spread over the whole vocabulary (Zipf exponent 0.1-0.4: the top token holds ~1e-4): the kept
    set is the vocabulary, its far tail included, and draws reach every id range."""
    probs = zipf_probs(batch, vocab, gen, (0.1, 0.4)).to(torch.float64)
    k = torch.tensor([(vocab, INT32_MAX, vocab + 1)[i % 3] for i in range(batch)], dtype=torch.int64)
    return probs, k, torch.ones(batch, dtype=torch.float64)


TINY = ((16, 1e-30), (256, 1e-40), (256, 2.0 ** -149))  # (tokens, probability): tiny normals, subnormals


def tiny_rows(batch: int, vocab: int, gen: Stream, has_k: bool, has_p: bool):
    """Four tokens hold the mass (0.4, 0.3, 0.2, 0.1); below them tiny and subnormal float32 probabilities,
    then exact zeros. top_k reaches into the subnormals or past every nonzero token (the k-th probability
    is then 0), top_p = 1.0 keeps the tiny tokens and 0.99999 drops them: a zero-probability token must never
    be drawn, a tiny one may be."""
    nonzero = 4 + sum(n for n, _ in TINY)

    def build(kind, _):
        ids = _ids(vocab, min(vocab, nonzero), gen)
        row = torch.zeros(vocab, dtype=torch.float64)
        row[ids[:4]] = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
        at = 4
        for n, value in TINY:
            row[ids[at:at + n]] = value
            at += n
        k, p = {"all": (vocab, 1.0), "subnormal": (4 + TINY[0][0] + 100, 0.99999),
                "past": (nonzero + 10, 1.0)}[kind]
        return row, min(k, vocab), p

    return _rows(batch, ["all", "subnormal", "past"], build)


# case -> (rows builder, default batch)
BOUNDARY = {
    "ties_at_cut": (tied_rows, EDGE_ROWS),
    "uniform": (uniform_rows, EDGE_ROWS),
    "top_p_exact": (exact_rows, len(EXACT_TOP_P)),
    "one_hot": (one_hot_rows, EDGE_ROWS),
    "last_token": (last_token_rows, EDGE_ROWS),
    "filters_off": (filters_off_rows, 3),
    "tiny_probs": (tiny_rows, 3),
}


def _put_per_row(b: Builder, name: str, values: torch.Tensor) -> None:
    """Per-row tensor [batch], or (a definition with one value for all rows) its first value."""
    if b.spec(name).shape:
        b.put(name, values.to(b.torch_dtype(name)))
    else:
        b.put_scalar(name, values[0].item())


# -- sampler calls: the inputs a sampler is drawn from, rows repeated ----------------------------
def distribution_input(definition: Definition) -> str:
    """The input a sampler draws from: `probs`, else `logits` (fi_trace's `sampling_from_logits`), else
    `target_probs` (chain speculative sampling: its batch axis is the first)."""
    for name in ("probs", "logits", "target_probs"):
        if name in definition.inputs:
            return name
    raise KeyError(f"{definition.name}: a sampler needs a probs or logits input, it has {', '.join(definition.inputs)}")


def repeat_rows(definition: Definition, inputs: Inputs, times: int, rows: slice | None = None) -> list:
    """The inputs with every row of the batch repeated `times` times (row-major)."""
    batch_axis = definition.inputs[distribution_input(definition)].shape[0]
    args = []
    for name, value in inputs.values.items():
        spec = definition.inputs[name]
        if isinstance(value, torch.Tensor) and spec.shape and spec.shape[0] == batch_axis:
            v = value[rows] if rows is not None else value
            args.append(v.repeat_interleave(times, dim=0))
        else:
            args.append(value)
    return args

"""Sampling inputs (op_type `sampling`): probabilities plus per-row top_k and/or top_p.

Probabilities are shaped like a language model's: each row is a Zipf law over a random
permutation of the vocabulary, p(rank r) ~ r^-s with s drawn per row in [0.8, 2.0], so rows
range from flat (top token ~2%) to peaked (top token ~60%). A uniform or randn-softmax row is
so flat that top-k/top-p filtering barely changes the distribution and bugs in it go unseen.
The softmax is taken in float64, so float32 rows sum to 1 within ~1e-7.

top_k is 1..min(vocab, 128) with about a quarter of rows at vocab (filtering off; at least one
such row when batch > 1); top_p is 0.5..0.95 with about a quarter of rows at 1.0.
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
PROBS, TOP_K, TOP_P_NAME = "probs", "top_k", "top_p"


def edge_cases(definition) -> list[str]:
    """top_k_1 (greedy) needs a top_k input, top_p_small a top_p input."""
    return [c for c, need in (("top_k_1", TOP_K), ("top_p_small", TOP_P_NAME)) if need in definition.inputs]


def zipf_probs(batch: int, vocab: int, gen: Stream) -> torch.Tensor:
    """[batch, vocab] float32, made on the CPU (log and softmax are not bit-identical across devices)."""
    s = uniform((batch, 1), gen).to(torch.float64) * (ZIPF_S[1] - ZIPF_S[0]) + ZIPF_S[0]
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
        raise b.error(f"the sampling generator makes probs, top_k and top_p ({missing})")
    batch_axis, vocab_axis = b.dim_axis(PROBS, 0), b.dim_axis(PROBS, 1)
    if batch_axis not in b.axes:
        b.set_axis(batch_axis, BATCH[b.size])
    if vocab_axis not in b.axes:
        b.set_axis(vocab_axis, VOCAB[b.size])
    batch, vocab = b.axis(batch_axis), b.axis(vocab_axis)
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


def _put_per_row(b: Builder, name: str, values: torch.Tensor) -> None:
    """Per-row tensor [batch], or (a definition with one value for all rows) its first value."""
    if b.spec(name).shape:
        b.put(name, values.to(b.torch_dtype(name)))
    else:
        b.put_scalar(name, values[0].item())


# -- sampler calls: the inputs a sampler is drawn from, rows repeated ----------------------------
def distribution_input(definition: Definition) -> str:
    """The input a sampler draws from: `probs`, else `logits` (fi_trace's `sampling_from_logits`)."""
    for name in ("probs", "logits"):
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

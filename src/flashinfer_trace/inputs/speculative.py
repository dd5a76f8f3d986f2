"""Inputs of chain speculative sampling (op_type `sampling`, FlashInfer's `chain_speculative_sampling`): a draft
model's probabilities `draft_probs` [batch, n, vocab] and the tokens it drew `draft_token_ids` [batch, n], and the
target model's probabilities `target_probs` [batch, n + 1, vocab] (one more row: the bonus token's).

The registry routes a `sampling` definition here when it draws token ids (`Definition.is_sampler`) and its inputs
are exactly INPUTS. Typical rows: each draft row a Zipf row (sampling.py's: a random permutation, exponent in
[0.8, 2.0]), each target row a mixture of its draft row and an independent Zipf row (weight of the draft in
MIX), so that acceptance rates are spread over (0, 1); the bonus row is a Zipf row of its own. The draft tokens
are drawn from the draft rows, as a draft model draws them (inverse CDF over the float64 row).

The edge cases (EDGE) sit at the boundaries of the contract (docs/boundary/speculative.md says why each exists):
the draft equal to the target (every draft token accepted, the bonus row always the one drawn from), draft and
target on disjoint ids (every draft rejected at position 0, the residual the whole target row), one-hot target
rows (FlashInfer's own test: the output is determined), draft tokens of probability 0 under the target (rejected
for sure) and under both models (rejected: the kernel's `u * p_draft < p_target` with 0 < 0), or under the draft
only (accepted for sure), and residuals with a single token of positive mass (the token at a rejection is
determined).
"""

from __future__ import annotations

import torch

from . import sampling as smp
from .common import Builder, Stream, permutation, randint, uniform

OP_TYPES = ("sampling",)  # shared with sampling.py, samplers.py and topk.py; `claims` decides (registry.py)
DRAFT, IDS, TARGET = "draft_probs", "draft_token_ids", "target_probs"
INPUTS = frozenset({DRAFT, IDS, TARGET})
BATCH = {"small": 2, "medium": 8, "large": 32}
VOCAB = {"small": 1000, "medium": 32000, "large": 128256}  # only when the definition leaves it var
MIX = (0.3, 0.9)  # the draft row's weight in a typical target row
BONUS_SUPPORT = 8  # the edge cases' bonus rows: Zipf over this many ids, none of them in the other rows' draws
EDGE = ("draft_equals_target", "disjoint", "one_hot_target", "zero_prob_draft", "single_residual")
EDGE_BATCH = 4


def is_chain(definition) -> bool:
    return frozenset(definition.inputs) == INPUTS


def claims(definition) -> bool:
    return definition.op_type in OP_TYPES and definition.is_sampler and is_chain(definition)


def edge_cases(definition) -> list[str]:
    return list(EDGE) if is_chain(definition) else []


# -- rows -------------------------------------------------------------------------------------------------------
def _zipf(rows: int, vocab: int, gen: Stream) -> torch.Tensor:
    return smp.zipf_probs(rows, vocab, gen).to(torch.float64)


def draw_ids(probs: torch.Tensor, gen: Stream) -> torch.Tensor:
    """[rows] int64: one token per row of probs [rows, vocab] (float64), by inverse CDF on the stream's uniforms."""
    cdf = probs.cumsum(dim=1)
    u = uniform((probs.shape[0], 1), gen).to(torch.float64) * cdf[:, -1:]
    ids = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=probs.shape[1] - 1)
    # a token of probability 0 is never the draft model's draw: step back to the last one of positive mass
    for r in (probs.gather(1, ids[:, None]).squeeze(1) == 0).nonzero().flatten().tolist():
        ids[r] = int(probs[r].nonzero().max())
    return ids


def _on(vocab: int, ids: torch.Tensor, gen: Stream) -> torch.Tensor:
    """A Zipf row over `ids` only (float64 [vocab])."""
    row = torch.zeros(vocab, dtype=torch.float64)
    row[ids] = _zipf(1, ids.numel(), gen)[0]
    return row


def _bonus_rows(batch: int, vocab: int, avoid: torch.Tensor, gen: Stream) -> torch.Tensor:
    """[batch, vocab]: Zipf rows over BONUS_SUPPORT ids outside `avoid` (bool [batch, vocab]): a bonus drawn from
    any other row shows as a token outside the allowed set."""
    out = torch.zeros(batch, vocab, dtype=torch.float64)
    for b in range(batch):
        free = (~avoid[b]).nonzero().flatten()
        if free.numel() < BONUS_SUPPORT:  # a small vocabulary: anywhere
            free = torch.arange(vocab)
        pick = free[permutation(free.numel(), gen)[:BONUS_SUPPORT]]
        out[b] = _on(vocab, pick, gen)
    return out


def typical(batch: int, n: int, vocab: int, gen: Stream):
    draft = _zipf(batch * n, vocab, gen).reshape(batch, n, vocab)
    other = _zipf(batch * n, vocab, gen).reshape(batch, n, vocab)
    w = (uniform((batch, n, 1), gen).to(torch.float64) * (MIX[1] - MIX[0]) + MIX[0])
    target = torch.cat([w * draft + (1 - w) * other, _zipf(batch, vocab, gen)[:, None]], dim=1)
    ids = draw_ids(draft.reshape(batch * n, vocab), gen).reshape(batch, n)
    return draft, ids, target


def draft_equals_target(batch: int, n: int, vocab: int, gen: Stream):
    """target[:, :n] is draft, value for value: every draft token is accepted (p_target / p_draft = 1), and the
    last token is the bonus, drawn from target[:, n] (a support of its own: from any other row it shows)."""
    draft = _zipf(batch * n, vocab, gen).reshape(batch, n, vocab)
    ids = draw_ids(draft.reshape(batch * n, vocab), gen).reshape(batch, n)
    avoid = torch.zeros(batch, vocab, dtype=torch.bool)
    avoid.scatter_(1, ids, True)
    avoid |= (draft > 1e-3).any(dim=1)  # the bonus apart from where the draft rows hold their mass
    return draft, ids, torch.cat([draft, _bonus_rows(batch, vocab, avoid, gen)[:, None]], dim=1)


def disjoint(batch: int, n: int, vocab: int, gen: Stream):
    """Per row and position, the draft on one half of the ids and the target on the other: every draft token has
    target probability 0, so the chain stops at position 0, and the residual max(0, target - draft) is the whole
    target row: the first token is drawn from target[:, 0], the rest is -1 and both counts are 0."""
    draft = torch.zeros(batch, n, vocab, dtype=torch.float64)
    target = torch.zeros(batch, n + 1, vocab, dtype=torch.float64)
    for b in range(batch):
        for i in range(n + 1):
            perm = permutation(vocab, gen)
            half = vocab // 2
            target[b, i] = _on(vocab, perm[half:], gen)
            if i < n:
                draft[b, i] = _on(vocab, perm[:half], gen)
    ids = draw_ids(draft.reshape(batch * n, vocab), gen).reshape(batch, n)
    return draft, ids, target


def one_hot_target(batch: int, n: int, vocab: int, gen: Stream):
    """One-hot target rows (FlashInfer's own test): even rows' draft tokens are the target's tokens (all accepted,
    the bonus the last row's token: the output is exactly the target's tokens); odd rows' agree up to position
    n // 2 and then differ (target probability 0: the chain stops there and the residual is the target's token).
    Either way the output is determined."""
    draft = _zipf(batch * n, vocab, gen).reshape(batch, n, vocab)
    tokens = randint(0, vocab, (batch, n + 1), gen).to(torch.int64)
    target = torch.zeros(batch, n + 1, vocab, dtype=torch.float64).scatter_(2, tokens[..., None], 1.0)
    ids = tokens[:, :n].clone()
    for b in range(1, batch, 2):
        stop = n // 2
        ids[b, stop] = (tokens[b, stop] + 1 + randint(0, vocab - 1, (1,), gen).to(torch.int64)[0]) % vocab
        draft[b, stop, tokens[b, stop]] = 0.0  # the residual at the stop: exactly the target's token
        draft[b, stop] /= draft[b, stop].sum()
    return draft, ids, target


def zero_prob_draft(batch: int, n: int, vocab: int, gen: Stream):
    """Typical rows, then per row one position p (cycling): rows 0 mod 3 put the draft token at target
    probability 0 (rejected for sure), rows 1 mod 3 at probability 0 under both models (the kernel's test
    u * 0 < 0 rejects it; a test with <= would accept it), rows 2 mod 3 at draft probability 0 with target
    probability positive (u * 0 < p_target accepts it for sure, where p_target / p_draft is a division by 0)."""
    draft, ids, target = typical(batch, n, vocab, gen)
    for b in range(batch):
        p = b % n
        d = int(ids[b, p])
        if b % 3 in (0, 1):
            target[b, p, d] = 0.0
            target[b, p] /= target[b, p].sum()
        if b % 3 in (1, 2):
            draft[b, p, d] = 0.0
            draft[b, p] /= draft[b, p].sum()
    return draft, ids, target


def single_residual(batch: int, n: int, vocab: int, gen: Stream):
    """target = draft / 2 + one-hot(r) / 2 per position (r not the draft token): max(0, target - draft) is
    positive at r alone, so a rejection (probability 1/2 at each position) emits r; all halves are exact in
    float32, so no rounding puts residual mass anywhere else."""
    draft = _zipf(batch * n, vocab, gen).reshape(batch, n, vocab)
    ids = draw_ids(draft.reshape(batch * n, vocab), gen).reshape(batch, n)
    r = (ids + 1 + randint(0, vocab - 1, (batch, n), gen).to(torch.int64)) % vocab
    draft32 = draft.to(torch.float32).to(torch.float64)  # the halves of the float32 values the kernel reads
    rows = draft32 / 2
    rows.scatter_add_(2, r[..., None], torch.full((batch, n, 1), 0.5, dtype=torch.float64))
    return draft32, ids, torch.cat([rows, _zipf(batch, vocab, gen)[:, None]], dim=1)


BUILDERS = {"draft_equals_target": draft_equals_target, "disjoint": disjoint, "one_hot_target": one_hot_target,
            "zero_prob_draft": zero_prob_draft, "single_residual": single_residual}


def generate(b: Builder) -> None:
    d = b.definition
    if not claims(d):
        raise b.mismatch(f"the speculative generator makes {', '.join(sorted(INPUTS))} for a sampler "
                         f"(inputs: {', '.join(d.inputs)})")
    batch_axis, n_axis, vocab_axis = b.dim_axis(DRAFT, 0), b.dim_axis(DRAFT, 1), b.dim_axis(DRAFT, 2)
    if batch_axis not in b.axes:
        b.set_axis(batch_axis, EDGE_BATCH if b.case in BUILDERS else BATCH[b.size])
    if vocab_axis not in b.axes:
        b.set_axis(vocab_axis, VOCAB[b.size])
    if n_axis not in b.axes:
        b.set_axis(n_axis, 4)
    target_rows = b.dim_axis(TARGET, 1)
    if target_rows not in b.axes:
        b.set_axis(target_rows, b.axis(n_axis) + 1)
    batch, n, vocab = b.axis(batch_axis), b.axis(n_axis), b.axis(vocab_axis)
    if b.axis(target_rows) != n + 1:
        raise b.error(f"target_probs needs {n + 1} rows per request (num draft tokens + 1), "
                      f"the definition says {b.axis(target_rows)}")
    build = BUILDERS.get(b.case, typical)
    draft, ids, target = build(batch, n, vocab, b.rng(b.case or "typical"))
    # every builder's rows sum to 1 already (renormalising here would move single_residual's exact halves)
    b.put(DRAFT, draft.to(b.torch_dtype(DRAFT)))
    b.put(IDS, ids.to(b.torch_dtype(IDS)))
    b.put(TARGET, target.to(b.torch_dtype(TARGET)))

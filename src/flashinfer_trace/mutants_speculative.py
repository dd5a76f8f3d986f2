"""Planted bugs of chain speculative sampling (chain_speculative_sampling_v32000 / _v128256:
docs/boundary/speculative.md), one or more per boundary class, each a text edit of a shipped definition's
reference. mutants.py appends them to its MUTANTS; tests/unit/test_speculative.py checks that each passes a typical
case and fails its boundary case (or, for plain wrong math, the typical one), all on the CPU against the float64
law of groundtruth/torch_speculative.py."""

from __future__ import annotations

from .mutants_model import Mutant, _m

CHAIN, CHAIN_128K = "chain_speculative_sampling_v32000", "chain_speculative_sampling_v128256"

_TEST = "passed = u * p_draft < p_target"
_RESIDUAL = "residual = (stop_target - stop_draft).clamp(min=0)"
_STOP_ROW = "stop_target = p[rows, emitted]"
_STOP = ("emitted = torch.where(failed.any(dim=1), failed.to(torch.int64).argmax(dim=1), "
         "torch.full_like(rows, n))")
_AFTER = "after = torch.arange(n, device=dev)[None, :] > emitted[:, None]"
_PAD = "out = torch.full((batch, n + 1), -1, dtype=torch.int64, device=dev)"

MUTANTS: tuple[Mutant, ...] = (
    # single_residual: the residual has one token; the target row has them all
    _m(CHAIN, "residual-is-target", "the token at a rejection drawn from the target row, not from the residual "
       "max(0, target - draft)", (_RESIDUAL, "residual = stop_target.clone()")),
    # disjoint: target probability 0 at every draft token; the inverted ratio accepts them all
    _m(CHAIN, "ratio-inverted", "a draft token accepted with probability min(1, p_draft / p_target), the ratio "
       "upside down", (_TEST, "passed = u * p_target < p_draft")),
    # draft_equals_target: every chain reaches the bonus, whose row has a support of its own
    _m(CHAIN_128K, "bonus-from-last-draft-row", "the bonus token drawn from the target row of the last draft "
       "position, not the extra row n", (_STOP_ROW, "stop_target = p[rows, emitted.clamp(max=n - 1)]"),
       cls="boundary-index"),
    # zero_prob_draft: a draft token of probability 0 under both models: 0 < 0 rejects it, 0 <= 0 accepts it
    _m(CHAIN, "zero-tie-accepted", "the test u * p_draft <= p_target: a draft token of probability 0 under both "
       "models accepted", (_TEST, "passed = u * p_draft <= p_target"), cls="boundary-ties"),
    # one_hot_target: the odd rows fail for sure at n // 2 and pass for sure after it
    _m(CHAIN, "no-stop", "the emitted count is every passed test, not the first failure: draft tokens after a "
       "rejection emitted", (_STOP, "emitted = passed.sum(dim=1)"), cls="boundary-structure"),
    # any row: a chain stopping early pads with 0
    _m(CHAIN_128K, "padding-zero", "the positions after the stop padded with 0, not -1",
       (_PAD, "out = torch.zeros((batch, n + 1), dtype=torch.int64, device=dev)")),
    # single_residual: every test passes with probability 1/2; re-testing the stop lets the count reach n
    _m(CHAIN, "accepted-retests-stop", "the accepted count re-tests the token the chain stopped at with a fresh "
       "uniform (the independent tests start at the stop, not after it: FlashInfer's kernel loop)",
       (_AFTER, "after = torch.arange(n, device=dev)[None, :] >= emitted[:, None]"), cls="boundary-index"),
)

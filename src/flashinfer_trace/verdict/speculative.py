"""Judging chain speculative sampling (groundtruth/torch_speculative.py): one call returns a random outcome per
request, the stop L, the token there and the accepted count, so each call is one draw of a categorical variable
whose exact law the float64 truth computes. The check draws each request many times (its row repeated), and holds
every side's draws to two targets with samples.py's tests (support, pooled cuts, per-row KS, bins), each at
alpha / 2:

* the outcome (L, token), code L * vocab + token over (n + 1) * vocab outcomes: its law is the theorem's
  (marginalised over draft tokens drawn from the draft rows, the emitted tokens follow the target);
* the accepted count given L, code L * (n + 1) + C, against the documented meaning of the count (every token's own
  test counted).

The deterministic parts (the shape, the draft tokens up to the stop, -1 after the token at the stop, the emitted
count equal to the stop, the accepted count in [L, n]) are checked exactly on every draw: a draw breaking one is
encoded -1, outside the allowed set, and one such draw is a `bug`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..groundtruth.torch_speculative import encode, laws, sizes, split
from ..inputs.rng import stream_seed
from ..inputs.sampling import repeat_rows
from ..inputs.speculative import IDS, is_chain
from ..reference import reference_function
from .samples import (
    CHUNK_ELEMENTS,
    OWN_CHECKS,
    SampleReport,
    SamplingSettings,
    SideReport,
    Target,
    judge_side,
    worst,
)

if TYPE_CHECKING:
    from ..definition import Definition
    from ..groundtruth import GroundTruth
    from ..inputs import Inputs
    from .drawstore import DrawStore

LAWS = 2  # the outcome's and the count's: alpha / 2 each


def targets(inputs: Inputs) -> tuple[Target, Target]:
    """(the outcome's target, the count's): core is every outcome of positive probability; every row 'filters'
    (it has outcomes outside its allowed set: a malformed draw is always one)."""
    x = inputs.to("cpu", copy=True).values
    q_out, allowed_out, q_count, allowed_count = laws(x)
    rows = q_out.shape[0]
    exact = torch.ones(rows, dtype=torch.bool)
    return (Target(q_out, allowed_out, q_out > 0, exact, exact.clone()),
            Target(q_count, allowed_count, q_count > 0, exact, exact.clone()))


def rows_per_call(inputs: Inputs) -> int:
    batch, n, vocab = sizes(inputs.values)
    device = inputs.values[IDS].device.type
    return max(1, CHUNK_ELEMENTS.get(device, CHUNK_ELEMENTS["cpu"]) // max((2 * n + 1) * vocab, 1))


def draw_reference(definition: Definition, inputs: Inputs, draws: int, seed: int) -> torch.Tensor:
    """[batch, draws] codes (torch_speculative.encode) of the reference's calls on each row repeated."""
    run = reference_function(definition)
    batch, n, vocab = sizes(inputs.values)
    chunk = rows_per_call(inputs)
    ids = inputs.values[IDS]
    out = torch.empty(batch, draws, dtype=torch.int64)
    for row in range(batch):
        done = 0
        while done < draws:
            k = min(draws - done, chunk)
            result = run.call(repeat_rows(definition, inputs, k, slice(row, row + 1)),
                              seed=stream_seed("reference-draws", seed, row, done))
            tokens, accepted, emitted = result if isinstance(result, (tuple, list)) else (result, None, None)
            if accepted is None:
                out[row, done:done + k] = -1
            else:
                out[row, done:done + k] = encode(tokens, accepted, emitted, ids[row:row + 1].expand(k, -1), vocab)
            done += k
    return out


def judge(side: str, codes: torch.Tensor, t_out: Target, t_count: Target, n: int, vocab: int,
          alpha: float) -> list[SideReport]:
    outcome, count = split(codes.cpu(), n, vocab)
    return [judge_side(side, outcome, t_out, alpha / LAWS),
            judge_side(f"{side} accepted count", count, t_count, alpha / LAWS)]


def check_chain(definition: Definition, inputs: Inputs, ground_truth: GroundTruth, settings: SamplingSettings,
                seed: int, cache: dict | None = None, store: DrawStore | None = None) -> SampleReport:
    from ..groundtruth.base import SamplerCallBroken

    batch, n, vocab = sizes(inputs.values)
    t_out, t_count = targets(inputs)
    plan = settings.plan(batch, (n + 1) * vocab, batch)
    key = ("reference-draws", plan.row_draws, seed)
    made = None
    if cache is not None and key in cache:
        reference, made = cache[key]
    else:
        reference = stored = None
        if store is not None:
            stored = store.key(definition, inputs, seed, plan.row_draws, rows_per_call(inputs),
                               inputs.values[IDS].device)
            reference = store.get(stored, (batch, plan.row_draws))
            made = "reused" if reference is not None else "made"
        if reference is None:
            reference = draw_reference(definition, inputs, plan.row_draws, seed)
            if stored is not None:
                store.put(stored, reference)
        if cache is not None:
            cache[key] = (reference, made)
    report = SampleReport(plan.as_dict())
    stop = t_out.q.reshape(batch, n + 1, vocab).sum(dim=2)
    report.rows = [{"row": r, "stop_law": [round(float(v), 6) for v in stop[r]],
                    "allowed": int(t_out.allowed[r].sum())} for r in range(batch)]
    report.sides += judge("reference", reference, t_out, t_count, n, vocab, plan.alpha)
    try:
        expected = ground_truth(inputs, draws=plan.row_draws)[0]
        report.sides += judge("ground truth", expected, t_out, t_count, n, vocab, plan.alpha)
    except SamplerCallBroken as e:  # a property of the kernel's call no distribution shows: a bug
        report.sides.append(SideReport("ground truth", 0, 0, [], 1.0, f"call contract: {e}", 0.0, "bug"))
    report.verdict = worst(s.verdict for s in report.sides)
    if made is not None:
        report.settings["reference_draws"] = made
    return report


OWN_CHECKS.append((lambda d: is_chain(d), check_chain))

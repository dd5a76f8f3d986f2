"""Comparing top-k selections: an index output is a set per row, judged by the scores that chose it.

A top-k selector (the DeepSeek-V3.2 indexer, `dsa_paged` with `topk_indices`) returns, per request,
the ids of its `min(topk, seq_len)` best-scoring tokens and -1 in the remaining entries. Comparing
those element-wise would fail on any reordering of the row, and comparing them as exact sets would
fail wherever two implementations round a near-tie at the boundary differently. So a row passes when
it is *a* valid top-k under the independent float64 scores (`groundtruth.torch_dsa.indexer_scores`):

* it holds exactly min(topk, seq_len) ids, no id twice, every id one of the request's own tokens
  (page from the block table, offset below seq_len), and -1 everywhere else (in any position);
* with `kth` the k-th largest float64 score of the request, every selected token scores at least
  `kth - band` and every unselected one at most `kth + band`, where
  `band = TIE_RTOL * magnitude` and magnitude is the sum of the absolute terms of that token's
  score (sum_h |w_h| * sum_d |q_hd k_d| * |scale|): the bound on how far a float32 evaluation of the
  same sum, in any order, can be from the exact one is about (head_dim + heads) * 2**-24 ~ 1.1e-5 of
  it, and TIE_RTOL = 2e-5 covers that, and nothing more.

A token exchanged across the boundary because of rounding or an exact tie passes (counted in
`widened`: selected by the actual output, not by the ground truth's); a wrong token, a dropped scale or
weight, a read past seq_len or a page-local id does not: its score is off by its own size. Every
failure is a **bug** (an index is right or wrong; `matched_ratio` does not apply).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .compare import DiffReport

if TYPE_CHECKING:
    from ..definition import Definition
    from ..inputs import Inputs
    from .compare import Tolerance

TIE_RTOL = 2e-5
TIE_ATOL = 0.0
MODEL = f"index set, ties within {TIE_RTOL:g} x sum|terms| of the score"


def applies(definition: Definition) -> bool:
    """Whether this definition's outputs are top-k index sets (judged here, not element-wise)."""
    from ..groundtruth.torch_dsa import indexer_applies

    return definition.op_type == "dsa_paged" and "topk_indices" in definition.outputs and \
        indexer_applies(definition) is None


def compare(definition: Definition, inputs: Inputs, actual, expected, tolerance: Tolerance) -> list[DiffReport]:
    actual = actual if isinstance(actual, (tuple, list)) else (actual,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    names = list(definition.outputs)
    tol = {**tolerance.as_dict(), "tie_rtol": TIE_RTOL, "tie_atol": TIE_ATOL}
    if len(actual) != len(names) or len(expected) != len(names):
        return [DiffReport("outputs", [], problem=f"{len(actual)} output(s) vs {len(names)} declared",
                           verdict="bug", tolerance=tol)]
    from ..groundtruth.torch_dsa import indexer_scores

    values = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in inputs.values.items()}
    requests = indexer_scores(values, int(definition.const_axes["page_size"]))
    return [judge_rows(name, a, e, requests, int(definition.const_axes["topk"]), tol)
            for name, a, e in zip(names, actual, expected, strict=True)]


def judge_rows(name: str, actual, expected, requests, topk: int, tolerance: dict) -> DiffReport:
    """One index output [rows, topk] against the scores of each row's request."""
    a = torch.as_tensor(actual).detach().cpu()
    e = torch.as_tensor(expected).detach().cpu()
    report = DiffReport(name, list(a.shape), tolerance=tolerance, error_model=MODEL)
    want = (len(requests), topk)
    if tuple(a.shape) != want or tuple(e.shape) != want:
        report.problem = f"shape {tuple(a.shape)} (ground truth {tuple(e.shape)}), expected {want}"
        report.verdict = "bug"
        return report
    if a.is_floating_point():
        report.problem = f"dtype {a.dtype}: token ids are integers"
        report.verdict = "bug"
        return report
    report.total = a.numel()
    problems: list[str] = []
    for row, req in enumerate(requests):
        bad, widened, why = _judge_row(a[row].to(torch.int64), e[row].to(torch.int64), req, topk)
        report.mismatched += bad
        report.widened += widened
        if bad and why:
            problems.append(f"row {row}: {why}")
            if report.worst_index is None:
                report.worst_index = [row, 0]
    if report.mismatched:
        report.verdict = "bug"
        more = f" (+{len(problems) - 2} more row(s))" if len(problems) > 2 else ""
        report.problem = (f"{report.mismatched} of {report.total} entries wrong: " + "; ".join(problems[:2]) + more)
    return report


def _judge_row(row: torch.Tensor, expected: torch.Tensor, req, topk: int) -> tuple[int, int, str]:
    """(wrong entries, entries passing only as boundary ties, why the first wrong one is wrong)."""
    n = req.slots.numel()
    k = min(topk, n)
    chosen = row[row != -1]
    if bool((chosen < 0).any()):
        stray = chosen[chosen < 0][:3].tolist()
        return int((chosen < 0).sum()), 0, f"negative id(s) other than the -1 padding: {stray}"
    if chosen.numel() != k:
        return abs(chosen.numel() - k), 0, f"{chosen.numel()} ids, expected min(topk, seq_len) = {k}"
    if k == 0:
        return 0, 0, ""
    unique = chosen.unique()
    if unique.numel() != chosen.numel():
        return chosen.numel() - unique.numel(), 0, f"{chosen.numel() - unique.numel()} id(s) selected twice"
    order = torch.argsort(req.slots)
    sorted_slots = req.slots[order]
    pos = torch.searchsorted(sorted_slots, chosen).clamp(max=n - 1)
    own = sorted_slots[pos] == chosen
    if not bool(own.all()):
        stray = chosen[~own][:3].tolist()
        return int((~own).sum()), 0, f"id(s) {stray} are not tokens of this request (its pages, below seq_len)"
    member = order[pos]  # each chosen id's position in the request
    selected = torch.zeros(n, dtype=torch.bool)
    selected[member] = True
    kth = torch.topk(req.scores, k).values[-1]
    band = TIE_ATOL + TIE_RTOL * req.magnitude
    low = selected & (req.scores < kth - band)  # chosen, but clearly below the k-th score
    high = ~selected & (req.scores > kth + band)  # left out, but clearly above it
    wrong = int(low.sum())
    if wrong or bool(high.any()):
        i = int(low.nonzero()[0]) if wrong else int(high.nonzero()[0])
        what = "selected" if wrong else "left out"
        return max(wrong, int(high.sum())), 0, (f"token {int(req.slots[i])} {what} with score "
                                                f"{float(req.scores[i]):.6g}, the k-th score is {float(kth):.6g} "
                                                f"(band {float(band[i]):.3g})")
    reference = set(expected[expected != -1].tolist())
    widened = sum(1 for t in chosen.tolist() if t not in reference)
    return 0, widened, ""

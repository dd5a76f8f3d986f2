"""Comparing `topk` outputs (flashinfer.top_k, top_k_varlen): index outputs are sets, judged by value.

The API promises neither an order within the row (sorted=False) nor a tie-break (tie_break=0), so two right
kernels may return different ids wherever entries equal to the k-th value straddle the cut. Index outputs are
judged by verdict/topk.py's row judge (the DSA indexer's): each row is one request whose token ids are its
columns (the varlen form: the first min(seq_len, width)) and whose scores are the input in float64, exactly;
the tie band is 0 (the selected values are the inputs themselves, no rounding enters), so only an exact tie
may be exchanged. A value output (the dense form's `values`) passes when every entry is the input at its
row's returned index, bit for bit, and the row's values, sorted, equal the ground truth's sorted: the same
multiset whatever the tie-break. Index dtypes are the API's (int64 dense, int32 varlen). Every failure is a
**bug**.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch

from . import topk as rows_judge
from .compare import DiffReport

if TYPE_CHECKING:
    from ..definition import Definition
    from ..inputs import Inputs
    from .compare import Tolerance

MODEL = "index set by value (exact ties only); values as a multiset, each the input at its index"


def applies(definition: Definition) -> bool:
    from ..inputs.topk_select import form

    return definition.op_type == "topk" and form(definition) is not None and "top_k" in definition.const_axes


def requests(definition: Definition, inputs: Inputs) -> list:
    """Per row: slots (its column ids), scores (float64), magnitude (0: the band is exact)."""
    from ..inputs.topk_select import form, windows

    x = inputs.values
    scores = (x["input"] if form(definition) == "dense" else x["logits"]).detach().cpu().to(torch.float64)
    rows, width = scores.shape
    lens = windows(x.get("seq_lens"), width, rows)
    return [SimpleNamespace(slots=torch.arange(n), scores=scores[r, :n], magnitude=torch.zeros(n, dtype=torch.float64))
            for r, n in enumerate(lens)]


def compare(definition: Definition, inputs: Inputs, actual, expected, tolerance: Tolerance) -> list[DiffReport]:
    actual = actual if isinstance(actual, (tuple, list)) else (actual,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    names = list(definition.outputs)
    tol = {**tolerance.as_dict(), "tie_rtol": 0.0, "tie_atol": 0.0}
    if len(actual) != len(names) or len(expected) != len(names):
        return [DiffReport("outputs", [], problem=f"{len(actual)} output(s) vs {len(names)} declared",
                           verdict="bug", tolerance=tol)]
    reqs = requests(definition, inputs)
    k = int(definition.const_axes["top_k"])
    got = dict(zip(names, actual, strict=True))
    reports = []
    for name, a, e in zip(names, actual, expected, strict=True):
        if name == "values":
            reports.append(judge_values(definition, inputs, a, e, got.get("indices"), tol))
            continue
        report = rows_judge.judge_rows(name, a, e, reqs, k, tol)
        report.error_model = MODEL
        want = definition.outputs[name].dtype.value
        have = str(torch.as_tensor(a).dtype).removeprefix("torch.")
        if report.passed and have != want:
            report.problem, report.verdict = f"dtype {have}, the API returns {want}", "bug"
        reports.append(report)
    return reports


def judge_values(definition: Definition, inputs: Inputs, actual, expected, indices, tolerance: dict) -> DiffReport:
    a = torch.as_tensor(actual).detach().cpu()
    e = torch.as_tensor(expected).detach().cpu()
    report = DiffReport("values", list(a.shape), tolerance=tolerance, error_model=MODEL)
    report.total = a.numel()
    src = inputs.values["input"].detach().cpu()
    if tuple(a.shape) != tuple(e.shape) or a.dtype != src.dtype:
        report.problem = f"shape {tuple(a.shape)} {a.dtype}, expected {tuple(e.shape)} {src.dtype}"
        report.verdict = "bug"
        return report
    bad = ~(a.to(torch.float64).sort(dim=-1).values == e.to(torch.float64).sort(dim=-1).values)
    why = "not the k largest values of the row"
    if indices is not None:
        idx = torch.as_tensor(indices).detach().cpu().to(torch.int64)
        if tuple(idx.shape) == tuple(a.shape) and bool(((idx >= 0) & (idx < src.shape[1])).all()):
            mismatch = ~(src.gather(1, idx).to(torch.float64) == a.to(torch.float64))
            if bool(mismatch.any()):
                bad, why = bad | mismatch, "values are not the input at the returned indices"
    report.mismatched = int(bad.sum())
    if report.mismatched:
        first = bad.nonzero()[0].tolist()
        report.worst_index = first
        report.verdict = "bug"
        report.problem = f"{report.mismatched} of {report.total} values wrong ({why}; first at {first})"
    return report

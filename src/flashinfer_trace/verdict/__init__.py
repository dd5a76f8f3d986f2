"""Is it right: one entry point, `judge`, over the comparisons of this package.

    compare.py     tolerances, the element-wise diff report, assert_close
    errormodel.py  per-element error scales of sums of products (gemm, attention, mamba, GDN, bf16 MoE)
    samples.py     samplers, statistically (support, and frequencies against the float64 distribution)
    speculative.py chain speculative sampling: each call's (stop, token, count) against its exact law
    topk.py        index sets judged by the scores they select
    contract.py    what kernel APIs do not promise (contract.toml): a failure there, explained by it, is info
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .compare import DiffReport, Mismatch, Tolerance
from .errormodel import compare_with_model
from .samples import SampleReport, SamplingSettings, check_sampler
from .speculative import check_chain  # noqa: F401 - registers its check with samples.check_sampler

if TYPE_CHECKING:
    from ..definition import Definition
    from ..inputs import Inputs

__all__ = ["Judgement", "assert_matches", "judge", "judge_sampler"]


@dataclass
class Judgement:
    """A comparison's outcome: passed, the verdict of a failure, how close each output came."""

    passed: bool
    verdict: str | None = None
    summary: str | None = None
    compared: list[dict[str, Any]] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)


def margins(reports: list[DiffReport]) -> list[dict[str, Any]]:
    """Per output: how much of its tolerance it used and how close it came."""
    return [{"output": r.name, "tolerance_used": r.tolerance_used, "max_abs": round(r.max_abs, 6),
             "max_rel": round(r.max_rel, 6), "cosine": round(r.cosine, 8), "mismatched": r.mismatched,
             "total": r.total} for r in reports]


def judge(definition: Definition, inputs: Inputs, actual, expected, tolerance: Tolerance, *,
          scales: Callable[[], list] | None = None) -> Judgement:
    """A reference's outputs against a ground truth's, with the op family's error model."""
    reports = compare_with_model(definition, inputs, actual, expected, tolerance, scales=scales)
    passed = all(r.passed for r in reports)
    return Judgement(passed, None if passed else Mismatch(reports).verdict,
                     None if passed else "; ".join(r.summary() for r in reports if not r.passed),
                     margins(reports), [r.as_dict() for r in reports])


def judge_sampler(definition: Definition, inputs: Inputs, ground_truth, settings: SamplingSettings,
                  seed: int, cache: dict | None = None, store=None) -> Judgement:
    report: SampleReport = check_sampler(definition, inputs, ground_truth, settings, seed, cache, store)
    return Judgement(report.passed, report.verdict, None if report.passed else report.summary(),
                     [], [report.as_dict()])


def assert_matches(definition: Definition, inputs: Inputs, actual, expected, tolerance: Tolerance) -> list[DiffReport]:
    """assert_close of a reference's outputs against a ground truth's on these inputs, with the op
    family's error model: sums of products are judged against their operands' scale."""
    reports = compare_with_model(definition, inputs, actual, expected, tolerance)
    if not all(r.passed for r in reports):
        raise Mismatch(reports)
    return reports

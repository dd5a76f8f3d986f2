"""Comparing samplers: a sampling reference's draws are random, so it is checked statistically.

Two checks per row of the batch:
* support: every draw, the reference's and the ground truth's, must be a token the definition's
  filters can keep. The allowed set comes from the independent torch computation of the filtered
  distribution, with the top-p cut widened by a little mass (`top_p_slack`) so that a token on the
  float32 boundary is not called a bug. One draw outside is a bug.
* distribution: a two-sample chi-square test of homogeneity between the reference's draws and the
  ground truth's (tokens with fewer than 10 pooled draws share one bin), Bonferroni-corrected over
  the rows. With a fixed seed the draws, and so the verdict, replay exactly.

Draws come from repeating each row `draws` times in one batch (rows are independent), in chunks
that bound memory.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import torch

from ..inputs.rng import stream_seed
from ..inputs.sampling import distribution_input, repeat_rows
from ..reference import reference_function

if TYPE_CHECKING:
    from ..definition import Definition
    from ..groundtruth import GroundTruth
    from ..inputs import Inputs

MIN_BIN = 10
CHUNK_ELEMENTS = 1 << 25  # rows x vocab per reference call: ~128 MB of float32 probabilities


@dataclass(frozen=True)
class SamplingSettings:
    draws: int = 100
    alpha: float = 1e-6
    top_p_slack: float = 1e-4

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RowReport:
    row: int
    bins: int
    chi2: float
    df: int
    p_value: float
    tvd: float
    outside_reference: int
    outside_ground_truth: int


@dataclass
class SampleReport:
    settings: dict[str, Any]
    rows: list[RowReport] = field(default_factory=list)
    verdict: str = "pass"

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        if not self.rows:
            return "no rows"
        worst = min(self.rows, key=lambda r: r.p_value)
        outside = sum(r.outside_reference for r in self.rows), sum(r.outside_ground_truth for r in self.rows)
        return (f"{len(self.rows)} row(s) x {self.settings['draws']} draws: min p-value {worst.p_value:.3g} "
                f"(row {worst.row}, chi2 {worst.chi2:.1f} on {worst.df} df, tvd {worst.tvd:.3f}), draws outside "
                f"the allowed set: reference {outside[0]}, ground truth {outside[1]} [{self.verdict}]")


class SamplingMismatch(AssertionError):
    def __init__(self, report: SampleReport, context: str = ""):
        super().__init__(f"{context}sampler draws differ: {report.summary()}")
        self.report = report


def chi2_sf(x: float, df: int) -> float:
    """Upper tail of the chi-square distribution (Wilson-Hilferty; plenty for a 1e-6 threshold)."""
    if df <= 0:
        return 1.0
    if x <= 0:
        return 1.0
    z = ((x / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 1.0 - NormalDist().cdf(z)


def two_sample_chi2(a: torch.Tensor, b: torch.Tensor, vocab: int) -> tuple[float, int, float, int]:
    """(chi2, df, p_value, bins) for the hypothesis that draws a and b share one distribution."""
    ca = torch.bincount(a.to(torch.int64).cpu(), minlength=vocab).to(torch.float64)
    cb = torch.bincount(b.to(torch.int64).cpu(), minlength=vocab).to(torch.float64)
    pooled = ca + cb
    big = pooled >= MIN_BIN
    cols_a, cols_b = [ca[big]], [cb[big]]
    rest_a, rest_b = ca[~big].sum(), cb[~big].sum()
    if rest_a + rest_b > 0:
        cols_a.append(rest_a[None])
        cols_b.append(rest_b[None])
    oa, ob = torch.cat(cols_a), torch.cat(cols_b)
    na, nb = float(oa.sum()), float(ob.sum())
    total = oa + ob
    keep = total > 0
    oa, ob, total = oa[keep], ob[keep], total[keep]
    bins = int(total.numel())
    if bins < 2:
        return 0.0, 0, 1.0, bins
    ea, eb = total * na / (na + nb), total * nb / (na + nb)
    chi2 = float(((oa - ea) ** 2 / ea).sum() + ((ob - eb) ** 2 / eb).sum())
    df = bins - 1
    return chi2, df, chi2_sf(chi2, df), bins


def draw_reference(definition: Definition, inputs: Inputs, draws: int, seed: int) -> torch.Tensor:
    """[batch, draws] samples from the reference, seeded, a bounded number of rows per call."""
    run = reference_function(definition)
    batch, vocab = inputs.values[distribution_input(definition)].shape
    rows_per_call = max(1, CHUNK_ELEMENTS // max(vocab, 1))
    out = torch.empty(batch, draws, dtype=torch.int64)
    for row in range(batch):
        done = 0
        while done < draws:
            n = min(draws - done, rows_per_call)
            # Every call starts the worker's RNG from the seed it is given: each chunk gets its own, or
            # the chunks of a row would repeat one another's draws (seen on the H100 at 2000 draws).
            samples = run.call(repeat_rows(definition, inputs, n, slice(row, row + 1)),
                               seed=stream_seed("reference-draws", seed, row, done))
            out[row, done:done + n] = samples.reshape(-1).to(torch.int64).cpu()
            done += n
    return out


def compare_samples(reference: torch.Tensor, ground_truth: torch.Tensor, vocab: int,
                    allowed: torch.Tensor | None, settings: SamplingSettings) -> SampleReport:
    report = SampleReport(settings.as_dict())
    batch = reference.shape[0]
    threshold = settings.alpha / max(batch, 1)
    verdict = "pass"
    for row in range(batch):
        a, b = reference[row].cpu(), ground_truth[row].cpu()
        chi2, df, p, bins = two_sample_chi2(a, b, vocab)
        fa = torch.bincount(a, minlength=vocab).double() / a.numel()
        fb = torch.bincount(b, minlength=vocab).double() / b.numel()
        tvd = float((fa - fb).abs().sum() / 2)
        out_a = out_b = 0
        if allowed is not None:
            ok = allowed[row].cpu()
            out_a, out_b = int((~ok[a]).sum()), int((~ok[b]).sum())
        report.rows.append(RowReport(row, bins, chi2, df, p, tvd, out_a, out_b))
        if out_a or out_b:
            verdict = "bug"
        elif p < threshold and verdict == "pass":
            verdict = "distribution"
    report.verdict = verdict
    return report


def allowed_tokens(definition: Definition, inputs: Inputs, slack: float) -> torch.Tensor | None:
    """[batch, vocab] bool: what the filters may keep, from the independent torch computation; None for a
    sampler of logits (the torch filters read probabilities): then only the distributions are compared."""
    from ..groundtruth.base import Call
    from ..groundtruth.torch_ref import filtered_distribution

    if distribution_input(definition) != "probs":
        return None
    return filtered_distribution(Call(definition, inputs, None, None), top_p_slack=slack) > 0


def check_sampler(definition: Definition, inputs: Inputs, ground_truth: GroundTruth,
                  settings: SamplingSettings, seed: int) -> SampleReport:
    reference = draw_reference(definition, inputs, settings.draws, seed)
    expected = ground_truth(inputs, draws=settings.draws)[0]
    vocab = inputs.values[distribution_input(definition)].shape[1]
    return compare_samples(reference, expected, vocab, allowed_tokens(definition, inputs, settings.top_p_slack),
                           settings)


def assert_samples_match(definition: Definition, inputs: Inputs, ground_truth: GroundTruth, *,
                         settings: SamplingSettings | None = None, seed: int = 0) -> SampleReport:
    """Assert that the reference samples like the ground truth; raise SamplingMismatch otherwise."""
    report = check_sampler(definition, inputs, ground_truth, settings or SamplingSettings(), seed)
    if not report.passed:
        raise SamplingMismatch(report)
    return report

"""Comparing samplers: a sampler's draws are random, so it is judged statistically, against the distribution it
must draw from: `groundtruth.torch_ref.filtered_distribution`, the filters computed independently in float64.
The reference's draws and the ground truth's (a kernel's, on a GPU) are each held to it; docs/ground-truth.md
("Sampling") derives every number below.

* support: every draw must be a token the filters can keep (`allowed`: the top-p cut widened by `top_p_slack`
  of mass, for float32 rounding at the boundary; no slack where every sum is exact). One draw outside is a
  **bug**: the set is exact, so no correct sampler ever fails it.
* frequencies, on the draws that land in the `core` (the cut narrowed by the slack: kept by every correct
  float32 implementation, so the tested distribution is known exactly), three tests at `alpha / 3` each:
  - the pooled cut test: at each cut "the top 1, 2, 4, ... tokens of a row" the draws falling above it,
    summed over the rows, against their expectation (Bernstein's inequality): a distortion shared by every
    row, such as mass moved across the top-1 cut, adds up over the whole check;
  - per row, Kolmogorov-Smirnov in descending-probability order and in id order (the DKW-Massart
    inequality): any transfer of mass between two tokens shows as that much deviation of the cumulative
    frequency in probability order, and between two id ranges (index arithmetic) in id order;
  - per row, every token with at least MIN_EXPECTED expected draws, and the others grouped in runs of
    consecutive ids, against its expected count (Bernstein): a rare token drawn several times too often,
    or a range of ids never drawn.
  All three bounds are inequalities, valid for every number of draws: the false-alarm rate is at most
  `alpha` per check. A rejection is a **distribution** failure.

The number of draws follows from the settings (`SamplingSettings.plan`): enough for the pooled test to see
`tv` of mass moved across a cut in every row, and for the support to see draws outside the set at a rate of
`out_of_set`, each with probability `power`. Draws come from repeating each row in one batch, in chunks that
bound memory; with fixed seeds they replay exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import torch

from ..inputs.rng import stream_seed
from ..inputs.sampling import distribution_input, repeat_rows
from ..reference import reference_function
from .drawstore import DrawStore

if TYPE_CHECKING:
    from ..definition import Definition
    from ..groundtruth import GroundTruth
    from ..inputs import Inputs

MIN_EXPECTED = 10  # draws a token needs, in expectation, to be a bin of its own in the per-row bin test
MIN_BIN = 10  # the two-sample fallback's pooled minimum
CHUNK_ELEMENTS = {"cpu": 1 << 25, "cuda": 1 << 28}  # rows x vocab per reference call: 128 MB / 1 GB of float32
TESTS = 3  # frequency tests, alpha / 3 each (the two KS orders share theirs)


# -- how many draws, and what they can see -----------------------------------------------------------------
def _z(power: float) -> float:
    return NormalDist().inv_cdf(power)


def cuts(vocab: int) -> int:
    """The pooled test's cuts: the top 1, 2, 4, ... tokens, below the vocabulary size."""
    return max(1, math.ceil(math.log2(max(vocab, 2))))


def pooled_detectable(draws: int, vocab: int, alpha: float, power: float) -> float:
    """The mass moved across one cut, the same in every row, that the pooled test sees with probability
    `power`: Bernstein's threshold x for the worst variance draws/4, plus z(power) standard deviations."""
    if draws <= 0:
        return math.inf
    log_term = math.log(2 * cuts(vocab) * TESTS / alpha)
    threshold = log_term / 3 + math.sqrt(log_term ** 2 / 9 + draws * log_term / 2)
    return min(1.0, (threshold + _z(power) * math.sqrt(draws) / 2) / draws)


def row_detectable(draws: int, rows: int, alpha: float, power: float) -> float:
    """The mass moved between two tokens of one row that its KS test sees with probability `power`:
    the DKW-Massart threshold sqrt(ln(2 * 2R * TESTS / alpha) / 2n) (two orders, R rows), plus
    z(power) / (2 sqrt(n))."""
    if draws <= 0:
        return math.inf
    log_term = math.log(2 * 2 * rows * TESTS / alpha)
    return min(1.0, (math.sqrt(log_term / 2) + _z(power) / 2) / math.sqrt(draws))


def out_of_set_detectable(draws: int, power: float) -> float:
    """The rate of draws outside the allowed set that `draws` draws show at least once with probability
    `power` (none is tolerated): 1 - (1 - rate)^draws = power."""
    if draws <= 0:
        return 1.0
    return -math.expm1(math.log1p(-power) / draws)


def draws_for_tv(tv: float, vocab: int, alpha: float, power: float) -> int:
    """The fewest draws per check for which pooled_detectable <= tv."""
    lo, hi = 1, 2
    while pooled_detectable(hi, vocab, alpha, power) > tv:
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        if pooled_detectable(mid, vocab, alpha, power) <= tv:
            hi = mid
        else:
            lo = mid + 1
    return lo


def draws_for_out_of_set(rate: float, power: float) -> int:
    return math.ceil(math.log1p(-power) / math.log1p(-rate))


@dataclass(frozen=True)
class Plan:
    """One check's draws and what they can see, at `power`, with at most `alpha` false alarms."""
    rows: int
    filtering_rows: int  # rows whose filters remove a token of positive probability
    row_draws: int
    alpha: float
    power: float
    tv_detectable: float  # mass moved across one cut (top 1, 2, 4, ...) in every row: the pooled test
    tv_detectable_row: float  # mass moved between any two tokens of one row: its KS test
    out_of_set_detectable: float | None  # rate of draws outside the allowed set in every filtering row (None: none)
    out_of_set_detectable_row: float  # the same rate in one row

    @property
    def draws(self) -> int:
        return self.rows * self.row_draws

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "draws": self.draws}


@dataclass(frozen=True)
class SamplingSettings:
    """What a sampler check must see, and how surely; the draws follow (`plan`). The defaults are the CPU's
    (cheap enough for CI); `gpu()` meets 0.5 % of mass moved and 1e-4 out of the set. A boundary case is
    planned for what it is built to expose (`edge=True`): draws outside the set, or a convention that moves
    0.74 of the mass or more (inputs/sampling.py), so it needs fewer draws."""
    tv: float = 0.45  # mass moved across a cut in every row, seen with probability `power`
    out_of_set: float = 0.05  # rate of draws outside the allowed set, seen with probability `power`
    alpha: float = 1e-6  # false alarms per check: 1000 checks in a run, 1e-3 for the run
    power: float = 0.99
    top_p_slack: float = 1e-4
    row_draws: int | None = None  # fixed draws per row (--draws) instead of the calculation
    min_row_draws: int = 8

    @classmethod
    def cpu(cls, row_draws: int | None = None, *, edge: bool = False) -> SamplingSettings:
        if edge:
            return cls(tv=0.6, out_of_set=0.1, row_draws=row_draws)
        return cls(row_draws=row_draws)

    @classmethod
    def gpu(cls, row_draws: int | None = None, *, edge: bool = False) -> SamplingSettings:
        if edge:
            return cls(tv=0.02, out_of_set=4e-4, row_draws=row_draws)
        return cls(tv=0.005, out_of_set=1e-4, row_draws=row_draws)

    def plan(self, rows: int, vocab: int, filtering_rows: int | None = None) -> Plan:
        rows = max(rows, 1)
        filtering = rows if filtering_rows is None else filtering_rows
        n = self.row_draws
        if n is None:
            n = max(self.min_row_draws, math.ceil(draws_for_tv(self.tv, vocab, self.alpha, self.power) / rows))
            if filtering:
                n = max(n, math.ceil(draws_for_out_of_set(self.out_of_set, self.power) / filtering))
        return Plan(rows, filtering, n, self.alpha, self.power,
                    pooled_detectable(n * rows, vocab, self.alpha, self.power),
                    row_detectable(n, rows, self.alpha, self.power),
                    out_of_set_detectable(n * filtering, self.power) if filtering else None,
                    out_of_set_detectable(n, self.power))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- what a correct sampler draws from ---------------------------------------------------------------------
@dataclass
class Target:
    """Per row, float64 / bool [rows, vocab]: the distribution, the allowed set (the top-p cut widened by the
    slack), the core (narrowed by it) and whether the row's sums are exact (then the slack is 0)."""
    q: torch.Tensor
    allowed: torch.Tensor
    core: torch.Tensor
    exact: torch.Tensor
    filtering: torch.Tensor  # [rows] bool: the filters remove a token of positive probability
    qc: torch.Tensor = field(init=False)  # q on the core, renormalised: what the tested draws follow
    order: torch.Tensor = field(init=False)  # per row: descending probability, ascending id among equals
    cdf: torch.Tensor = field(init=False)  # qc's cumulative sum in that order
    cdf_id: torch.Tensor = field(init=False)  # qc's cumulative sum in id order

    def __post_init__(self) -> None:
        qc = torch.where(self.core, self.q, 0.0)
        self.qc = qc / qc.sum(dim=1, keepdim=True).clamp(min=1e-300)
        self.order = torch.sort(-self.qc, dim=1, stable=True).indices
        self.cdf = self.qc.gather(1, self.order).cumsum(dim=1)
        self.cdf_id = self.qc.cumsum(dim=1)

    @property
    def vocab(self) -> int:
        return self.q.shape[1]


def exact_rows(inputs: Inputs) -> torch.Tensor:
    """[rows] bool: every probability a multiple of 2**-24 and the row summing to exactly 1 (so every partial
    sum, in any order, is exact in float32), and where top-k precedes top-p, its kept mass a power of two (so
    renormalising is exact too): then a correct float32 sampler places the top-p cut exactly."""
    x = inputs.values
    p = x["probs"].to(torch.float64).cpu()
    scaled = p * 2.0 ** 24
    exact = (scaled == scaled.round()).all(dim=1) & (p.sum(dim=1) == 1.0)
    if "top_k" in x and "top_p" in x:
        batch, vocab = p.shape
        k = _per_row(x["top_k"], batch)
        k = torch.where((k <= 0) | (k >= vocab), vocab, k)
        for r in exact.nonzero().flatten().tolist():
            kth = -torch.kthvalue(-p[r], int(k[r])).values
            exact[r] = bool(torch.frexp(p[r][p[r] >= kth].sum()).mantissa == 0.5)
    return exact


def _per_row(v, batch: int) -> torch.Tensor:
    if isinstance(v, torch.Tensor) and v.dim() > 0:
        return v.to(torch.int64).cpu()
    return torch.full((batch,), int(v.item() if isinstance(v, torch.Tensor) else v), dtype=torch.int64)


def target(definition: Definition, inputs: Inputs, slack: float) -> Target | None:
    """The independent torch computation of what the sampler draws from: top-k / top-p over probabilities
    (torch_ref.py), or the samplers of inputs/samplers.py, min-p and those over logits (torch_samplers.py, whose
    min-p band is relative: MIN_P_SLACK). None for a sampler with inputs neither knows (FlashInfer's fi_trace
    files with a temperature or indices): then only the two samplers' distributions are compared."""
    from ..groundtruth.base import Call
    from ..groundtruth.torch_ref import filtered_distributions
    from ..groundtruth.torch_samplers import bands, probabilities
    from ..inputs.samplers import kind

    if kind(definition) is not None:
        cpu = inputs.to("cpu", copy=True)
        q, wide, narrow, exact = bands(cpu.values, slack)
        positive = probabilities(cpu.values) > 0  # over logits: every finite logit, before any filter
        return Target(q, wide > 0, narrow > 0, exact, (wide > 0).sum(dim=1) < positive.sum(dim=1))
    known = {"probs", "top_k", "top_p"}
    if distribution_input(definition) != "probs" or any(
            n not in known and s.dtype is not None for n, s in definition.inputs.items()):
        return None
    cpu = inputs.to("cpu", copy=True)
    exact = exact_rows(cpu)
    shift = torch.where(exact, 0.0, slack).to(torch.float64)
    q, wide, narrow = filtered_distributions(Call(definition, cpu, None, None), [0.0, shift, -shift])
    allowed, core = wide > 0, narrow > 0
    positive = cpu.values["probs"].cpu() > 0
    return Target(q, allowed, core, exact, allowed.sum(dim=1) < positive.sum(dim=1))


def allowed_tokens(definition: Definition, inputs: Inputs, slack: float) -> torch.Tensor | None:
    """[batch, vocab] bool: what the filters may keep (None for a sampler of logits)."""
    t = target(definition, inputs, slack)
    return None if t is None else t.allowed


# -- the tests ---------------------------------------------------------------------------------------------
def bernstein_p(deviation: torch.Tensor, variance: torch.Tensor) -> torch.Tensor:
    """P(|S - E[S]| >= d) <= 2 exp(-d^2 / (2 (V + d / 3))) for a sum of independent variables within 1 of
    their means (Bernstein): a valid p-value bound for any number of draws."""
    d = deviation.abs().to(torch.float64)
    v = variance.clamp(min=0).to(torch.float64)
    return (2 * torch.exp(-d * d / (2 * (v + d / 3)).clamp(min=1e-300))).clamp(max=1.0)


@dataclass
class SideReport:
    """One sampler's draws (the reference's, or the ground truth's) against the target."""
    side: str
    draws: int
    outside: int  # draws outside the allowed set (or the vocabulary)
    outside_rows: list[int]
    p_value: float  # the smallest p of the frequency tests, Bonferroni-adjusted (x3 tests, x cuts / 2 rows / bins)
    test: str  # which test gave it
    tvd_max: float  # the largest per-row total-variation distance of the frequencies from the target (noisy)
    verdict: str = "pass"


def judge_side(side: str, draws: torch.Tensor, t: Target, alpha: float) -> SideReport:
    """Support, then the three frequency tests, of one sampler's draws [rows, n] (every row at once)."""
    draws = draws.to(torch.int64).cpu()
    rows, vocab = t.q.shape
    valid = (draws >= 0) & (draws < vocab)
    ids = draws.clamp(0, vocab - 1)
    outside_per_row = (~(valid & t.allowed.gather(1, ids))).sum(dim=1)
    in_core = valid & t.core.gather(1, ids)
    counts = torch.zeros(rows, vocab, dtype=torch.float64).scatter_add_(1, ids, in_core.to(torch.float64))
    n = counts.sum(dim=1)  # core draws per row
    share = counts / n.clamp(min=1)[:, None]
    drawn_cdf = share.gather(1, t.order).cumsum(dim=1)  # in descending-probability order

    # pooled cuts: the top 1, 2, 4, ... tokens of every row
    pooled, pooled_at = 1.0, ""
    sizes = [1 << j for j in range(cuts(vocab)) if (1 << j) < vocab]
    for s in sizes:
        f = t.cdf[:, s - 1].clamp(0, 1)
        p = float(bernstein_p((n * (drawn_cdf[:, s - 1] - f)).sum(), (n * f * (1 - f)).sum()))
        if p < pooled:
            pooled, pooled_at = p, f"pooled cut at the top {s} token(s)"
    pooled = min(1.0, pooled * max(len(sizes), 1))

    # per row: KS in descending-probability order and in id order
    deviation = {"probability": (drawn_cdf - t.cdf).abs().amax(dim=1),
                 "id": (share.cumsum(dim=1) - t.cdf_id).abs().amax(dim=1)}
    ks, ks_at = 1.0, ""
    for order, d in deviation.items():
        p = torch.where(n > 0, 2 * torch.exp(-2 * n * d * d), 1.0)
        r = int(p.argmin())
        if float(p[r]) < ks:
            ks, ks_at = float(p[r]), f"row {r} KS in {order} order (deviation {float(d[r]):.3g})"
    ks = min(1.0, ks * 2 * rows)
    tvd = torch.where(n > 0, (share - t.qc).abs().sum(dim=1) / 2, 0.0)

    bins_p, bins_at, nbins = _bins_test(counts, t.qc, n)
    p_value, test = min((pooled, pooled_at), (ks, ks_at), (bins_p, bins_at), key=lambda c: c[0])
    p_value = min(1.0, TESTS * p_value)
    bad_rows = (outside_per_row > 0).nonzero().flatten().tolist()
    verdict = "bug" if bad_rows else ("distribution" if p_value < alpha else "pass")
    return SideReport(side, int(draws.numel()), int(outside_per_row.sum()), bad_rows, p_value, test or "-",
                      round(float(tvd.max()), 6), verdict)


def _bins_test(counts: torch.Tensor, q: torch.Tensor, n: torch.Tensor) -> tuple[float, str, int]:
    """(p, which bin, bins): per row, each token with >= MIN_EXPECTED expected draws, and the other tokens of
    positive probability in runs of consecutive ids of about MIN_EXPECTED expected draws each, observed
    against expected (Bernstein), Bonferroni over every bin of every row."""
    rows, vocab = q.shape
    e = q * n[:, None]
    big = e >= MIN_EXPECTED
    small = (q > 0) & ~big
    es = torch.where(small, e, 0.0)
    group = ((es.cumsum(dim=1) - es) / MIN_EXPECTED).floor().to(torch.int64)
    local = torch.where(big, torch.arange(vocab)[None, :], vocab + group)
    key = (local + torch.arange(rows)[:, None] * (2 * vocab))[big | small]
    observed = torch.zeros(rows * 2 * vocab, dtype=torch.float64).scatter_add_(0, key, counts[big | small])
    expected = torch.zeros(rows * 2 * vocab, dtype=torch.float64).scatter_add_(0, key, e[big | small])
    used = (expected > 0).nonzero().flatten()
    if not used.numel():
        return 1.0, "", 0
    row = used // (2 * vocab)
    o, x = observed[used], expected[used]
    p = bernstein_p(o - x, x * (1 - x / n[row].clamp(min=1)))
    i = int(p.argmin())
    r, at = int(row[i]), int(used[i] % (2 * vocab))
    if at < vocab:
        name = f"token {at}"
    else:
        members = ((group[r] == at - vocab) & small[r]).nonzero().flatten()
        name = f"tokens {int(members.min())}..{int(members.max())}"
    where = f"row {r} {name}: {int(o[i])} draws, {float(x[i]):.1f} expected"
    return min(1.0, float(p[i]) * used.numel()), where, used.numel()


# -- the report ------------------------------------------------------------------------------------------
@dataclass
class SampleReport:
    settings: dict[str, Any]  # the plan: draws, and what they can see
    sides: list[SideReport] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)  # per row: kept tokens, boundary band, exact
    verdict: str = "pass"

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        s = self.settings
        head = f"{s.get('rows', '?')} row(s) x {s.get('row_draws', '?')} draws"
        parts = []
        for side in self.sides:
            if side.draws == 0 and side.verdict != "pass":  # the call itself broke (SamplerCallBroken)
                parts.append(f"{side.side}: {side.test}")
            elif side.outside:
                rows = ", ".join(map(str, side.outside_rows[:5]))
                parts.append(f"{side.side}: {side.outside} draw(s) outside the allowed set (rows {rows})")
            else:
                parts.append(f"{side.side}: min p {side.p_value:.3g} ({side.test}), max tvd {side.tvd_max:.3f}")
        return f"{head}: " + "; ".join(parts) + f" [{self.verdict}]"


class SamplingMismatch(AssertionError):
    def __init__(self, report: SampleReport, context: str = ""):
        super().__init__(f"{context}sampler draws differ: {report.summary()}")
        self.report = report


def worst(verdicts) -> str:
    verdicts = list(verdicts)
    for v in ("bug", "distribution"):
        if v in verdicts:
            return v
    return "pass"


def compare_to_target(reference: torch.Tensor, ground_truth: torch.Tensor | None, t: Target,
                      plan: Plan) -> SampleReport:
    """Each sampler's draws [rows, n] against the target distribution."""
    report = SampleReport(plan.as_dict())
    allowed, band = t.allowed.sum(dim=1).tolist(), (t.allowed & ~t.core).sum(dim=1).tolist()
    report.rows = [{"row": r, "allowed": allowed[r], "band": band[r], "exact": bool(t.exact[r]),
                    "filtering": bool(t.filtering[r])} for r in range(t.q.shape[0])]
    report.sides.append(judge_side("reference", reference, t, plan.alpha))
    if ground_truth is not None:
        report.sides.append(judge_side("ground truth", ground_truth, t, plan.alpha))
    report.verdict = worst(s.verdict for s in report.sides)
    return report


# -- logits samplers: no independent distribution, the two samplers against each other ---------------------
def chi2_sf(x: float, df: int) -> float:
    """Upper tail of the chi-square distribution (the regularised upper incomplete gamma function)."""
    if df <= 0 or x <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(x / 2, dtype=torch.float64)))


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


def compare_two_samples(reference: torch.Tensor, ground_truth: torch.Tensor, vocab: int, plan: Plan) -> SampleReport:
    """A logits sampler: per row, a two-sample chi-square test of homogeneity, Bonferroni over rows (no
    support test and no stated power: the chi-square tail is an approximation)."""
    report = SampleReport(plan.as_dict())
    rows = reference.shape[0]
    best = (1.0, "")
    for r in range(rows):
        _, df, p, _ = two_sample_chi2(reference[r], ground_truth[r], vocab)
        best = min(best, (p, f"row {r} two-sample chi-square on {df} df"))
    p_value = min(1.0, best[0] * rows)
    verdict = "distribution" if p_value < plan.alpha else "pass"
    report.sides.append(SideReport("reference vs ground truth", int(reference.numel()), 0, [], p_value,
                                   best[1] or "-", 0.0, verdict))
    report.verdict = verdict
    return report


# -- the check ---------------------------------------------------------------------------------------------
def rows_per_call(definition: Definition, inputs: Inputs) -> int:
    """Repeated rows in one reference call: CHUNK_ELEMENTS of the device over the vocabulary."""
    dist = inputs.values[distribution_input(definition)]
    return max(1, CHUNK_ELEMENTS.get(dist.device.type, CHUNK_ELEMENTS["cpu"]) // max(dist.shape[1], 1))


def draw_reference(definition: Definition, inputs: Inputs, draws: int, seed: int) -> torch.Tensor:
    """[batch, draws] samples from the reference, seeded, a bounded number of rows per call."""
    run = reference_function(definition)
    batch = inputs.values[distribution_input(definition)].shape[0]
    chunk = rows_per_call(definition, inputs)
    out = torch.empty(batch, draws, dtype=torch.int64)
    for row in range(batch):
        done = 0
        while done < draws:
            n = min(draws - done, chunk)
            # Every call starts the worker's RNG from the seed it is given: each chunk gets its own, or
            # the chunks of a row would repeat one another's draws (seen on the H100 at 2000 draws).
            samples = run.call(repeat_rows(definition, inputs, n, slice(row, row + 1)),
                               seed=stream_seed("reference-draws", seed, row, done))
            out[row, done:done + n] = samples.reshape(-1).to(torch.int64).cpu()
            done += n
    return out


def plan_for(definition: Definition, inputs: Inputs, settings: SamplingSettings,
             t: Target | None = None) -> Plan:
    rows, vocab = inputs.values[distribution_input(definition)].shape
    filtering = int(t.filtering.sum()) if t is not None else None
    return settings.plan(rows, vocab, filtering)


# (applies, check): samplers whose one call is more than a token per row register a check of their own here
# (speculative.py, imported with the package, registers chain speculative sampling's)
OWN_CHECKS: list[tuple[Callable[[Definition], bool], Callable[..., SampleReport]]] = []


def check_sampler(definition: Definition, inputs: Inputs, ground_truth: GroundTruth,
                  settings: SamplingSettings, seed: int, cache: dict | None = None,
                  store: DrawStore | None = None) -> SampleReport:
    """`cache` keeps the reference's draws for the other ground truths of the same case (they cost the most);
    `store` keeps them on disk for later runs of the same reference, inputs, torch and device (drawstore.py).
    A sampler with a check of its own (OWN_CHECKS: chain speculative sampling, speculative.py) gets that one."""
    for applies, own in OWN_CHECKS:
        if applies(definition):
            return own(definition, inputs, ground_truth, settings, seed, cache, store)
    t = target(definition, inputs, settings.top_p_slack)
    plan = plan_for(definition, inputs, settings, t)
    key = ("reference-draws", plan.row_draws, seed)
    made = None
    if cache is not None and key in cache:
        reference, made = cache[key]
    else:
        reference = stored = None
        if store is not None:
            dist = inputs.values[distribution_input(definition)]
            stored = store.key(definition, inputs, seed, plan.row_draws, rows_per_call(definition, inputs),
                               dist.device)
            reference = store.get(stored, (dist.shape[0], plan.row_draws))
            made = "reused" if reference is not None else "made"
        if reference is None:
            reference = draw_reference(definition, inputs, plan.row_draws, seed)
            if stored is not None:
                store.put(stored, reference)
        if cache is not None:
            cache[key] = (reference, made)
    from ..groundtruth.base import SamplerCallBroken

    try:
        expected, broken = ground_truth(inputs, draws=plan.row_draws)[0], None
    except SamplerCallBroken as e:  # a property of the kernel's call no distribution shows: judged here, a bug
        expected, broken = None, SideReport("ground truth", 0, 0, [], 1.0, f"call contract: {e}", 0.0, "bug")
    if t is None and expected is not None:
        vocab = inputs.values[distribution_input(definition)].shape[1]
        report = compare_two_samples(reference, expected, vocab, plan)
    elif t is None:
        report = SampleReport(plan.as_dict())
    else:
        report = compare_to_target(reference, expected, t, plan)
    if broken is not None:
        report.sides.append(broken)
        report.verdict = worst(side.verdict for side in report.sides)
    if made is not None:
        report.settings["reference_draws"] = made  # this run's, or a stored set's of an earlier run
    return report


def assert_samples_match(definition: Definition, inputs: Inputs, ground_truth: GroundTruth, *,
                         settings: SamplingSettings | None = None, seed: int = 0) -> SampleReport:
    """Assert that the reference and the ground truth sample like the target; raise SamplingMismatch otherwise."""
    report = check_sampler(definition, inputs, ground_truth, settings or SamplingSettings(), seed)
    if not report.passed:
        raise SamplingMismatch(report)
    return report

"""Comparing a reference's outputs with a ground truth's: tolerances, the diff report, the verdict.

Tolerances come from the least precise float dtype the definition touches (an fp32 lse computed
from bf16 q/k is only as exact as bf16), then op-type and definition overrides from
`tolerances.toml` in the definitions folder, then the command line; the one used is recorded
with every result. An element passes when |actual - expected| <= atol + rtol * scale, where scale is
|expected| (torch.isclose) or, for sums of products, the operand scale of errormodel.py (the larger of
the two); an output passes when the share of passing elements reaches `matched_ratio` (1.0 except for
fp8/fp4, whose kernels round intermediates the reference keeps in float32) and, where a `min_cosine` is
set, its cosine with the expected output reaches that floor: fp8 rounding scatters every element a little
in no common direction, a wrong formula bends the whole output one way (docs/ground-truth.md, "An fp8
error model").
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

if TYPE_CHECKING:
    from ..definition import Definition

TOLERANCE_FILE = "tolerances.toml"
BUG_ABS = 1.0  # a difference above this is no rounding effect
BUG_COSINE = 0.99


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    matched_ratio: float = 1.0
    origin: str = ""  # where the values came from: "dtype:bfloat16, op_type:moe, cli"
    min_cosine: float | None = None  # the output's cosine with the expected one must reach it (None: no floor)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# The least precise first; a definition's tolerance follows the first of these it touches.
PRECISION_ORDER = ("float4_e2m1", "float8_e5m2", "float8_e4m3fn", "bfloat16", "float16", "float32")
DTYPE_TOLERANCES = {
    "float4_e2m1": Tolerance(0.1, 0.2, 0.85),
    "float8_e5m2": Tolerance(0.1, 0.2, 0.9),
    "float8_e4m3fn": Tolerance(0.1, 0.2, 0.9),
    "bfloat16": Tolerance(1e-2, 1e-2),
    "float16": Tolerance(1e-3, 1e-3),
    "float32": Tolerance(1e-5, 1e-5),
}
FIELDS = ("atol", "rtol", "matched_ratio", "min_cosine")
RATIOS = ("matched_ratio", "min_cosine")  # in [0, 1]


class ToleranceConfigError(ValueError):
    pass


def governing_dtype(definition: Definition) -> str:
    """The least precise float dtype among the definition's tensor inputs and outputs."""
    used = {s.dtype.value for s in [*definition.inputs.values(), *definition.outputs.values()]
            if s.shape is not None and s.dtype is not None}  # None: an absent optional fi_trace input
    for name in PRECISION_ORDER:
        if name in used:
            return name
    return "float32"


def load_tolerance_config(path: str | Path) -> dict[str, dict[str, dict[str, float]]]:
    """`[op_type.<name>]` and `[definition.<name>]` tables of atol / rtol / matched_ratio / min_cosine."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ToleranceConfigError(f"{path}: {e}") from None
    out: dict[str, dict[str, dict[str, float]]] = {"op_type": {}, "definition": {}}
    for section, tables in data.items():
        if section not in out or not isinstance(tables, dict):
            raise ToleranceConfigError(f"{path}: unknown table [{section}] (expected [op_type.X] or "
                                       f"[definition.X])")
        for key, values in tables.items():
            if not isinstance(values, dict):
                raise ToleranceConfigError(f"{path}: [{section}.{key}] must be a table")
            for f, v in values.items():
                if f not in FIELDS:
                    raise ToleranceConfigError(f"{path}: [{section}.{key}].{f}: unknown field "
                                               f"(expected {', '.join(FIELDS)})")
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= 0) or (
                        f in RATIOS and v > 1):
                    raise ToleranceConfigError(f"{path}: [{section}.{key}].{f}: {v!r} is not a "
                                               f"{'ratio in [0, 1]' if f in RATIOS else 'number >= 0'}")
            out[section][key] = {f: float(v) for f, v in values.items()}
    return out


def _config_for(definition: Definition) -> dict[str, dict[str, dict[str, float]]]:
    folder = definition.source.parent.parent if definition.source else None
    for candidate in ([folder / TOLERANCE_FILE, folder.parent / TOLERANCE_FILE] if folder else []):
        if candidate.is_file():
            return _loaded(candidate)
    return {"op_type": {}, "definition": {}}


_LOADED: dict[Path, tuple[tuple[int, int], dict]] = {}


def _loaded(path: Path) -> dict[str, dict[str, dict[str, float]]]:
    """load_tolerance_config, parsed once per file version: every case asks (a suite asks ~17k times; the
    parse was ~2 ms a case). Keyed on the file's mtime and size, so an edited file is read again."""
    st = path.stat()
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _LOADED.get(path)
    if hit is None or hit[0] != stamp:
        hit = _LOADED[path] = (stamp, load_tolerance_config(path))
    return hit[1]


def tolerance_for(definition: Definition, *, config: dict | None = None, cli: dict[str, float] | None = None
                  ) -> Tolerance:
    """dtype defaults, then `[op_type.X]`, then `[definition.X]`, then command-line values."""
    dtype = governing_dtype(definition)
    tol = replace(DTYPE_TOLERANCES[dtype], origin=f"dtype:{dtype}")
    config = _config_for(definition) if config is None else config
    layers = [(f"op_type:{definition.op_type}", config.get("op_type", {}).get(definition.op_type)),
              (f"definition:{definition.name}", config.get("definition", {}).get(definition.name)),
              ("cli", {k: v for k, v in (cli or {}).items() if v is not None} or None)]
    for origin, values in layers:
        if values:
            tol = replace(tol, **values, origin=f"{tol.origin}, {origin}")
    return tol


# -- the diff report --------------------------------------------------------------------------------
@dataclass
class DiffReport:
    """One output's comparison. `verdict`: "pass", "precision" (close but out of tolerance) or "bug"."""

    name: str
    shape: list[int]
    total: int = 0
    mismatched: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst_index: list[int] | None = None
    worst_actual: float | None = None
    worst_expected: float | None = None
    cosine: float = 1.0
    nan_actual: int = 0
    nan_expected: int = 0
    inf_actual: int = 0
    inf_expected: int = 0
    tolerance: dict[str, Any] = field(default_factory=dict)
    verdict: str = "pass"
    problem: str | None = None  # a structural problem (shape) that made values incomparable
    error_model: str = "|expected|"  # what rtol multiplies (errormodel.py)
    widened: int = 0  # elements that pass only because of the operand scale
    # how much of its tolerance the comparison used: |actual - expected| / allowed at the rank where the
    # verdict is decided (the matched_ratio quantile; the worst element at 1.0); <= 1 passes. A pass at 0.02
    # says the tolerance is loose for this kernel: what a tighter one (an fp8 error model) needs to know
    tolerance_used: float | None = None
    # the tolerance's min_cosine where it applied: an expected output whose rms reaches atol (below it the
    # direction is rounding noise, and atol governs each element); None: not applied
    cosine_floor: float | None = None

    @property
    def mismatch_ratio(self) -> float:
        return self.mismatched / self.total if self.total else 0.0

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mismatch_ratio": self.mismatch_ratio}

    def summary(self) -> str:
        if self.problem:
            return f"{self.name}: {self.problem} [{self.verdict}]"
        worst = ""
        if self.worst_index is not None:
            worst = (f", worst at {tuple(self.worst_index)}: actual {self.worst_actual:.6g} vs expected "
                     f"{self.worst_expected:.6g}")
        floor = (f" below the floor {self.cosine_floor}"
                 if self.cosine_floor is not None and self.cosine < self.cosine_floor else "")
        nonfinite = ""
        if self.nan_actual or self.nan_expected or self.inf_actual or self.inf_expected:
            nonfinite = (f", nan {self.nan_actual}/{self.nan_expected} inf {self.inf_actual}/{self.inf_expected}"
                         f" (actual/expected)")
        model = "" if self.error_model == "|expected|" else f" x {self.error_model}"
        return (f"{self.name}: {self.mismatched}/{self.total} ({self.mismatch_ratio:.2%}) out of tolerance "
                f"atol={self.tolerance.get('atol')} rtol={self.tolerance.get('rtol')}{model}, max abs "
                f"{self.max_abs:.4g}, max rel {self.max_rel:.4g}, cosine {self.cosine:.6f}{floor}{worst}{nonfinite} "
                f"[{self.verdict}]")


CHUNK = 1 << 26  # elements compared at once: a KV cache of 2**31 elements is never widened to float64 whole


@dataclass
class _Tally:
    """What `diff` gathers over the slices of one output, in order."""
    nan_a: int = 0
    nan_e: int = 0
    inf_a: int = 0
    inf_e: int = 0
    mismatched: int = 0
    widened: int = 0
    finite: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    dot: float = 0.0
    na2: float = 0.0
    ne2: float = 0.0
    worst: tuple[float, int, float, float] | None = None  # (score, flat index, actual, expected)
    bad_nonfinite: bool = False  # a NaN or an infinity where the other side differs
    top: torch.Tensor | None = None  # the largest err / allowed ratios, as many as the matched_ratio quantile needs


def diff(actual: Any, expected: Any, tolerance: Tolerance, name: str = "output", *,
         scale: torch.Tensor | None = None, error_model: str | None = None) -> DiffReport:
    """Compare one output; both are upcast to float64 (non-float values compare exactly), CHUNK elements at a
    time. `scale`: the element-wise magnitude rtol multiplies where it is larger than |expected| (errormodel.py).
    Computed where both tensors are (a GPU's float64 is fast; eight test processes comparing on one
    node's CPU cores are not), on the CPU when they are on different devices."""
    a = torch.as_tensor(actual).detach()
    e = torch.as_tensor(expected).detach()
    if a.device != e.device:
        a, e = a.cpu(), e.cpu()
    report = DiffReport(name, list(a.shape), tolerance=tolerance.as_dict())
    if scale is not None:
        scale = torch.as_tensor(scale).detach().to(e.device)
        if scale.shape != e.shape:
            scale = None
        else:
            report.error_model = error_model or "operand scale"
    if a.shape != e.shape:
        report.problem = f"shape {tuple(a.shape)} != expected {tuple(e.shape)}"
        report.verdict = "bug"
        return report
    exact = not (a.is_floating_point() or e.is_floating_point())
    a, e = a.flatten(), e.flatten()
    s = None if scale is None else scale.flatten()
    n = report.total = a.numel()
    # tolerance_used is the k-th smallest ratio, i.e. the m-th largest: each slice keeps its m largest. Where m
    # is larger than a slice (a low matched_ratio over a huge output), the output is compared whole
    k = min(max(math.ceil(tolerance.matched_ratio * n - 1e-9), 1), max(n, 1))
    m = n - k + 1
    step = CHUNK if m <= CHUNK else max(n, 1)
    t = _Tally()
    for lo in range(0, n, step):
        _tally(t, a[lo:lo + step], e[lo:lo + step], None if s is None else s[lo:lo + step], tolerance, exact, lo, m)
    report.nan_actual, report.nan_expected, report.inf_actual, report.inf_expected = t.nan_a, t.nan_e, t.inf_a, t.inf_e
    report.mismatched, report.widened = t.mismatched, t.widened
    if not exact:
        report.tolerance_used = 0.0 if t.top is None or not t.top.numel() else round(float(t.top.min()), 6)
    if t.finite:
        report.max_abs, report.max_rel = t.max_abs, t.max_rel
        na, ne = math.sqrt(t.na2), math.sqrt(t.ne2)
        report.cosine = 1.0 if na == ne == 0.0 else t.dot / (na * ne) if na and ne else 0.0
        if tolerance.min_cosine is not None and not exact and ne >= tolerance.atol * math.sqrt(t.finite):
            report.cosine_floor = tolerance.min_cosine
            used = 1.0 - report.cosine
            slack = 1.0 - tolerance.min_cosine
            used = used / slack if slack > 0 else (0.0 if used <= 0 else math.inf)
            report.tolerance_used = max(report.tolerance_used or 0.0, round(used, 6))
    if t.worst is not None:
        _, flat, report.worst_actual, report.worst_expected = t.worst
        report.worst_index = list(_unravel(flat, report.shape))
    matched = 1.0 - report.mismatch_ratio
    cosine_ok = report.cosine_floor is None or report.cosine >= report.cosine_floor
    if cosine_ok and (report.mismatched == 0 or matched >= tolerance.matched_ratio):
        report.verdict = "pass"
    elif report.max_abs > BUG_ABS or report.cosine < BUG_COSINE or t.bad_nonfinite:
        report.verdict = "bug"
    else:
        report.verdict = "precision"
    return report


def _tally(t: _Tally, a: torch.Tensor, e: torch.Tensor, s: torch.Tensor | None, tolerance: Tolerance, exact: bool,
           offset: int, m: int) -> None:
    """Add one slice (flat, starting at `offset`) to the tally."""
    a, e = a.to(torch.float64), e.to(torch.float64)
    t.nan_a += int(a.isnan().sum())
    t.nan_e += int(e.isnan().sum())
    t.inf_a += int(a.isinf().sum())
    t.inf_e += int(e.isinf().sum())
    finite = a.isfinite() & e.isfinite()
    err = (a - e).abs()
    if exact:
        ok = a == e
    else:
        allowed = tolerance.atol + tolerance.rtol * e.abs()
        ok = torch.where(finite, err <= allowed, False)
        if s is not None:
            s = s.to(torch.float64)
            wide = torch.where(finite & s.isfinite(), err <= tolerance.atol + tolerance.rtol * s, False)
            t.widened += int((wide & ~ok).sum())
            ok |= wide
            allowed = torch.where(s.isfinite(), torch.maximum(allowed, tolerance.atol + tolerance.rtol * s), allowed)
        # the same infinity, or NaN on both sides, is agreement (an empty softmax's lse is -inf)
        agree = (a.isinf() & (a == e)) | (a.isnan() & e.isnan())
        ok |= agree
        ratio = torch.where(allowed > 0, err / allowed.clamp_min(1e-300), torch.where(err > 0, math.inf, 0.0))
        ratio = torch.where(finite, ratio, torch.where(agree, 0.0, math.inf))
        top = ratio.topk(min(m, ratio.numel())).values
        both = top if t.top is None else torch.cat([t.top, top])
        t.top = both.topk(min(m, both.numel())).values
    t.mismatched += int((~ok).sum())
    t.bad_nonfinite |= bool((~ok & ~finite).any())
    count = int(finite.sum())
    if count:
        fe, fa, ferr = e[finite], a[finite], err[finite]
        t.finite += count
        t.max_abs = max(t.max_abs, float(ferr.max()))
        t.max_rel = max(t.max_rel, float((ferr / fe.abs().clamp_min(1e-12)).max()))
        t.dot += float(fa @ fe)
        t.na2 += float(fa @ fa)
        t.ne2 += float(fe @ fe)
    bad = (~ok).nonzero().flatten()
    if bad.numel():
        score = torch.where(finite, err, math.inf)[bad]
        i = int(score.argmax())
        best, flat = float(score[i]), int(bad[i])
        if t.worst is None or best > t.worst[0]:
            t.worst = (best, offset + flat, float(a[flat]), float(e[flat]))


def _unravel(flat: int, shape: list[int]) -> tuple[int, ...]:
    idx = []
    for dim in reversed(shape):
        idx.append(flat % dim)
        flat //= dim
    return tuple(reversed(idx))


class Mismatch(AssertionError):
    """Outputs differ beyond tolerance; `reports` holds one DiffReport per output."""

    def __init__(self, reports: list[DiffReport], context: str = ""):
        failing = [r for r in reports if not r.passed]
        verdict = "bug" if any(r.verdict == "bug" for r in failing) else "precision"
        lines = [f"{context}{len(failing)} of {len(reports)} output(s) differ [{verdict}]"]
        lines += ["  " + r.summary() for r in reports]
        super().__init__("\n".join(lines))
        self.reports = reports
        self.verdict = verdict


def compare_outputs(actual: Any, expected: Any, tolerance: Tolerance, names: list[str] | None = None, *,
                    scales: list | None = None, error_models: list[str] | None = None) -> list[DiffReport]:
    actual = actual if isinstance(actual, (tuple, list)) else (actual,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    if len(actual) != len(expected):
        return [DiffReport("outputs", [], problem=f"{len(actual)} output(s) vs {len(expected)} expected",
                           verdict="bug", tolerance=tolerance.as_dict())]
    names = names or [f"output[{i}]" for i in range(len(actual))]
    scales = scales if scales is not None and len(scales) == len(actual) else [None] * len(actual)
    models = error_models if error_models is not None and len(error_models) == len(actual) else [None] * len(actual)
    return [diff(a, e, tolerance, n, scale=s, error_model=m)
            for a, e, n, s, m in zip(actual, expected, names, scales, models, strict=True)]


def assert_close(actual: Any, expected: Any, rtol: float | None = None, atol: float | None = None, *,
                 tolerance: Tolerance | None = None, matched_ratio: float | None = None,
                 names: list[str] | None = None, scales: list | None = None,
                 error_models: list[str] | None = None) -> list[DiffReport]:
    """Assert that outputs (a tensor or a tuple of them) agree; raise Mismatch with the diff report.

    Give either a Tolerance (e.g. from `tolerance_for`) or rtol/atol, which override it. `scales`:
    one per output from `errormodel.error_scales` (None entries: |expected|).
    Returns the reports when everything passes, so callers can record them.
    """
    base = tolerance or Tolerance(1e-5, 1e-5, origin="assert_close default")
    tol = replace(base, **{k: v for k, v in (("rtol", rtol), ("atol", atol), ("matched_ratio", matched_ratio))
                           if v is not None})
    reports = compare_outputs(actual, expected, tol, names, scales=scales, error_models=error_models)
    if not all(r.passed for r in reports):
        raise Mismatch(reports)
    return reports

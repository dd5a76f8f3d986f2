"""`flashinfer-trace check`: the reference tests' checks, outside pytest, on any definitions.

A pipeline of plain functions, each taking the previous result and the config:

    discover(targets, config) -> Discovered      definitions, plus files that did not load
    plan(discovered, config)  -> list[Case]      what to check: shape, dtype, match, determinism, edge cases
    run(cases, config)        -> list[Result]    one result per case: pass / fail / skip / error
    summarise(results)        -> Summary         counts, and skip reasons grouped

`run` is a generator: each result is yielded (and, with `config.results_file`, appended to a JSONL
stream, fsynced) as it completes, so an interrupt or a kill keeps everything finished; with
`config.resume` the cases already in that file are not run again, their recorded results are reused.
"""

from __future__ import annotations

import os
import time
import traceback
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .compare import Mismatch, Tolerance, tolerance_for
from .compare_samples import SamplingSettings, check_sampler
from .definition import Definition
from .errormodel import compare_with_model, error_scales
from .groundtruth import SOURCES, GroundTruthUnavailable, default_device, get_ground_truth
from .inputs import InputGenerationError, UnsupportedOpType, edge_cases, generate_inputs
from .inputs.common import fixed_bytes
from .testing import expected_dtypes, expected_shapes, is_sampler, run_reference, shape_fits

CHECKS = ("shape", "dtype", "match", "deterministic", "edge")


@dataclass
class CheckConfig:
    sources: tuple[str, ...] = SOURCES
    sizes: tuple[str, ...] = ("small", "medium")
    seeds: tuple[int, ...] = (0,)
    cases: tuple[str, ...] | None = None  # None: every edge case; () none; else only these
    device: str | None = None
    tolerance: dict[str, float] = field(default_factory=dict)  # command-line atol / rtol / matched_ratio
    draws: int | None = None  # sampler draws per row; None: by device
    definitions_dir: str | None = None
    save_failures: str | None = None
    save_inputs: bool = False
    results_file: str | None = None  # JSONL, one result a line as each completes
    resume: bool = False  # reuse the results already in results_file

    @property
    def resolved_device(self) -> str:
        return self.device or default_device()

    def sampling(self) -> SamplingSettings:
        draws = self.draws or (64 if self.resolved_device == "cpu" else 2000)
        return SamplingSettings(draws=draws)


@dataclass(frozen=True)
class Case:
    definition: Definition
    check: str
    size: str = "small"
    seed: int = 0
    case: str | None = None
    source: str | None = None

    @property
    def id(self) -> str:
        parts = [self.definition.name, self.check, self.source, self.size, str(self.seed), self.case]
        return "-".join(p for p in parts if p)


@dataclass
class Result:
    definition: str
    check: str
    status: str  # pass | fail | skip | error
    size: str | None = None
    seed: int | None = None
    case: str | None = None
    source: str | None = None
    reason: str | None = None
    verdict: str | None = None
    tolerance: dict[str, Any] | None = None
    ground_truth: dict[str, Any] | None = None
    reports: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    failure_file: str | None = None
    inputs: str | None = None  # where the case's inputs came from: "generator" or "fi_trace init"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def key(self) -> tuple:
        return (self.definition, self.check, self.source, self.size, self.seed, self.case)


def case_key(case: Case) -> tuple:
    """What identifies a case's result (Result.key of the result it produces)."""
    return (case.definition.name, case.check, case.source, case.size, case.seed, case.case)


def recorded(path: str | Path) -> dict[tuple, Result]:
    """The results in a JSONL stream by key (the last record of a key wins); a torn line is skipped."""
    from .sweep.results import from_fields, read_latest

    return {r.key: r for r in read_latest(path, from_fields(Result), lambda r: r.key)}


@dataclass
class Discovered:
    definitions: list[Definition]
    errors: list[Result]


@dataclass
class Summary:
    total: int
    by_status: dict[str, int]
    skip_reasons: dict[str, int]
    failures: list[str]

    @property
    def ok(self) -> bool:
        return not self.by_status.get("fail") and not self.by_status.get("error")


# -- discover ---------------------------------------------------------------------------------------
def discover(targets: Iterable[str], config: CheckConfig) -> Discovered:
    """Files, folders (every *.json below) or names in the definitions folder."""
    from .dataset import Dataset, load_path
    from .validate import DefinitionError

    defs: list[Definition] = []
    errors: list[Result] = []
    seen: set[str] = set()
    for target in targets:
        p = Path(target)
        if p.is_dir():
            paths = sorted(p.rglob("*.json"))
        elif p.suffix == ".json" or p.is_file():
            paths = [p]
        else:
            paths = None
        loaded: list[Definition] = []
        for path in paths if paths is not None else [None]:
            try:
                loaded.append(load_path(path) if path is not None else Dataset(config.definitions_dir).load(target))
            except (DefinitionError, KeyError, FileNotFoundError) as e:
                msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
                errors.append(Result(str(path or target), "load", "error", reason=msg))
        for d in loaded:
            if d.name not in seen:
                seen.add(d.name)
                defs.append(d)
    return Discovered(defs, errors)


# -- plan -------------------------------------------------------------------------------------------
# A check holds the inputs, the reference's float32 copies and the torch ground truth's float64 ones
# (an fp8 weight grows 8x there) at once: about this many times the inputs' bytes at the peak.
MEMORY_FACTOR = 12


def memory_budget(device: str) -> int:
    """Bytes the checks may use: the GPU's memory on CUDA, the machine's RAM on the CPU."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def too_large(d: Definition, budget: int) -> str | None:
    """Why a definition cannot be checked in this much memory, or None."""
    fixed = fixed_bytes(d)
    if fixed * MEMORY_FACTOR <= budget:
        return None
    return (f"too-large: its fixed-size inputs alone are {fixed / 2**30:.1f} GiB; with the reference's float32 "
            f"and the ground truth's float64 copies that is ~{fixed * MEMORY_FACTOR / 2**30:.0f} GiB, more than "
            f"the {budget / 2**30:.0f} GiB here")


def plan(discovered: Discovered, config: CheckConfig) -> list[Case | Result]:
    """Cases in the order they run; a definition no generator supports, or one too large for this
    machine, becomes a skip result."""
    out: list[Case | Result] = list(discovered.errors)
    budget = memory_budget(config.resolved_device)
    for d in discovered.definitions:
        try:
            cases = edge_cases(d)
        except UnsupportedOpType as e:
            out.append(Result(d.name, "all", "skip", reason=f"no-generator: {e}"))
            continue
        why = too_large(d, budget) or _fi_trace_inputs_problem(d, config.resolved_device)
        if why:
            out.append(Result(d.name, "all", "skip", reason=why))
            continue
        if config.cases is not None:
            cases = [c for c in cases if c in config.cases]
        for size in config.sizes:
            out += [Case(d, "shape", size), Case(d, "dtype", size)]
            out += [Case(d, "match", size, seed, source=s) for seed in config.seeds for s in config.sources]
        out.append(Case(d, "deterministic"))
        out += [Case(d, "edge", "small", 0, c, s) for c in cases for s in config.sources]
    return out


def _fi_trace_inputs_problem(d: Definition, device: str = "cpu") -> str | None:
    """Our generators key on op_type and input names; FlashInfer's fi_trace files often name or lay out
    an op's inputs otherwise (`input` for `hidden_states`, rope's `indptr`/`offsets`). Such a definition
    is one skip saying what did not fit (one small case is made to find out), not an error per check.
    Where the file carries its template's `init`, generate_inputs falls back to it (confined, on `device`:
    an init may need the GPU)."""
    if not d.from_fi_trace:
        return None
    try:
        generate_inputs(d, "small", 0, device=device)
    except InputGenerationError as e:
        return f"fi-trace-inputs: our input generator does not fit this FlashInfer fi_trace definition: {e}"
    return None


# -- run --------------------------------------------------------------------------------------------
class _Memo:
    """Inputs and reference outputs of the current (definition, size, seed, case): several
    checks and sources share them, and cases are planned grouped."""

    def __init__(self, device: str):
        self.device = device
        self.key: tuple | None = None
        self.inputs = self.outputs = None
        self._scales_key: tuple | None = None
        self._scales: list | None = None

    def get(self, case: Case):
        key = (case.definition.name, case.size, case.seed, case.case)
        if key != self.key:  # forgotten before generating: a failure must not leave another case's inputs
            self.key = self.inputs = self.outputs = None
            self.inputs = generate_inputs(case.definition, case.size, case.seed, device=self.device,
                                          case=case.case)
            self.key = key
        return self.inputs

    def reference(self, case: Case):
        self.get(case)
        if self.outputs is None:
            self.outputs = run_reference(case.definition, self.inputs, seed=case.seed)
        return self.outputs

    def scales(self, case: Case):
        """The error model's per-element scales of these inputs (errormodel.py), computed once."""
        self.get(case)
        if self._scales_key != self.key:
            self._scales_key, self._scales = self.key, error_scales(case.definition, self.inputs)
        return self._scales


def _result(case: Case, status: str, **kw) -> Result:
    return Result(case.definition.name, case.check, status, case.size, case.seed, case.case, case.source, **kw)


def _compare(case: Case, memo: _Memo, config: CheckConfig, tol: Tolerance) -> Result:
    d = case.definition
    try:
        gt = get_ground_truth(case.source, d, device=memo.device)
    except GroundTruthUnavailable as e:
        return _result(case, "skip", reason=str(e))
    inputs = memo.get(case)
    try:
        return _compare_with(case, memo, config, tol, gt, inputs)
    except GroundTruthUnavailable as e:  # an adapter that finds out late that it cannot run this
        return _result(case, "skip", reason=str(e))


def _compare_with(case: Case, memo: _Memo, config: CheckConfig, tol: Tolerance, gt, inputs) -> Result:
    d = case.definition
    if is_sampler(d):
        settings = config.sampling()
        report = check_sampler(d, inputs, gt, settings, case.seed)
        return _result(case, "pass" if report.passed else "fail", verdict=report.verdict,
                       tolerance=settings.as_dict(), ground_truth=gt.describe(), reports=[report.as_dict()],
                       reason=None if report.passed else report.summary())
    expected = gt(inputs)
    reports = compare_with_model(d, inputs, memo.reference(case), expected, tol, scales=lambda: memo.scales(case))
    passed = all(r.passed for r in reports)
    verdict = None if passed else Mismatch(reports).verdict
    return _result(case, "pass" if passed else "fail", verdict=verdict, tolerance=tol.as_dict(),
                   ground_truth=gt.describe(), reports=[r.as_dict() for r in reports],
                   reason=None if passed else "; ".join(r.summary() for r in reports if not r.passed))


def _structure(case: Case, memo: _Memo) -> Result:
    d = case.definition
    outputs = memo.reference(case)
    if case.check == "shape":
        got = [list(getattr(o, "shape", [])) if getattr(o, "shape", None) is not None else None for o in outputs]
        want = expected_shapes(d, memo.inputs)
        ok = len(got) == len(want) and all(shape_fits(g, w) for g, w in zip(got, want, strict=False))
    else:
        got = [str(getattr(o, "dtype", type(o).__name__)).replace("torch.", "") for o in outputs]
        want = expected_dtypes(d)
        ok = got == want
    return _result(case, "pass" if ok else "fail", reason=None if ok else f"{case.check}s {got} != {want}")


def _deterministic(case: Case, memo: _Memo) -> Result:
    inputs = memo.get(case)
    first = run_reference(case.definition, inputs, seed=0)
    second = run_reference(case.definition, inputs, seed=0)
    same = all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
               for a, b in zip(first, second, strict=True))
    return _result(case, "pass" if same else "fail",
                   reason=None if same else "two runs with the same inputs and seed differ")


def run_case(case: Case, memo: _Memo, config: CheckConfig) -> Result:
    start = time.perf_counter()
    try:
        if case.check in ("match", "edge"):
            tol = tolerance_for(case.definition, cli=config.tolerance)
            result = _compare(case, memo, config, tol)
        elif case.check in ("shape", "dtype"):
            result = _structure(case, memo)
        else:
            result = _deterministic(case, memo)
    except InputGenerationError as e:
        result = _result(case, "error", reason=f"inputs: {e}")
    except Exception as e:  # a kernel or reference that raises is a result, not a crash of the run
        tb = traceback.extract_tb(e.__traceback__)[-1]
        result = _result(case, "error", reason=f"{type(e).__name__}: {' '.join(str(e).split())[:400]} "
                                               f"({Path(tb.filename).name}:{tb.lineno})")
    result.seconds = time.perf_counter() - start
    if memo.inputs is not None and memo.key == (case.definition.name, case.size, case.seed, case.case):
        result.inputs = memo.inputs.source
    return result


def run(cases: list[Case | Result], config: CheckConfig) -> Iterator[Result]:
    from .failures import save_failure
    from .sweep.results import JsonlStream

    memo = _Memo(config.resolved_device)
    done = recorded(config.results_file) if config.resume and config.results_file else {}
    stream = JsonlStream(config.results_file, append=config.resume) if config.results_file else None
    try:
        for case in cases:
            if isinstance(case, Result):
                result = case
            elif case_key(case) in done:
                yield done[case_key(case)]  # already in the stream
                continue
            else:
                result = run_case(case, memo, config)
                if result.status == "fail" and config.save_failures:
                    record = {**result.as_dict(), "device": memo.device,
                              "definition_path": str(case.definition.source) if case.definition.source else None}
                    result.failure_file = str(save_failure(record, config.save_failures, inputs=config.save_inputs))
            if stream is not None:
                stream.write(result.as_dict())
            yield result
    finally:
        if stream is not None:
            stream.close()


# -- summarise --------------------------------------------------------------------------------------
def summarise(results: list[Result]) -> Summary:
    by_status = Counter(r.status for r in results)
    reasons = Counter(r.reason for r in results if r.status == "skip")
    failures = [f"{r.definition} {r.check} {r.source or ''} {r.size or ''} seed={r.seed}: {r.reason}"
                for r in results if r.status in ("fail", "error")]
    return Summary(len(results), dict(by_status), dict(reasons.most_common()), failures)


def check(targets: Iterable[str], config: CheckConfig) -> tuple[list[Result], Summary]:
    results = list(run(plan(discover(targets, config), config), config))
    return results, summarise(results)

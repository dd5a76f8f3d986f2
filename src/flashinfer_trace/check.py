"""The engine: the only code that executes a case. `flashinfer-trace check` and the pytest suite
(tests/references, through pytest_plugin.py) are its two faces; both write `CaseRecord`s.

A pipeline of plain functions, each taking the previous result and the config:

    discover(targets, config) -> Discovered        definitions, plus files that did not load
    plan(discovered, config)  -> list[Case]        shape, dtype, match per size x seed x source,
                                                   determinism, edge cases per source
    run(cases, config)        -> Iterator[CaseRecord]   one record per case, streamed as it completes
    summarise(records)        -> Summary           counts, and skip reasons grouped

Exceptions become statuses in one place (`outcome_of`). With `config.results_file` each record is
appended to a JSONL stream, fsynced, as it completes; with `config.resume` the cases already there
are not run again.
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .definition import Definition
from .groundtruth import (
    KERNEL,
    SOURCES,
    GroundTruthUnavailable,
    PrebuildLookup,
    default_device,
    get_ground_truth,
    paths,
)
from .inputs import InputGenerationError, Inputs, UnsupportedOpType, edge_cases, generate_inputs
from .inputs.common import CaseTooLarge, EdgeCaseUnavailable, fixed_bytes, memory_budget, too_large
from .memo import Memo, Phases, same_bytes
from .options import DEFAULT_SEEDS, DEFAULT_SIZES, TOLERANCE_OPTIONS, fresh_seed
from .reference import expected_dtypes, expected_shapes, output_dtypes, output_shapes, run_reference, shape_fits
from .results.record import CaseRecord, Check, GroundTruthPath
from .sandbox import ReferenceFailure, SandboxError
from .status import Kind, Status
from .verdict import Judgement, judge, judge_sampler
from .verdict.compare import CHUNK, tolerance_for
from .verdict.contract import Contract, reconsider
from .verdict.drawstore import DrawStore
from .verdict.samples import SamplingSettings

SIZE_ORDER = {"small": 0, "medium": 1, "large": 2}
DEFAULT_REPEATS = 5  # kernel runs per comparison on a GPU
RACE_FACTOR = 4  # times more for kernels with atomics, split-K or multi-CTA reductions (Adapter.races)


@dataclass
class CheckConfig:
    sources: tuple[str, ...] = SOURCES
    sizes: tuple[str, ...] = DEFAULT_SIZES
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    cases: tuple[str, ...] | None = None  # None: every edge case; () none; else only these
    device: str | None = None
    tolerance: dict[str, float] = field(default_factory=dict)  # overrides: atol / rtol / matched_ratio / min_cosine
    draws: int | None = None  # sampler draws per row; None: by device
    definitions_dir: str | None = None
    definition_set: str | None = None  # the records' definition_set: None ours, "fi_trace" FlashInfer's own
    save_failures: str | None = None
    save_inputs: bool = False
    results_file: str | None = None  # JSONL, one record a line as each completes
    resume: bool = False  # reuse the records already in results_file
    # the JIT prebuild's answers (definition, source, api=None) -> its record, from the face that started or found the
    # prebuild (its report, sweep/jit/report.py): what it could not build is skipped
    prebuild_lookup: PrebuildLookup | None = None
    environment: str | None = None  # the environment id the records carry
    # this run's fresh seed, beside the fixed ones: a reference cannot be right for the fixed seeds only.
    # None: none (config_from_options draws one unless told "off"); replayed with --seeds N
    fresh_seed: int | None = None
    repeats: int | None = None  # kernel runs per comparison on the same inputs; None: 1 on the CPU, 5 on a GPU
    paths: bool = True  # every path of a source (call modes: groundtruth.paths); False: its plain path only
    # where a comparison's ground truth comes from (get_ground_truth's signature): planted kernels replace it
    resolve: Callable[..., Any] | None = None
    kernel: str | None = None  # the source "kernel": the user's MODULE:FUNCTION (groundtruth/kernel.py)
    contract: Contract | None = None  # what kernel APIs do not promise (verdict/contract.py); None: contract.toml
    # a run's tier: definitions with more fixed-size input bytes (weights) are one skip each (CI's reference run)
    max_fixed_bytes: int | None = None
    draws_store: str | None = None  # a sampler reference's draws kept here for later runs (verdict/drawstore.py)

    @property
    def resolved_device(self) -> str:
        return default_device() if self.device in (None, "auto") else self.device

    def memory(self) -> int | None:
        """Bytes one case may use: a GPU's whole budget (its ledger hands them out: budget/); None on a CPU
        (what is available there is judged per case)."""
        from .budget import device_budget

        budget = device_budget(self.resolved_device)
        return None if budget is None else budget.capacity

    def repeats_for(self, gt) -> int:
        """Runs of one comparison: a GPU kernel may race (wrong in some runs); more where it reduces across
        CTAs (`Adapter.races`); a sampler's draws are its repeats; torch on the CPU is run once."""
        if gt.kind == "sampler":
            return 1
        if self.repeats is not None:
            return max(1, self.repeats) * (RACE_FACTOR if gt.adapter.races else 1)
        if not str(gt.device).startswith("cuda"):
            return 1
        return DEFAULT_REPEATS * (RACE_FACTOR if gt.adapter.races else 1)

    @property
    def all_seeds(self) -> tuple[tuple[int, bool], ...]:
        """(seed, fresh) of every comparison: the fixed seeds, then the fresh one (a seed named both ways is the
        fresh one: its counts drawn too, as a fresh record's replay asks: `--seed N --fresh-seed N`)."""
        fixed = tuple((s, False) for s in self.seeds if s != self.fresh_seed)
        return fixed + (() if self.fresh_seed is None else ((self.fresh_seed, True),))

    def sampling(self, edge: bool = False) -> SamplingSettings:
        """Sampler checks: the draws follow from what must be seen (verdict/samples.py; a boundary case is
        planned for the gross failures it is built to expose); --draws fixes them."""
        if self.resolved_device == "cpu":
            return SamplingSettings.cpu(self.draws, edge=edge)
        return SamplingSettings.gpu(self.draws, edge=edge)

    def prebuild(self) -> PrebuildLookup | None:
        return self.prebuild_lookup


def config_from_options(get: Callable[[str], Any], **more: Any) -> CheckConfig:
    """A CheckConfig from the options add_check_options registered (`get(dest)`), plus the face's own."""
    sizes, seeds = get("sizes"), get("seeds")
    return CheckConfig(sizes=tuple(sizes) if sizes else DEFAULT_SIZES, seeds=tuple(seeds) if seeds else DEFAULT_SEEDS,
                       device=get("device"), draws=get("draws"), save_failures=get("save_failures"),
                       save_inputs=bool(get("save_inputs")),
                       fresh_seed=fresh_seed(get("fresh_seed")), repeats=get("repeats"), paths=not get("plain_path"),
                       max_fixed_bytes=None if get("max_fixed_mib") is None else int(get("max_fixed_mib") * 2**20),
                       draws_store=get("draws_store"),
                       tolerance={k: v for k in TOLERANCE_OPTIONS if (v := get(k)) is not None}, **more)



def configure_sandbox(get: Callable[[str], Any]) -> None:
    """The reference worker's settings from the same options."""
    allow, timeout, memory = (get("allow_unconfined_references"), get("reference_timeout"), get("reference_memory"))
    if allow or timeout or memory:
        from .sandbox import configure

        configure(timeout=timeout, memory_gb=memory, allow_unconfined=True if allow else None)


# -- the case ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    definition: Definition
    check: Check
    size: str = "small"
    seed: int = 0
    case: str | None = None
    source: str | None = None
    skip: tuple[Kind, str] | None = None  # decided at planning: the case cannot run here, and why
    path: str | None = None  # the source's path (groundtruth.paths): None its plain call
    fresh: bool = False  # `seed` is the run's fresh seed: the id says "fresh", the record the number
    definition_set: str | None = None  # None: definitions/; "fi_trace": FlashInfer's own (a name may repeat ours)

    @property
    def id(self) -> str:
        source = f"{self.source}:{self.path}" if self.source and self.path else self.source
        parts = [self.definition.name, self.check.value, source, self.size, "fresh" if self.fresh else str(self.seed),
                 self.case]
        return "-".join(p for p in parts if p)

    @property
    def key(self) -> tuple:
        """What identifies the case's record (CaseRecord.key)."""
        return (self.definition.name, self.check.value, self.source, self.path, self.size, self.seed, self.case,
                self.definition_set)

    def record(self, status: Status, **kw: Any) -> CaseRecord:
        return CaseRecord(definition=self.definition.name, definition_set=self.definition_set,
                          op_type=self.definition.op_type, check=self.check, size=self.size, seed=self.seed,
                          case=self.case, source=self.source, path=self.path, fresh=self.fresh, status=status, **kw)


@dataclass
class Discovered:
    definitions: list[Definition]
    errors: list[CaseRecord]


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
    errors: list[CaseRecord] = []
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
                loaded.append(load_path(path, root=p if p.is_dir() else None) if path is not None
                              else Dataset(config.definitions_dir).load(target))
            except (DefinitionError, KeyError, FileNotFoundError) as e:
                msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
                errors.append(CaseRecord(definition=str(path or target), definition_set=config.definition_set,
                                         check=Check.LOAD, status=Status.ERROR, kind=Kind.LOAD, detail=msg,
                                         environment=config.environment))
        for d in loaded:
            if d.name not in seen:
                seen.add(d.name)
                defs.append(d)
    return Discovered(defs, errors)


# -- plan -------------------------------------------------------------------------------------------
def _fi_trace_inputs(d: Definition, device: str = "cpu") -> tuple[str | None, str | None]:
    """(why no inputs can be made, where they come from) for a FlashInfer fi_trace definition; (None, None)
    for others. Our generators key on op_type and input names; FlashInfer's fi_trace files often name or
    lay out an op's inputs otherwise (`input` for `hidden_states`, rope's `indptr`/`offsets`). Where the
    file carries its template's `init`, generate_inputs falls back to it (confined, on `device`), else to
    the declaration (declared.py); one small case made here says which."""
    if not d.from_fi_trace:
        return None, None
    try:
        return None, generate_inputs(d, "small", 0, device=device).source
    except CaseTooLarge:
        return None, None  # the case itself says so
    except InputGenerationError as e:
        return f"our input generator does not fit this FlashInfer fi_trace definition: {e}", None
    except Exception as e:  # out of device memory while planning: the cases say it under the device's budget
        from .budget import is_out_of_memory

        if is_out_of_memory(e):
            return None, None
        raise


def definition_cases(d: Definition, config: CheckConfig, budget: int | None = None) -> list[Case]:
    """A definition's cases, in the order they run (a case's checks together: they share its inputs;
    the edge cases of a size after its random ones).
    A definition no family generator knows gets its inputs from its init or its declaration, and no edge cases."""
    edge = edge_cases(d)
    if config.cases is not None:
        edge = [c for c in edge if c in config.cases]
    skip = None
    if config.max_fixed_bytes is not None and (fixed := fixed_bytes(d)) > config.max_fixed_bytes:
        skip = (Kind.INPUT_LIMIT, f"{fixed / 2**20:.0f} MiB of fixed-size inputs, over this run's "
                                  f"--max-fixed-mib {config.max_fixed_bytes / 2**20:g}")
    elif budget is not None and (why := too_large(d, budget)):
        skip = (Kind.TOO_LARGE, why)
    else:
        why, source = _fi_trace_inputs(d, config.resolved_device)
        if why:
            skip = (Kind.FI_TRACE_INPUTS, why)
        elif source not in (None, "generator"):
            edge = []  # the family's edge cases need its generator, which does not fit this file
    out: list[Case] = []
    routes = [(s, p) for s in config.sources for p in (paths(s, d) if config.paths else [None])]
    for size in sorted(config.sizes, key=lambda s: SIZE_ORDER.get(s, 3)):
        out += [Case(d, Check.SHAPE, size, skip=skip), Case(d, Check.DTYPE, size, skip=skip)]
        out += [Case(d, Check.MATCH, size, seed, source=s, path=p, fresh=fresh, skip=skip)
                for seed, fresh in config.all_seeds for s, p in routes]
        # boundary-seeking inputs at every size: an indexing bug may need the larger shapes to show
        out += [Case(d, Check.EDGE, size, 0, c, s, skip=skip, path=p) for c in edge for s, p in routes]
    out.append(Case(d, Check.DETERMINISTIC, skip=skip))
    if config.definition_set:
        out = [replace(c, definition_set=config.definition_set) for c in out]
    return out


def plan(discovered: Discovered, config: CheckConfig) -> list[Case | CaseRecord]:
    """Cases in the order they run; a definition no generator supports is one skip record."""
    out: list[Case | CaseRecord] = list(discovered.errors)
    budget = config.memory() or memory_budget(config.resolved_device)  # a GPU: its ledger's budget
    for d in discovered.definitions:
        try:
            out += definition_cases(d, config, budget)
        except UnsupportedOpType as e:
            out.append(CaseRecord(definition=d.name, definition_set=config.definition_set, op_type=d.op_type,
                                  check=Check.ALL, status=Status.SKIP,
                                  kind=Kind.NO_GENERATOR, detail=f"no-generator: {e}", environment=config.environment))
    return out


# -- run --------------------------------------------------------------------------------------------
def _path(gt) -> GroundTruthPath:
    return GroundTruthPath.model_validate(gt.describe())


def _compare(case: Case, memo: Memo, config: CheckConfig, phases: Phases) -> CaseRecord:
    d = case.definition
    tol = tolerance_for(d, cli=config.tolerance)
    mine = {"kernel": config.kernel} if case.source == KERNEL else {}  # the user's function, where it is the source
    gt = (config.resolve or get_ground_truth)(case.source, d, device=memo.device, prebuild=config.prebuild(),
                                              path=case.path, **mine)
    if d.is_sampler:
        settings = config.sampling(edge=case.check is Check.EDGE)
        inputs = memo.copy(case, phases)
        with phases("compare"):
            store = DrawStore(Path(config.draws_store)) if config.draws_store else None
            j = judge_sampler(d, inputs, gt, settings, case.seed, cache=memo.sampler_draws, store=store)
        plan = j.reports[0]["settings"] if j.reports else settings.as_dict()
        return _judged(case, j, ground_truth=_path(gt), sampling=plan, kind=Kind.SAMPLES)
    actual = memo.reference(case, phases)
    runs, judgements, first = config.repeats_for(gt), [], None
    spread = Spread()
    for _ in range(runs):  # the same inputs every time: a kernel right in some runs only is racing
        inputs = memo.copy(case, phases)
        with phases("ground_truth"):
            expected = gt(inputs)
        with phases("compare"):
            first, same = spread.add(first, expected)
            # a run whose outputs are the first run's bytes has the first run's judgement: judged once
            judgements.append(judgements[0] if same else
                              judge(d, memo.inputs, actual, expected, tol, scales=lambda: memo.scales(case)))
    wrong = [j for j in judgements if not j.passed]
    repeats = {"runs": runs, "wrong": len(wrong), **spread.as_dict()} if runs > 1 else None
    record = _judged(case, wrong[0] if wrong else judgements[0], ground_truth=_path(gt), tolerance=tol.as_dict(),
                     kind=Kind.MISMATCH, repeats=repeats)
    if wrong and len(wrong) < runs:
        record.kind = Kind.FLAKY_WRONG
        record.detail = f"wrong in {len(wrong)}/{runs} runs on the same inputs: {wrong[0].summary}"
    elif wrong and case.check is Check.EDGE:  # wrong every time, on a boundary case: does the API promise it?
        _contract(record, case, memo, config, gt, tol, expected, phases)
    return record


def _contract(record: CaseRecord, case: Case, memo: Memo, config: CheckConfig, gt, tol, expected,
              phases: Phases) -> None:
    """A failure where the kernel's API promises nothing (verdict/contract.py) becomes info, saying why and by how
    much; where the property does not explain the difference, the failure stays and says so."""
    def rerun(seen: Inputs) -> tuple:
        memo.plan(case, reference=True)  # the lease grows back to the reference's phase (or the case starts again)
        with phases("reference"):
            return run_reference(case.definition, seen.to(memo.device, copy=True), seed=case.seed)

    decision = reconsider(case.definition, case.case, gt.describe(), memo.inputs, expected, tol, rerun,
                          contract=config.contract)
    if decision is not None:
        record.detail = decision.detail(record.detail)
        if decision.explained:
            record.status, record.kind = Status.INFO, Kind.OUTSIDE_CONTRACT


class Spread:
    """How much repeated runs of a kernel on the same inputs differ from its first run: a nondeterministic
    kernel that is always within tolerance passes, with this recorded."""

    def __init__(self) -> None:
        self.identical = True
        self.max_abs = 0.0

    def add(self, first: tuple | None, outputs: tuple) -> tuple[tuple, bool]:
        """(the first run's outputs, whether these are byte for byte the first run's: NaN where the first had
        the same NaN counts as the same)."""
        if first is None:
            return outputs, False
        same = len(first) == len(outputs)
        for a, b in zip(first, outputs, strict=False):
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
                same = same and _equal_values(a, b)
                continue
            if a.shape != b.shape or a.dtype != b.dtype:
                same = self.identical = False
                continue
            if not same_bytes(a, b):
                same = self.identical = False
                if a.is_floating_point():
                    x, y = a.reshape(-1), b.reshape(-1)
                    for lo in range(0, x.numel(), CHUNK):  # widened a slice at a time (verdict/compare.py)
                        diff = (x[lo:lo + CHUNK].double() - y[lo:lo + CHUNK].double()).abs()
                        self.max_abs = max(self.max_abs, float(diff.nan_to_num(0.0, posinf=0.0, neginf=0.0).max()))
        return first, same

    def as_dict(self) -> dict[str, Any]:
        return {"identical": self.identical, "max_abs_spread": self.max_abs}


def _equal_values(a: Any, b: Any) -> bool:
    """Two outputs that are not both tensors (None, a Python number): equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except (TypeError, ValueError, RuntimeError):
        return False


def _judged(case: Case, j: Judgement, *, kind: Kind, **kw: Any) -> CaseRecord:
    return case.record(Status.PASS if j.passed else Status.FAIL, kind=None if j.passed else kind, detail=j.summary,
                       verdict=j.verdict, compared=j.compared, reports=[] if j.passed else j.reports, **kw)


def _structure(case: Case, memo: Memo, phases: Phases) -> CaseRecord:
    d = case.definition
    outputs = memo.reference(case, phases)
    if case.check is Check.SHAPE:
        got, want = output_shapes(outputs), expected_shapes(d, memo.inputs)
        ok = len(got) == len(want) and all(shape_fits(g, w) for g, w in zip(got, want, strict=False))
        kind = Kind.SHAPE
    else:
        got, want = output_dtypes(outputs), expected_dtypes(d)
        ok, kind = got == want, Kind.DTYPE
    if ok:
        return case.record(Status.PASS)
    return case.record(Status.FAIL, kind=kind, detail=f"{case.check.value}s {got} != {want}")


def _deterministic(case: Case, memo: Memo, phases: Phases) -> CaseRecord:
    first = memo.reference(case, phases)
    with phases("reference"):
        second = run_reference(case.definition, memo.copy(case, phases), seed=case.seed)
    same = len(first) == len(second) and all(
        torch.equal(a, b) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) else a == b
        for a, b in zip(first, second, strict=True))
    if same:
        return case.record(Status.PASS)
    return case.record(Status.FAIL, kind=Kind.NONDETERMINISTIC, detail="two runs with the same inputs and seed differ")


def outcome_of(e: BaseException) -> tuple[Status, Kind, str]:
    """Every exception a case can end in, as a status: the one place they are mapped."""
    if isinstance(e, GroundTruthUnavailable):  # an adapter that finds out late that it cannot run this
        if e.kind == Kind.BUILDING.value:  # its module is a `jit-` session's to build: no verdict, not a skip
            return Status.NOT_RUN, Kind.BUILDING, f"not-run: {e}"
        return Status.SKIP, Kind(e.kind), str(e)
    if isinstance(e, CaseTooLarge):
        return Status.SKIP, Kind.TOO_LARGE, f"too-large: {e}"
    from .budget.guard import classify

    if (memory := classify(e)) is not None:  # the device ran out of memory: the harness's, never a verdict
        return memory
    if isinstance(e, EdgeCaseUnavailable):
        return Status.SKIP, Kind.NO_GENERATOR, f"no-generator: {e}"
    if isinstance(e, InputGenerationError):
        return Status.ERROR, Kind.INPUTS, f"inputs: {e}"
    if isinstance(e, (ReferenceFailure, SandboxError)):
        return Status.ERROR, Kind.REFERENCE, " ".join(str(e).split())[:1000]
    tb = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f" ({Path(tb.filename).name}:{tb.lineno})" if tb else ""
    return Status.ERROR, Kind.EXCEPTION, f"{type(e).__name__}: {' '.join(str(e).split())[:400]}{where}"


def run_case(case: Case, memo: Memo, config: CheckConfig) -> CaseRecord:
    """One case, start to record; never raises for what the case does (KeyboardInterrupt passes). On a GPU within
    the memory the device's budget gives it (budget/guard.py: running out of memory is retried alone, never a
    verdict)."""
    guard = memo.memory_guard
    if guard is None:
        return _run_case(case, memo, config)
    from .budget.guard import guarded
    from .sandbox import pool

    if memo.key is not None and memo.key != memo.group(case):
        memo.free()  # the last group's tensors and lease go back before this one asks
    guard.worker_peak, guard.arena_bytes = pool.take_device_peak, pool.cuda_arena_bytes
    return guarded(case, guard, lambda: _run_case(case, memo, config), memo.free, memo.held)


def _run_case(case: Case, memo: Memo, config: CheckConfig) -> CaseRecord:
    from .budget.guard import NeedMemory
    from .budget.ledger import BudgetTimeout
    from .sandbox import pool

    start, starts, phases = time.perf_counter(), pool.worker_starts(), Phases()
    if case.skip is not None:
        record = case.record(Status.SKIP, kind=case.skip[0], detail=f"{case.skip[0].value}: {case.skip[1]}")
    else:
        try:
            if case.check in (Check.MATCH, Check.EDGE):
                record = _compare(case, memo, config, phases)
            elif case.check in (Check.SHAPE, Check.DTYPE):
                record = _structure(case, memo, phases)
            else:
                record = _deterministic(case, memo, phases)
        except (NeedMemory, BudgetTimeout):  # the device's budget: budget/guard.py starts the case again
            raise
        except Exception as e:  # a kernel or reference that raises is a record, not a crash of the run
            status, kind, detail = outcome_of(e)
            record = case.record(status, kind=kind, detail=detail)
        # whatever else it did, it may not do that
        if memo.mutated and record.status in (Status.PASS, Status.FAIL, Status.INFO):
            record = case.record(Status.FAIL, kind=Kind.MUTATES_INPUTS, verdict=record.verdict,
                                 ground_truth=record.ground_truth, tolerance=record.tolerance, compared=record.compared,
                                 repeats=record.repeats,
                                 detail=f"the reference wrote into {', '.join(memo.mutated)}, which the definition "
                                        f"does not declare as outputs")
    record.seconds = time.perf_counter() - start
    record.phases = {**{k: round(v, 4) for k, v in phases.seconds.items()},
                     "worker_starts": pool.worker_starts() - starts}
    record.environment = config.environment
    if memo.inputs is not None and memo.key == memo.group(case):
        record.inputs = memo.inputs.source
        record.axes = {a: memo.inputs.axes[a] for a in case.definition.var_axes if a in memo.inputs.axes} or None
    if record.status is Status.FAIL and config.save_failures:
        record.failure_file = save_failure(record, case, memo, config)
    return record


def save_failure(record: CaseRecord, case: Case, memo: Memo, config: CheckConfig) -> str:
    from .failures import save_failure as save

    data = {**record.as_dict(), "device": memo.device,
            "definition_path": str(case.definition.source) if case.definition.source else None}
    return str(save(data, config.save_failures, inputs=config.save_inputs))


def recorded(path: str | Path) -> dict[tuple, CaseRecord]:
    """The records in a JSONL stream by key (the last record of a key wins); a torn line is skipped."""
    from .results.record import parse
    from .results.stream import read_latest

    return {r.key: r for r in read_latest(path, parse, lambda r: r.key)}


def run(cases: list[Case | CaseRecord], config: CheckConfig) -> Iterator[CaseRecord]:
    from .results.stream import JsonlStream

    memo = Memo(config.resolved_device, config.memory())
    done = recorded(config.results_file) if config.resume and config.results_file else {}
    stream = JsonlStream(config.results_file, append=config.resume) if config.results_file else None
    try:
        for case in cases:
            if isinstance(case, CaseRecord):
                record = case
            elif case.key in done:
                yield done[case.key]  # already in the stream
                continue
            else:
                record = run_case(case, memo, config)
            if stream is not None:
                stream.write(record.as_dict())
            yield record
    finally:
        if stream is not None:
            stream.close()


# -- summarise --------------------------------------------------------------------------------------
def summarise(records: list[CaseRecord]) -> Summary:
    by_status = Counter(r.status.value for r in records)
    reasons = Counter(r.detail for r in records if r.status is Status.SKIP)
    failures = [f"{r.definition} {r.check} {r.source or ''} {r.size or ''} seed={r.seed}: {r.detail}"
                for r in records if r.status in (Status.FAIL, Status.ERROR)]
    return Summary(len(records), dict(by_status), dict(reasons.most_common()), failures)


def check(targets: Iterable[str], config: CheckConfig) -> tuple[list[CaseRecord], Summary]:
    records = list(run(plan(discover(targets, config), config), config))
    return records, summarise(records)

"""Which prebuild jobs a set of definitions needs here (one per definition and kernel source whose ground truth
can run it, with a known build's figure where one is measured: expect.py), the configuration they run with, and the
order they start in (shortest expected first, so the comparisons of most definitions can start while the long
builds go on)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .expect import GUESS, GUESS_DEFAULT, JIT_SESSION_BUDGET, KNOWN_BUILDS, expectations, known_build
from .report import BuildRecord

if TYPE_CHECKING:
    from ...definition import Definition

__all__ = ["DEFAULT_BUDGET", "GUESS", "GUESS_DEFAULT", "JIT_SESSION_BUDGET", "KERNEL_SOURCES", "LONG_SECONDS",
           "LONG_SHARE", "Job", "JitConfig", "expected", "keywords", "order", "plan", "select_k"]

KERNEL_SOURCES = ("flashinfer", "sglang")
DEFAULT_BUDGET = 600.0  # seconds per job, a references or bench session's (a jit session's: JIT_SESSION_BUDGET)
NVCC_GB = 4  # memory one nvcc of a CUTLASS kernel can take: bounds the compilers a job may run
# A job expected to take longer than LONG_SECONDS is long: long jobs hold at most LONG_SHARE of the workers at
# once and build below the others' CPU priority, so one long module (fp8 MoE: ~41 min on 16 cores) never keeps
# the short ones, and the comparisons waiting for them, from starting.
LONG_SECONDS = 240.0
LONG_SHARE = 0.25


@dataclass(frozen=True)
class Job:
    definition: str  # name
    path: str  # the definition file the worker loads
    op_type: str
    source: str
    api: str
    budget: float
    expect: float | None = None  # seconds, from a known build (expect.KNOWN_BUILDS); None: the report or a guess
    expect_from: str | None = None  # the known build's evidence
    known_modules: tuple[str, ...] = ()  # the modules the known build makes: all here, nothing needs building

    @property
    def key(self) -> tuple[str, str]:
        return (self.definition, self.source)


@dataclass
class JitConfig:
    sources: tuple[str, ...] = KERNEL_SOURCES
    device: str = "cuda"
    workers: int | None = None  # None: by the machine's cores
    max_jobs: int | None = None  # nvcc jobs per worker (MAX_JOBS); None: by cores and workers
    budget: float = DEFAULT_BUDGET
    budgets: dict[str, float] = field(default_factory=dict)  # op type or definition name -> seconds
    report: str | None = None  # JSONL, one record a line as each job ends
    log_dir: str | None = None  # one compiler log per job
    resume: bool = False  # keep built/cached records of the report, run the rest
    select: Callable[[Job], bool] | None = None  # e.g. a pytest -k expression over the job's keywords
    stamps: str | None = None  # the stamp file (`default_stamps()`: beside the JIT cache); None keeps none
    recheck: bool = False  # run every job even where its stamp says nothing changed
    cores: int | None = None  # the cores the builds may use (a share of the host's: sweep/host.py); None: all
    long_seconds: float = LONG_SECONDS  # expected seconds above which a job is long
    long_share: float = LONG_SHARE  # the share of the workers long jobs may hold at once (at least one)
    # the worker's command line before `--worker FD DEVICE` (None: `python -m ...jit.worker`): a seam for stand-ins
    worker_command: tuple[str, ...] | None = None
    arch: str | None = None  # the GPU's (sm90), for the known builds; None: the device's, detected
    # a references or bench session's: a job expected past its budget whose modules are not here is recorded
    # `deferred` at once, not built (expect.defer); `defer_to` names the `jit-` session that builds it
    defer: bool = False
    defer_to: str | None = None

    def __post_init__(self):
        if not self.long_seconds > 0:
            raise ValueError(f"JitConfig.long_seconds: expected seconds > 0, got {self.long_seconds!r}")
        if not 0 < self.long_share <= 1:
            raise ValueError(f"JitConfig.long_share: expected a share in (0, 1], got {self.long_share!r}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"JitConfig.workers: expected at least 1, got {self.workers!r}")

    def long_slots(self, workers: int) -> int:
        """How many of `workers` may build long jobs at once."""
        return max(1, int(workers * self.long_share))

    def stamp_path(self) -> Path | None:
        return Path(self.stamps) if self.stamps else None

    def budget_for(self, definition: Definition) -> float:
        return float(self.budgets.get(definition.name, self.budgets.get(definition.op_type, self.budget)))

    def pool_size(self) -> tuple[int, int]:
        """(workers, nvcc jobs per worker). Each job may use every core: a module has few sources
        (gemm_sm90: 8, most 1-3), so the compilers running at once stay near the core count, and
        the long module of many sources finishes in one round instead of two. Memory bounds it (NVCC_GB
        a compiler)."""
        cores = self.cores or os.cpu_count() or 4
        workers = self.workers or max(1, min(8, cores // 2))
        memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        return workers, self.max_jobs or max(2, min(cores, int(memory_gb // NVCC_GB)))


def plan(definitions: Iterable[Definition], config: JitConfig, *,
         versions: dict[str, str | None] | None = None) -> list[Job]:
    """A job for every kernel source whose ground truth can run the definition here (the availability
    pipeline decides, without building anything); unavailable ones need no module. A job of a known build (its
    source, API, this arch and the installed release: `versions`, default this environment's) carries its figure."""
    from ...groundtruth import GroundTruthUnavailable, get_ground_truth

    arch = config.arch or _device_arch(config.device)
    found = _installed({k.package for k in KNOWN_BUILDS}) if versions is None else versions
    jobs = []
    for d in definitions:
        for source in config.sources:
            try:
                gt = get_ground_truth(source, d, device=config.device, prebuild=None)
            except GroundTruthUnavailable:
                continue
            known = known_build(source, gt.api, arch, found)
            job = Job(d.name, str(d.source) if d.source else d.name, d.op_type, source, gt.api, config.budget_for(d),
                      **({"expect": known.seconds, "expect_from": known.evidence, "known_modules": known.modules}
                         if known else {}))
            if config.select is None or config.select(job):
                jobs.append(job)
    return jobs


def _device_arch(device: str) -> str | None:
    """The arch of a CUDA device (sm90); None on the CPU or without a usable GPU."""
    if not device.startswith("cuda"):
        return None
    try:
        import torch

        from ..combos import arch_of

        return arch_of(torch.cuda.get_device_capability(torch.device(device))) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no GPU to ask: no known build applies
        return None


def _installed(distributions: set[str]) -> dict[str, str | None]:
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in distributions:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def keywords(job: Job) -> set[str]:
    """The names a pytest -k expression sees for this job's tests."""
    return {job.definition, job.op_type, f"test_{job.op_type}", job.source}


def select_k(expression: str | None) -> Callable[[Job], bool] | None:
    """A job filter from a pytest `-k` expression: the tests it keeps are the ones the prebuild builds for."""
    if not expression:
        return None
    from _pytest.mark.expression import Expression

    compiled = Expression.compile(expression)

    def keep(job: Job) -> bool:
        words = [w.lower() for w in keywords(job)]
        return compiled.evaluate(lambda name, **_: any(name.lower() in w for w in words))

    return keep


def expected(jobs: Iterable[Job], previous: Iterable[BuildRecord] = ()) -> dict[tuple[str, str], float]:
    """Each job's expected seconds: its earlier build's time (a timed-out one took at least that), else a known
    build's, else a guess by op type (expect.expectations says where each comes from)."""
    return {k: e.seconds for k, e in expectations(jobs, previous).items()}


def order(jobs: list[Job], previous: Iterable[BuildRecord] = ()) -> list[Job]:
    """Shortest expected first, so the comparisons of most definitions can start early (the long jobs are kept to
    their share of the workers by the scheduler, which starts them longest first)."""
    guess = expected(jobs, previous)
    return sorted(jobs, key=lambda j: guess[j.key])

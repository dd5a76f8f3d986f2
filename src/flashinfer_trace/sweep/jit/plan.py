"""Which prebuild jobs a set of definitions needs here (one per definition and kernel source whose ground truth
can run it), the configuration they run with, and the order they start in (longest first)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .report import BuildRecord

if TYPE_CHECKING:
    from ...definition import Definition

__all__ = ["DEFAULT_BUDGET", "GUESS", "KERNEL_SOURCES", "Job", "JitConfig", "keywords", "order", "plan", "select_k"]

KERNEL_SOURCES = ("flashinfer", "sglang")
DEFAULT_BUDGET = 600.0
# First guesses of a job's cost (seconds, cold, measured on an H100 with 0.6.6/0.7.2), used only to
# start the long jobs first when no earlier report says better.
GUESS = {"moe": 450, "gemm": 176, "sampling": 146, "gqa_ragged": 68, "mla_ragged": 68, "gqa_paged": 68, "rope": 59,
         "rmsnorm": 35, "mla_paged": 26, "activation": 8,
         "mamba_ssu": 90}  # mamba_ssu: a guess (one selective_state_update module per dtypes/dim/dstate)
# gdn: a guess, not measured (0.6.x gdn_prefill_sm90 compiles 32 CUTLASS sm90a kernel instantiations)
GUESS["gdn"] = 300
NVCC_GB = 4  # memory one nvcc of a CUTLASS kernel can take: bounds the compilers a job may run


@dataclass(frozen=True)
class Job:
    definition: str  # name
    path: str  # the definition file the worker loads
    op_type: str
    source: str
    api: str
    budget: float

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


def plan(definitions: Iterable[Definition], config: JitConfig) -> list[Job]:
    """A job for every kernel source whose ground truth can run the definition here (the availability
    pipeline decides, without building anything); unavailable ones need no module."""
    from ...groundtruth import GroundTruthUnavailable, get_ground_truth

    jobs = []
    for d in definitions:
        for source in config.sources:
            try:
                gt = get_ground_truth(source, d, device=config.device, prebuild=None)
            except GroundTruthUnavailable:
                continue
            job = Job(d.name, str(d.source) if d.source else d.name, d.op_type, source, gt.api, config.budget_for(d))
            if config.select is None or config.select(job):
                jobs.append(job)
    return jobs


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


def order(jobs: list[Job], previous: Iterable[BuildRecord] = ()) -> list[Job]:
    """Longest first, so the long builds do not start last: a job's earlier build time, else a guess."""
    seen = {r.key: r.seconds for r in previous if r.status in ("built", "build-timeout")}
    return sorted(jobs, key=lambda j: -seen.get(j.key, GUESS.get(j.op_type, 30)))

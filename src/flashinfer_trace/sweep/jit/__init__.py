"""JIT prebuild: compile every kernel module the ground truths need before any test runs.

FlashInfer compiles each kernel family with nvcc on first use (minutes for the largest). Left to the
tests, those builds run one after another inside test time limits, and an interrupt loses them.
Here they run in parallel, short ones first, each with its own time budget counted from its own start, and every
outcome is a record; the comparisons of a definition start as soon as its jobs have ended (PrebuildWatch):

    plan(definitions, config)  -> list[Job]            one job per (definition, kernel source) that can run here
    order(jobs, previous)      -> list[Job]            shortest expected first (recorded seconds, a known build's,
                                                       else a guess: expectations() says which)
    run(jobs, config)          -> Iterator[BuildRecord]  a pool of warm-up workers; each record streamed, the
                                                       long jobs on a bounded share of the workers; a
                                                       references or bench session's job expected past its
                                                       budget, its modules not here, is `deferred` at once
    PrebuildWatch(report).outcome(definition, source)   the same, waiting while a running prebuild has the job
    summarise(records)         -> dict                 counts by status, seconds, modules built
    JitReport.load(path).outcome(definition, source) -> BuildRecord | None   what the report says of a job

A job is a warm-up call of the ground truth on the definition's small inputs in a worker process,
so whatever modules that call needs get built, whichever FlashInfer version is installed (no
dependence on its internal JIT API). A job's modules are the JIT cache's libraries loaded in its
worker (/proc/self/maps); those that appeared or changed during the job are the ones it built. A stamp
file beside the cache remembers them: on a warm machine a job whose inputs and libraries are
unchanged is `cached` without running. A job that runs past its budget has its whole process group killed;
ninja keeps the finished objects, so the next build resumes where it stopped.

Statuses: `built` (new modules appeared), `cached` (nothing to build), `build-failed` (the
exception came from the JIT build: compiler output in `log_tail`), `build-timeout`, `deferred` (left to the
combination's `jit-` session: its cases are `not-run: building`), and `error`
(the call failed after building: not a build problem; the tests report it). The report is read
back by `availability` (the engine's `--jit-report FILE`, CheckConfig.jit_report, or a JitReport handed
over): a failed or
timed-out build makes the tests of that definition skip as `build-failed` / `build-timeout`, its own matrix state;
a deferred one makes them `not-run: building` (Status.NOT_RUN, Kind.BUILDING).

The modules: plan.py (jobs, config, order), expect.py (expected seconds and their origin, known builds, deferral),
scheduler.py (the pool, budgets, streaming), pipeline.py (the prebuild
in the background, the order comparisons start in), worker.py (the child
process that builds one job), cache.py (the JIT cache's libraries, stamps) and report.py (jit.jsonl: a leaf,
standard library only, so the ground truths read it without importing the sweep).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .expect import (
    KNOWN_BUILDS,
    Expectation,
    KnownBuild,
    expectations,
    fitting_budget,
    known_build,
    sharing_apis,
)
from .plan import (
    DEFAULT_BUDGET,
    GUESS,
    JIT_SESSION_BUDGET,
    KERNEL_SOURCES,
    LONG_SECONDS,
    LONG_SHARE,
    NVCC_GB,
    JitConfig,
    Job,
    expected,
    keywords,
    order,
    plan,
    select_k,
)
from .report import STATUSES, BuildRecord, JitReport, PrebuildWatch, read_report, state_path, summarise

if TYPE_CHECKING:
    from .cache import (
        STAMPS,
        Stamps,
        cache_roots,
        default_stamps,
        fingerprint,
        libraries,
        loaded_libraries,
        module_roots,
        new_modules,
    )
    from .scheduler import HEARTBEAT, LOG_TAIL, group_key, run
    from .scheduler import _Schedule as _Schedule
    from .worker import BUILD_FRAMES, NICE, is_build_failure, worker_main

# The names of the one-module jit.py that live in the pool, worker and cache modules, by module: loaded on first
# use (PEP 562), so that importing the report does not load them, and `python -m ...jit.worker` does not import
# its own module twice. plan.py is imported above: importing it later would bind the submodule over the
# re-exported function `plan`.
_LAZY = {
    **dict.fromkeys(("HEARTBEAT", "LOG_TAIL", "_Schedule", "group_key", "run"), "scheduler"),
    **dict.fromkeys(("BUILD_FRAMES", "NICE", "is_build_failure", "worker_main"), "worker"),
    **dict.fromkeys(("STAMPS", "Stamps", "cache_roots", "default_stamps", "fingerprint", "libraries",
                     "loaded_libraries", "module_roots", "new_modules"), "cache"),
}
_SUBMODULES = ("cache", "pipeline", "scheduler", "worker")

__all__ = ["BUILD_FRAMES", "DEFAULT_BUDGET", "GUESS", "KERNEL_SOURCES", "LOG_TAIL", "NICE", "NVCC_GB",
           "STAMPS", "STATUSES", "HEARTBEAT", "BuildRecord", "JitConfig", "JitReport", "Job", "Stamps", "cache_roots",
           "default_stamps", "fingerprint", "group_key", "is_build_failure", "keywords", "libraries",
           "loaded_libraries", "new_modules", "order", "plan", "read_report", "run", "select_k", "LONG_SECONDS",
           "LONG_SHARE", "PrebuildWatch", "expected", "state_path",
           "summarise", "worker_main", "JIT_SESSION_BUDGET", "KNOWN_BUILDS", "Expectation", "KnownBuild",
           "expectations", "fitting_budget", "known_build", "module_roots", "sharing_apis"]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_SUBMODULES})

"""A session's JIT prebuild: its jobs (for the selected tests' definitions, a `jit` session's all of them), run in
the background or answered by FlashInfer's prebuilt package, its summary, and the gate that starts each test target
once its definitions' builds have ended (those expected ready first)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .isolation import Target
from .results import JsonlStream
from .targets import target_definitions

JIT_STREAM = "jit.jsonl"


def k_expression(pytest_args: list[str]) -> str | None:
    """The -k expression among pytest arguments (the prebuild builds only for the tests it keeps)."""
    for i, a in enumerate(pytest_args):
        if a == "-k" and i + 1 < len(pytest_args):
            return pytest_args[i + 1]
        if a.startswith("-k") and len(a) > 2:
            return a[2:].lstrip("=")
    return None


def plan_prebuild(results: Path, pytest_args: list[str], *, cwd: Path | None = None, resume: bool = False,
                  budget: float | None = None, cores: int | None = None, kind: str = "references",
                  combination: str | None = None, arch: str | None = None):
    """The jobs that build every module the selected tests' kernels need, and their configuration. A `jit`
    session builds everything, an hour a job by default (JIT_SESSION_BUDGET); a references or bench session defers
    a job expected past its budget whose modules are not here to `jit-<combination>` (expect.defer)."""
    from ..check import CheckConfig, discover
    from ..dataset import definitions_dir
    from . import jit

    default = jit.JIT_SESSION_BUDGET if kind == "jit" else jit.DEFAULT_BUDGET
    config = jit.JitConfig(report=str(results / JIT_STREAM), log_dir=str(results / "jit-logs"), resume=resume,
                           select=jit.select_k(k_expression(pytest_args)), budget=budget or default,
                           stamps=jit.default_stamps(), cores=cores, arch=arch, defer=kind in ("references", "bench"),
                           defer_to=f"jit-{combination}" if combination else None)
    found = discover([str(definitions_dir(cwd / "definitions" if cwd else None))], CheckConfig())
    return jit.plan(found.definitions, config), config


class _Prebuilt:
    """FlashInfer's prebuilt package of the installed release supplies the modules: one `prebuilt` record per job,
    written at once (the interface of jit.pipeline.Background: nothing runs in the background)."""

    def __init__(self, jobs, config, package: dict):
        from . import prebuilt

        self.t0 = time.monotonic()
        self.records = prebuilt.prebuilt_records(jobs, package)
        with JsonlStream(config.report, append=config.resume) as stream:
            for r in self.records:
                stream.write(r.as_dict())
        self.ended_at = round(time.monotonic() - self.t0, 1)

    def stop(self) -> None:
        pass

    def join(self, timeout: float | None = None):
        from . import jit

        return self.records, jit.summarise(self.records) | {"wall_seconds": self.ended_at}


def start_prebuild(jobs, config, versions: dict[str, str | None] | None = None):
    """(the prebuild, what the summary notes of it): in the background (jit.Background: records to jit.jsonl, a
    progress line each to stderr), or with FlashInfer's prebuilt package of the installed release (`versions`:
    default this environment's) nothing to build, every job `prebuilt`."""
    from . import prebuilt
    from .jit.pipeline import Background
    from .manifest import package_versions

    package, why_not = prebuilt.package_of(package_versions() if versions is None else versions)
    noted = {**({"prebuilt": package} if package else {}), **({"note": why_not} if why_not else {})}
    return (_Prebuilt(jobs, config, package) if package is not None else Background(jobs, config)), noted


def finish_prebuild(background, noted: dict | None = None) -> dict:
    """Wait for the prebuild's end: its summary."""
    records, summary = background.join()
    summary |= {"report": JIT_STREAM, **(noted or {})}
    print(f"prebuild: {len(records)} job(s): " + ", ".join(f"{k} {v}" for k, v in summary["counts"].items())
          + f" in {summary['wall_seconds']} s", file=sys.stderr)
    return summary


def prebuild(results: Path, pytest_args: list[str], *, cwd: Path | None = None, resume: bool = False,
             budget: float | None = None, cores: int | None = None, versions: dict[str, str | None] | None = None
             ) -> tuple[dict, dict[str, float]]:
    """Build every module the selected tests' kernels need and wait for the end; (summary, the cache's libraries
    after it)."""
    jobs, config = plan_prebuild(results, pytest_args, cwd=cwd, resume=resume, budget=budget, cores=cores)
    return finish_prebuild(*start_prebuild(jobs, config, versions)), cache_libraries()


def cache_libraries() -> dict[str, float]:
    """The JIT cache's libraries now (what the session's builds are measured against)."""
    from . import jit

    return jit.libraries(jit.cache_roots())


def read_prebuild(results: Path):
    from . import jit

    return jit.read_report(results / JIT_STREAM)


def gate(watch, definitions: Path) -> Callable[[Target, threading.Event], None]:
    """What a test target waits for before it starts: every prebuild job of its definitions has ended (the
    definitions' tests then neither build nor wait inside their time limit), unless the run is stopped."""
    def before(target: Target, stop: threading.Event) -> None:
        names = target_definitions(target, definitions)
        if names is None:
            state = watch.state()
            names = [j.get("definition") for j in state["jobs"].values()] if state else []
        watch.wait(names, stop=stop.is_set)

    return before


def compiled_since(before: dict[str, float]) -> list[str]:
    """Modules compiled while the tests ran: the prebuild should have left none."""
    from . import jit

    return jit.new_modules(before, jit.libraries(jit.cache_roots()))

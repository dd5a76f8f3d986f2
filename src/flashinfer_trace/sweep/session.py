"""One matrix session, run inside its environment after the install:

    python -m flashinfer_trace.sweep.session references|bench|jit --combination constraints/X.toml --session NAME
        --results results/NAME [--arch sm90|auto] [--install-json FILE] [--jobs N] [--test-timeout S]
        [--no-fi-trace] [--fi-trace-op-type T ...] [-- PYTEST-ARGS]

A pipeline of plain steps: check the GPU against the combination (a mismatch is recorded and the
session skips), collect the manifest, build the JIT modules the selected tests need (jit/, in
parallel, each with its own budget; a `jit` session builds everything, an hour a job, and stops there; a references
or bench session leaves a job expected past its budget, its modules not here, to the `jit-` session: deferred at
once, its cases `not-run: building`), import FlashInfer's own definitions
where it has them (fitrace_step.py: results/<session>/fi_trace/, or a note why not) and, while the modules
build, run the tests with every file (a shard of one, a CPU session's group of small ones: targets.py) in its own
process (isolation.py: a crash or a hang fails one test, the rest still run), each started once its definitions'
builds have ended, those expected
ready first (session.json's `timeline`: seconds to the first and the last comparison), sample the clocks again,
write results/<session>/ (results.py). Exit status: 0 when everything that ran passed (cases not run
for a module still building included), 1 on test failures, 3 when the session was skipped (arch mismatch, no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..results.record import CaseRecord, from_test, parse
from ..status import HARNESS_KINDS, Status
from .combos import Combination, arch_of, load_combination
from .fitrace_step import FiTraceConfig, fi_trace_step, fi_trace_targets
from .install import torch_differences
from .isolation import Target
from .results import ERRORS, FAILURES, JsonlStream, SessionInfo, TestRecord, from_fields, read_latest, write_session
from .session_prebuild import (  # noqa: F401 - re-exported: the CLI and the tests plan and gate through here
    JIT_STREAM,
    cache_libraries,
    compiled_since,
    finish_prebuild,
    gate,
    k_expression,
    plan_prebuild,
    prebuild,
    read_prebuild,
    start_prebuild,
)
from .session_report import Timeline, bad_lines, building_lines, info_line, not_run_kinds, phase_totals
from .targets import group_small, order_targets, shard, target_definitions, target_files  # noqa: F401

EXIT_SKIPPED = 3
REFERENCE_TESTS = "tests/references"
BENCH_TESTS = "tests/bench"
# where GPU sessions keep sampler references' draws for the node's later sessions (verdict/drawstore.py)
DRAWS_ENV = "FLASHINFER_TRACE_DRAWS_DIR"
DRAWS_DIR = Path.home() / ".cache" / "flashinfer-trace" / "sampler-draws"


def detect_arch() -> str | None:
    """The first GPU's arch (sm90), from torch in this environment; None without a usable GPU."""
    try:
        import torch

        if torch.cuda.is_available():
            return arch_of(torch.cuda.get_device_capability(0))
    except Exception:  # noqa: BLE001 - a torch that cannot see the GPU is "no GPU" here
        return None
    return None


def check_gpu(combo: Combination, arch: str | None) -> tuple[str, str | None, str | None]:
    """(status, reason, arch): "ok", or "no-gpu" / "arch-mismatch" with why."""
    if not combo.gpu:
        return "ok", None, None
    found = detect_arch()
    if found is None:
        return "no-gpu", f"{combo.id} needs a CUDA GPU; torch sees none", None
    if arch not in (None, "auto") and found != arch:
        return "arch-mismatch", f"session is for {arch}, the GPU is {found}", found
    if found not in combo.archs:
        return "arch-mismatch", f"{combo.id} supports {', '.join(combo.archs)}, the GPU is {found}", found
    return "ok", None, found


def pytest_args(kind: str, combo: Combination, results: Path, extra: list[str], fresh_seed: int | None = None
                ) -> list[str]:
    if kind == "bench":  # the report: a module the prebuild could not build, or deferred, is not built in a test
        report = [f"--bench-jit-report={results / JIT_STREAM}"] if combo.gpu else []
        return [f"--benchmark-json={results / 'benchmark.json'}", f"--bench-stream={results / 'benchmark.jsonl'}",
                *report, "-p", "no:xdist", *extra]
    device = "cuda" if combo.gpu else "cpu"
    report = [f"--jit-report={results / JIT_STREAM}"] if combo.gpu else []  # the tests skip what it could not build
    # a sampler reference's draws are the same in every release's session on this torch and GPU: made once
    if combo.gpu and not any(a.startswith("--draws-store") for a in extra):
        report.append(f"--draws-store={os.environ.get(DRAWS_ENV) or DRAWS_DIR}")
    # one fresh seed for every test process of the session (they collect the same cases); the user's wins
    fresh = [] if fresh_seed is None or any(a.startswith("--fresh-seed") for a in extra) else [
        f"--fresh-seed={fresh_seed}"]
    # the test processes share one GPU: each case takes its memory from the device's budget (budget/)
    return [f"--device={device}", f"--save-failures={results / 'failures'}", *report, *fresh, *QUIET_PLUGINS, *extra]


# pytest plugins a reference test process has no use for, each a cost in every one of ~17k tests or ~35 processes:
# logging attaches its capture handler to each of torch's ~40 non-propagating loggers three times a test (~2 ms;
# a log line still reaches the test's captured stderr), hypothesis imports itself whole for its terminal summary
QUIET_PLUGINS = ("-p", "no:logging", "-p", "no:hypothesispytest")


def session_fresh_seed(results: Path, resume: bool) -> int:
    """A new fresh seed, or the interrupted session's when resuming (its finished cases keep theirs)."""
    from ..options import fresh_seed

    if resume:
        try:
            earlier = json.loads((results / "session.json").read_text()).get("fresh_seed")
        except (OSError, ValueError):
            earlier = None
        if isinstance(earlier, int):
            return earlier
    return fresh_seed(None)


def torch_differences_found(combo: Combination, install: dict | None, torch: dict | None) -> list[str]:
    """How the torch this session imports differs from its combination's pin: the install's own finding (a
    preinstalled torch), else the manifest's torch. PyPI's Linux torch is a CUDA build, so a CPU combination
    installed without the CPU index runs on `2.8.0+cu128`; the matrix's environment says so, not only the pin."""
    if install and install.get("differences"):
        return list(install["differences"])
    if not isinstance(torch, dict) or not torch.get("version"):
        return []  # no torch to compare (its import failed: the manifest records the error)
    return torch_differences(combo, torch)


@dataclass
class SessionConfig:
    """One session's settings: `main`'s arguments. `fi_trace`: the fi_trace step's config (a references
    session; default: the installed FlashInfer's version, emitted on the session's device);
    FiTraceConfig(enabled=False) leaves it out."""

    kind: str  # references | bench | jit
    combo: Combination
    session: str
    results: Path
    arch: str | None = None
    install: dict | None = None
    jobs: int = 1
    test_timeout: float = 900.0
    extra: list[str] | None = None  # the test processes' pytest arguments
    cwd: Path | None = None
    resume: bool = False
    jit_budget: float | None = None
    cores: int | None = None
    fi_trace: FiTraceConfig | None = None

    @property
    def definitions(self) -> Path:
        return (self.cwd or Path(".")) / "definitions"


@dataclass
class SessionState:
    """What one step hands the next: the session's record as it grows, and what runs in the background."""

    info: SessionInfo
    manifest: dict
    t0: float
    targets: list[Target] = field(default_factory=list)
    earlier: list = field(default_factory=list)  # a resumed run's records
    builds: list | None = None  # the prebuild's jobs (a GPU combination)
    background: Any = None  # the running prebuild (jit.pipeline.Background)
    noted: dict = field(default_factory=dict)
    built_before: dict[str, float] | None = None  # the JIT cache's libraries before the prebuild
    before: Callable | None = None  # the gate a test target waits at until its definitions' modules are built
    timeline: Timeline | None = None  # set once the tests start
    records: list = field(default_factory=list)


class Done(Exception):
    """A step ended the session with this exit status; the session's record is written."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def start(_: None, c: SessionConfig) -> SessionState:
    from . import manifest as mf
    from . import mps

    started, t0 = mf.now(), time.monotonic()
    if "--allow-unconfined-references" in (c.extra or []):  # the manifest records it; the children inherit it
        from ..sandbox import configure

        configure(allow_unconfined=True)
    info = SessionInfo(c.session, c.combo.id, install_mode=(c.install or {}).get("mode"),
                       constraints_file=str(c.combo.path), constraints_sha256=c.combo.sha256, started=started,
                       mps=mps.recorded(),
                       fresh_seed=session_fresh_seed(c.results, c.resume) if c.kind == "references" else None)
    manifest = mf.collect(combination=c.combo.metadata(), install=c.install, repo=c.cwd or ".")
    if c.combo.gpu:  # its version, folder, namespace and counters before; finish() adds those after
        from . import compiler_cache

        manifest["compiler_cache"] = compiler_cache.start_record(compiler_cache.recorded())
    return SessionState(info, manifest, t0)


def check_device(s: SessionState, c: SessionConfig) -> SessionState:
    """No GPU, or another arch than the session's: recorded, and the session skips."""
    from . import manifest as mf

    status, reason, found = check_gpu(c.combo, c.arch)
    s.info.arch = found or (c.arch if c.combo.gpu else "cpu")
    if status != "ok":
        s.info.status, s.info.reason = status, reason
        s.info.finished, s.info.wall_seconds = mf.now(), round(time.monotonic() - s.t0, 1)
        write_session(c.results, s.info, manifest=mf.finish(s.manifest))
        print(f"{c.session}: {status}: {reason}", file=sys.stderr)
        raise Done(EXIT_SKIPPED)
    differences = torch_differences_found(c.combo, c.install, s.manifest.get("torch"))
    if differences:
        s.info.reason = "; ".join(differences)
    return s


def collect(s: SessionState, c: SessionConfig) -> SessionState:
    from .isolation import collect_files

    s.targets = collect_files([str((c.cwd or Path(".")) / (BENCH_TESTS if c.kind == "bench" else REFERENCE_TESTS))])
    s.earlier = streamed_records(c.results, c.kind) if c.resume else []
    s.info.status = "running"  # until the end: a session killed outright is read as partial, from tests.jsonl
    write_session(c.results, s.info, manifest=s.manifest)
    return s


def start_builds(s: SessionState, c: SessionConfig) -> SessionState:
    """A GPU combination's JIT prebuild, started in the background (jit/)."""
    if c.combo.gpu:
        s.builds, config = plan_prebuild(c.results, c.extra or [], cwd=c.cwd, resume=c.resume, budget=c.jit_budget,
                                         cores=c.cores, kind=c.kind, combination=c.combo.id,
                                         arch=s.info.arch if s.info.arch not in (None, "cpu") else None)
        s.built_before = cache_libraries()
        s.background, s.noted = start_prebuild(s.builds, config)
    return s


def jit_only(s: SessionState, c: SessionConfig) -> SessionState:
    """A `jit` session ends with its prebuild."""
    from . import manifest as mf

    if c.kind != "jit":
        return s
    if s.background is not None:
        s.info.jit, s.background = finish_prebuild(s.background, s.noted), None
        write_session(c.results, s.info, manifest=s.manifest)
    if s.info.jit is None:
        s.info.jit = {"counts": {}, "wall_seconds": 0.0, "note": f"{c.combo.id} has no GPU: nothing to build"}
    bad = {k: v for k, v in s.info.jit["counts"].items() if k in ("build-failed", "build-timeout")}
    s.info.status, s.info.reason = "ok", ", ".join(f"{k} {v}" for k, v in bad.items()) or None
    s.info.finished, s.info.wall_seconds = mf.now(), round(time.monotonic() - s.t0, 1)
    write_session(c.results, s.info, manifest=mf.finish(s.manifest))
    print(f"{c.session}: prebuild: " + ", ".join(f"{k} {v}" for k, v in s.info.jit["counts"].items())
          + f" in {s.info.jit['wall_seconds']} s", file=sys.stderr)
    raise Done(1 if bad else 0)


def bench_waits(s: SessionState, c: SessionConfig) -> SessionState:
    """Timings beside running compiles would be the compiles': a bench session waits for its whole prebuild."""
    if c.kind == "bench" and s.background is not None:
        s.info.jit, s.background = finish_prebuild(s.background, s.noted), None
    return s


def reference_targets(s: SessionState, c: SessionConfig) -> SessionState:
    """A references session's targets and their gate: FlashInfer's own definitions imported (or a note why not),
    the files sharded; while the modules build, the targets whose modules are expected ready first, each
    started once its definitions' builds have ended."""
    if c.kind != "references":
        return s
    step = fi_trace_step(c.results, c.fi_trace or session_fi_trace(c.combo, c.resume))
    s.info.fi_trace = step.as_dict()
    write_session(c.results, s.info, manifest=s.manifest)
    print(f"{c.session}: fi_trace: {step.status}" + (f" {step.count} definition(s)" if step.imported else "")
          + (f": {step.detail}" if step.detail else ""), file=sys.stderr)
    kept, own = fi_trace_targets(step, c.results, s.targets)
    s.targets = shard(kept, c.jobs, c.definitions, own)
    if not c.combo.gpu:  # a GPU session's targets wait for their own modules: kept one file each there
        s.targets = group_small(s.targets, c.jobs, c.definitions)
    if s.builds is not None:
        from .jit import PrebuildWatch
        from .jit.pipeline import readiness

        deferred = [r.key for r in read_prebuild(c.results) if r.status == "deferred"]  # written before the tests
        ready = readiness(s.builds, read_prebuild(c.results) if c.resume else (), settled=deferred)
        s.targets = order_targets(s.targets, ready, c.definitions)
        s.before = gate(PrebuildWatch(c.results / JIT_STREAM), c.definitions)
    return s


def run_tests(s: SessionState, c: SessionConfig) -> SessionState:
    """Every target in its own process (isolation.py), each record streamed to tests.jsonl as it ends."""
    from .isolation import run_isolated

    convert = record_of(c.kind, f"{c.combo.id}@{s.info.arch}")
    s.timeline = Timeline(s.t0)
    jobs = 1 if c.kind == "bench" else c.jobs
    with JsonlStream(c.results / STREAM, append=c.resume) as stream:
        def streamed(r: TestRecord) -> None:
            record = convert(r)
            s.timeline.note(record)
            stream.write(record.as_dict())

        s.records = s.earlier + [convert(r) for r in run_isolated(
            s.targets, pytest_args(c.kind, c.combo, c.results, c.extra or [], s.info.fresh_seed),
            python=sys.executable, env=child_environment(jobs, c.cores), cwd=str(c.cwd) if c.cwd else None,
            test_timeout=c.test_timeout, jobs=jobs, log_dir=c.results / "logs", on_record=streamed,
            skip={r.nodeid for r in s.earlier}, before=s.before)]
    if s.background is not None:
        s.info.jit = finish_prebuild(s.background, s.noted)
    return s


def rerun_alone(s: SessionState, c: SessionConfig) -> SessionState:
    """The cases that ran out of device memory (or whose reference worker the device refused) beside the other
    test processes, run again once those have all ended: one process, the device to itself. The ledger's
    alone lease waits for the other cases' leases, not for the memory other processes hold outside them
    (contexts, libraries' workspaces, caches): on the H200 such cases got 1-10 GiB of a free device. Out of
    memory here is the harness's failure still, never a verdict; the later record replaces the earlier."""
    from .isolation import run_isolated

    if c.kind != "references" or not s.records:
        return s
    latest = {r.nodeid: r for r in s.records}
    again = {n for n, r in latest.items() if r.status is Status.NOT_RUN and r.kind in HARNESS_KINDS}
    files = {Path(n.partition("::")[0]).name for n in again}
    targets = [t for t in s.targets if any(Path(f).name in files for f in target_files(t))]
    if not again or not targets:
        return s
    print(f"{c.session}: {len(again)} case(s) out of memory beside the others: run again, alone", file=sys.stderr)
    convert = record_of(c.kind, f"{c.combo.id}@{s.info.arch}")
    with JsonlStream(c.results / STREAM, append=True) as stream:
        def streamed(r: TestRecord) -> None:
            record = convert(r)
            record.memory = {**(record.memory or {}), "rerun_alone": True}
            latest[record.nodeid] = record
            stream.write(record.as_dict())

        run_isolated(targets, pytest_args(c.kind, c.combo, c.results, c.extra or [], s.info.fresh_seed),
                     python=sys.executable, env=child_environment(1, c.cores), cwd=str(c.cwd) if c.cwd else None,
                     test_timeout=c.test_timeout, jobs=1, log_dir=c.results / "logs" / "alone", on_record=streamed,
                     skip=set(latest) - again)
    s.records = list(latest.values())
    return s


def finish(s: SessionState, c: SessionConfig) -> int:
    """The session's record, a summary line, one line per failed test and one line for the info ones (not
    failures: their kernels differ where the API promises nothing); 1 when any failed."""
    from . import manifest as mf

    info = s.info
    info.timeline = s.timeline.as_dict(s.background)
    from ..results.memory import memory_line, memory_summary

    bad = [r for r in s.records if str(r.status) in FAILURES + ERRORS]
    info.memory = memory_summary(s.records)
    # the harness failed (out of memory, a worker the device refused): no cell can say green
    harness = bool(info.memory and info.memory.get("harness", info.memory["out_of_memory"]))
    # a case not run (building: a jit- session's module) is no failure
    info.status = "harness-failed" if harness else "tests-failed" if bad else "ok"
    info.not_run = not_run_kinds(s.records)
    outside = [r for r in s.records if str(r.status) == Status.INFO.value]  # differs where no promise is made
    info.phases = phase_totals(s.records)
    if s.built_before is not None and info.jit is not None:  # modules the tests built, not the prebuild
        info.jit["compiled_during_tests"] = sorted(set(compiled_since(s.built_before))
                                                   - set(info.jit.get("modules_built", ())))
    info.finished, info.wall_seconds = mf.now(), round(time.monotonic() - s.t0, 1)
    write_session(c.results, info, records=s.records, manifest=mf.finish(s.manifest))
    seed = f", fresh seed {info.fresh_seed}" if info.fresh_seed is not None else ""
    print(f"{c.session}: {info.status}: " + ", ".join(f"{k} {v}" for k, v in info.counts.items())
          + f" in {info.wall_seconds} s{seed}", file=sys.stderr)
    memory = [line] if (line := memory_line(info.memory)) else []
    for line in [*bad_lines(bad), *building_lines(info, c.session, c.combo.id), *memory]:
        print(line, file=sys.stderr)
    if outside:
        print(info_line(outside), file=sys.stderr)
    return 1 if bad or harness else 0


# the session, step by step: each takes the last one's state and the config; a step may end it (Done)
STEPS = (start, check_device, collect, start_builds, jit_only, bench_waits, reference_targets, run_tests,
         rerun_alone)


def run_session(kind: str, combo: Combination, session: str, results: Path, **options: Any) -> int:
    """Run STEPS, then `finish`; Ctrl-C at any step keeps what was done (`interrupted`). `options`: the rest of
    SessionConfig's fields."""
    config = SessionConfig(kind, combo, session, results, **options)
    state = None
    try:
        for step in STEPS:
            state = step(state, config)
    except Done as done:
        return done.code
    except KeyboardInterrupt:
        if state is None:
            raise
        return interrupted(state, config)
    return finish(state, config)


STREAM = "tests.jsonl"


def _prebuild_so_far(results: Path) -> dict:
    from . import jit

    return jit.summarise(jit.read_report(results / JIT_STREAM)) | {"interrupted": True, "report": JIT_STREAM}


def interrupted(s: SessionState, c: SessionConfig) -> int:
    """Ctrl-C (or a SIGINT from a time limit): the builds that finished are in jit.jsonl, every test record
    streamed so far (an earlier run's too) in tests.jsonl; both become the session's result."""
    from . import manifest as mf

    testing = s.timeline is not None
    if s.background is not None:
        s.background.stop()
    if s.background is not None or (c.combo.gpu and not testing):
        s.info.jit = _prebuild_so_far(c.results)
    if testing:
        s.info.timeline = s.timeline.as_dict(s.background)
    where = "" if testing else "during the JIT prebuild " if c.combo.gpu else "before the tests "
    records = streamed_records(c.results, c.kind)
    s.info.status = "interrupted"
    s.info.reason = f"interrupted {where}after {len(records)} test(s); --resume goes on"
    s.info.finished, s.info.wall_seconds = mf.now(), round(time.monotonic() - s.t0, 1)
    write_session(c.results, s.info, records=records, manifest=mf.finish(s.manifest))
    print(f"{s.info.session}: {s.info.reason} ({c.results})", file=sys.stderr)
    return 130


def record_of(kind: str, environment: str):
    """What a session records per test: a references session the CaseRecord each test made (the matrix
    reads these), with the environment it ran in; a bench session pytest's own record."""
    if kind != "references":
        return lambda test: test

    def convert(test: TestRecord) -> CaseRecord:
        record = from_test(test.as_dict())
        record.environment = environment
        return record

    return convert


def child_environment(jobs: int, cores: int | None = None) -> dict[str, str]:
    """The test processes' environment: each gets its share of the cores for torch's CPU threads
    (the comparisons run in float64 on the CPU). Left alone, each of N processes starts one thread
    per core, N x cores threads in all, and OpenMP's spinning threads then slow every CPU op. `cores`: the
    session's share of the host (sessions side by side on several GPUs), else every core."""
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (cores or os.cpu_count() or 1) // max(1, jobs)))
    return env


def session_fi_trace(combo: Combination, resume: bool, versions: dict[str, str | None] | None = None,
                     op_types: tuple[str, ...] | None = None, enabled: bool = True) -> FiTraceConfig:
    """The fi_trace step of a session in this environment: the installed FlashInfer (`versions`: default this
    environment's), emitted on the session's device (a GPU lets the inits that need CUDA emit)."""
    from .manifest import package_versions

    found = package_versions() if versions is None else versions
    return FiTraceConfig(flashinfer=found.get("flashinfer-python"), enabled=enabled, op_types=op_types,
                         device="cuda" if combo.gpu else "cpu", reuse=resume)


def streamed_records(results: Path, kind: str = "references") -> list[TestRecord] | list[CaseRecord]:
    """The records a session streamed (one per node id, the last wins), in the order written."""
    if kind == "references":
        return read_latest(results / STREAM, parse, lambda r: r.nodeid)
    return read_latest(results / STREAM, from_fields(TestRecord), lambda r: r.nodeid)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashinfer_trace.sweep.session", description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=("references", "bench", "jit"))
    p.add_argument("--combination", required=True)
    p.add_argument("--session", required=True)
    p.add_argument("--results", required=True)
    p.add_argument("--arch", default="auto")
    p.add_argument("--install-json", help="the install step's result (mode, differences)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--test-timeout", type=float, default=900.0)
    p.add_argument("--resume", action="store_true", help="keep the tests already in tests.jsonl, run the rest")
    p.add_argument("--jit-budget", type=float, help="seconds per prebuild job (default 600; a jit session's 3600)")
    p.add_argument("--cores", type=int, help="this session's share of the host's cores (default: all)")
    p.add_argument("--no-fi-trace", action="store_true",
                   help="do not import and check FlashInfer's own definitions (fi_trace, >= 0.7)")
    p.add_argument("--fi-trace-op-type", action="append", metavar="T",
                   help="import only these op types of FlashInfer's own definitions (repeatable; default all)")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:cut])
    args.pytest_args = argv[cut + 1:]
    install = json.loads(Path(args.install_json).read_text()) if args.install_json else None
    combo = load_combination(args.combination)
    fi_trace = session_fi_trace(combo, args.resume, op_types=tuple(args.fi_trace_op_type or ()) or None,
                                enabled=not args.no_fi_trace)
    return run_session(args.kind, combo, args.session, Path(args.results),
                       arch=args.arch, install=install, jobs=args.jobs, test_timeout=args.test_timeout,
                       extra=args.pytest_args, cwd=Path.cwd(), resume=args.resume, jit_budget=args.jit_budget,
                       cores=args.cores, fi_trace=fi_trace)


if __name__ == "__main__":
    sys.exit(main())

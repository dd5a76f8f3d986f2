"""One matrix session, run inside its environment after the install:

    python -m flashinfer_trace.sweep.session references|bench|jit --combination constraints/X.toml --session NAME
        --results results/NAME [--arch sm90|auto] [--install-json FILE] [--jobs N] [--test-timeout S]
        [--no-fi-trace] [--fi-trace-op-type T ...] [-- PYTEST-ARGS]

A pipeline of plain steps: check the GPU against the combination (a mismatch is recorded and the
session skips), collect the manifest, build the JIT modules the selected tests need (jit/, in
parallel, each with its own budget; a `jit` session stops there), import FlashInfer's own definitions
where it has them (fitrace_step.py: results/<session>/fi_trace/, or a note why not) and, while the modules
build, run the tests with every file (or shard of one) in its own process (isolation.py: a crash or a hang
fails one test, the rest still run), each started once its definitions' builds have ended, those expected
ready first (session.json's `timeline`: seconds to the first and the last comparison), sample the clocks again,
write results/<session>/ (results.py). Exit status: 0 when everything ran and passed, 1 on test
failures, 3 when the session was skipped (arch mismatch, no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..results.record import CaseRecord, from_test, parse
from .combos import Combination, arch_of, load_combination
from .fitrace_step import FiTraceConfig, fi_trace_step, fi_trace_targets
from .install import torch_differences
from .isolation import Target
from .results import ERRORS, FAILURES, JsonlStream, SessionInfo, TestRecord, from_fields, read_latest, write_session

EXIT_SKIPPED = 3
REFERENCE_TESTS = "tests/references"
BENCH_TESTS = "tests/bench"


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


def pytest_args(kind: str, combo: Combination, results: Path, extra: list[str], fresh_seed: int | None = None,
                jobs: int = 1) -> list[str]:
    if kind == "bench":
        return [f"--benchmark-json={results / 'benchmark.json'}", f"--bench-stream={results / 'benchmark.jsonl'}",
                "-p", "no:xdist", *extra]
    device = "cuda" if combo.gpu else "cpu"
    report = [f"--jit-report={results / JIT_STREAM}"] if combo.gpu else []  # the tests skip what it could not build
    # one fresh seed for every test process of the session (they collect the same cases); the user's wins
    fresh = [] if fresh_seed is None or any(a.startswith("--fresh-seed") for a in extra) else [
        f"--fresh-seed={fresh_seed}"]
    # the test processes share one GPU: a case that needs more than its share of the memory is too-large
    share = [f"--gpu-share={jobs}"] if combo.gpu and jobs > 1 else []
    return [f"--device={device}", f"--save-failures={results / 'failures'}", *report, *fresh, *share, *extra]


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


def run_session(kind: str, combo: Combination, session: str, results: Path, *, arch: str | None = None,
                install: dict | None = None, jobs: int = 1, test_timeout: float = 900.0,
                extra: list[str] | None = None, cwd: Path | None = None, resume: bool = False,
                jit_budget: float | None = None, cores: int | None = None,
                fi_trace: FiTraceConfig | None = None) -> int:
    """`fi_trace`: the fi_trace step's config (a references session; default: the installed FlashInfer's
    version, emitted on the session's device); FiTraceConfig(enabled=False) leaves it out."""
    from . import manifest as mf
    from . import mps
    from .isolation import collect_files, run_isolated

    started, t0 = mf.now(), time.monotonic()
    if "--allow-unconfined-references" in (extra or []):  # the manifest records it; the children inherit it
        from ..sandbox import configure

        configure(allow_unconfined=True)
    info = SessionInfo(session, combo.id, install_mode=(install or {}).get("mode"), constraints_file=str(combo.path),
                       constraints_sha256=combo.sha256, started=started, mps=mps.recorded(),
                       fresh_seed=session_fresh_seed(results, resume) if kind == "references" else None)
    manifest = mf.collect(combination=combo.metadata(), install=install, repo=cwd or ".")
    if combo.gpu:  # its version, folder, namespace and counters before; finish() adds those after
        from . import compiler_cache

        manifest["compiler_cache"] = compiler_cache.start_record(compiler_cache.recorded())
    status, reason, found = check_gpu(combo, arch)
    info.arch = found or (arch if combo.gpu else "cpu")
    if status != "ok":
        info.status, info.reason = status, reason
        info.finished, info.wall_seconds = mf.now(), round(time.monotonic() - t0, 1)
        write_session(results, info, manifest=mf.finish(manifest))
        print(f"{session}: {status}: {reason}", file=sys.stderr)
        return EXIT_SKIPPED
    differences = torch_differences_found(combo, install, manifest.get("torch"))
    if differences:
        info.reason = "; ".join(differences)
    folder = BENCH_TESTS if kind == "bench" else REFERENCE_TESTS
    targets = collect_files([str((cwd or Path(".")) / folder)])
    earlier = streamed_records(results, kind) if resume else []
    info.status = "running"  # until the end: a session killed outright is read as partial, from tests.jsonl
    write_session(results, info, manifest=manifest)
    built_before, background, before, noted, builds = None, None, None, {}, None
    definitions = (cwd or Path(".")) / "definitions"
    try:
        if combo.gpu:
            builds, config = plan_prebuild(results, extra or [], cwd=cwd, resume=resume, budget=jit_budget,
                                           cores=cores)
            built_before = cache_libraries()
            background, noted = start_prebuild(builds, config)
            if kind == "jit":
                info.jit = finish_prebuild(background, noted)
                write_session(results, info, manifest=manifest)
    except KeyboardInterrupt:  # the finished builds are in jit.jsonl, an earlier run's tests in tests.jsonl
        return _interrupted_prebuild(info, results, manifest, t0, kind, background)
    if kind == "jit":
        if info.jit is None:
            info.jit = {"counts": {}, "wall_seconds": 0.0, "note": f"{combo.id} has no GPU: nothing to build"}
        bad = {k: v for k, v in info.jit["counts"].items() if k in ("build-failed", "build-timeout")}
        info.status, info.reason = "ok", ", ".join(f"{k} {v}" for k, v in bad.items()) or None
        info.finished, info.wall_seconds = mf.now(), round(time.monotonic() - t0, 1)
        write_session(results, info, manifest=mf.finish(manifest))
        print(f"{session}: prebuild: " + ", ".join(f"{k} {v}" for k, v in info.jit["counts"].items())
              + f" in {info.jit['wall_seconds']} s", file=sys.stderr)
        return 1 if bad else 0
    if kind == "bench" and background is not None:  # timings beside running compiles would be the compiles'
        try:
            info.jit, background = finish_prebuild(background, noted), None
        except KeyboardInterrupt:
            return _interrupted_prebuild(info, results, manifest, t0, kind, background)
    if kind == "references":  # FlashInfer's own definitions, imported here, run beside ours (test_fi_trace.py)
        try:
            targets, before = reference_targets(targets, info, results, manifest, combo, fi_trace, resume=resume,
                                                jobs=jobs, definitions=definitions, builds=builds)
        except KeyboardInterrupt:
            return _interrupted_prebuild(info, results, manifest, t0, kind, background)
    convert = record_of(kind, f"{combo.id}@{info.arch}")
    timeline = Timeline(t0)

    def streamed(r: TestRecord) -> None:
        record = convert(r)
        timeline.note(record)
        stream.write(record.as_dict())

    try:
        with JsonlStream(results / STREAM, append=resume) as stream:
            records = earlier + [convert(r) for r in run_isolated(
                targets, pytest_args(kind, combo, results, extra or [], info.fresh_seed, jobs), python=sys.executable,
                env=child_environment(1 if kind == "bench" else jobs, cores),
                cwd=str(cwd) if cwd else None, test_timeout=test_timeout, jobs=1 if kind == "bench" else jobs,
                log_dir=results / "logs", on_record=streamed, skip={r.nodeid for r in earlier}, before=before)]
        if background is not None:
            info.jit = finish_prebuild(background, noted)
    except KeyboardInterrupt:  # what finished is in the stream: keep it readable as the session's result
        if background is not None:
            background.stop()
            info.jit = _prebuild_so_far(results)
        info.timeline = timeline.as_dict(background)
        return _interrupted(info, results, manifest, t0, "", kind)
    info.timeline = timeline.as_dict(background)
    bad = [r for r in records if str(r.status) in FAILURES + ERRORS]
    info.status = "tests-failed" if bad else "ok"
    info.phases = phase_totals(records)
    if built_before is not None and info.jit is not None:  # modules the tests built, not the prebuild
        info.jit["compiled_during_tests"] = sorted(set(compiled_since(built_before))
                                                   - set(info.jit.get("modules_built", ())))
    info.finished, info.wall_seconds = mf.now(), round(time.monotonic() - t0, 1)
    write_session(results, info, records=records, manifest=mf.finish(manifest))
    seed = f", fresh seed {info.fresh_seed}" if info.fresh_seed is not None else ""
    print(f"{session}: {info.status}: " + ", ".join(f"{k} {v}" for k, v in info.counts.items())
          + f" in {info.wall_seconds} s{seed}", file=sys.stderr)
    for line in bad_lines(bad):
        print(line, file=sys.stderr)
    return 1 if bad else 0


def reference_targets(files: list[str], info: SessionInfo, results: Path, manifest: dict, combo: Combination,
                      fi_trace: FiTraceConfig | None, *, resume: bool, jobs: int, definitions: Path,
                      builds: list | None) -> tuple[list[Target], Callable | None]:
    """A references session's targets and their gate: FlashInfer's own definitions imported (or a note why not),
    the files sharded; while the modules build, the targets whose modules are expected ready first, each
    started once its definitions' builds have ended."""
    step = fi_trace_step(results, fi_trace or session_fi_trace(combo, resume))
    info.fi_trace = step.as_dict()
    write_session(results, info, manifest=manifest)
    print(f"{info.session}: fi_trace: {step.status}" + (f" {step.count} definition(s)" if step.imported else "")
          + (f": {step.detail}" if step.detail else ""), file=sys.stderr)
    kept, own = fi_trace_targets(step, results, files)
    targets = shard(kept, jobs, definitions, own)
    if builds is None:
        return targets, None
    from .jit import PrebuildWatch
    from .jit.pipeline import readiness

    ready = readiness(builds, read_prebuild(results) if resume else ())
    return order_targets(targets, ready, definitions), gate(PrebuildWatch(results / JIT_STREAM), definitions)


def bad_lines(bad: list, limit: int = 20) -> list[str]:
    """One line per failed or errored test, so a CI log names them without the results folder: the test,
    its status and kind, the first line of its detail (escaped: a definition controls the message)."""
    from ..escape import for_terminal

    lines = []
    for r in bad[:limit]:
        if isinstance(r, CaseRecord):
            name, why = r.nodeid or r.definition, f"{r.status}" + (f" [{r.kind}]" if r.kind else "")
            detail = (r.detail or "").strip().splitlines()
        else:
            name, why, detail = r.nodeid, str(r.status), (r.message or "").strip().splitlines()
        lines.append(f"  {for_terminal(name)}: {why}" + (f": {for_terminal(detail[0][:300])}" if detail else ""))
    if len(bad) > limit:
        lines.append(f"  ... and {len(bad) - limit} more (the session's results folder has them all)")
    return lines


STREAM = "tests.jsonl"
JIT_STREAM = "jit.jsonl"


def _prebuild_so_far(results: Path) -> dict:
    from . import jit

    return jit.summarise(jit.read_report(results / JIT_STREAM)) | {"interrupted": True, "report": JIT_STREAM}


def _interrupted_prebuild(info: SessionInfo, results: Path, manifest: dict, t0: float, kind: str,
                          background) -> int:
    if background is not None:
        background.stop()
    info.jit = _prebuild_so_far(results)
    return _interrupted(info, results, manifest, t0, "during the JIT prebuild", kind)


def _interrupted(info: SessionInfo, results: Path, manifest: dict, t0: float, where: str, kind: str) -> int:
    """Ctrl-C (or a SIGINT from a time limit): every record streamed so far becomes the session's result."""
    from . import manifest as mf

    records = streamed_records(results, kind)
    info.status = "interrupted"
    info.reason = f"interrupted {where + ' ' if where else ''}after {len(records)} test(s); --resume goes on"
    info.finished, info.wall_seconds = mf.now(), round(time.monotonic() - t0, 1)
    write_session(results, info, records=records, manifest=mf.finish(manifest))
    print(f"{info.session}: {info.reason} ({results})", file=sys.stderr)
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


def phase_totals(records: list[TestRecord] | list[CaseRecord]) -> dict[str, float]:
    """Where the tests' time went, summed over every test (each records its `phases`)."""
    totals: dict[str, float] = {}
    for r in records:
        phases = r.phases if isinstance(r, CaseRecord) else r.properties.get("phases")
        for k, v in (phases.items() if isinstance(phases, dict) else ()):
            if isinstance(v, (int, float)):
                totals[k] = totals.get(k, 0.0) + v
    return {k: round(v, 1) for k, v in totals.items()}


def child_environment(jobs: int, cores: int | None = None) -> dict[str, str]:
    """The test processes' environment: each gets its share of the cores for torch's CPU threads
    (the comparisons run in float64 on the CPU). Left alone, each of N processes starts one thread
    per core, N x cores threads in all, and OpenMP's spinning threads then slow every CPU op. `cores`: the
    session's share of the host (sessions side by side on several GPUs), else every core."""
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (cores or os.cpu_count() or 1) // max(1, jobs)))
    return env


def shard(files: list[str], jobs: int, definitions: Path, own: dict[str, tuple] | None = None) -> list[Target]:
    """Test files split into shards that run side by side: about 2 x jobs processes in all, each file's
    share in proportion to its definitions (test_<op>.py: definitions/<op>/), so a file with many
    definitions (GEMM's) is not the whole session's critical path. `own`: a file's pytest arguments of its
    own (test_fi_trace.py: --fi-trace-definitions DIR, whose definitions it counts, every op type)."""
    own = own or {}

    def target(f: str, *more: str) -> Target:
        args = (*own.get(f, ()), *more)
        return (f, args) if args else f

    if jobs <= 1:
        return [target(f) for f in files]

    def count(f: str) -> int:
        if f in own and len(own[f]) >= 2:
            return len(list(Path(own[f][1]).rglob("*.json")))
        return len(list((definitions / Path(f).stem.removeprefix("test_")).glob("*.json")))

    counts = {f: max(1, count(f)) for f in files}
    total = sum(counts.values())
    out: list[Target] = []
    for f in sorted(files, key=lambda f: -counts[f]):  # the big files first: their shards start early
        n = max(1, min(counts[f], round(2 * jobs * counts[f] / total)))
        out += [target(f)] if n == 1 else [target(f, "--shard", f"{i}/{n}") for i in range(n)]
    return out


def session_fi_trace(combo: Combination, resume: bool, versions: dict[str, str | None] | None = None,
                     op_types: tuple[str, ...] | None = None, enabled: bool = True) -> FiTraceConfig:
    """The fi_trace step of a session in this environment: the installed FlashInfer (`versions`: default this
    environment's), emitted on the session's device (a GPU lets the inits that need CUDA emit)."""
    from .manifest import package_versions

    found = package_versions() if versions is None else versions
    return FiTraceConfig(flashinfer=found.get("flashinfer-python"), enabled=enabled, op_types=op_types,
                         device="cuda" if combo.gpu else "cpu", reuse=resume)


def k_expression(pytest_args: list[str]) -> str | None:
    """The -k expression among pytest arguments (the prebuild builds only for the tests it keeps)."""
    for i, a in enumerate(pytest_args):
        if a == "-k" and i + 1 < len(pytest_args):
            return pytest_args[i + 1]
        if a.startswith("-k") and len(a) > 2:
            return a[2:].lstrip("=")
    return None


def plan_prebuild(results: Path, pytest_args: list[str], *, cwd: Path | None = None, resume: bool = False,
                  budget: float | None = None, cores: int | None = None):
    """The jobs that build every module the selected tests' kernels need, and their configuration."""
    from ..check import CheckConfig, discover
    from ..dataset import definitions_dir
    from . import jit

    config = jit.JitConfig(report=str(results / JIT_STREAM), log_dir=str(results / "jit-logs"), resume=resume,
                           select=jit.select_k(k_expression(pytest_args)), budget=budget or jit.DEFAULT_BUDGET,
                           stamps=jit.default_stamps(), cores=cores)
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


def target_definitions(target: Target, definitions: Path) -> list[str] | None:
    """The definitions a test target runs (test_<op>.py: definitions/<op>/; a `--shard I/N` of it: every N-th of
    their sorted names from the I-th, the plugin's rule); None when not known (the target then waits for the whole
    prebuild). A -k filter can move definitions between shards: their cases then wait inside the test process."""
    path, own = (target, ()) if isinstance(target, str) else target
    folder = definitions / Path(path.split("::")[0]).stem.removeprefix("test_")
    if not folder.is_dir():
        return None
    names = sorted(f.stem for f in folder.glob("*.json"))
    if "--shard" in own:
        index, _, count = own[own.index("--shard") + 1].partition("/")
        i, n = int(index), int(count)
        names = [d for k, d in enumerate(names) if k % n == i]
    return names


def order_targets(targets: list[Target], ready: dict[str, float], definitions: Path) -> list[Target]:
    """The targets whose definitions' modules are expected ready first (their slowest job's expected seconds);
    otherwise in the given order (the big files' shards first)."""
    def key(item: tuple[int, Target]) -> tuple[float, int]:
        names = target_definitions(item[1], definitions)
        worst = max(ready.values(), default=0.0) if names is None else max((ready.get(d, 0.0) for d in names),
                                                                             default=0.0)
        return worst, item[0]

    return [t for _, t in sorted(enumerate(targets), key=key)]


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


class Timeline:
    """When the session's comparisons came (wall seconds from the session's start): the first and the last case
    that compared a kernel or the torch ground truth with the reference (pass, fail, xfail, xpass), and the same
    for the kernels' comparisons alone (FlashInfer, SGLang). Thread-safe: the records arrive from the
    supervisor's threads."""

    RAN = ("pass", "fail", "xfail", "xpass", "passed", "failed")
    KERNELS = ("flashinfer", "sglang")

    def __init__(self, t0: float):
        self.t0, self.lock = t0, threading.Lock()
        self.first: float | None = None
        self.last: float | None = None
        self.first_kernel: float | None = None
        self.last_kernel: float | None = None
        self.comparisons = 0

    def note(self, record, at: float | None = None) -> None:
        if str(getattr(record, "status", getattr(record, "outcome", ""))) not in self.RAN:
            return
        now = round((time.monotonic() if at is None else at) - self.t0, 1)
        with self.lock:
            self.comparisons += 1
            self.first = now if self.first is None else self.first
            self.last = now
            if getattr(record, "source", None) in self.KERNELS:
                self.first_kernel = now if self.first_kernel is None else self.first_kernel
                self.last_kernel = now

    def as_dict(self, background=None) -> dict:
        return {"first_comparison_s": self.first, "last_comparison_s": self.last,
                "first_kernel_comparison_s": self.first_kernel, "last_kernel_comparison_s": self.last_kernel,
                "comparisons": self.comparisons,
                "prebuild_end_s": None if background is None or background.ended_at is None else
                round(background.t0 - self.t0 + background.ended_at, 1)}


def compiled_since(before: dict[str, float]) -> list[str]:
    """Modules compiled while the tests ran: the prebuild should have left none."""
    from . import jit

    return jit.new_modules(before, jit.libraries(jit.cache_roots()))


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
    p.add_argument("--jit-budget", type=float, help="seconds per prebuild job (default 600)")
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

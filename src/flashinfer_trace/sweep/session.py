"""One matrix session, run inside its environment after the install:

    python -m flashinfer_trace.sweep.session references|bench|jit --combination constraints/X.toml --session NAME
        --results results/NAME [--arch sm90|auto] [--install-json FILE] [--jobs N] [--test-timeout S]
        [--no-fi-trace] [--fi-trace-op-type T ...] [-- PYTEST-ARGS]

A pipeline of plain steps: check the GPU against the combination (a mismatch is recorded and the
session skips), collect the manifest, build the JIT modules the selected tests need (jit/, in
parallel, each with its own budget; a `jit` session stops there), import FlashInfer's own definitions
where it has them (fitrace_step.py: results/<session>/fi_trace/, or a note why not), run the tests with every file
(or shard of one) in its own process (isolation.py: a crash or a hang fails one test, the rest
still run), sample the clocks again,
write results/<session>/ (results.py). Exit status: 0 when everything ran and passed, 1 on test
failures, 3 when the session was skipped (arch mismatch, no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ..results.record import CaseRecord, from_test, parse
from .combos import Combination, arch_of, load_combination
from .fitrace_step import FiTraceConfig, fi_trace_step, fi_trace_targets
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
    if install and install.get("differences"):
        info.reason = "; ".join(install["differences"])
    folder = BENCH_TESTS if kind == "bench" else REFERENCE_TESTS
    targets = collect_files([str((cwd or Path(".")) / folder)])
    earlier = streamed_records(results, kind) if resume else []
    info.status = "running"  # until the end: a session killed outright is read as partial, from tests.jsonl
    write_session(results, info, manifest=manifest)
    built_before = None
    try:
        if combo.gpu:
            info.jit, built_before = prebuild(results, extra or [], cwd=cwd, resume=resume, budget=jit_budget,
                                              cores=cores)
            write_session(results, info, manifest=manifest)
    except KeyboardInterrupt:  # the finished builds are in jit.jsonl, an earlier run's tests in tests.jsonl
        from . import jit

        info.jit = jit.summarise(jit.read_report(results / JIT_STREAM)) | {"interrupted": True, "report": JIT_STREAM}
        return _interrupted(info, results, manifest, t0, "during the JIT prebuild", kind)
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
    if kind == "references":  # FlashInfer's own definitions, imported here, run beside ours (test_fi_trace.py)
        step = fi_trace_step(results, fi_trace or session_fi_trace(combo, resume))
        info.fi_trace = step.as_dict()
        write_session(results, info, manifest=manifest)
        print(f"{session}: fi_trace: {step.status}" + (f" {step.count} definition(s)" if step.imported else "")
              + (f": {step.detail}" if step.detail else ""), file=sys.stderr)
        files, own = fi_trace_targets(step, results, targets)
        targets = shard(files, jobs, (cwd or Path(".")) / "definitions", own)
    convert = record_of(kind, f"{combo.id}@{info.arch}")
    try:
        with JsonlStream(results / STREAM, append=resume) as stream:
            records = earlier + [convert(r) for r in run_isolated(
                targets, pytest_args(kind, combo, results, extra or [], info.fresh_seed, jobs), python=sys.executable,
                env=child_environment(1 if kind == "bench" else jobs, cores),
                cwd=str(cwd) if cwd else None, test_timeout=test_timeout, jobs=1 if kind == "bench" else jobs,
                log_dir=results / "logs", on_record=lambda r: stream.write(convert(r).as_dict()),
                skip={r.nodeid for r in earlier})]
    except KeyboardInterrupt:  # what finished is in the stream: keep it readable as the session's result
        return _interrupted(info, results, manifest, t0, "", kind)
    bad = [r for r in records if str(r.status) in FAILURES + ERRORS]
    info.status = "tests-failed" if bad else "ok"
    info.phases = phase_totals(records)
    if built_before is not None:
        info.jit["compiled_during_tests"] = compiled_since(built_before)
    info.finished, info.wall_seconds = mf.now(), round(time.monotonic() - t0, 1)
    write_session(results, info, records=records, manifest=mf.finish(manifest))
    seed = f", fresh seed {info.fresh_seed}" if info.fresh_seed is not None else ""
    print(f"{session}: {info.status}: " + ", ".join(f"{k} {v}" for k, v in info.counts.items())
          + f" in {info.wall_seconds} s{seed}", file=sys.stderr)
    for line in bad_lines(bad):
        print(line, file=sys.stderr)
    return 1 if bad else 0


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


def prebuild(results: Path, pytest_args: list[str], *, cwd: Path | None = None, resume: bool = False,
             budget: float | None = None, cores: int | None = None, versions: dict[str, str | None] | None = None
             ) -> tuple[dict, dict[str, float]]:
    """Build every module the selected tests' kernels need; (summary, the cache's libraries after it). With
    FlashInfer's prebuilt package of the installed release (`versions`: default this environment's), build
    nothing: every job is `prebuilt`."""
    from ..check import CheckConfig, discover
    from ..dataset import definitions_dir
    from . import jit, prebuilt
    from .manifest import package_versions

    t0 = time.monotonic()
    config = jit.JitConfig(report=str(results / JIT_STREAM), log_dir=str(results / "jit-logs"), resume=resume,
                           select=jit.select_k(k_expression(pytest_args)), budget=budget or jit.DEFAULT_BUDGET,
                           stamps=jit.default_stamps(), cores=cores)
    found = discover([str(definitions_dir(cwd / "definitions" if cwd else None))], CheckConfig())
    jobs = jit.plan(found.definitions, config)
    package, why_not = prebuilt.package_of(package_versions() if versions is None else versions)
    if package is not None:  # FlashInfer's own prebuilt modules: nothing to build
        records = prebuilt.prebuilt_records(jobs, package)
        with JsonlStream(config.report, append=resume) as stream:
            for r in records:
                stream.write(r.as_dict())
    else:
        records = list(jit.run(jobs, config))
    summary = jit.summarise(records) | {"wall_seconds": round(time.monotonic() - t0, 1), "report": JIT_STREAM,
                                        **({"prebuilt": package} if package else {}),
                                        **({"note": why_not} if why_not else {})}
    print(f"prebuild: {len(records)} job(s): " + ", ".join(f"{k} {v}" for k, v in summary["counts"].items())
          + f" in {summary['wall_seconds']} s", file=sys.stderr)
    return summary, jit.libraries(jit.cache_roots())


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

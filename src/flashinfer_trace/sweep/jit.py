"""JIT prebuild: compile every kernel module the ground truths need before any test runs.

FlashInfer compiles each kernel family with nvcc on first use (13-134 s a module). Left to the
tests, those builds run one after another inside test time limits, and an interrupt loses them.
Here they run first, in parallel, each with its own time budget, and every outcome is a record:

    plan(definitions, config)  -> list[Job]            one job per (definition, kernel source) that can run here
    order(jobs, previous)      -> list[Job]            longest first (recorded seconds, else a guess by op type)
    run(jobs, config)          -> Iterator[BuildRecord]  a pool of warm-up workers; each record streamed
    summarise(records)         -> dict                 counts by status, seconds, modules built

A job is a warm-up call of the ground truth on the definition's small inputs in a worker process,
so whatever modules that call needs get built, whichever FlashInfer version is installed (no
dependence on its internal JIT API). A job's modules are the JIT cache's libraries loaded in its
worker (/proc/self/maps); those that appeared or changed during the job are the ones it built. A stamp
file beside the cache remembers them: on a warm machine a job whose inputs and libraries are
unchanged is `cached` without running. A job that runs past its budget has its whole process group killed;
ninja keeps the finished objects, so the next build resumes where it stopped.

Statuses: `built` (new modules appeared), `cached` (nothing to build), `build-failed` (the
exception came from the JIT build: compiler output in `log_tail`), `build-timeout`, and `error`
(the call failed after building: not a build problem; the tests report it). The report is read
back by `availability` (FLASHINFER_TRACE_JIT_REPORT): a failed or timed-out build makes the tests
of that definition skip as `build-failed` / `build-timeout`, its own matrix state.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..definition import Definition

STATUSES = ("built", "cached", "build-failed", "build-timeout", "error")
KERNEL_SOURCES = ("flashinfer", "sglang")
REPORT_ENV = "FLASHINFER_TRACE_JIT_REPORT"
DEFAULT_BUDGET = 600.0
# First guesses of a job's cost (seconds, cold, measured on an H100 with 0.6.6/0.7.2), used only to
# start the long jobs first when no earlier report says better.
GUESS = {"moe": 450, "gemm": 176, "sampling": 146, "gqa_ragged": 68, "mla_ragged": 68, "gqa_paged": 68, "rope": 59,
         "rmsnorm": 35, "mla_paged": 26, "activation": 8,
         "mamba_ssu": 90}  # mamba_ssu: a guess (one selective_state_update module per dtypes/dim/dstate)
# gdn: a guess, not measured (0.6.x gdn_prefill_sm90 compiles 32 CUTLASS sm90a kernel instantiations)
GUESS["gdn"] = 300
NVCC_GB = 4  # memory one nvcc of a CUTLASS kernel can take: bounds the compilers a job may run
URGENT = 2  # the expected-longest groups' first jobs build at normal priority, every other job at NICE
NICE = 10
LOG_TAIL = 4000


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
class BuildRecord:
    definition: str
    source: str
    status: str
    api: str | None = None
    op_type: str | None = None
    seconds: float = 0.0
    budget: float | None = None
    modules: list[str] = field(default_factory=list)  # modules this job's call loaded that it built
    uses: list[str] = field(default_factory=list)  # JIT modules loaded in its worker at its end (with those of
    # the worker's earlier jobs: a module stays loaded, so this is a superset, which the stamp checks)
    checked_by: str = "warm-up"  # or "stamp": unchanged since its last warm-up, not run (Stamps)
    nice: int | None = None  # the build's CPU priority (URGENT jobs keep the session's, others NICE)
    message: str | None = None
    log_tail: str | None = None
    log: str | None = None  # the job's full compiler log, when kept
    libraries: dict[str, float] | None = field(default=None, repr=False, compare=False)  # for the stamps only
    job: Job | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown build status {self.status!r}")

    @property
    def key(self) -> tuple[str, str]:
        return (self.definition, self.source)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("libraries", "job")}


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

    def stamp_path(self) -> Path | None:
        return Path(self.stamps) if self.stamps else None

    def budget_for(self, definition: Definition) -> float:
        return float(self.budgets.get(definition.name, self.budgets.get(definition.op_type, self.budget)))

    def pool_size(self) -> tuple[int, int]:
        """(workers, nvcc jobs per worker). Each job may use every core: a module has few sources
        (gemm_sm90: 8, most 1-3), so the compilers running at once stay near the core count, and
        the long module of many sources finishes in one round instead of two (at 4 a job, gemm_sm90
        took 176 s on the H100). Memory bounds it (NVCC_GB a compiler)."""
        cores = os.cpu_count() or 4
        workers = self.workers or max(1, min(8, cores // 2))
        memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        return workers, self.max_jobs or max(2, min(cores, int(memory_gb // NVCC_GB)))


# -- plan ---------------------------------------------------------------------------------------------
def plan(definitions: Iterable[Definition], config: JitConfig) -> list[Job]:
    """A job for every kernel source whose ground truth can run the definition here (the availability
    pipeline decides, without building anything); unavailable ones need no module."""
    from ..groundtruth import GroundTruthUnavailable, get_ground_truth

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


# -- run ----------------------------------------------------------------------------------------------
def run(jobs: list[Job], config: JitConfig) -> Iterator[BuildRecord]:
    """Every job's record, as each ends (also appended to `config.report`, fsynced). With
    `config.resume`, jobs already `built` or `cached` in the report are not run again."""
    from .results import JsonlStream

    done = {r.key: r for r in read_report(config.report)} if (config.resume and config.report) else {}
    kept = {k for k, r in done.items() if r.status in ("built", "cached")}
    todo = [j for j in order(jobs, done.values()) if j.key not in kept]
    for j in jobs:
        if j.key in kept:
            yield done[j.key]
    stamps = Stamps(config.stamp_path())
    stream = JsonlStream(config.report, append=config.resume) if config.report else None
    unchanged = [] if config.recheck else [(j, stamps.fresh(j)) for j in todo]
    for job, entry in unchanged:
        if entry is not None:
            r = BuildRecord(job.definition, job.source, "cached", api=job.api, op_type=job.op_type, budget=job.budget,
                            uses=sorted(Path(p).stem for p in entry["libraries"]), checked_by="stamp",
                            message=f"stamped {entry['recorded']}: the same definition, versions and arch, and its "
                                    f"{len(entry['libraries'])} module(s) unchanged; not run again")
            if stream:
                stream.write(r.as_dict())
            yield r
    todo = [j for j, entry in unchanged if entry is None] if unchanged else todo
    if not todo:
        if stream:
            stream.close()
        return
    results: queue.Queue[BuildRecord | None] = queue.Queue()
    pending = _Schedule(todo)
    pending.urgent = {id(j) for j in pending.ready[:URGENT]}
    workers, max_jobs = config.pool_size()
    threads = [threading.Thread(target=_drive, args=(pending, results, config, max_jobs), daemon=True)
               for _ in range(min(workers, len(todo)))]
    for t in threads:
        t.start()
    try:
        finished = 0
        while finished < len(threads):
            r = results.get()
            if r is None:
                finished += 1
                continue
            if stream:
                stream.write(r.as_dict())
            if r.status in ("built", "cached") and r.libraries is not None:
                stamps.record(r)
            yield r
    finally:
        _stop.set()
        for t in threads:
            t.join(timeout=5)
        _stop.clear()
        if stream:
            stream.close()


_stop = threading.Event()


def group_key(job: Job) -> tuple[str, str]:
    """Jobs that most likely need the same modules: the APIs of one Python module of one source (27
    GEMM definitions all wait for FlashInfer's gemm_sm90; the three sampling APIs share `sampling`,
    paged and ragged prefill one prefill module, rmsnorm and fused_add_rmsnorm `norm`)."""
    return (job.source, job.api.split("(")[0].rpartition(".")[0] or job.api)


class _Schedule:
    """The first job of each group first (in the given order), the rest of a group only once that one
    has ended: on the H100, all 8 workers sat on the lock of one module (gemm_sm90, 169 s) while the
    other modules waited; with a group per API, three workers still built `sampling` together. A
    group whose first job ran out of budget is not tried again job by job."""

    def __init__(self, jobs: list[Job]):
        groups: dict[tuple[str, str], list[Job]] = {}
        for j in jobs:
            groups.setdefault(group_key(j), []).append(j)
        self.ready = [g[0] for g in groups.values()]
        self.waiting = {k: g[1:] for k, g in groups.items() if len(g) > 1}
        self.leaders = {id(g[0]) for g in groups.values()}
        self.urgent: set[int] = set()  # jobs on the critical path: their workers stay at normal priority
        self.skipped: list[BuildRecord] = []
        self.cond = threading.Condition()

    def take(self) -> Job | None:
        with self.cond:
            while not self.ready:
                if not self.waiting or _stop.is_set():
                    return None
                self.cond.wait(0.5)
            return self.ready.pop(0)

    def done(self, job: Job, record: BuildRecord) -> list[BuildRecord]:
        """The group's other jobs become ready; records for those not run (their leader timed out)."""
        with self.cond:
            rest = self.waiting.pop(group_key(job), []) if id(job) in self.leaders else []
            skipped = []
            if record.status == "build-timeout":
                skipped = [BuildRecord(j.definition, j.source, "build-timeout", api=j.api, op_type=j.op_type,
                                       budget=j.budget, message=f"not tried: {job.definition}'s build of this API "
                                                            f"ran out of its {job.budget:g} s budget")
                           for j in rest]
            else:
                self.ready.extend(rest)
            self.cond.notify_all()
            return skipped


def _drive(pending: _Schedule, results: queue.Queue, config: JitConfig, max_jobs: int) -> None:
    """One worker process at a time, fed jobs until none are left; a worker killed for a timeout
    (or one that died) is replaced for the next job."""
    worker: _Worker | None = None
    try:
        while not _stop.is_set():
            job = pending.take()
            if job is None:
                return
            try:
                if worker is None or not worker.alive():
                    worker = _Worker(config, max_jobs)
                record = worker.run(job, config, urgent=id(job) in pending.urgent)
            except Exception as e:  # noqa: BLE001 - a worker that cannot start: this job's record; the pool goes on
                record = BuildRecord(job.definition, job.source, "error", api=job.api, op_type=job.op_type,
                                     budget=job.budget, message=f"the prebuild worker failed: {type(e).__name__}: {e}")
            if worker is not None and (record.status == "build-timeout" or not worker.alive()):
                worker.kill()
                worker = None
            results.put(record)
            for skipped in pending.done(job, record):
                results.put(skipped)
    finally:
        if worker is not None:
            worker.close()
        results.put(None)


class _Worker:
    """`python -m flashinfer_trace.sweep.jit --worker`: jobs on stdin, records on a pipe, compiler output
    in a log file per job. Its own process group, so a timeout kills nvcc and ninja with it."""

    def __init__(self, config: JitConfig, max_jobs: int):
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, MAX_JOBS=str(max_jobs), PYTHONUNBUFFERED="1")
        # a process group of its own (killpg), in this session: a new session would also be a new
        # scheduler autogroup, and the CPU would be shared per job rather than per compiler
        group = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flashinfer_trace.sweep.jit", "--worker", str(write_fd), config.device],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(write_fd,),
            env=env, **group)
        os.close(write_fd)
        self.answers = os.fdopen(read_fd, "rb", buffering=0)
        self.buffer = b""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, job: Job, config: JitConfig, urgent: bool = False) -> BuildRecord:
        log = _log_path(config, job)
        t0 = time.monotonic()
        message = json.dumps({"job": asdict(job), "log": str(log), "urgent": urgent}) + "\n"
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(message.encode())
            self.proc.stdin.flush()
        except OSError as e:
            return _record(job, "error", t0, message=f"the prebuild worker is gone: {e}", log=log)
        line = self._read_line(job.budget)
        if line is None:
            self.kill()
            return _record(job, "build-timeout", t0, log=log,
                           message=f"not built within its budget of {job.budget:g} s (finished objects are "
                                   f"kept: `flashinfer-trace jit build` resumes)")
        if not line:  # end of file: the worker died
            try:
                code = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
                code = self.proc.returncode
            why = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            return _record(job, "error", t0, message=f"the prebuild worker died ({why})", log=log)
        try:
            answer = json.loads(line)
            libraries = answer.pop("libraries", None)
            record = BuildRecord(**{**answer, "seconds": round(time.monotonic() - t0, 2), "budget": job.budget,
                                    "log_tail": _tail(log) if answer.get("status") == "build-failed" else None,
                                    "log": str(log) if config.log_dir else None})
            record.libraries, record.job = (libraries if isinstance(libraries, dict) else None), job
            return record
        except (ValueError, TypeError) as e:
            return _record(job, "error", t0, message=f"unreadable answer from the prebuild worker: {e}", log=log)

    def _read_line(self, timeout: float) -> bytes | None:
        """The next answer; None when the budget ran out, b"" when the worker closed its end."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or _stop.is_set():
                return None
            ready, _, _ = select.select([self.answers], [], [], min(left, 1.0))
            if ready:
                chunk = self.answers.read(65536)
                if not chunk:
                    return b""
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.answers.close()

    def close(self) -> None:
        if self.alive():
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
                return
        self.answers.close()


def _log_path(config: JitConfig, job: Job) -> Path:
    folder = Path(config.log_dir) if config.log_dir else Path(os.environ.get("TMPDIR", "/tmp")) / "flashinfer-trace-jit"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{job.definition}.{job.source}.log"


def _tail(path: Path, limit: int = LOG_TAIL) -> str | None:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def _record(job: Job, status: str, t0: float, *, message: str, log: Path) -> BuildRecord:
    return BuildRecord(job.definition, job.source, status, api=job.api, op_type=job.op_type,
                       seconds=round(time.monotonic() - t0, 2), budget=job.budget, message=message,
                       log_tail=_tail(log))


# -- the worker ---------------------------------------------------------------------------------------
def libraries(roots: list[Path]) -> dict[str, float]:
    """Shared libraries in the JIT caches: path -> mtime (a rebuilt module counts as built)."""
    found = {}
    for root in roots:
        if root.is_dir():
            for p in root.rglob("*.so"):
                try:
                    found[str(p)] = p.stat().st_mtime
                except OSError:
                    continue
    return found


def new_modules(before: dict[str, float], after: dict[str, float]) -> list[str]:
    """Modules whose library appeared or was rebuilt between two `libraries` readings."""
    return sorted(Path(p).stem for p, m in after.items() if before.get(p) != m)


def loaded_libraries(roots: list[Path], maps: str = "/proc/self/maps") -> dict[str, float]:
    """The JIT cache's libraries this process has loaded: path -> mtime. The cache alone cannot say
    which job built what (eight jobs build side by side); what a job's call loaded is its own."""
    prefixes = tuple(str(r.resolve()) + os.sep for r in roots)
    found: dict[str, float] = {}
    try:
        with open(maps) as f:
            for line in f:
                path = line.split(maxsplit=5)[-1].strip() if line.count(" ") >= 5 else ""
                if path.endswith(".so") and path.startswith(prefixes) and path not in found:
                    try:
                        found[path] = os.stat(path).st_mtime
                    except OSError:
                        continue
    except OSError:
        pass
    return found


STAMPS = "flashinfer-trace-prebuilt.json"


def default_stamps() -> str:
    """The stamp file of this environment's JIT cache (one per combination: nox gives each its own)."""
    return str(cache_roots()[0] / STAMPS)


@cache
def _versions() -> dict[str, str | None]:
    from importlib import metadata

    found: dict[str, str | None] = {}
    for dist in ("torch", "flashinfer-python", "sglang", "sgl-kernel"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    return found


def fingerprint(job: Job) -> str:
    """What decides which modules a job needs: the definition, the kernel package's API and versions,
    the arch the modules are built for."""
    import hashlib

    try:
        text = Path(job.path).read_bytes()
    except OSError:
        text = job.definition.encode()
    arch = {k: os.environ.get(k) for k in ("FLASHINFER_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST")}
    blob = json.dumps([job.source, job.api, hashlib.sha256(text).hexdigest(), _versions(), arch], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class Stamps:
    """What each job loaded when it last ran, kept beside the JIT cache: a job whose definition,
    versions and arch are the same and whose libraries are all there, unchanged, is `cached` without
    starting a worker (a warm machine's prebuild: 73 warm-up calls took 14 s on the H100). A module
    the tests still had to build would show as `compiled_during_tests` in the session."""

    def __init__(self, path: Path | None):
        self.path = path
        self.lock = threading.Lock()
        try:
            data = json.loads(path.read_text()) if path else {}
        except (OSError, ValueError):
            data = {}
        self.entries: dict[str, dict] = data if isinstance(data, dict) else {}

    @staticmethod
    def _key(definition: str, source: str) -> str:
        return f"{source}:{definition}"

    def fresh(self, job: Job) -> dict | None:
        entry = self.entries.get(self._key(job.definition, job.source))
        if not isinstance(entry, dict) or entry.get("fingerprint") != fingerprint(job):
            return None
        libraries = entry.get("libraries")
        if not isinstance(libraries, dict):
            return None
        for path, mtime in libraries.items():
            try:
                if os.stat(path).st_mtime != mtime:
                    return None
            except OSError:
                return None
        return entry

    def record(self, record: BuildRecord) -> None:
        if self.path is None or record.job is None:
            return
        with self.lock:
            self.entries[self._key(record.definition, record.source)] = {
                "fingerprint": fingerprint(record.job), "libraries": record.libraries,
                "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
                tmp.write_text(json.dumps(self.entries, indent=1, sort_keys=True))
                os.replace(tmp, self.path)
            except OSError:
                pass  # no stamp: the next run checks by running the job


def cache_roots() -> list[Path]:
    """Where the installed kernel packages keep their JIT builds."""
    roots = []
    try:
        from flashinfer.jit import env as fi_env  # type: ignore[import-not-found]

        roots.append(Path(fi_env.FLASHINFER_JIT_DIR))
    except Exception:  # noqa: BLE001 - not installed, or a version without jit.env
        base = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", Path.home()))
        roots.append(base / ".cache" / "flashinfer")
    return roots


BUILD_FRAMES = (f"{os.sep}flashinfer{os.sep}jit{os.sep}", "cpp_extension", f"{os.sep}triton{os.sep}compiler")


def is_build_failure(exc: BaseException) -> bool:
    """Whether an exception came out of a JIT build (a frame of FlashInfer's jit package, torch's
    cpp_extension or Triton's compiler, or a compiler process), as opposed to a kernel's own error."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, subprocess.CalledProcessError) or "ninja" in str(e).lower():
            return True
        for frame in traceback.extract_tb(e.__traceback__):
            if any(mark in frame.filename for mark in BUILD_FRAMES):
                return True
        e = e.__cause__ or e.__context__
    return False


def _warm(job: dict, device: str) -> tuple[str, str | None]:
    from ..groundtruth import GroundTruthUnavailable

    try:
        from ..dataset import load_definition, load_path
        from ..groundtruth import get_ground_truth
        from ..inputs import generate_inputs

        d = load_path(job["path"]) if Path(job["path"]).is_file() else load_definition(job["definition"])
        gt = get_ground_truth(job["source"], d, device=device, prebuild=None)
        gt(generate_inputs(d, "small", 0, device=device))
        import torch

        if device.startswith("cuda"):
            torch.cuda.synchronize()
    except GroundTruthUnavailable as e:
        return "error", f"unavailable while building: {e}"
    except Exception as e:  # noqa: BLE001 - every failure is a record
        text = " ".join(f"{type(e).__name__}: {e}".split())[:2000]
        return ("build-failed" if is_build_failure(e) else "error"), text
    return "ok", None


def worker_main(answer_fd: int, device: str) -> int:
    out = os.fdopen(answer_fd, "wb", buffering=0)
    roots = None
    for line in sys.stdin:
        request = json.loads(line)
        job = request["job"]
        if not request.get("urgent") and os.getpriority(os.PRIO_PROCESS, 0) < NICE:
            # the long builds get the cores first: on the H100, `sampling` (one source) took 199 s
            # among 30 other compilers at equal priority, 146 s with fewer. Its compilers inherit it.
            os.setpriority(os.PRIO_PROCESS, 0, NICE)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)  # the compiler's output goes to the job's log: ninja inherits these
        os.dup2(log, 2)
        os.close(log)
        if roots is None:
            try:
                import flashinfer  # noqa: F401 - where its JIT cache is, before the first job
            except Exception:  # noqa: BLE001
                pass
            roots = cache_roots()
        before = libraries(roots)
        status, message = _warm(job, device)
        used = loaded_libraries(roots)
        modules = new_modules(before, used)
        if status == "ok":
            status = "built" if modules else "cached"
        answer = {"definition": job["definition"], "source": job["source"], "api": job["api"],
                  "op_type": job["op_type"], "status": status, "modules": modules, "message": message,
                  "uses": sorted(Path(p).stem for p in used), "libraries": used,
                  "nice": os.getpriority(os.PRIO_PROCESS, 0)}
        out.write((json.dumps(answer) + "\n").encode())
    return 0


# -- summarise / read back ------------------------------------------------------------------------
def summarise(records: Iterable[BuildRecord]) -> dict[str, Any]:
    records = list(records)
    modules = sorted({m for r in records for m in r.modules})
    return {"counts": dict(Counter(r.status for r in records)), "jobs": len(records), "modules_built": modules,
            "stamped": sum(r.checked_by == "stamp" for r in records),
            "job_seconds": round(sum(r.seconds for r in records), 1),
            "slowest": [{"definition": r.definition, "source": r.source, "status": r.status, "seconds": r.seconds,
                         "modules": r.modules} for r in sorted(records, key=lambda r: -r.seconds)[:10]]}


def read_report(path: str | Path | None) -> list[BuildRecord]:
    if not path:
        return []
    from .results import from_fields, read_latest

    return read_latest(path, from_fields(BuildRecord), lambda r: r.key)


@cache
def _report(path: str) -> dict[tuple[str, str], BuildRecord]:
    return {r.key: r for r in read_report(path)}


def prebuild_outcome(definition: str, source: str) -> BuildRecord | None:
    """This process's prebuild record of (definition, source), when a report is configured."""
    path = os.environ.get(REPORT_ENV)
    return _report(path).get((definition, source)) if path else None


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        sys.exit(worker_main(int(sys.argv[2]), sys.argv[3]))
    sys.exit("usage: python -m flashinfer_trace.sweep.jit --worker FD DEVICE (the CLI is `flashinfer-trace jit build`)")

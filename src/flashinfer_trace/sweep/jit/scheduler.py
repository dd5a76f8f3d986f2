"""Running prebuild jobs: a pool of worker processes, the short jobs first and the long ones on a bounded share of
the workers, each job within its own time budget (its process group killed past it), the jobs of one API group
after their leader, every record streamed to the report as it ends and the prebuild's progress to its state file
(report.py: what the comparisons waiting for a definition's modules read). A job a session defers (expect.defer) is
recorded before any other runs, and never reaches a worker."""

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
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from .cache import Stamps
from .expect import Expectation, defer, expectations
from .plan import JitConfig, Job, order
from .report import BuildRecord, StateWriter, read_report

__all__ = ["HEARTBEAT", "LOG_TAIL", "group_key", "run"]

LOG_TAIL = 4000
HEARTBEAT = 2.0  # seconds between the state file's heartbeats: a waiter takes a silent prebuild for dead


def run(jobs: list[Job], config: JitConfig, stop: threading.Event | None = None) -> Iterator[BuildRecord]:
    """Every job's record, as each ends (also appended to `config.report`, fsynced). With
    `config.resume`, jobs already `built` or `cached` in the report are not run again. Beside the report, its
    state (report.state_path): the jobs planned, which started when, a heartbeat, and whether the prebuild ended.
    With `config.defer`, the jobs deferred (expect.defer) are in the report and ended in the state when this
    returns. Setting `stop` (from another thread) ends the running jobs as at a timeout and takes no new one."""
    from ..results import JsonlStream

    done = {r.key: r for r in read_report(config.report)} if (config.resume and config.report) else {}
    # the report (emptied unless resuming) and the state are there when this returns, before the first record:
    # a comparison that looks a job up from now on waits for it
    stream = JsonlStream(config.report, append=config.resume) if config.report else None
    expect = expectations(jobs, done.values())
    state = StateWriter(config.report, [(j.definition, j.source, j.api, j.budget, expect[j.key].seconds)
                                        for j in jobs])
    kept = {k for k, r in done.items() if r.status in ("built", "cached")}
    stamps = Stamps(config.stamp_path())
    held = defer([j for j in jobs if j.key not in kept], expect, config, stamps=stamps)
    for r in held:  # at once: their comparisons need not wait for a build that is not coming
        if stream:
            stream.write(r.as_dict())
        state.ended(r.definition, r.source)
    return _records(jobs, config, done, kept, expect, held, stamps, stream, state, stop or threading.Event())


def _expected(record: BuildRecord, expect: dict[tuple[str, str], Expectation]) -> BuildRecord:
    e = expect.get(record.key)
    if e is not None and record.expected is None:
        record.expected, record.expected_from = e.seconds, e.origin
    return record


def _records(jobs: list[Job], config: JitConfig, done: dict, kept: set, expect: dict, held: list[BuildRecord],
             stamps: Stamps, stream, state: StateWriter, stop: threading.Event) -> Iterator[BuildRecord]:
    guess = {k: e.seconds for k, e in expect.items()}
    skip = kept | {r.key for r in held}
    todo = [j for j in order(jobs, done.values()) if j.key not in skip]
    threads: list[threading.Thread] = []
    try:
        for j in jobs:
            if j.key in kept:
                state.ended(j.definition, j.source)
                yield done[j.key]
        yield from held
        unchanged = [] if config.recheck else [(j, stamps.fresh(j)) for j in todo]
        for job, entry in unchanged:
            if entry is not None:
                r = _expected(BuildRecord(
                    job.definition, job.source, "cached", api=job.api, op_type=job.op_type, budget=job.budget,
                    uses=sorted(Path(p).stem for p in entry["libraries"]), checked_by="stamp",
                    message=f"stamped {entry['recorded']}: the same definition, versions and arch, and its "
                            f"{len(entry['libraries'])} module(s) unchanged; not run again"), expect)
                if stream:
                    stream.write(r.as_dict())
                state.ended(r.definition, r.source)
                yield r
        todo = [j for j, entry in unchanged if entry is None] if unchanged else todo
        if not todo:
            return
        workers, max_jobs = config.pool_size()
        workers = min(workers, len(todo))
        pending = _Schedule(todo, guess, config.long_seconds, config.long_slots(workers), stop)
        results: queue.Queue[BuildRecord | None] = queue.Queue()
        threads += [threading.Thread(target=_drive, args=(pending, results, config, max_jobs), daemon=True)
                    for _ in range(workers)]
        for t in threads:
            t.start()
        finished = 0
        while finished < len(threads):
            try:
                r = results.get(timeout=HEARTBEAT)
            except queue.Empty:
                r = False
            for key, t0 in pending.started_since():
                state.started(*key, at=t0)
            if r is False:
                state.beat()
                continue
            if r is None:
                finished += 1
                continue
            _expected(r, expect)
            if stream:
                stream.write(r.as_dict())
            state.ended(r.definition, r.source)
            if r.status in ("built", "cached") and r.libraries is not None:
                stamps.record(r)
            yield r
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
        if stream:
            stream.close()
        state.finish()


def group_key(job: Job) -> tuple[str, str]:
    """Jobs that most likely need the same modules: the APIs of one Python module of one source (27
    GEMM definitions all wait for FlashInfer's gemm_sm90; the three sampling APIs share `sampling`,
    paged and ragged prefill one prefill module, rmsnorm and fused_add_rmsnorm `norm`)."""
    return (job.source, job.api.split("(")[0].rpartition(".")[0] or job.api)


class _Schedule:
    """Which job a free worker takes. A long job (expected above `long_seconds`) only while fewer than
    `long_slots` long ones run, the longest first, so the long builds start early but never hold more than their
    share; otherwise the shortest-expected ready job. Of each group (`group_key`: the APIs of one Python module
    share its kernels) the first job runs first and the rest once it has ended, so workers do not sit on the lock
    of one module while other modules wait. When a group's job runs out of its budget the next one of the group
    runs alone, with its own budget, resuming the objects ninja kept: every job is tried in its own time, and a
    module too slow for one budget still costs one worker at a time."""

    def __init__(self, jobs: list[Job], guess: dict[tuple[str, str], float], long_seconds: float, long_slots: int,
                 stop: threading.Event | None = None):
        self.guess, self.long_seconds, self.long_slots = guess, long_seconds, long_slots
        self.stop = stop or threading.Event()
        groups: dict[tuple[str, str], list[Job]] = {}
        for j in jobs:
            groups.setdefault(group_key(j), []).append(j)
        self.ready = [g[0] for g in groups.values()]
        self.waiting = {k: g[1:] for k, g in groups.items() if len(g) > 1}
        self.leaders = {id(g[0]) for g in groups.values()}
        self.running_long = 0
        self.started: dict[tuple[str, str], float] = {}  # job key -> wall time it was taken (time.time())
        self._reported: set[tuple[str, str]] = set()
        self.cond = threading.Condition()

    def is_long(self, job: Job) -> bool:
        return self.guess.get(job.key, 0.0) > self.long_seconds

    def take(self) -> Job | None:
        with self.cond:
            while True:
                if self.stop.is_set():
                    return None
                job = self._pick()
                if job is not None:
                    self.ready.remove(job)
                    self.running_long += self.is_long(job)
                    self.started[job.key] = time.time()
                    return job
                if not self.ready and not self.waiting:
                    return None
                self.cond.wait(0.5)

    def _pick(self) -> Job | None:
        longs = [j for j in self.ready if self.is_long(j)]
        if longs and self.running_long < self.long_slots:
            return max(longs, key=lambda j: self.guess.get(j.key, 0.0))
        shorts = [j for j in self.ready if not self.is_long(j)]
        return min(shorts, key=lambda j: self.guess.get(j.key, 0.0)) if shorts else None

    def done(self, job: Job, record: BuildRecord) -> None:
        """The group's other jobs become ready: all of them, or after a timeout only the next, as its new leader."""
        with self.cond:
            self.running_long -= self.is_long(job)
            if id(job) in self.leaders:
                rest = self.waiting.pop(group_key(job), [])
                if record.status == "build-timeout" and rest:
                    self.leaders.add(id(rest[0]))
                    if rest[1:]:
                        self.waiting[group_key(job)] = rest[1:]
                    rest = rest[:1]
                self.ready.extend(rest)
            self.cond.notify_all()

    def started_since(self) -> list[tuple[tuple[str, str], float]]:
        """Jobs taken since the last call, with when (for the state file)."""
        with self.cond:
            new = [(k, t) for k, t in self.started.items() if k not in self._reported]
            self._reported.update(k for k, _ in new)
            return new


def _drive(pending: _Schedule, results: queue.Queue, config: JitConfig, max_jobs: int) -> None:
    """One worker process at a time, fed jobs until none are left; a worker killed for a timeout
    (or one that died) is replaced for the next job."""
    worker: _Worker | None = None
    try:
        while not pending.stop.is_set():
            job = pending.take()
            if job is None:
                return
            long = pending.is_long(job)
            try:
                if worker is None or not worker.alive():
                    worker = _Worker(config, max_jobs, pending.stop)
                record = worker.run(job, config, low_priority=long)
            except Exception as e:  # noqa: BLE001 - a worker that cannot start: this job's record; the pool goes on
                record = BuildRecord(job.definition, job.source, "error", api=job.api, op_type=job.op_type,
                                     budget=job.budget, message=f"the prebuild worker failed: {type(e).__name__}: {e}")
            if worker is not None and (record.status == "build-timeout" or not worker.alive() or worker.retiring):
                worker.kill()
                worker = None
            elif worker is not None and long:  # its process stays below the others' priority: not for a short job
                worker.close()
                worker = None
            results.put(record)
            pending.done(job, record)
    finally:
        if worker is not None:
            worker.close()
        results.put(None)


class _Worker:
    """`python -m flashinfer_trace.sweep.jit.worker --worker` (worker.py): jobs on stdin, records on a pipe,
    compiler output in a log file per job. Its own process group, so a timeout kills nvcc and ninja with it."""

    def __init__(self, config: JitConfig, max_jobs: int, stop: threading.Event | None = None):
        self.stop = stop or threading.Event()
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, MAX_JOBS=str(max_jobs), PYTHONUNBUFFERED="1")
        # a process group of its own (killpg), in this session: a new session would also be a new
        # scheduler autogroup, and the CPU would be shared per job rather than per compiler
        group = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
        command = list(config.worker_command or (sys.executable, "-m", "flashinfer_trace.sweep.jit.worker"))
        self.proc = subprocess.Popen(
            [*command, "--worker", str(write_fd), config.device],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(write_fd,),
            env=env, **group)
        os.close(write_fd)
        self.answers = os.fdopen(read_fd, "rb", buffering=0)
        self.buffer = b""
        self.retiring = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, job: Job, config: JitConfig, low_priority: bool = False) -> BuildRecord:
        """The job's record; its budget counts from here, when it starts building, not from the prebuild's start."""
        log = _log_path(config, job)
        t0 = time.monotonic()
        message = json.dumps({"job": asdict(job), "log": str(log), "low_priority": low_priority}) + "\n"
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
            # a worker whose CUDA context a kernel broke ends after this answer (worker.broken_context)
            self.retiring = bool(answer.pop("retire", None))
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
            if left <= 0 or self.stop.is_set():
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

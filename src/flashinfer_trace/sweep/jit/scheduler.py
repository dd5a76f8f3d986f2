"""Running prebuild jobs: a pool of worker processes, each job within its time budget (its process group killed
past it), the jobs of one API group after their leader, every record streamed to the report as it ends."""

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
from .plan import JitConfig, Job, order
from .report import BuildRecord, read_report

__all__ = ["LOG_TAIL", "URGENT", "group_key", "run"]

URGENT = 2  # the expected-longest groups' first jobs build at normal priority, every other job at worker.NICE
LOG_TAIL = 4000


def run(jobs: list[Job], config: JitConfig) -> Iterator[BuildRecord]:
    """Every job's record, as each ends (also appended to `config.report`, fsynced). With
    `config.resume`, jobs already `built` or `cached` in the report are not run again."""
    from ..results import JsonlStream

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
    has ended, so workers do not sit on the lock of one module while other modules wait (`group_key`:
    a group per Python module of the APIs, not per API, since APIs of one module share its kernels). A
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
    """`python -m flashinfer_trace.sweep.jit.worker --worker` (worker.py): jobs on stdin, records on a pipe,
    compiler output in a log file per job. Its own process group, so a timeout kills nvcc and ninja with it."""

    def __init__(self, config: JitConfig, max_jobs: int):
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, MAX_JOBS=str(max_jobs), PYTHONUNBUFFERED="1")
        # a process group of its own (killpg), in this session: a new session would also be a new
        # scheduler autogroup, and the CPU would be shared per job rather than per compiler
        group = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flashinfer_trace.sweep.jit.worker", "--worker", str(write_fd), config.device],
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

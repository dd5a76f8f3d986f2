"""Fault isolation for GPU test runs: a segfault, a CUDA error that poisons the process, or a hang
fails the test it happened in, and every other test still gets its record.

Each target (a test file or a nodeid) runs in its own `python -m pytest` child, in a new process
group so that a kill also reaches what the test spawned (compilers, servers). The child streams its
events through `_stream_plugin`, flushed line by line; the supervisor reads that stream, so after the
child dies it knows what was reported and which test was running. That test is recorded as an error
(crash) or timeout (hang), and a new child resumes the target with every test that already has a
record deselected, until each collected test has one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ._stream_plugin import DESELECT_OPTION, STREAM_OPTION
from .results import TestRecord

__all__ = ["collect_files", "run_isolated"]

TAIL_LINES = 20
TERM_GRACE_S = 3.0
POLL_S = 0.1


def collect_files(paths: list[str]) -> list[str]:
    """Directories become their `test_*.py` files (sorted), so callers can isolate per file."""
    files: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            files.extend(str(f) for f in sorted(path.rglob("test_*.py")) if f.is_file())
        else:
            files.append(p)
    return files


Target = str | tuple[str, tuple[str, ...]]  # a path or nodeid, or one with pytest arguments of its own


def run_isolated(targets: list[Target], pytest_args: list[str], *, python: str = sys.executable,
                 env: dict[str, str] | None = None, cwd: str | None = None, test_timeout: float = 900.0,
                 jobs: int = 1, log_dir: str | Path | None = None,
                 on_record: Callable[[TestRecord], None] | None = None, skip: Collection[str] = (),
                 before: Callable[[Target, threading.Event], None] | None = None) -> list[TestRecord]:
    """Run each target in its own pytest child (up to `jobs` at once) and return one record per test,
    in collection order per target, targets in the given order.

    `env` is the children's whole environment (default: this process's). Child output and event
    streams go to `log_dir` (kept) or a temporary directory (removed). Parallelism is `jobs`, not
    pytest-xdist: a `-n` child reports no collection to the supervisor. `on_record` gets each record
    the moment it is final (from the supervisor's threads: make it thread-safe); tests in `skip` (node
    ids recorded by an earlier run) are deselected. `before(target, stop)` is called in the target's pool thread
    before its child starts (the session waits there for the target's JIT modules; `stop` is set on Ctrl-C).
    """
    with tempfile.TemporaryDirectory(prefix="flashinfer-trace-isolation-") as tmp:
        logs = Path(log_dir) if log_dir is not None else Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        stop = threading.Event()

        def one(i: int, target: Target) -> list[TestRecord]:
            if before is not None and not stop.is_set():
                before(target, stop)
            path, own = (target, ()) if isinstance(target, str) else target
            slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", " ".join((path, *own)))[-80:].strip("_.") or "target"
            return _run_target(path, [*pytest_args, *own], python=python, env=env, cwd=cwd,
                               test_timeout=test_timeout, stem=logs / f"{i:03d}-{slug}", stop=stop,
                               on_record=on_record or _ignore, skip=frozenset(skip))

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = [pool.submit(one, i, t) for i, t in enumerate(targets)]
            try:
                return [r for f in futures for r in f.result()]
            except BaseException:  # Ctrl-C: the workers kill their children instead of waiting them out
                stop.set()
                pool.shutdown(wait=True, cancel_futures=True)
                raise


def _ignore(_record: TestRecord) -> None:
    pass


def _record(nodeid: str, e: dict[str, Any]) -> TestRecord:
    return TestRecord(nodeid, e["status"], float(e.get("duration") or 0.0), e.get("message"),
                      dict(e.get("properties") or {}))


class _Attempt:
    """One child's run of a target, as far as its event stream tells; each report is passed on as it
    is read."""

    def __init__(self, on_record: Callable[[TestRecord], None] = _ignore) -> None:
        self.on_record = on_record
        self.collected: list[str] | None = None
        self.cases: dict[str, dict[str, Any]] = {}  # nodeid -> the case it checks (reference tests)
        self.collect_errors: list[tuple[str, str]] = []
        self.reports: dict[str, dict[str, Any]] = {}
        self.current: str | None = None  # started, not reported
        self.current_since = 0.0  # supervisor's monotonic clock when it saw the start
        self.last_event = time.monotonic()
        self._buffer = b""
        self._offset = 0

    def read(self, stream: Path) -> None:
        try:
            with open(stream, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self._apply(event)

    def _apply(self, event: dict[str, Any]) -> None:
        self.last_event = time.monotonic()
        kind = event.get("event")
        if kind == "collected":
            self.collected = list(event.get("nodeids") or [])
            cases = event.get("cases")
            self.cases = dict(cases) if isinstance(cases, dict) else {}
        elif kind == "collect_error":
            self.collect_errors.append((event.get("nodeid") or "", event.get("message") or ""))
        elif kind == "start":
            self.current, self.current_since = event["nodeid"], self.last_event
        elif kind == "report":
            self.reports[event["nodeid"]] = event
            if self.current == event["nodeid"]:
                self.current = None
            self.on_record(_record(event["nodeid"], event))


def _run_target(target: str, pytest_args: list[str], *, python: str, env: dict[str, str] | None, cwd: str | None,
                test_timeout: float, stem: Path, stop: threading.Event,
                on_record: Callable[[TestRecord], None] = _ignore, skip: frozenset[str] = frozenset()
                ) -> list[TestRecord]:
    """Run one target until every collected test has a record, restarting after crashes and kills."""
    order: list[str] = []  # collection order over all attempts
    records: dict[str, TestRecord] = {}
    head: list[TestRecord] = []  # collection errors and target-level failures
    first = True
    restarts = refused = 0
    cases: dict[str, dict[str, Any]] = {}  # nodeid -> its case, over all attempts

    def final(record: TestRecord) -> TestRecord:  # a record the supervisor made (crash, timeout): streamed too
        if record.nodeid in cases:
            record.properties.setdefault("case", cases[record.nodeid])
        on_record(record)
        return record

    while True:
        deselect = stem.with_name(f"{stem.name}.{restarts}.deselect")
        deselect.write_text("".join(f"{n}\n" for n in [*skip, *records]))
        attempt, rc, killed = _run_child(target, pytest_args, python=python, env=env, cwd=cwd,
                                         test_timeout=test_timeout, stem=stem.with_name(f"{stem.name}.{restarts}"),
                                         deselect=deselect, stop=stop, on_record=on_record)
        log = stem.with_name(f"{stem.name}.{restarts}.log")
        cases.update(attempt.cases)
        known = set(order)
        order.extend(n for n in attempt.collected or [] if n not in known)
        for nodeid, e in attempt.reports.items():
            records[nodeid] = _record(nodeid, e)
            if nodeid not in order:
                order.append(nodeid)
        if first and _device_refused(attempt) and refused < len(REFUSED_WAITS) and not stop.is_set():
            stop.wait(REFUSED_WAITS[refused])  # the device refused the process, not the tests' doing: again, later
            refused += 1
            continue
        if first:
            head += [final(TestRecord(nodeid or target, "error", 0.0, f"collection error: {message}"))
                     for nodeid, message in attempt.collect_errors]
        progressed = bool(attempt.reports)
        crashed = attempt.current is not None
        if crashed:
            nodeid, elapsed = attempt.current, time.monotonic() - attempt.current_since
            if nodeid not in order:
                order.append(nodeid)
            if killed == "timeout":
                records[nodeid] = final(TestRecord(nodeid, "timeout", elapsed,
                                                   f"no result after {test_timeout:g} s: killed the process group"))
            else:
                why = "stopped by the supervisor" if killed else _death(rc)
                records[nodeid] = final(TestRecord(nodeid, "error", elapsed,
                                                   f"{why} during this test\n{_tail(log)}".rstrip()))
            progressed = True
        elif first and not attempt.collected and not attempt.collect_errors and (
                attempt.collected is None or killed or rc not in (0, 5)):  # 5: everything deselected
            if killed == "timeout":
                why = f"collection did not finish within {test_timeout:g} s: killed the process group"
            else:
                why = "stopped by the supervisor" if killed else f"{_death(rc)} without running any test"
            head.append(final(TestRecord(target, "timeout" if killed == "timeout" else "error", 0.0,
                                         f"{why}\n{_tail(log)}".rstrip())))
        elif not first and attempt.collected is None:  # a resumed child that could not collect
            for nodeid in order:
                if nodeid not in records:
                    records[nodeid] = final(TestRecord(nodeid, "error", 0.0, f"resumed run collected nothing: "
                                                       f"{_death(rc)}\n{_tail(log)}".rstrip()))
        first = False
        abnormal = crashed or killed is not None or rc not in (0, 1, 2, 5)
        missing = [n for n in order if n not in records]
        if not (missing and abnormal and progressed) or stop.is_set() or restarts >= len(order) + 2:
            break
        restarts += 1
    return head + [records.get(n) or final(TestRecord(n, "error", 0.0, "collected but no result")) for n in order]


# waits before the next try of a target whose collection the device refused (an MPS server recovering from another
# client's fatal fault refuses new clients until the faulted ones have exited: minutes where a prebuild worker was one)
REFUSED_WAITS = (5.0, 10.0, 20.0, 40.0, 80.0, 160.0)


def _device_refused(attempt: _Attempt) -> bool:
    """Whether a child collected nothing because the device refused it a CUDA context (budget.is_device_unavailable)."""
    from ..budget.device import is_device_unavailable

    return bool(attempt.collect_errors) and not attempt.collected and all(
        is_device_unavailable(message) for _, message in attempt.collect_errors)


def _run_child(target: str, pytest_args: list[str], *, python: str, env: dict[str, str] | None, cwd: str | None,
               test_timeout: float, stem: Path, deselect: Path, stop: threading.Event,
               on_record: Callable[[TestRecord], None] = _ignore) -> tuple[_Attempt, int, str | None]:
    """One pytest child, watched: returns what it streamed, its exit code, and why it was killed."""
    stream, log = stem.with_name(stem.name + ".jsonl"), stem.with_name(stem.name + ".log")
    stream.unlink(missing_ok=True)
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONUNBUFFERED"] = "1"
    cmd = [python, "-m", "pytest", target, "-p", "flashinfer_trace.sweep._stream_plugin", "-p", "no:cacheprovider",
           f"{STREAM_OPTION}={stream}", f"{DESELECT_OPTION}={deselect}", "-q", *pytest_args]
    attempt = _Attempt(on_record)
    killed: str | None = None
    with open(log, "wb") as out:
        out.write(f"$ {' '.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env,
                                cwd=cwd, start_new_session=True)
        try:
            while True:
                try:
                    proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                attempt.read(stream)
                now = time.monotonic()
                since = attempt.current_since if attempt.current is not None else attempt.last_event
                if now - since > test_timeout:
                    killed = "timeout"
                elif stop.is_set():
                    killed = "stopped"
                if killed:
                    _kill_group(proc)
                    break
        finally:
            if proc.poll() is None:
                _kill_group(proc)
            _kill_stragglers(proc.pid)
    attempt.read(stream)
    return attempt, proc.returncode, killed


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the child's process group, SIGKILL it after a grace period."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _kill_stragglers(pgid: int) -> None:
    """What a test spawned and left behind dies with its child, even when the child exited cleanly."""
    _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _death(rc: int | None) -> str:
    if rc is not None and rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = "an unknown signal"
        return f"process died with {name} (signal {-rc})"
    return f"process exited with code {rc}"


_FRAMEWORK_FRAME = re.compile(r'^\s*File ".*(/_pytest/|/pluggy/|<frozen runpy>)')


def _tail(log: Path, lines: int = TAIL_LINES) -> str:
    """The end of the child's output, without pytest's own frames: in a faulthandler dump they would
    push the test's frame and the "Fatal Python error" line out of the tail."""
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    tail = [line for line in text.splitlines() if not _FRAMEWORK_FRAME.match(line)][-lines:]
    return "--- last lines of the child's output ---\n" + "\n".join(tail) if tail else ""

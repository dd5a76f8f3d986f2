"""The JIT report: jit.jsonl, one BuildRecord per (definition, kernel source) as each prebuild job ends, and
how it is read back (`JitReport.load(path).outcome(definition, source)`: the path is passed, not found in
the environment). Beside it, while a prebuild runs, its state (`state_path`: jit.state.json, the jobs planned,
when each started, a heartbeat, whether it ended): `PrebuildWatch(path).outcome(...)` waits for a job the running
prebuild has not ended yet, so comparisons start as soon as their own modules are built.

A leaf module (the standard library and the status vocabulary only): the engine reads the report while
cases run, and must not import the sweep (its planner imports the ground truths) to do so.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ...status import BuildStatus

__all__ = ["STATE_STALE", "STATUSES", "BuildRecord", "JitReport", "PrebuildWatch", "StateWriter",
           "read_report", "state_path", "summarise", "watch"]

STATUSES = tuple(s.value for s in BuildStatus)  # the one vocabulary (status.py)


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
    checked_by: str = "warm-up"  # or "stamp": unchanged since its last warm-up, not run (Stamps); "plan": deferred
    nice: int | None = None  # the build's CPU priority (URGENT jobs keep the session's, others NICE)
    message: str | None = None
    log_tail: str | None = None
    log: str | None = None  # the job's full compiler log, when kept
    expected: float | None = None  # the seconds the plan expected it to take (expect.py) ...
    expected_from: str | None = None  # ... and where that figure came from (report, known build, guess)
    covers: list[str] = field(default_factory=list)  # deferred: the other APIs that load its known modules (wait too)
    libraries: dict[str, float] | None = field(default=None, repr=False, compare=False)  # for the stamps only
    job: Any = field(default=None, repr=False, compare=False)  # the plan.Job it ran (not imported: a leaf)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown build status {self.status!r}")

    @property
    def key(self) -> tuple[str, str]:
        return (self.definition, self.source)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("libraries", "job")}


def summarise(records: Iterable[BuildRecord]) -> dict[str, Any]:
    """Counts by status, seconds, modules built, the slowest jobs, and the deferred ones with their message (the
    command that builds them)."""
    records = list(records)
    modules = sorted({m for r in records for m in r.modules})
    deferred = [{"definition": r.definition, "source": r.source, "expected": r.expected, "message": r.message}
                for r in records if r.status == "deferred"]
    return {"counts": dict(Counter(r.status for r in records)), "jobs": len(records), "modules_built": modules,
            "stamped": sum(r.checked_by == "stamp" for r in records),
            "job_seconds": round(sum(r.seconds for r in records), 1),
            "slowest": [{"definition": r.definition, "source": r.source, "status": r.status, "seconds": r.seconds,
                         "modules": r.modules} for r in sorted(records, key=lambda r: -r.seconds)[:10]],
            **({"deferred": deferred} if deferred else {})}


def read_report(path: str | Path | None) -> list[BuildRecord]:
    """The records of a jit.jsonl, the last one per (definition, source) winning, in the order written (a resumed
    prebuild appends). A torn or malformed line, or an object that is not a record, is skipped: a report cut short
    by a kill still reads."""
    if not path:
        return []
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    fields = set(BuildRecord.__dataclass_fields__)
    out: dict[tuple[str, str], BuildRecord] = {}
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        try:
            record = BuildRecord(**{k: v for k, v in obj.items() if k in fields})
        except (TypeError, KeyError, ValueError):
            continue
        out.pop(record.key, None)
        out[record.key] = record
    return list(out.values())


def _record(line: str) -> BuildRecord | None:
    try:
        obj = json.loads(line)
        return BuildRecord(**{k: v for k, v in obj.items() if k in BuildRecord.__dataclass_fields__})
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class JitReport:
    """One prebuild's records by (definition, source), for the callers handed the report's path."""

    def __init__(self, records: Iterable[BuildRecord] = ()):
        self.records: dict[tuple[str, str], BuildRecord] = {r.key: r for r in records}

    @classmethod
    def load(cls, path: str | Path | None) -> JitReport:
        """The report at `path`; an empty one when `path` is empty or unreadable."""
        return cls(read_report(path))

    def outcome(self, definition: str, source: str, api: str | None = None) -> BuildRecord | None:
        """The prebuild's record of (definition, source); for a pair it did not build, where `api` is given, the
        record of a job it deferred for `api` or for an API sharing its JIT module (deferred_for: a definition it did
        not plan, e.g. one of FlashInfer's own traced files, would build that module inside a test); else None."""
        found = self.records.get((definition, source))
        return found if found is not None or api is None else deferred_for(self.records.values(), api, source)

    def __len__(self) -> int:
        return len(self.records)


def deferred_for(records: Iterable[BuildRecord], api: str, source: str) -> BuildRecord | None:
    """The deferral that stands for `api` (from `source`): the first deferred record of `source` whose API is `api`
    or whose `covers` names it (the other APIs that load the JIT modules its known build makes:
    expect.sharing_apis), copied as a deferred record of `api` whose message names the definition it was deferred
    for and whether through the same API or a shared JIT module; None when no deferred record of `source` is or
    covers `api`.
    Those modules are the ones left to the jit- session. (An fp8 MoE file of FlashInfer's own, not among the
    prebuild's jobs, built that module for 10 minutes inside a test while holding device memory, and a case
    waiting to take the device alone held every other process: H200, 2026-11-29.)"""
    for r in records:
        if r.status == "deferred" and r.source == source and api in (r.api, *r.covers):
            same = "the same API" if r.api == api else f"{r.api}, the same JIT module"
            return BuildRecord(r.definition, r.source, "deferred", api=api,
                               message=f"{r.message or 'left to a jit- session'} (deferred for {r.definition}, "
                                       f"{same})")
    return None


# -- a running prebuild ---------------------------------------------------------------------------------------
STATE_STALE = 60.0  # seconds without a heartbeat after which a waiter takes the prebuild for dead


def state_path(report: str | Path) -> Path:
    """The state file of the prebuild writing `report` (jit.jsonl -> jit.state.json)."""
    report = Path(report)
    return report.with_name(f"{report.stem}.state.json")


def _key(definition: str, source: str) -> str:
    return f"{source}:{definition}"


class StateWriter:
    """The prebuild's side of its state file, rewritten whole (atomically) on every change and heartbeat: the
    jobs planned (definition, source, api, budget, expected seconds), each one's start and end, and `finished`.
    Without a report path it writes nothing."""

    def __init__(self, report: str | Path | None, planned: Iterable[tuple[str, str, str, float, float]], *,
                 clock: Callable[[], float] = time.time):
        self.path, self.clock = (state_path(report) if report else None), clock
        now = clock()
        try:  # a resumed report's earlier lines say nothing of this run's jobs until they end again
            offset = os.path.getsize(report) if report else 0
        except OSError:
            offset = 0
        self.state: dict[str, Any] = {
            "pid": os.getpid(), "started": now, "heartbeat": now, "finished": False, "offset": offset,
            "jobs": {_key(d, s): {"definition": d, "source": s, "api": api, "budget": budget, "expected": guess,
                                  "started": None, "ended": False} for d, s, api, budget, guess in planned}}
        self._write()

    def started(self, definition: str, source: str, at: float) -> None:
        job = self.state["jobs"].get(_key(definition, source))
        if job is not None:
            job["started"] = at
            self._write()

    def ended(self, definition: str, source: str) -> None:
        job = self.state["jobs"].get(_key(definition, source))
        if job is not None:
            job["ended"] = True
            self._write()

    def beat(self) -> None:
        self._write()

    def finish(self) -> None:
        self.state["finished"] = True
        self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        self.state["heartbeat"] = self.clock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.state, f)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except OSError:
            pass  # no state: waiters see none and read the report as it is


class PrebuildWatch:
    """The report of a prebuild that may still be running. `outcome` answers at once where the report has the job,
    or where no running prebuild has it planned; otherwise it waits (polling) until the job's record appears, and
    gives a `build-timeout` record saying why when the prebuild ended without one, stopped beating (`stale`
    seconds), or the job ran `stale` seconds past its own budget from its own start."""

    def __init__(self, path: str | Path | None, *, poll: float = 0.5, stale: float = STATE_STALE,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep):
        if poll <= 0 or stale <= 0:
            raise ValueError(f"PrebuildWatch: poll and stale must be > 0 seconds, got {poll!r}, {stale!r}")
        self.path = Path(path) if path else None
        self.poll, self.stale, self.clock, self.sleep = poll, stale, clock, sleep
        self.records: dict[tuple[str, str], BuildRecord] = {}
        self.at: dict[tuple[str, str], int] = {}  # where in the report each record's line starts
        self._offset = 0

    def _read(self) -> None:
        """The report's lines appended since the last read (a torn last line waits for its end)."""
        if self.path is None:
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return
        start = self._offset
        for line in chunk.split(b"\n")[:-1]:
            record = _record(line.decode("utf-8", "replace"))
            if record is not None:
                self.records[record.key], self.at[record.key] = record, start
            start += len(line) + 1
        self._offset = start  # a torn last line is read again, whole, next time

    def state(self) -> dict[str, Any] | None:
        if self.path is None:
            return None
        try:
            data = json.loads(state_path(self.path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and isinstance(data.get("jobs"), dict) else None

    def _verdict(self, definition: str, source: str, state: Any = False) -> tuple[bool, BuildRecord | None]:
        """(settled, record): settled when waiting longer cannot change the answer (`state`: one already read)."""
        self._read()
        state = self.state() if state is False else state
        job = state["jobs"].get(_key(definition, source)) if state else None
        found = self.records.get((definition, source))
        if found is not None and (not isinstance(job, dict) or job.get("ended")
                                  or self.at[found.key] >= int(state.get("offset") or 0)):
            return True, found
        if not isinstance(job, dict):
            return True, None  # no running prebuild has it: nothing to wait for
        if job.get("ended"):  # its record was written before its state: read again
            self._read()
            return True, self.records.get((definition, source)) or self._missing(job, "its record is missing")
        now = self.clock()
        if state.get("finished"):
            return True, self._missing(job, "the prebuild ended without a record of it (interrupted?)")
        if now - float(state.get("heartbeat") or 0) > self.stale:
            return True, self._missing(job, f"the prebuild stopped answering (no heartbeat for {self.stale:g} s)")
        started, budget = job.get("started"), float(job.get("budget") or 0)
        if started is not None and now - float(started) > budget + self.stale:
            return True, self._missing(job, f"not ended {budget:g} + {self.stale:g} s after its start")
        return False, None

    @staticmethod
    def _missing(job: dict, why: str) -> BuildRecord:
        return BuildRecord(job["definition"], job["source"], "build-timeout", api=job.get("api"),
                           budget=job.get("budget"), message=f"no build record: {why}")

    def outcome(self, definition: str, source: str, api: str | None = None) -> BuildRecord | None:
        """The job's record, waiting for it while the running prebuild has it planned and not ended; for a job it
        does not have, the deferral standing for `api` (deferred_for, as JitReport.outcome)."""
        while True:
            settled, record = self._verdict(definition, source)
            if settled:
                if record is None and api is not None:
                    return deferred_for(self.records.values(), api, source)
                return record
            self.sleep(self.poll)

    def pending(self, definitions: Iterable[str]) -> list[tuple[str, str]]:
        """The jobs of these definitions a running prebuild has planned and not settled yet."""
        state = self.state()
        if not state:
            return []
        names = set(definitions)
        return [(j["definition"], j["source"]) for j in state["jobs"].values()
                if isinstance(j, dict) and j.get("definition") in names
                and not self._verdict(j["definition"], j["source"], state)[0]]

    def wait(self, definitions: Iterable[str], timeout: float | None = None,
             stop: Callable[[], bool] | None = None) -> bool:
        """Until every job of these definitions has settled (True), or `timeout` seconds passed or `stop()` says
        so (False)."""
        names, deadline = list(definitions), None if timeout is None else self.clock() + timeout
        while self.pending(names):
            if (deadline is not None and self.clock() >= deadline) or (stop is not None and stop()):
                return False
            self.sleep(self.poll)
        return True


@cache
def watch(path: str) -> PrebuildWatch:
    """The watch of the report at `path`, one per process (it reads the report as it grows)."""
    return PrebuildWatch(path)

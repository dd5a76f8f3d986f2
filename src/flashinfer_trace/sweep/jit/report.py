"""The JIT report: jit.jsonl, one BuildRecord per (definition, kernel source) as each prebuild job ends, and
how it is read back (`JitReport.load(path).outcome(definition, source)`: the path is passed, not found in
the environment).

A leaf module (the standard library and the status vocabulary only): the engine reads the report while
cases run, and must not import the sweep (its planner imports the ground truths) to do so.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ...status import BuildStatus

__all__ = ["STATUSES", "BuildRecord", "JitReport", "cached", "read_report", "summarise"]

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
    checked_by: str = "warm-up"  # or "stamp": unchanged since its last warm-up, not run (Stamps)
    nice: int | None = None  # the build's CPU priority (URGENT jobs keep the session's, others NICE)
    message: str | None = None
    log_tail: str | None = None
    log: str | None = None  # the job's full compiler log, when kept
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
    records = list(records)
    modules = sorted({m for r in records for m in r.modules})
    return {"counts": dict(Counter(r.status for r in records)), "jobs": len(records), "modules_built": modules,
            "stamped": sum(r.checked_by == "stamp" for r in records),
            "job_seconds": round(sum(r.seconds for r in records), 1),
            "slowest": [{"definition": r.definition, "source": r.source, "status": r.status, "seconds": r.seconds,
                         "modules": r.modules} for r in sorted(records, key=lambda r: -r.seconds)[:10]]}


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


class JitReport:
    """One prebuild's records by (definition, source), for the callers handed the report's path."""

    def __init__(self, records: Iterable[BuildRecord] = ()):
        self.records: dict[tuple[str, str], BuildRecord] = {r.key: r for r in records}

    @classmethod
    def load(cls, path: str | Path | None) -> JitReport:
        """The report at `path`; an empty one when `path` is empty or unreadable."""
        return cls(read_report(path))

    def outcome(self, definition: str, source: str) -> BuildRecord | None:
        """The prebuild's record of (definition, source); None when it did not build that pair."""
        return self.records.get((definition, source))

    def __len__(self) -> int:
        return len(self.records)


@cache
def cached(path: str) -> JitReport:
    """The report at `path`, read once per process (a session's report is written before its tests)."""
    return JitReport.load(path)

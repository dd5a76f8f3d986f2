"""What a session says of its records: the summary lines a console and a CI log show (each failed test, the info
ones, the cases not run and the command that builds their modules), the time per phase, and the timeline of its
comparisons."""

from __future__ import annotations

import threading
import time
from collections import Counter

from ..results.record import CaseRecord
from .results import SessionInfo, TestRecord


def not_run_kinds(records: list) -> dict[str, int] | None:
    """The cases not run, by why (`building`: their modules are a `jit-` session's to build), apart from the
    failures; None when every case ran."""
    kinds = Counter(str(getattr(r, "kind", None) or "other") for r in records if str(r.status) == "not-run")
    return dict(kinds) or None


def building_lines(info: SessionInfo, session: str, combination: str) -> list[str]:
    """What to run so that the cases not run for their modules run next time: one command for every deferred job."""
    from .jit.expect import build_command

    count = (info.not_run or {}).get("building", 0)
    deferred = (info.jit or {}).get("deferred") or []
    if not deferred:
        return []
    names = list(dict.fromkeys(d["definition"] for d in deferred))
    longest = max(float(d.get("expected") or 0.0) for d in deferred)
    return [f"  {len(deferred)} JIT job(s) deferred, {count} case(s) not run: building; build them beside or "
            f"before {session}, then run it again:",
            f"    {build_command(f'jit-{combination}', names, longest)}"]


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


def info_line(records: list, limit: int = 10) -> str:
    """The info records in one line of their own, apart from the failures: tests whose kernel differs where its
    API promises nothing (verdict/contract.py), which fail nothing but should not go unseen."""
    from ..escape import for_terminal

    names = [for_terminal(r.nodeid or "-".join(str(p) for p in (r.definition, r.source, r.path, r.size, r.case)
                                                if p is not None)) for r in records[:limit]]
    more = f", ... and {len(records) - limit} more" if len(records) > limit else ""
    return (f"  info {len(records)}, outside the API's contract (not failures; the records say why): "
            + ", ".join(names) + more)


def phase_totals(records: list[TestRecord] | list[CaseRecord]) -> dict[str, float]:
    """Where the tests' time went, summed over every test (each records its `phases`)."""
    totals: dict[str, float] = {}
    for r in records:
        phases = r.phases if isinstance(r, CaseRecord) else r.properties.get("phases")
        for k, v in (phases.items() if isinstance(phases, dict) else ()):
            if isinstance(v, (int, float)):
                totals[k] = totals.get(k, 0.0) + v
    return {k: round(v, 1) for k, v in totals.items()}


class Timeline:
    """When the session's comparisons came (wall seconds from the session's start): the first and the last case
    that compared a kernel or the torch ground truth with the reference (pass, fail, info, xfail, xpass), and the same
    for the kernels' comparisons alone (FlashInfer, SGLang). Thread-safe: the records arrive from the
    supervisor's threads."""

    RAN = ("pass", "fail", "info", "xfail", "xpass", "passed", "failed")
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

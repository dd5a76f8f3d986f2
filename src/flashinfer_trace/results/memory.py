"""What a session's records say of the device's memory: the largest planned and measured peaks, the planner's
misses, the cases retried alone, and the harness's failures (not-run: out-of-memory, worker-start), which make a
session unclean whatever its verdicts say."""

from __future__ import annotations

from typing import Any

from ..status import HARNESS_KINDS, Kind, Status


def memory_summary(records: list) -> dict[str, Any] | None:
    """Per session (session.json `memory`); None where no record carries memory figures (a CPU session)."""
    figures = [r.memory for r in records if isinstance(getattr(r, "memory", None), dict)]
    harness = [r for r in records if getattr(r, "status", None) is Status.NOT_RUN
               and getattr(r, "kind", None) in HARNESS_KINDS]
    if not figures and not harness:
        return None
    planned = [m["planned"] for m in figures if isinstance(m.get("planned"), int)]
    measured = [m["measured"] for m in figures if isinstance(m.get("measured"), int)]
    over = [r for r in records if isinstance(getattr(r, "memory", None), dict) and r.memory.get("over_plan")]
    worst = max(over, key=lambda r: r.memory["measured"] / max(1, r.memory["planned"]), default=None)
    return {
        "cases": len(figures),
        "planned_max_bytes": max(planned, default=None),
        "measured_max_bytes": max(measured, default=None),
        "over_plan": len(over),
        "worst_over_plan": None if worst is None else {
            "nodeid": worst.nodeid or worst.definition, "planned": worst.memory["planned"],
            "measured": worst.memory["measured"], "ground_truth": worst.memory.get("ground_truth")},
        "retried_alone": sum(1 for m in figures if m.get("alone")),
        # run again after every other test process had ended (sweep/session.py rerun_alone)
        "rerun_alone": sum(1 for m in figures if m.get("rerun_alone")),
        "out_of_memory": sum(1 for r in harness if r.kind is Kind.OUT_OF_MEMORY),
        "harness": len(harness),
    }


def memory_line(summary: dict[str, Any] | None) -> str | None:
    """One line for the session's console summary."""
    if not summary:
        return None

    def gib(n: Any) -> str:
        return "-" if not isinstance(n, int) else f"{n / 2**30:.2f} GiB"

    return (f"device memory: {summary['cases']} case(s), peak planned {gib(summary['planned_max_bytes'])}, "
            f"measured {gib(summary['measured_max_bytes'])}; over plan {summary['over_plan']}, retried alone "
            f"{summary['retried_alone']}, run again alone {summary.get('rerun_alone', 0)}, out of memory (the "
            f"harness's) {summary['out_of_memory']}"
            + (f", workers the device refused {other}" if (other := summary.get("harness", 0)
                                                           - summary["out_of_memory"]) else ""))

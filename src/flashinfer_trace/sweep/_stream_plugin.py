"""Pytest plugin for the children of `isolation.run_isolated`: streams one JSON line per event to the
file named by its option --trace-stream, flushed line by line, so that whatever the child reported
before a segfault or a kill survives it and the supervisor knows which test was running. A flushed line
is in the kernel's page cache, which outlives the process; no fsync: the only reader is the supervisor on
the same host, which a host crash ends too (an fsync per event cost ~3 ms, two per test, ~17k tests a session).

Events: {"event": "collected", "nodeids": [...], "cases": {nodeid: the case's identity}} (a test that
records a case says which before it runs, so the record of a crash during it names the case),
{"event": "collect_error", "nodeid", "message"}, {"event": "start", "nodeid", "time"}, and one
{"event": "report", "nodeid", "status", "duration", "message", "properties"} per test with setup, call
and teardown folded into one status.

--trace-deselect names a file of nodeids (one a line) to deselect by exact match: the
supervisor's resume list. Pytest's own --deselect matches prefixes, so deselecting `test_x` would
also drop `test_x2` and `test_x[1]`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

STREAM_OPTION = "--trace-stream"
DESELECT_OPTION = "--trace-deselect"
MESSAGE_CHARS = 1500

_stream = None
_pending: dict[str, dict[str, Any]] = {}  # nodeid -> the test's reports folded so far


def _emit(event: dict[str, Any]) -> None:
    if _stream is None:
        return
    _stream.write(json.dumps(event, default=repr) + "\n")
    _stream.flush()


def _json_safe(value: Any) -> Any:
    try:
        return json.loads(json.dumps(value, default=repr))
    except (TypeError, ValueError):
        return {str(k): repr(v) for k, v in value.items()} if isinstance(value, dict) else repr(value)


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("flashinfer-trace isolation", "the isolation supervisor's child (sweep/isolation.py)")
    g.addoption(STREAM_OPTION, default=None, metavar="FILE", help="stream one JSON line per event here")
    g.addoption(DESELECT_OPTION, default=None, metavar="FILE", help="deselect the nodeids listed here (exact match)")


def pytest_configure(config: pytest.Config) -> None:
    global _stream
    path = config.getoption(STREAM_OPTION)
    if path and _stream is None:
        _stream = open(path, "a", encoding="utf-8")  # open for the whole session


def pytest_unconfigure(config: pytest.Config) -> None:
    global _stream
    if _stream is not None:
        _stream.close()
        _stream = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = config.getoption(DESELECT_OPTION)
    if not path or not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        drop = {line.rstrip("\n") for line in f if line.strip()}
    if not drop:
        return
    keep = [item for item in items if item.nodeid not in drop]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in drop])
        items[:] = keep


def pytest_collection_finish(session: pytest.Session) -> None:
    cases = {item.nodeid: case for item in session.items if (case := dict(item.user_properties).get("case"))}
    _emit({"event": "collected", "nodeids": [item.nodeid for item in session.items], "cases": _json_safe(cases)})


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        text = str(report.longrepr)
        _emit({"event": "collect_error", "nodeid": report.nodeid,
               "message": text[-MESSAGE_CHARS:]})  # the cause is at the end of a collection traceback


def pytest_runtest_logstart(nodeid: str, location) -> None:
    _emit({"event": "start", "nodeid": nodeid, "time": time.time()})


def _message(report: pytest.TestReport) -> str | None:
    longrepr = report.longrepr
    if longrepr is None:
        return None
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, lineno, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    text = getattr(crash, "message", None) or str(longrepr)
    return text[:MESSAGE_CHARS]


def _phase(report: pytest.TestReport) -> tuple[str, str | None]:
    """The status this phase alone gives the test, and why."""
    xfail = getattr(report, "wasxfail", None)
    if report.when != "call" and report.failed:
        return "error", f"error in {report.when}: {_message(report)}"
    if report.skipped:
        if xfail is not None:
            return "xfailed", xfail or _message(report)
        return "skipped", _message(report)
    if report.failed:
        return "failed", _message(report)
    if xfail is not None:
        return "xpassed", xfail or None
    return "passed", None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    state = _pending.setdefault(report.nodeid, {"status": "passed", "duration": 0.0, "messages": [],
                                                "properties": {}})
    state["duration"] += report.duration or 0.0
    state["properties"].update(dict(report.user_properties))
    if report.when != "call" and report.passed:
        return
    status, message = _phase(report)
    if state["status"] != "error":  # a setup/teardown error wins over whatever the call did
        state["status"] = status
    if message:
        state["messages"].append(message)


def pytest_runtest_logfinish(nodeid: str, location) -> None:
    state = _pending.pop(nodeid, None)
    if state is None:
        return
    _emit({"event": "report", "nodeid": nodeid, "status": state["status"], "duration": state["duration"],
           "message": "\n".join(state["messages"])[:2 * MESSAGE_CHARS] or None,
           "properties": _json_safe(state["properties"])})

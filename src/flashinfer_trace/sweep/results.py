"""What a session leaves behind, `results/<session>/`, written atomically:

    session.json    the session: combination, status (ok / tests-failed / harness-failed / install-failed /
                    arch-mismatch / no-gpu / uninstallable; running until it ends, interrupted), reason,
                    install mode, constraints hash
    env.json        the environment manifest (manifest.py)
    fi_trace/       a references session's import of FlashInfer's own definitions (>= 0.7) and its
                    manifest.fi-trace; their records are in tests.jsonl with definition_set "fi_trace"
    jit.jsonl       the JIT prebuild, one record per (definition, kernel source) as each ends (jit/)
    tests.jsonl     one record per test as it finishes (fsynced): what a killed session leaves
    tests.json      one record per test: a references session's are CaseRecords (results/record.py,
                    schema_version 2), a bench session's pytest's own (TestRecord, schema_version 1)
    junit.xml       the same records as JUnit XML
    benchmark.jsonl each benchmark as it finishes (bench sessions; pytest-benchmark's format)
    benchmark.json  pytest-benchmark's JSON of the last child (bench sessions)

A session that could not install writes session.json with status install-failed and the log tail,
and no tests; the matrix shows the whole combination as install-failed. `matrix build` reads the
streams where the whole-file results are missing.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..escape import for_xml
from ..results.stream import (  # noqa: F401 - re-exported: the sweep's modules read and write through these
    JsonlStream,
    from_fields,
    read_jsonl,
    read_latest,
    write_atomic,
    write_json,
)

if TYPE_CHECKING:  # the noxfile imports this module with the standard library and packaging only
    from ..results.record import CaseRecord

RECORD_SCHEMA = 2  # results/record.py's SCHEMA_VERSION: a references session's tests.json

SCHEMA_VERSION = 1
TEST_STATUSES = ("passed", "failed", "error", "timeout", "skipped", "xfailed", "xpassed")
# harness-failed: the tests ran, but some could not be judged for the harness's own failure (out of device memory);
# running: written at the start, so a killed session still says so
SESSION_STATUSES = ("ok", "tests-failed", "harness-failed", "install-failed", "arch-mismatch", "no-gpu",
                    "uninstallable", "running", "interrupted")
RAN = ("ok", "tests-failed", "harness-failed")  # the sessions whose tests ran (their records are the matrix's)
FILES = ("session.json", "env.json", "tests.json", "junit.xml", "benchmark.json")


@dataclass
class TestRecord:
    __test__ = False  # a record, not a pytest test class

    nodeid: str
    status: str
    duration: float = 0.0
    message: str | None = None  # skip reason, failure summary, crash signal
    properties: dict[str, Any] = field(default_factory=dict)  # definition, source, size, seed, tolerance, ...

    def __post_init__(self):
        if self.status not in TEST_STATUSES:
            raise ValueError(f"unknown test status {self.status!r}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SessionInfo:
    session: str
    combination: str
    status: str = "ok"
    reason: str | None = None
    install_mode: str | None = None
    constraints_file: str | None = None
    constraints_sha256: str | None = None
    arch: str | None = None
    started: str | None = None
    finished: str | None = None
    wall_seconds: float | None = None
    counts: dict[str, int] = field(default_factory=dict)
    # the not-run cases by kind, apart from the failures (`building`: their JIT modules are the combination's
    # `jit-` session's to build; the session is no less ok for them)
    not_run: dict[str, int] | None = None
    log_tail: str | None = None
    jit: dict[str, Any] | None = None  # the JIT prebuild: counts, seconds, modules, compiled during tests
    phases: dict[str, float] | None = None  # the tests' time summed by phase (inputs, reference, ...)
    mps: dict[str, Any] | None = None  # GPU sessions: whether CUDA MPS was used, and why not (sweep/mps.py)
    fresh_seed: int | None = None  # the run's fresh seed, the same in every test process (replay: --seeds N)
    # seconds from the session's start to its first and last comparison, and to the prebuild's end (session.py)
    timeline: dict[str, Any] | None = None
    # a references session's fi_trace step (sweep/fitrace_step.py): FlashInfer's own definitions imported into
    # fi_trace/ and checked beside ours, or why not (status skip, kind not-installed / api-missing)
    fi_trace: dict[str, Any] | None = None
    # a GPU session's device memory (results/memory.py): peaks planned and measured, misses, retries, harness failures
    memory: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self):
        if self.status not in SESSION_STATUSES:
            raise ValueError(f"unknown session status {self.status!r}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


FAILURES = ("failed", "xpassed", "fail", "xpass")  # pytest's words (bench sessions) and the engine's
ERRORS = ("error", "timeout")
SKIPS = ("skipped", "xfailed", "skip", "xfail", "not-run")


def _junit_fields(r: TestRecord | CaseRecord) -> tuple[str, str, str, float, str | None, dict[str, Any]]:
    """(classname, name, status, seconds, message, properties) of either kind of record."""
    if not isinstance(r, TestRecord):  # a CaseRecord
        name = r.nodeid or "-".join(str(p) for p in (r.definition, r.check, r.source, r.size, r.seed, r.case)
                                    if p is not None)
        path, _, test = name.partition("::")
        props = {k: v for k, v in r.as_dict().items() if v not in (None, [], {}) and k not in ("detail", "reports")}
        return path.removesuffix(".py").replace("/", "."), test or path, r.status.value, r.seconds, r.detail, props
    path, _, test = r.nodeid.partition("::")
    return path.removesuffix(".py").replace("/", "."), test or path, r.status, r.duration, r.message, r.properties


def junit_xml(records: list[TestRecord] | list[CaseRecord], suite: str) -> bytes:
    """The records as JUnit XML. Every string goes through for_xml: a message may quote a definition, and
    one control character in it would otherwise make the whole file unparseable."""
    rows = [_junit_fields(r) for r in records]
    root = ET.Element("testsuites")
    ts = ET.SubElement(root, "testsuite", name=for_xml(suite), tests=str(len(rows)),
                       failures=str(sum(r[2] in FAILURES for r in rows)),
                       errors=str(sum(r[2] in ERRORS for r in rows)),
                       skipped=str(sum(r[2] in SKIPS for r in rows)),
                       time=f"{sum(r[3] for r in rows):.3f}")
    for classname, name, status, seconds, message, properties in rows:
        tc = ET.SubElement(ts, "testcase", classname=for_xml(classname), name=for_xml(name), time=f"{seconds:.3f}")
        if properties:
            props = ET.SubElement(tc, "properties")
            for k, v in properties.items():
                ET.SubElement(props, "property", name=for_xml(k),
                              value=for_xml(v if isinstance(v, str) else json.dumps(v, default=str)))
        msg = for_xml((message or "")[:2000])
        if status in FAILURES:
            ET.SubElement(tc, "failure", message=msg.splitlines()[0] if msg else status).text = msg
        elif status in ERRORS:
            ET.SubElement(tc, "error", message=f"{status}: {msg.splitlines()[0] if msg else ''}").text = msg
        elif status in SKIPS:
            ET.SubElement(tc, "skipped", message=msg)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def counts(records: list[TestRecord] | list[CaseRecord]) -> dict[str, int]:
    return dict(Counter(str(r.status) for r in records))


def write_session(directory: str | Path, session: SessionInfo, *,
                  records: list[TestRecord] | list[CaseRecord] | None = None,
                  manifest: dict[str, Any] | None = None) -> Path:
    """Write everything the session has; tests.json / junit.xml only when tests ran."""
    directory = Path(directory)
    if records is not None:
        session.counts = counts(records)
        cases = bool(records) and not isinstance(records[0], TestRecord)
        write_json(directory / "tests.json", {"schema_version": RECORD_SCHEMA if cases else SCHEMA_VERSION,
                                              "session": session.session, "tests": [r.as_dict() for r in records]})
        write_atomic(directory / "junit.xml", junit_xml(records, session.session))
    if manifest is not None:
        write_json(directory / "env.json", manifest)
    write_json(directory / "session.json", session.as_dict())
    return directory


def read_records(path: str | Path) -> list[TestRecord] | list[CaseRecord]:
    """A tests.json's records: CaseRecords (schema_version 2), else pytest's TestRecords."""
    data = json.loads(Path(path).read_text())
    if data.get("schema_version") == RECORD_SCHEMA:
        from ..results.record import CaseRecord

        return [CaseRecord.model_validate(t) for t in data["tests"]]
    return [TestRecord(**t) for t in data["tests"]]

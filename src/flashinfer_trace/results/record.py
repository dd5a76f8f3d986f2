"""`CaseRecord`: what one checked case says, written by both faces of the engine (`check` and the pytest
suite) and the only thing the matrix reads.

Versioned: `schema_version` 2 is this model (`definition_set` was added to it with a default, so records
written before it read as this repository's set); version 1 was the pytest suite's bag of properties
(`TestRecord`: nodeid, pytest status, message, properties), which `from_v1` converts, so the
committed snapshot's results still build the same matrix.
"""

from __future__ import annotations

import enum
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..status import Kind, Status

SCHEMA_VERSION = 2
FI_TRACE_SET = "fi_trace"  # FlashInfer's own definitions (import-fi-trace), beside this repository's definitions/
DEFINITION_SETS = (FI_TRACE_SET,)


def qualified_name(definition: str, definition_set: str | None) -> str:
    """The name a definition goes by beside the other sets: `fi_trace/<name>` (FlashInfer may name one
    of its definitions as we name ours), a definition of definitions/ by its plain name."""
    return f"{definition_set}/{definition}" if definition_set else definition


class Check(str, enum.Enum):
    """What a case checks."""

    SHAPE = "shape"  # the reference's output shapes against the definition's axes
    DTYPE = "dtype"  # its output dtypes against the definition
    MATCH = "match"  # its outputs against a ground truth, at a size and seed
    DETERMINISTIC = "deterministic"  # two runs on the same inputs and seed are identical
    EDGE = "edge"  # its outputs against a ground truth on a named edge case
    LOAD = "load"  # the definition file itself (a load error)
    ALL = "all"  # the whole definition (a skip decided at planning: no generator, too large)

    def __str__(self) -> str:
        return self.value


class PassedOver(BaseModel):
    model_config = ConfigDict(extra="ignore")
    api: str
    reason: str = ""


class GroundTruthPath(BaseModel):
    """The kernel path a source took (its API, version, device) and the ones it passed over."""

    model_config = ConfigDict(extra="allow")
    source: str | None = None  # (version-1 records did not always say)
    path: str | None = None  # the source's path checked (groundtruth.paths); None: its plain path
    api: str | None = None
    version: str | None = None
    device: str | None = None
    passed_over: list[PassedOver] = Field(default_factory=list)


class CaseRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", use_enum_values=False)

    schema_version: Literal[2] = SCHEMA_VERSION
    definition: str
    # which set the definition is of: None this repository's definitions/, "fi_trace" FlashInfer's own
    definition_set: Literal["fi_trace"] | None = None
    op_type: str | None = None
    check: Check
    size: str | None = None
    seed: int | None = None
    case: str | None = None  # the edge case's name; None for the normal inputs
    source: str | None = None  # the ground truth compared with: flashinfer | sglang | torch
    path: str | None = None  # which of the source's paths (call modes): None its plain call, "tensor-cores+graph"
    fresh: bool = False  # the seed is this run's fresh one (drawn per run, replayable with --seeds)
    status: Status
    kind: Kind | None = None  # why it did not pass
    detail: str | None = None  # the same in words: the skip reason, the failure summary
    verdict: str | None = None  # a failed comparison: "precision" (close) or "bug"
    ground_truth: GroundTruthPath | None = None
    tolerance: dict[str, Any] | None = None
    sampling: dict[str, Any] | None = None  # a sampler's draws and thresholds
    repeats: dict[str, Any] | None = None  # the kernel run N times on the same inputs: runs, wrong, spread
    compared: list[dict[str, Any]] = Field(default_factory=list)  # per output: how close it came
    reports: list[dict[str, Any]] = Field(default_factory=list)  # per output: the full diff of a failure
    phases: dict[str, float] = Field(default_factory=dict)  # seconds per phase, worker_starts
    seconds: float = 0.0
    device_time_us: float | None = None
    # a GPU case's device memory (budget/): planned and measured peak bytes, the lease held, the ground truth's
    # memory class; over_plan where the measured peak passed the plan (the planner's miss), alone where it ran
    # with the device to itself after running out of memory
    memory: dict[str, Any] | None = None
    inputs: str | None = None  # where the inputs came from: "generator", "fi_trace init" or "declared"
    # the case's var axes (a fresh seed draws its typical counts afresh: inputs.common.fresh_count)
    axes: dict[str, int] | None = None
    known_issue: str | None = None
    failure_file: str | None = None
    environment: str | None = None
    nodeid: str | None = None  # the pytest face's test id

    @property
    def key(self) -> tuple:
        """What identifies the case: a later record of the same key replaces an earlier one."""
        return (self.definition, self.check.value, self.source, self.path, self.size, self.seed, self.case,
                self.definition_set)

    @property
    def qualified(self) -> str:
        """The definition's name among every set's (`qualified_name`): what the matrix keys rows by."""
        return qualified_name(self.definition, self.definition_set)

    @property
    def tolerance_used(self) -> float | None:
        """The largest fraction of its tolerance any output used (<= 1 passes); None when not compared."""
        used = [c.get("tolerance_used") for c in self.compared]
        finite = [float(u) for u in used if isinstance(u, (int, float)) and math.isfinite(u)]
        return max(finite) if finite else None

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_defaults=False)


def parse(obj: dict[str, Any]) -> CaseRecord:
    """A record of any schema version; raises ValueError (pydantic's ValidationError) on one that is not."""
    version = obj.get("schema_version", 1)
    if version == SCHEMA_VERSION:
        return CaseRecord.model_validate(obj)
    if version == 1:
        return from_v1(obj)
    raise ValueError(f"unknown record schema_version {version!r}")


# -- schema version 1: the pytest suite's records -----------------------------------------------------
_V1_STATUS = {"passed": Status.PASS, "failed": Status.FAIL, "error": Status.ERROR, "timeout": Status.TIMEOUT,
              "skipped": Status.SKIP, "xfailed": Status.XFAIL, "xpassed": Status.XPASS}
_V1_CHECK = {"test_output_shape": Check.SHAPE, "test_output_dtype": Check.DTYPE,
             "test_matches_ground_truth": Check.MATCH, "test_deterministic": Check.DETERMINISTIC,
             "test_edge_case": Check.EDGE}
_KINDS = {k.value: k for k in Kind}


def from_v1(test: dict[str, Any]) -> CaseRecord:
    """One version-1 test record as a CaseRecord: the only place that reads ids and messages."""
    props = test.get("properties") or {}
    nodeid, message = test["nodeid"], test.get("message")
    status = _V1_STATUS[test["status"]]
    if status is Status.FAIL and "XPASS(strict)" in (message or ""):  # pytest's strict xpass is a failure
        status = Status.XPASS
    kind = None
    if status is Status.SKIP:
        kind = _KINDS.get(props.get("skip_kind") or (message or "").partition(":")[0].strip(), Kind.OTHER)
    file_stem = Path(nodeid.partition("::")[0]).stem
    name = nodeid.partition("::")[2].partition("[")[0]
    gt = props.get("ground_truth")
    return CaseRecord(
        definition=props.get("definition") or "", op_type=file_stem.removeprefix("test_") or None,
        check=_V1_CHECK.get(props.get("check") or name, Check.MATCH), size=props.get("size"), seed=props.get("seed"),
        case=props.get("case"), source=props.get("source"), status=status, kind=kind, detail=message,
        verdict=props.get("verdict"), ground_truth=GroundTruthPath.model_validate(gt) if isinstance(gt, dict) else None,
        tolerance=props.get("tolerance"), sampling=props.get("sampling"), compared=props.get("compared") or [],
        phases={k: v for k, v in (props.get("phases") or {}).items() if isinstance(v, (int, float))},
        seconds=float(test.get("duration") or 0.0), known_issue=props.get("known_issue"),
        failure_file=props.get("failure_file"), nodeid=nodeid)


def from_test(test: dict[str, Any]) -> CaseRecord:
    """A pytest test's result (nodeid, pytest status, user properties) as the CaseRecord its test made.
    A test that died before it recorded one (a crash, a timeout) gets its case's identity with the
    supervisor's status and message; a version-1 test record is converted."""
    props = test.get("properties") or {}
    made, case = props.get("record"), props.get("case")
    if isinstance(made, dict):
        record = CaseRecord.model_validate(made)
    elif isinstance(case, dict):
        status = _V1_STATUS.get(test["status"], Status.ERROR)
        kind = Kind.CRASH if status is Status.ERROR else Kind.OTHER if status is Status.SKIP else None
        record = CaseRecord.model_validate({**case, "status": status, "kind": kind, "detail": test.get("message")})
    else:
        return from_v1(test)
    record.nodeid = test["nodeid"]
    if not record.seconds:
        record.seconds = float(test.get("duration") or 0.0)
    return record

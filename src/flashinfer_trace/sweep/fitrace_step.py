"""The references session's fi_trace step: FlashInfer's own definitions, imported into
`results/<session>/fi_trace/` and checked beside the reference suite.

    fi_trace_step(results, FiTraceConfig) -> FiTraceStep     the import (or why none), as a session note
    fi_trace_targets(step, targets)       -> targets          test_fi_trace.py given the folder, or left out

FlashInfer writes its own definitions from 0.7 on (`FI_TRACE_SPEC`, decided from the installed version).
An environment without FlashInfer, or with an older one, has nothing to import: the step is a note in
the one status vocabulary (skip, `not-installed` / `api-missing`), never an error, and the reference
suite runs as before. An emission that fails where it should work (no confinement, the worker died) is
an `error` note; the reference suite still runs. The import runs the templates in the confined worker,
as `flashinfer-trace import-fi-trace` does, and keeps its manifest beside the definitions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from ..status import Kind, Status

__all__ = ["FI_TRACE_SPEC", "FOLDER", "TEST_FILE", "FiTraceConfig", "FiTraceStep", "fi_trace_step",
           "fi_trace_targets"]

FI_TRACE_SPEC = SpecifierSet(">=0.7")  # flashinfer.trace (TraceTemplate, fi_trace) first shipped in 0.7.0
FOLDER = "fi_trace"  # under results/<session>/
TEST_FILE = "test_fi_trace.py"  # tests/references/: the one test over the imported folder
OPTION = "--fi-trace-definitions"  # pytest_plugin.FI_TRACE_OPTION (not imported: the plugin imports torch)


def import_with_worker(out: Path, op_types: list[str] | None, device: str | None) -> dict[str, Any]:
    """The real importer: FlashInfer's templates in the confined worker (fitrace/importer.py); the manifest."""
    from ..fitrace.importer import import_fi_trace

    return import_fi_trace(out, op_types, device=device)


@dataclass
class FiTraceConfig:
    """What the step needs, passed in: the installed FlashInfer's version (None: not installed), the emission
    device, the op types to import (None: all), and the importer (a seam: tests give a stand-in)."""

    flashinfer: str | None = None
    enabled: bool = True
    device: str | None = None
    op_types: tuple[str, ...] | None = None
    importer: Callable[[Path, list[str] | None, str | None], dict[str, Any]] = import_with_worker
    reuse: bool = False  # --resume: keep the folder an interrupted run imported (its records name those files)


@dataclass
class FiTraceStep:
    """The step's outcome, written into session.json as `fi_trace`."""

    status: Status
    kind: Kind | None = None
    detail: str | None = None
    flashinfer: str | None = None
    folder: str | None = None  # relative to the session's results
    manifest: str | None = None
    count: int | None = None  # definitions written
    op_types: int | None = None
    not_emitted: int | None = None  # templates that gave no definition (the manifest says why)
    seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def imported(self) -> bool:
        return self.status is Status.PASS and bool(self.count)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"], d["kind"] = self.status.value, self.kind.value if self.kind else None
        extra = d.pop("extra")
        return {**{k: v for k, v in d.items() if v is not None}, **extra}


def supported(version: str | None) -> FiTraceStep | None:
    """None where this FlashInfer writes its own definitions; else the skip note that says why not."""
    if not version:
        return FiTraceStep(Status.SKIP, Kind.NOT_INSTALLED,
                           f"not-installed: flashinfer-python (its own definitions need {FI_TRACE_SPEC})")
    try:
        ok = Version(version) in FI_TRACE_SPEC
    except InvalidVersion:
        ok = True  # a local build: let the import find out
    if not ok:
        return FiTraceStep(Status.SKIP, Kind.API_MISSING,
                           f"api-missing: flashinfer {version} has no flashinfer.trace (fi_trace needs "
                           f"flashinfer-python {FI_TRACE_SPEC})", flashinfer=version)
    return None


def fi_trace_step(results: Path, config: FiTraceConfig) -> FiTraceStep:
    """Import the installed FlashInfer's definitions into results/FOLDER, or say why not. Never raises for
    what the environment lacks or the emission hits: that is the note."""
    import time

    if not config.enabled:
        return FiTraceStep(Status.NOT_RUN, None, "--no-fi-trace: FlashInfer's own definitions not imported",
                           flashinfer=config.flashinfer)
    why_not = supported(config.flashinfer)
    if why_not is not None:
        return why_not
    from ..fitrace.layout import MANIFEST_NAME

    out = Path(results) / FOLDER
    t0 = time.monotonic()
    manifest = _earlier(out / MANIFEST_NAME) if config.reuse else None
    if manifest is None:
        try:
            manifest = config.importer(out, list(config.op_types) if config.op_types else None, config.device)
        except Exception as e:  # noqa: BLE001 - recorded as the step's error; the reference suite still runs
            return FiTraceStep(Status.ERROR, Kind.EXCEPTION, f"import-fi-trace: {type(e).__name__}: {e}"[:1500],
                               flashinfer=config.flashinfer, seconds=round(time.monotonic() - t0, 1))
    count = manifest.get("count") if isinstance(manifest, dict) else None
    if not isinstance(count, int):
        return FiTraceStep(Status.ERROR, Kind.EXCEPTION, "import-fi-trace: its manifest has no count",
                           flashinfer=config.flashinfer)
    step = FiTraceStep(Status.PASS if count else Status.SKIP, None if count else Kind.OTHER,
                       None if count else "import-fi-trace wrote no definition (the manifest says why)",
                       flashinfer=str(manifest.get("flashinfer_version") or config.flashinfer), folder=FOLDER,
                       manifest=f"{FOLDER}/{MANIFEST_NAME}", count=count, op_types=manifest.get("op_types"),
                       not_emitted=manifest.get("failed"), seconds=round(time.monotonic() - t0, 1))
    if config.op_types:
        step.extra["only_op_types"] = sorted(config.op_types)
    return step


def _earlier(path: Path) -> dict[str, Any] | None:
    import json

    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def fi_trace_targets(step: FiTraceStep, results: Path, files: list[str]) -> tuple[list[str], dict[str, tuple]]:
    """The reference suite's files and the pytest arguments some of them need: test_fi_trace.py is given the
    imported folder, or is left out where nothing was imported (the step's note says why)."""
    own: dict[str, tuple] = {}
    kept = []
    for f in files:
        if Path(f).name != TEST_FILE:
            kept.append(f)
        elif step.imported:
            kept.append(f)
            own[f] = (OPTION, str(Path(results) / FOLDER))
    return kept, own

"""`flashinfer-trace import-fi-trace`: the installed FlashInfer's own definitions, in `definitions/` layout.

The CLI process never imports FlashInfer's templates: it reads the installed version from the package
metadata, asks a confined worker to run every traced API's template (`emit.py`, worker op
`fi_trace_emit`), checks what comes back and writes `<out>/<op_type>/<name>.json` plus the manifest
(`layout.py`).
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from .emit import MIN_VERSION
from .layout import MANIFEST_NAME, write_layout

__all__ = ["MANIFEST_NAME", "FiTraceUnavailable", "default_emit_device", "import_fi_trace", "installed_flashinfer"]

DISTRIBUTIONS = ("flashinfer-python", "flashinfer")
# The emission needs shapes and dtypes only (it builds on the meta device first); an init that insists on
# model-sized CPU tensors beyond this fails, as a result, instead of computing for minutes.
EMIT_MEMORY = 10 << 30


class FiTraceUnavailable(RuntimeError):
    """No FlashInfer here, or one without flashinfer.trace: the message says which."""


def installed_flashinfer() -> str:
    """The installed FlashInfer's version, from its distribution's metadata (nothing is imported);
    FiTraceUnavailable when there is none or it predates flashinfer.trace."""
    for dist in DISTRIBUTIONS:
        try:
            version = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    else:
        raise FiTraceUnavailable(f"not-installed: flashinfer-python (import-fi-trace runs the installed "
                                 f"FlashInfer's trace templates, which need FlashInfer >= {MIN_VERSION})")
    try:
        too_old = Version(version) < Version(MIN_VERSION)
    except InvalidVersion:
        too_old = False  # a local build: let the worker find out
    if too_old:
        raise FiTraceUnavailable(f"flashinfer {version} has no flashinfer.trace (added in {MIN_VERSION})")
    return version


def default_emit_device() -> str:
    """Where the templates' inits run after the meta device: a GPU where there is one (inits that need
    CUDA emit there), else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def import_fi_trace(out: str | Path, op_types: list[str] | None = None, *,
                    timeout: float | None = None, device: str | None = None) -> dict[str, Any]:
    """Emit every traced API's definition in a confined worker and write them under `out`; the manifest.
    `device`: "cpu" or a CUDA device for the worker (None: `default_emit_device()`)."""
    from ..sandbox.pool import TaskUnavailable, run_task

    installed_flashinfer()
    try:
        emitted = run_task("flashinfer_trace.fitrace.emit", {"op_types": list(op_types) if op_types else None},
                           label="import-fi-trace", timeout=timeout, memory_bytes=EMIT_MEMORY,
                           device=device or default_emit_device())
    except TaskUnavailable as e:
        raise FiTraceUnavailable(str(e)) from None
    if not isinstance(emitted, dict):
        raise FiTraceUnavailable("the worker's emission result is not an object")
    return write_layout(emitted, Path(out))

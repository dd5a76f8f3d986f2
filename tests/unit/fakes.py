"""A stand-in `flashinfer` for the adapters' unit tests on a machine without it: the module the test built, installed
as `flashinfer` at a release and on a device of a compute capability, so the adapters' gates (versions, arch) and
call forms run on the CPU."""

from __future__ import annotations

import sys
from types import ModuleType

from packaging.version import Version

from flashinfer_trace.groundtruth import base


def install_flashinfer(monkeypatch, module: ModuleType, version: str,
                       cc: tuple[int, int] | None = (9, 0)) -> ModuleType:
    """`module` as `flashinfer` `version`; a CUDA device reports capability `cc` (None: leave the device as it is)."""
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    monkeypatch.setattr(base, "installed_version", lambda package: Version(version))
    monkeypatch.setattr(base, "_imported", {})
    if cc is not None:
        monkeypatch.setattr(base, "cuda_capability", lambda device: cc if str(device).startswith("cuda") else None)
    return module

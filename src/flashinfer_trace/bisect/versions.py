"""The releases of a package: from an index through pip (`pip index versions`, so pip's configured index and
its --index-url apply), or from a folder of wheels (the wheelhouse's own reader)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name
from packaging.version import Version

from ..sweep.wheelhouse import _wheels

if TYPE_CHECKING:
    from .search import BisectConfig


def wheelhouse_versions(folder: str | Path, package: str) -> list[Version]:
    """The versions of `package` among the wheels of `folder`."""
    folder = Path(folder)
    if not folder.is_dir():
        from .search import BisectError

        raise BisectError(f"--wheelhouse {folder}: not a folder")
    name = canonicalize_name(package)
    return sorted({v for (n, v) in _wheels(folder) if n == name})


def parse_pip_index(text: str) -> list[Version]:
    """The versions `pip index versions` printed ("Available versions: 0.7.2, 0.7.1, ...")."""
    from ..sweep.newcombo import parse_versions

    return parse_versions(text)


def index_versions(package: str, *, pre: bool = False, index_url: str | None = None,
                   python: str = sys.executable) -> list[Version]:
    """The package's releases on the index pip is configured with (or `index_url`)."""
    from .search import BisectError

    cmd = [python, "-m", "pip", "index", "versions", package, "--disable-pip-version-check",
           *(["--pre"] if pre else []), *(["--index-url", index_url] if index_url else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    found = parse_pip_index(proc.stdout)
    if proc.returncode != 0 or not found:
        tail = " ".join((proc.stderr or proc.stdout).split())[-300:]
        raise BisectError(f"no releases of {package} from the index ({' '.join(cmd[1:])}): {tail or 'none listed'}")
    return found


def list_versions(config: BisectConfig) -> list[Version]:
    """The candidates' source: the versions given, the wheelhouse folder, or the index."""
    if config.versions is not None:
        return sorted(config.versions)
    if config.wheelhouse is not None:
        return wheelhouse_versions(config.wheelhouse, config.package)
    return index_versions(config.package, pre=config.pre, index_url=config.index_url, python=config.python)

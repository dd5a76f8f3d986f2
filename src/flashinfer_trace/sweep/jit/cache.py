"""Where the kernel packages keep their JIT builds, which of those libraries a process loaded or a job built,
and the stamps beside the cache that let an unchanged job count as `cached` without running."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import threading
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import Job
    from .report import BuildRecord

__all__ = ["STAMPS", "Stamps", "cache_roots", "default_stamps", "fingerprint", "libraries", "loaded_libraries",
           "module_roots", "new_modules"]


def libraries(roots: list[Path]) -> dict[str, float]:
    """Shared libraries in the JIT caches: path -> mtime (a rebuilt module counts as built)."""
    found = {}
    for root in roots:
        if root.is_dir():
            for p in root.rglob("*.so"):
                try:
                    found[str(p)] = p.stat().st_mtime
                except OSError:
                    continue
    return found


def new_modules(before: dict[str, float], after: dict[str, float]) -> list[str]:
    """Modules whose library appeared or was rebuilt between two `libraries` readings."""
    return sorted(Path(p).stem for p, m in after.items() if before.get(p) != m)


def loaded_libraries(roots: list[Path], maps: str = "/proc/self/maps") -> dict[str, float]:
    """The JIT cache's libraries this process has loaded: path -> mtime. The cache alone cannot say
    which job built what (eight jobs build side by side); what a job's call loaded is its own."""
    prefixes = tuple(str(r.resolve()) + os.sep for r in roots)
    found: dict[str, float] = {}
    try:
        with open(maps) as f:
            for line in f:
                path = line.split(maxsplit=5)[-1].strip() if line.count(" ") >= 5 else ""
                if path.endswith(".so") and path.startswith(prefixes) and path not in found:
                    try:
                        found[path] = os.stat(path).st_mtime
                    except OSError:
                        continue
    except OSError:
        pass
    return found


STAMPS = "flashinfer-trace-prebuilt.json"


def default_stamps() -> str:
    """The stamp file of this environment's JIT cache (one per combination: nox gives each its own)."""
    return str(cache_roots()[0] / STAMPS)


@cache
def _versions() -> dict[str, str | None]:
    from importlib import metadata

    found: dict[str, str | None] = {}
    for dist in ("torch", "flashinfer-python", "sglang", "sgl-kernel"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    return found


def fingerprint(job: Job) -> str:
    """What decides which modules a job needs: the definition, the kernel package's API and versions,
    the arch the modules are built for."""
    import hashlib

    try:
        text = Path(job.path).read_bytes()
    except OSError:
        text = job.definition.encode()
    arch = {k: os.environ.get(k) for k in ("FLASHINFER_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST")}
    blob = json.dumps([job.source, job.api, hashlib.sha256(text).hexdigest(), _versions(), arch], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class Stamps:
    """What each job loaded when it last ran, kept beside the JIT cache: a job whose definition,
    versions and arch are the same and whose libraries are all there, unchanged, is `cached` without
    starting a worker (a warm machine's prebuild then runs no warm-up call). A module
    the tests still had to build would show as `compiled_during_tests` in the session. The file is shared by the
    sessions of one combination (a `jit-` session beside its references session): each entry is merged into what
    the file holds now, under a lock, so neither drops the other's."""

    def __init__(self, path: Path | None):
        self.path = path
        self.lock = threading.Lock()
        try:
            data = json.loads(path.read_text()) if path else {}
        except (OSError, ValueError):
            data = {}
        self.entries: dict[str, dict] = data if isinstance(data, dict) else {}

    @staticmethod
    def _key(definition: str, source: str) -> str:
        return f"{source}:{definition}"

    def fresh(self, job: Job) -> dict | None:
        entry = self.entries.get(self._key(job.definition, job.source))
        if not isinstance(entry, dict) or entry.get("fingerprint") != fingerprint(job):
            return None
        libraries = entry.get("libraries")
        if not isinstance(libraries, dict):
            return None
        for path, mtime in libraries.items():
            try:
                if os.stat(path).st_mtime != mtime:
                    return None
            except OSError:
                return None
        return entry

    def record(self, record: BuildRecord) -> None:
        if self.path is None or record.job is None:
            return
        key = self._key(record.definition, record.source)
        entry = {"fingerprint": fingerprint(record.job), "libraries": record.libraries,
                 "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with self.lock:
            self.entries[key] = entry
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path.with_name(f".{self.path.name}.lock"), "a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)  # another process's prebuild stamps into the same file
                    try:
                        now = json.loads(self.path.read_text())
                    except (OSError, ValueError):
                        now = {}
                    self.entries = {**(now if isinstance(now, dict) else {}), key: entry}
                    tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
                    tmp.write_text(json.dumps(self.entries, indent=1, sort_keys=True))
                    os.replace(tmp, self.path)
            except OSError:
                pass  # no stamp: the next run checks by running the job


def cache_roots() -> list[Path]:
    """Where the installed kernel packages keep their JIT builds."""
    roots = []
    try:
        from flashinfer.jit import env as fi_env  # type: ignore[import-not-found]

        roots.append(Path(fi_env.FLASHINFER_JIT_DIR))
    except Exception:  # noqa: BLE001 - not installed, or a version without jit.env
        base = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", Path.home()))
        roots.append(base / ".cache" / "flashinfer")
    return roots


def module_roots() -> list[Path]:
    """Where a module may already be, so that its job need not build it: the JIT caches, and FlashInfer's AOT
    folder (`<package>/data/aot`: where flashinfer-jit-cache, `--jit-modules` and `jit import --place` put them;
    found without importing the package)."""
    roots = cache_roots()
    try:
        spec = importlib.util.find_spec("flashinfer")
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        roots.append(Path(location) / "data" / "aot")
    return roots

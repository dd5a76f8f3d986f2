"""The environment manifest (`env.json`): everything a result depends on that is not in the code.

Python; torch with its CUDA runtime and cuDNN; the versions of flashinfer and its cubin / jit-cache
packages, sglang, sgl_kernel, triton, tvm-ffi; the GPU (name, compute capability, SM count, L2,
driver) with clocks, power and temperature sampled at the start and the end of the session; the git
SHA; the combination file and its hash; the install mode; the environment variables that steer the
kernels. Collecting it never imports flashinfer or sglang (an import can crash): versions come from
package metadata.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "triton", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "sglang",
            "sglang-kernel", "sgl-kernel", "apache-tvm-ffi", "nvidia-cudnn-frontend", "cuda-python",
            "nvidia-cutlass-dsl", "pytest", "pytest-benchmark")
ENV_PREFIXES = ("FLASHINFER_", "TORCH_CUDA_ARCH_LIST", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "MAX_JOBS",
                "FLASHINFER_TRACE_", "CCACHE_")
SMI_FIELDS = ("name", "compute_cap", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "power.draw",
              "power.limit", "temperature.gpu", "pstate", "clocks_event_reasons.active")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def nvidia_smi() -> list[dict[str, str]]:
    """One dict per GPU from nvidia-smi (clocks in MHz, power in W), [] without a driver."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) == len(SMI_FIELDS):
            rows.append(dict(zip(SMI_FIELDS, values, strict=True)))
    return rows


def visible(rows: list[dict[str, str]], spec: str | None) -> list[dict[str, str]]:
    """The GPUs a process pinned with CUDA_VISIBLE_DEVICES=`spec` sees, in its order (nvidia-smi lists them all);
    every row when unset or not a list of indices (UUIDs)."""
    if spec is None or not spec.strip():
        return rows
    parts = [p.strip() for p in spec.split(",")]
    if not all(p.isdigit() for p in parts):
        return rows
    return [rows[int(p)] for p in parts if int(p) < len(rows)]


def gpu_snapshot() -> dict[str, Any]:
    """Clocks, power and temperature now (the part of the GPU state that drifts)."""
    keys = ("clocks.sm", "clocks.mem", "clocks.max.sm", "power.draw", "power.limit", "temperature.gpu", "pstate",
            "clocks_event_reasons.active")
    return {"time": now(), "gpus": [{k: row.get(k) for k in keys} for row in nvidia_smi()]}


def torch_info() -> dict[str, Any]:
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - a broken torch is a fact to record
        return {"error": f"{type(e).__name__}: {e}"}
    info: dict[str, Any] = {"version": torch.__version__, "cuda": torch.version.cuda,
                            "git": getattr(torch.version, "git_version", None), "file": torch.__file__}
    try:
        info["cudnn"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001
        info["cudnn"] = None
    info["cuda_available"] = bool(torch.cuda.is_available())
    if info["cuda_available"]:
        gpus = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"name": p.name, "compute_capability": f"{p.major}.{p.minor}",
                         "sm_count": p.multi_processor_count, "memory_bytes": p.total_memory,
                         "l2_bytes": getattr(p, "L2_cache_size", None)})
        info["devices"] = gpus
    return info


def sandbox_info() -> dict[str, Any]:
    """How references are confined here (a worker is started to find out): the mechanisms active and
    missing, and whether the user allowed running without the missing ones."""
    try:
        from ..sandbox import status
        from ..sandbox.pool import describe_settings

        return {"confinement": status(probe=True), "settings": describe_settings()}
    except Exception as e:  # noqa: BLE001 - a manifest records what it could not find out
        return {"error": f"{type(e).__name__}: {e}"}


def sandbox_label(manifest: dict) -> str | None:
    """"confined", "unconfined (allowed): landlock, seccomp missing", "refused: ..." or None (not recorded)."""
    info = (manifest or {}).get("sandbox")
    if not isinstance(info, dict):
        return None
    c = info.get("confinement") or {}
    if not isinstance(c, dict) or "complete" not in c:
        return "unknown: " + str(info.get("error") or c.get("error") or "no worker ran")
    if c["complete"]:
        return "confined"
    missing = ", ".join(sorted(c.get("missing") or {}))
    return f"unconfined (allowed): {missing} missing" if c.get("allow_unconfined") else f"refused: {missing} missing"


def git_sha(repo: str | Path = ".") -> str | None:
    """HEAD (with -dirty), or $FLASHINFER_TRACE_GIT_SHA where the tree was copied without .git."""
    if os.environ.get("FLASHINFER_TRACE_GIT_SHA"):
        return os.environ["FLASHINFER_TRACE_GIT_SHA"]
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    if out.returncode != 0 or not sha:
        return None
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10).stdout.strip()
    return sha + ("-dirty" if dirty else "")


def collect(*, combination: dict | None = None, install: dict | None = None, repo: str | Path = ".") -> dict:
    smi = nvidia_smi()
    return {
        "schema_version": 1,
        "collected": now(),
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": {"system": platform.system(), "release": platform.release(), "machine": platform.machine()},
        "torch": torch_info(),
        "packages": package_versions(),
        "gpu": {"driver": smi[0]["driver_version"] if smi else None,
                "nvidia_smi": [{k: row.get(k) for k in ("name", "compute_cap", "driver_version")} for row in smi]},
        "clocks_start": gpu_snapshot(),
        "git_sha": git_sha(repo),
        "combination": combination,
        "install": install,
        "environment": {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)},
        "sandbox": sandbox_info(),
    }


def finish(manifest: dict) -> dict:
    """Add the end-of-session GPU snapshot, and the compiler cache's counters after the session."""
    from .compiler_cache import finish_record

    extra = {"compiler_cache": finish_record(manifest["compiler_cache"])} if manifest.get("compiler_cache") else {}
    return {**manifest, "clocks_end": gpu_snapshot(), "finished": now(), **extra}


if __name__ == "__main__":  # python -m flashinfer_trace.sweep.manifest: print this environment's manifest
    print(json.dumps(finish(collect()), indent=2, default=str))

"""FlashInfer JIT modules built on another machine, loaded instead of compiled again.

A fresh GPU machine, or one whose JIT cache is gone, compiles every module again (minutes a
release, fused MoE alone far more: docs/evidence/sessions.md). The modules are plain shared
libraries keyed by FlashInfer version and CUDA arch. FlashInfer loads a module it finds in
its AOT folder (`<package>/data/aot/<name>/<name>.so`, where its flashinfer-jit-cache wheel puts
them) instead of building it: `JitSpec.build_and_load` in 0.5.3, 0.6.6 and 0.6.14 (read in their sources;
0.7.x keeps an index of AOT artifacts and is not relied on here).

`--jit-modules ROOT` names a JIT cache root of another machine, laid out as this project's own
($FLASHINFER_TRACE_JIT_CACHE: `<combination>/.cache/flashinfer/<version>/<arch>/cached_ops/<name>/<name>.so`).
Only the modules of the same combination, FlashInfer version and arch are taken, so a library
never meets another release's headers; what was placed is a line of the install record.

    find(root, combination, version, arch) -> {name: library}
    place(modules, package)                -> names placed into <package>/data/aot

`flashinfer-trace jit export / import` (jitarchive.py) carry such a root's modules between machines
as one checked archive, in this same layout.

FlashInfer also publishes the modules itself, per release and CUDA version, as flashinfer-jit-cache on its own
index (https://flashinfer.ai/whl/<cu130>; a combination names it in `indexes` and pins the package). Where the
session's environment has flashinfer-jit-cache of its flashinfer-python's release, the prebuild builds nothing:
every job is recorded `prebuilt` (`package_of`, `prebuilt_records`).
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
from pathlib import Path, PurePosixPath

from packaging.version import InvalidVersion, Version

from .combos import Combination, arch_env

JIT_PACKAGE = "flashinfer-jit-cache"
SUPPORTED_BELOW = Version("0.7")  # from 0.7 FlashInfer looks AOT modules up in an index (jit/env.py get_aot_path)


def arch_folder(arch: str) -> str:
    """FlashInfer's cache folder for an arch: sm90 -> 90a (its FLASHINFER_CUDA_ARCH_LIST, no dot)."""
    return arch_env(arch)["FLASHINFER_CUDA_ARCH_LIST"].replace(".", "")


def jit_cache_root() -> Path:
    """This machine's JIT cache root, one folder per combination (the noxfile's FLASHINFER_WORKSPACE_BASE)."""
    return Path(os.environ.get("FLASHINFER_TRACE_JIT_CACHE") or Path.home() / ".cache" / "flashinfer-trace" / "jit")


def ops_folder(combination: str, version: str, arch: str) -> PurePosixPath:
    """A combination's modules of one FlashInfer version and arch, relative to a JIT cache root."""
    return PurePosixPath(combination, ".cache", "flashinfer", version, arch_folder(arch), "cached_ops")


def find(root: Path, combination: str, version: str, arch: str) -> dict[str, Path]:
    ops = Path(root) / ops_folder(combination, version, arch)
    return {d.name: d / f"{d.name}.so" for d in sorted(ops.glob("*")) if (d / f"{d.name}.so").is_file()}


def place(modules: dict[str, Path], package: Path) -> list[str]:
    """Copy each library into the package's AOT folder; one already there with the same bytes stays. The package
    may be the combination's shared folder, placed into by two of its sessions at once: each copies to a part file
    of its own."""
    for name, library in modules.items():
        dest = package / "data" / "aot" / name / f"{name}.so"
        if dest.is_file() and filecmp.cmp(dest, library, shallow=False):
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
        shutil.copyfile(library, part)
        part.replace(dest)  # a loader never sees half a library
    return list(modules)


def flashinfer_package(python: str) -> Path | None:
    """Where `python` finds the flashinfer package (found without importing it: no torch import)."""
    code = ("import importlib.util as u; s = u.find_spec('flashinfer'); "
            "print(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120).stdout.strip()
    return Path(out) if out else None


def carry_in(root: Path, combo: Combination, python: str, arch: str) -> str:
    """The install record's line: what was placed from `root`, or why nothing was (never an exception: the
    modules then compile here, as without the flag)."""
    version = combo.flashinfer
    if version is None:
        return f"--jit-modules {root}: {combo.id} pins no flashinfer-python; nothing placed"
    if version >= SUPPORTED_BELOW:
        return (f"--jit-modules {root}: flashinfer {version} finds AOT modules through an index of artifacts, which "
                "this does not write; nothing placed, every module compiles here")
    modules = find(root, combo.id, str(version), arch)
    if not modules:
        return (f"--jit-modules {root}: no modules of {combo.id} (flashinfer {version}, {arch_folder(arch)}) there; "
                "every module compiles here")
    try:
        package = flashinfer_package(python)
        if package is None:
            return f"--jit-modules {root}: the session's python finds no flashinfer package; nothing placed"
        names = place(modules, package)
    except (OSError, subprocess.SubprocessError) as e:
        return f"--jit-modules {root}: nothing more placed ({type(e).__name__}: {e}); the rest compiles here"
    return (f"placed {len(names)} prebuilt JIT modules of flashinfer {version} ({arch_folder(arch)}) from {root} "
            f"into {package / 'data' / 'aot'}, loaded there instead of compiled: {', '.join(names)}")


def package_of(versions: dict[str, str | None]) -> tuple[dict | None, str | None]:
    """(FlashInfer's prebuilt-modules package when it is of the installed release, else None; why not, when one is
    installed for another). `versions`: distribution name -> installed version (manifest.package_versions)."""
    fi, package = versions.get("flashinfer-python"), versions.get(JIT_PACKAGE)
    if not fi or not package:
        return None, None
    try:
        same = Version(package).public == Version(fi).public  # 0.6.6+cu130 is of flashinfer-python 0.6.6
    except InvalidVersion:
        return None, f"{JIT_PACKAGE} {package!r}: not a version; the modules are built"
    if not same:
        return None, f"{JIT_PACKAGE} {package} is not of flashinfer-python {fi}; the modules are built"
    return {"package": JIT_PACKAGE, "version": package, "flashinfer-cubin": versions.get("flashinfer-cubin")}, None


def prebuilt_records(jobs: list, package: dict) -> list:
    """One `prebuilt` record per prebuild job: nothing built, the package's modules load (a module it lacks would
    be compiled by the tests and show in the session's `compiled_during_tests`)."""
    from .jit.report import BuildRecord

    return [BuildRecord(j.definition, j.source, "prebuilt", api=j.api, op_type=j.op_type, budget=j.budget,
                        checked_by="package", message=f"{package['package']} {package['version']} is installed: its "
                                                      "modules load, the prebuild builds nothing")
            for j in jobs]

"""One archive of a combination's built FlashInfer JIT modules: `flashinfer-trace jit export / import`.

A cold prebuild takes minutes a release (fp8 MoE far more), and a node that cannot build, or
one whose JIT cache is gone, can load what another node built (prebuilt.py). Export packs the
modules of one combination, FlashInfer version and arch from a JIT cache root into a tar (gzip, xz
or bz2 by the name's suffix) whose first member, `jit-archive.json`, says what they are for
(combination, FlashInfer version, CUDA version, arch) and lists each module's path, size and sha256.

Import refuses, before writing anything, an archive for another FlashInfer version, CUDA version or
arch than the target's, and a member that is not a listed regular file at its listed path (absolute
paths, `..`, links: nothing can land outside the destination). It streams each member into a
temporary folder inside the destination, checks its size and sha256, and only when every module
matched moves them into place, in prebuilt.py's layout, so the destination is a `--jit-modules ROOT`
for the sessions; `--place` also copies them into an interpreter's FlashInfer AOT folder.

Optionally the archive also carries the compiler cache (compiler_cache.py: ccache's entries, under `ccache/`,
each listed with its size and sha256 in the manifest's `ccache` and checked like a module): another machine
then compiles what the modules do not cover (other releases, other definitions) from the same cache. Its entries
are keyed by compiler, flags and a CUDA/arch namespace, so entries of another CUDA version that come along are
never used for this one. An entry the destination cache already has stays as it is.

    export(root, combo, archive, build, ccache_dir=None)                   -> manifest
    import_archive(archive, dest, expect, combination, ccache_dest=None)   -> (manifest, {name: library})
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from packaging.version import InvalidVersion, Version

from . import prebuilt
from .combos import ARCHS, ID_PATTERN, Combination, arch_of

MANIFEST = "jit-archive.json"
KIND = "flashinfer-trace-jit-modules"
FORMAT = 1
COMPRESSION = {".tar": "", ".tar.gz": "gz", ".tgz": "gz", ".tar.xz": "xz", ".txz": "xz", ".tar.bz2": "bz2",
               ".tbz2": "bz2"}
DEFAULT_DEST = Path.home() / ".cache" / "flashinfer-trace" / "jit-modules"
MODULE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
CUDA = re.compile(r"(\d+)\.(\d+)(?:\.\d+)?")
CCACHE_PREFIX = "ccache"
CCACHE_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
CCACHE_SKIP = ("stats", "CACHEDIR.TAG", "ccache.conf")  # counters and settings, not entries
CHUNK = 1 << 20
MANIFEST_LIMIT = 16 << 20


class JitArchiveError(ValueError):
    pass


@dataclass(frozen=True)
class Build:
    """What modules are built for: they load only where all three are the same."""

    flashinfer: str
    cuda: str  # MAJOR.MINOR of the CUDA torch was built with
    arch: str  # sm90

    def differences(self, other: Build) -> list[str]:
        return [f"{what} {mine} in the archive, {theirs} here" for what, mine, theirs in (
            ("FlashInfer", self.flashinfer, other.flashinfer), ("CUDA", self.cuda, other.cuda),
            ("arch", self.arch, other.arch)) if mine != theirs]


def cuda_version(text: str, where: str = "--cuda") -> str:
    """'13.0' from '13.0' or '13.0.2'."""
    m = CUDA.fullmatch(str(text).strip())
    if not m:
        raise JitArchiveError(f"{where} {text!r}: expected a CUDA version MAJOR.MINOR, e.g. 13.0")
    return f"{int(m[1])}.{int(m[2])}"


def cuda_of_variant(variant: str) -> str | None:
    """The CUDA version of a torch wheel variant: cu130 -> 13.0; None for cpu."""
    m = re.fullmatch(r"cu(\d+)(\d)", variant)
    return f"{int(m[1])}.{m[2]}" if m else None


def check_arch(arch: str, where: str = "--arch") -> str:
    if arch not in ARCHS:
        raise JitArchiveError(f"{where} {arch!r}: expected one of {', '.join(ARCHS)}")
    return arch


def flashinfer_version(text: str, where: str = "--flashinfer-version") -> str:
    try:
        Version(text)
    except (InvalidVersion, TypeError):
        raise JitArchiveError(f"{where} {text!r}: not a version") from None
    return text


def detect_arch() -> str | None:
    """This machine's GPU arch (the first GPU nvidia-smi lists); None without one."""
    from .manifest import nvidia_smi

    found = [arch_of(g["compute_cap"]) for g in nvidia_smi() if g.get("compute_cap")]
    return found[0] if found else None


PROBE = """import importlib.metadata as m, json
try:
    fi = m.version("flashinfer-python")
except m.PackageNotFoundError:
    fi = None
try:
    import torch
    cuda = torch.version.cuda
except Exception:
    cuda = None
print(json.dumps({"flashinfer": fi, "cuda": cuda}))
"""


def probe(python: str) -> dict:
    """The FlashInfer version and torch's CUDA version that `python` has (None for what it lacks)."""
    try:
        out = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=300)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        raise JitArchiveError(f"--python {python}: cannot run it to read its FlashInfer and CUDA versions") from None


def compression(archive: str | Path) -> str:
    name = Path(archive).name
    for suffix, mode in sorted(COMPRESSION.items(), key=lambda kv: -len(kv[0])):
        if name.endswith(suffix) and len(name) > len(suffix):
            return mode
    raise JitArchiveError(f"{archive}: the name must end in {', '.join(COMPRESSION)} (it picks the compression)")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def built_archs(root: Path, combination: str, version: str) -> list[str]:
    """The archs a JIT cache root has modules of, for one combination and FlashInfer version."""
    base = Path(root) / combination / ".cache" / "flashinfer" / version
    return [a for a in ARCHS if (base / prebuilt.arch_folder(a)).is_dir()]


def ccache_entries(directory: Path) -> list[tuple[str, Path]]:
    """(member path, file) for each cache entry in a ccache folder: not its counters, settings, locks or tmp/."""
    directory = Path(directory)
    if not directory.is_dir():
        raise JitArchiveError(f"--with-ccache {directory}: not a folder")
    found = []
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory)
        if (not p.is_file() or p.is_symlink() or rel.parts[0] == "tmp" or p.name in CCACHE_SKIP
                or p.name.endswith(".lock") or not all(CCACHE_PART.fullmatch(part) for part in rel.parts)):
            continue
        found.append((str(PurePosixPath(CCACHE_PREFIX, *rel.parts)), p))
    return found


def export(root: str | Path, combo: Combination, archive: str | Path, build: Build,
           ccache_dir: str | Path | None = None) -> dict:
    """Pack `combo`'s modules of `build` under `root` into `archive` (written whole, then renamed); with
    `ccache_dir`, the compiler cache's entries too."""
    root, archive = Path(root), Path(archive)
    mode = compression(archive)
    if combo.flashinfer is None or str(combo.flashinfer) != build.flashinfer:
        raise JitArchiveError(f"{combo.id} pins flashinfer-python {combo.flashinfer}, not {build.flashinfer}")
    modules = prebuilt.find(root, combo.id, build.flashinfer, build.arch)
    if not modules:
        where = root / prebuilt.ops_folder(combo.id, build.flashinfer, build.arch)
        others = built_archs(root, combo.id, build.flashinfer)
        raise JitArchiveError(f"no built modules in {where}" + (f" (there are of {', '.join(others)}: --arch)"
                                                                 if others else "") +
                              f": build them first (`nox -s jit-{combo.id}` or `flashinfer-trace jit build`)")
    folder = prebuilt.ops_folder(combo.id, build.flashinfer, build.arch)
    entries = [{"name": name, "path": str(folder / name / f"{name}.so"), "size": so.stat().st_size,
                "sha256": _sha256(so)} for name, so in modules.items()]
    manifest = {"kind": KIND, "format": FORMAT, "combination": combo.id, "constraints_sha256": combo.sha256,
                **asdict(build), "arch_folder": prebuilt.arch_folder(build.arch),
                "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "modules": entries}
    sources = {e["path"]: modules[e["name"]] for e in entries}
    if ccache_dir is not None:
        cached = ccache_entries(Path(ccache_dir))
        manifest["ccache"] = [{"path": path, "size": f.stat().st_size, "sha256": _sha256(f)} for path, f in cached]
        sources |= dict(cached)
    archive.parent.mkdir(parents=True, exist_ok=True)
    part = archive.with_name(f".{archive.name}.part")
    try:
        with tarfile.open(part, f"w:{mode}" if mode else "w") as tar:
            data = json.dumps(manifest, indent=1).encode()
            tar.addfile(_info(MANIFEST, len(data)), io.BytesIO(data))
            for entry in entries + manifest.get("ccache", []):
                with open(sources[entry["path"]], "rb") as f:
                    tar.addfile(_info(entry["path"], entry["size"]), f)
        os.replace(part, archive)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return manifest


def _info(name: str, size: int) -> tarfile.TarInfo:
    """A plain file member: no owner, no host's mode bits."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, int(time.time())
    return info


def read_manifest(data: bytes, archive: Path) -> dict:
    """The manifest, every field checked: its paths decide where files are written."""
    where = f"{archive}: {MANIFEST}"
    try:
        m = json.loads(data)
    except ValueError as e:
        raise JitArchiveError(f"{where}: not JSON ({e})") from None
    if not isinstance(m, dict) or m.get("kind") != KIND or m.get("format") != FORMAT:
        raise JitArchiveError(f"{where}: not a JIT module manifest of format {FORMAT}")
    for key in ("combination", "flashinfer", "cuda", "arch"):
        if not isinstance(m.get(key), str):
            raise JitArchiveError(f"{where}: `{key}` missing or not a string")
    if not ID_PATTERN.match(m["combination"]):
        raise JitArchiveError(f"{where}: combination {m['combination']!r} is not a combination id")
    flashinfer_version(m["flashinfer"], f"{where}: flashinfer")
    cuda_version(m["cuda"], f"{where}: cuda")
    check_arch(m["arch"], f"{where}: arch")
    if not isinstance(m.get("modules"), list) or not m["modules"]:
        raise JitArchiveError(f"{where}: `modules` missing or empty")
    folder = prebuilt.ops_folder(m["combination"], m["flashinfer"], m["arch"])
    seen = set()
    for entry in m["modules"]:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not MODULE_NAME.fullmatch(name) or name in seen:
            raise JitArchiveError(f"{where}: module {entry!r:.120}: a unique name of letters, digits, _.+- is needed")
        seen.add(name)
        if entry.get("path") != str(folder / name / f"{name}.so"):
            raise JitArchiveError(f"{where}: module {name}: path {entry.get('path')!r} is not "
                                  f"{folder / name / f'{name}.so'}")
        if not _sized(entry):
            raise JitArchiveError(f"{where}: module {name}: size and sha256 are needed")
    cached = m.get("ccache", [])
    if not isinstance(cached, list):
        raise JitArchiveError(f"{where}: `ccache` is not a list")
    for entry in cached:
        path = entry.get("path") if isinstance(entry, dict) else None
        parts = PurePosixPath(path).parts if isinstance(path, str) else ()
        if (len(parts) < 2 or parts[0] != CCACHE_PREFIX or not all(CCACHE_PART.fullmatch(p) for p in parts[1:])
                or path in seen or not _sized(entry)):
            raise JitArchiveError(f"{where}: ccache entry {entry!r:.120}: a unique path {CCACHE_PREFIX}/... of "
                                  "letters, digits, _.+- with its size and sha256 is needed")
        seen.add(path)
    return m


def _sized(entry: dict) -> bool:
    return isinstance(entry.get("size"), int) and entry["size"] >= 0 and isinstance(entry.get("sha256"), str) and \
        bool(re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]))


def _member_path(member: tarfile.TarInfo, archive: Path) -> str:
    """A member's name as a safe relative path, or the refusal that names it."""
    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith("/") or PurePosixPath(name).is_absolute():
        raise JitArchiveError(f"{archive}: member {name!r} has an absolute path: refused, nothing written")
    if ".." in parts or "\\" in name or "\0" in name:
        raise JitArchiveError(f"{archive}: member {name!r} is not a plain relative path (.., \\ or NUL): refused, "
                              "nothing written")
    if member.issym() or member.islnk():
        raise JitArchiveError(f"{archive}: member {name!r} is a link (to {member.linkname!r}): refused, nothing "
                              "written")
    if not (member.isfile() or member.isdir()):
        raise JitArchiveError(f"{archive}: member {name!r} is not a regular file: refused, nothing written")
    return str(PurePosixPath(*parts)) if parts else ""


def _copy(source, path: Path, size: int) -> str:
    h, written = hashlib.sha256(), 0
    with open(path, "wb") as out:
        while chunk := source.read(CHUNK):
            h.update(chunk)
            out.write(chunk)
            written += len(chunk)
    if written != size:
        raise OSError(f"{written} bytes read, the member says {size}")
    return h.hexdigest()


def import_archive(archive: str | Path, dest: str | Path, expect: Build, combination: str | None = None,
                   ccache_dest: str | Path | None = None) -> tuple[dict, dict[str, Path]]:
    """Check `archive` against the target `expect` (and `combination`, when given), then write its
    modules under `dest` (and its compiler cache entries, if any, into `ccache_dest` when given). Every refusal
    comes before the first file is moved into `dest`."""
    archive, dest = Path(archive), Path(dest)
    if not archive.is_file():
        raise JitArchiveError(f"{archive}: no such file")
    try:
        tar = tarfile.open(archive, "r|*")
    except (tarfile.TarError, OSError) as e:
        raise JitArchiveError(f"{archive}: not a tar archive ({e})") from None
    made = next((p for p in reversed((dest, *dest.parents)) if not p.exists()), None)  # the top folder made here
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".jit-import-", dir=dest))  # beside the targets: a rename moves
    placed: dict[str, Path] = {}
    try:
        try:
            with tar:
                manifest, staged = _stage(tar, archive, expect, combination, staging)
        except (tarfile.TarError, EOFError, OSError) as e:
            raise JitArchiveError(f"{archive}: unreadable or damaged ({type(e).__name__}: {e}); nothing "
                                  "written") from None
        try:
            for entry in manifest["modules"]:
                target = dest / entry["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged[entry["path"]], target)
                placed[entry["name"]] = target
        except OSError as e:
            raise JitArchiveError(f"{dest}: cannot write there ({e}); {len(placed)} of {len(staged)} module(s) "
                                  "moved in, each whole") from None
        if ccache_dest is not None and manifest.get("ccache"):
            _place_ccache(manifest["ccache"], staged, Path(ccache_dest))
        return manifest, placed
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if made is not None and not placed:
            shutil.rmtree(made, ignore_errors=True)  # only folders this call made, holding nothing else


def _place_ccache(entries: list[dict], staged: dict[str, Path], target: Path) -> None:
    """Checked cache entries into a ccache folder; one it already has stays (an entry's name is its key)."""
    try:
        for entry in entries:
            path = target.joinpath(*PurePosixPath(entry["path"]).parts[1:])
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(staged[entry["path"]], path.with_name(path.name + ".part"))  # staging may be elsewhere
            os.replace(path.with_name(path.name + ".part"), path)
    except OSError as e:
        raise JitArchiveError(f"--ccache-dir {target}: cannot write there ({e}); the modules are in place") from None


def _stage(tar: tarfile.TarFile, archive: Path, expect: Build, combination: str | None,
           staging: Path) -> tuple[dict, dict[str, Path]]:
    first = tar.next()
    if first is None or first.name != MANIFEST or not first.isfile():
        raise JitArchiveError(f"{archive}: its first member is not {MANIFEST}: not an archive of `jit export`")
    if first.size > MANIFEST_LIMIT:
        raise JitArchiveError(f"{archive}: {MANIFEST} is {first.size} bytes: not a manifest of `jit export`")
    manifest = read_manifest(tar.extractfile(first).read(), archive)
    if combination is not None and manifest["combination"] != combination:
        raise JitArchiveError(f"{archive}: modules of {manifest['combination']}, not {combination}: nothing written")
    differences = Build(manifest["flashinfer"], cuda_version(manifest["cuda"]), manifest["arch"]).differences(expect)
    if differences:
        raise JitArchiveError(f"{archive}: built for another target ({'; '.join(differences)}): they would not load "
                              "here; nothing written")
    listed = {e["path"]: e for e in manifest["modules"] + manifest.get("ccache", [])}
    staged: dict[str, Path] = {}
    while (member := tar.next()) is not None:  # a stream: each member once, in order
        path = _member_path(member, archive)
        if member.isdir():
            continue
        entry = listed.get(path)
        if entry is None or path in staged:
            why = "appears twice" if path in staged else "is not a module its manifest lists"
            raise JitArchiveError(f"{archive}: member {member.name!r} {why}: refused, nothing written")
        if member.size != entry["size"]:
            raise JitArchiveError(f"{archive}: {path}: {member.size} bytes, the manifest says {entry['size']}: "
                                  "damaged, nothing written")
        staged[path] = staging / f"{len(staged)}.part"
        digest = _copy(tar.extractfile(member), staged[path], member.size)
        if digest != entry["sha256"]:
            raise JitArchiveError(f"{archive}: {path}: sha256 {digest}, the manifest says {entry['sha256']}: "
                                  "damaged, nothing written")
    missing = sorted(set(listed) - set(staged))
    if missing:
        raise JitArchiveError(f"{archive}: {len(missing)} listed module(s) missing ({', '.join(missing)}): "
                              "nothing written")
    return manifest, staged

"""Pinned combinations: `constraints/<id>.toml`, one per (torch, flashinfer-python, sglang, CUDA).

    [combination]
    cuda = "13"                    # "12", "13" or "none"
    torch_variant = "cu130"        # the PyTorch wheel index variant ("cpu", "cu128", "cu130", ...)
    archs = ["sm80", "sm90"]       # GPU archs the combination supports
    python = ">=3.10,<3.14"        # a packaging specifier
    default_for = ["cuda13"]       # optional: alias sessions (references-cuda13, bench-cuda13)
    status = "ok"                  # or "uninstallable", with `reason`: kept so the matrix shows it
    nightly = true
    indexes = ["https://flashinfer.ai/whl/cu130"]   # optional: more package indexes for the pins (FlashInfer's
                                   # own, for flashinfer-jit-cache: its prebuilt JIT modules)
    tags = ["release-axis"]        # optional: more nox tags for the per-arch reference and bench sessions (an
                                   # axis run on demand, `nox -t release-axis`, rather than in the nightly)

    [pins]                         # exact versions only
    torch = "2.11.0"
    flashinfer-python = "0.6.6"

The noxfile imports this module from the nox interpreter, so it needs only the standard library
and `packaging` (and tomli before Python 3.11).
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ARCHS = ("sm80", "sm89", "sm90", "sm100", "sm103", "sm120")
CUDA_MAJORS = ("none", "12", "13")
ALIASES = ("cpu", "cuda12", "cuda13")
STATUSES = ("ok", "uninstallable")
REQUIRED = ("cuda", "torch_variant", "archs", "python")
KNOWN_FIELDS = (*REQUIRED, "default_for", "status", "reason", "nightly", "indexes", "tags")
ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9.+_-]*$")
TAG_PATTERN = re.compile(r"^[a-z][a-z0-9-]*$")
# tags the noxfile gives sessions itself: a combination naming one would blur what `nox -t` selects
RESERVED_TAGS = ("references", "bench", "jit", "nightly", "uninstallable", "torch-axis", "cpu", "cuda12", "cuda13",
                 "tests", "lint", "matrix", *ARCHS)


class CombinationError(ValueError):
    pass


# what a session installs of the project's own dependencies, beside a combination's pins (install.py); a
# wheelhouse carries them too (wheelhouse.py)
PROJECT_REQUIREMENTS = ("packaging", "pydantic", "rich", "tomli; python_version < '3.11'", "pytest", "pytest-timeout",
                        "pytest-benchmark", "landlock>=1.0.0.dev5; sys_platform == 'linux'",
                        "pyseccomp>=0.1.2; sys_platform == 'linux'")


@dataclass(frozen=True)
class Combination:
    id: str
    path: Path
    cuda: str
    torch_variant: str
    archs: tuple[str, ...]
    python: SpecifierSet
    pins: dict[str, Version]  # canonical name -> exact version
    default_for: tuple[str, ...] = ()
    status: str = "ok"
    reason: str | None = None
    nightly: bool = True
    sha256: str = field(default="", compare=False)
    indexes: tuple[str, ...] = ()  # extra package indexes for the pins (pip --extra-index-url)
    tags: tuple[str, ...] = ()  # more nox tags for the per-arch sessions (an axis run on demand)

    @property
    def installable(self) -> bool:
        return self.status == "ok"

    @property
    def gpu(self) -> bool:
        return self.cuda != "none"

    def pin(self, name: str) -> Version | None:
        return self.pins.get(canonicalize_name(name))

    @property
    def torch(self) -> Version:
        return self.pins["torch"]

    @property
    def flashinfer(self) -> Version | None:
        return self.pin("flashinfer-python")

    @property
    def sglang(self) -> Version | None:
        return self.pin("sglang")

    def requirements(self, *, without: tuple[str, ...] = ()) -> list[str]:
        skip = {canonicalize_name(n) for n in without}
        return [f"{n}=={v}" for n, v in self.pins.items() if n not in skip]

    def constraints_text(self) -> str:
        return "\n".join(self.requirements()) + "\n"

    @property
    def label(self) -> str:
        """How matrix columns name it: CUDA / torch / flashinfer / sglang."""
        parts = [f"CUDA {self.cuda}" if self.gpu else "CPU", f"torch {self.torch}"]
        parts.append(f"flashinfer {self.flashinfer}" if self.flashinfer else "no flashinfer")
        if self.sglang:
            parts.append(f"sglang {self.sglang}")
        return " / ".join(parts)

    def metadata(self) -> dict:
        return {"id": self.id, "cuda": self.cuda, "torch_variant": self.torch_variant, "archs": list(self.archs),
                "python": str(self.python), "pins": {k: str(v) for k, v in self.pins.items()},
                "default_for": list(self.default_for), "status": self.status, "reason": self.reason,
                "label": self.label, "file": str(self.path), "sha256": self.sha256, "indexes": list(self.indexes),
                "tags": list(self.tags)}


def _need(cond: bool, path: Path, where: str, message: str) -> None:
    if not cond:
        raise CombinationError(f"{path}: {where}: {message}")


def load_combination(path: str | Path) -> Combination:
    path = Path(path)
    raw = path.read_bytes()
    try:
        data = tomllib.loads(raw.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise CombinationError(f"{path}: not valid TOML: {e}") from None
    extra = sorted(set(data) - {"combination", "pins"})
    _need(not extra, path, "$", f"unknown table(s) {extra}")
    meta, pins = data.get("combination"), data.get("pins")
    _need(isinstance(meta, dict), path, "[combination]", "missing")
    _need(isinstance(pins, dict) and bool(pins), path, "[pins]", "missing or empty")
    for key in REQUIRED:
        _need(key in meta, path, f"combination.{key}", "missing")
    unknown = sorted(set(meta) - set(KNOWN_FIELDS))
    _need(not unknown, path, "combination", f"unknown field(s) {unknown}")
    cid = path.stem
    _need(bool(ID_PATTERN.match(cid)), path, "file name", f"{cid!r} is not a valid combination id")
    cuda = meta["cuda"]
    _need(cuda in CUDA_MAJORS, path, "combination.cuda", f"{cuda!r} is not one of {', '.join(CUDA_MAJORS)}")
    variant = meta["torch_variant"]
    _need(isinstance(variant, str) and bool(re.fullmatch(r"cpu|cu\d{3}|rocm[\d.]+", variant)), path,
          "combination.torch_variant", f"{variant!r} is not cpu / cuXYZ")
    _need((variant == "cpu") == (cuda == "none"), path, "combination.torch_variant",
          f"{variant!r} does not match cuda {cuda!r}")
    if variant.startswith("cu"):
        _need(variant[2:4] == cuda, path, "combination.torch_variant", f"{variant!r} is not a CUDA {cuda} build")
    archs = meta["archs"]
    _need(isinstance(archs, list) and all(a in ARCHS for a in archs), path, "combination.archs",
          f"must be a list of {', '.join(ARCHS)}")
    _need(bool(archs) == (cuda != "none"), path, "combination.archs", "a GPU combination lists its archs; CPU none")
    try:
        python = SpecifierSet(meta["python"])
    except (InvalidSpecifier, TypeError):
        raise CombinationError(f"{path}: combination.python: {meta['python']!r} is not a version specifier"
                               ) from None
    default_for = meta.get("default_for", [])
    _need(isinstance(default_for, list) and all(a in ALIASES for a in default_for), path,
          "combination.default_for", f"must be a list of {', '.join(ALIASES)}")
    status = meta.get("status", "ok")
    _need(status in STATUSES, path, "combination.status", f"{status!r} is not one of {', '.join(STATUSES)}")
    _need(status == "ok" or bool(meta.get("reason")), path, "combination.reason",
          "an uninstallable combination says why")
    _need(isinstance(meta.get("nightly", True), bool), path, "combination.nightly", "must be true or false")
    indexes = meta.get("indexes", [])
    _need(isinstance(indexes, list) and all(isinstance(i, str) and re.fullmatch(r"(https?|file)://\S+", i)
                                            for i in indexes), path, "combination.indexes",
          f"{indexes!r}: must be a list of http(s):// or file:// index URLs")
    tags = meta.get("tags", [])
    _need(isinstance(tags, list) and all(isinstance(t, str) and TAG_PATTERN.fullmatch(t) for t in tags), path,
          "combination.tags", f"{tags!r}: must be a list of lower-case tags (letters, digits, '-')")
    reserved = sorted(set(tags) & set(RESERVED_TAGS))
    _need(not reserved, path, "combination.tags", f"{reserved} are the noxfile's own tags")
    exact: dict[str, Version] = {}
    for name, value in pins.items():
        where = f"pins.{name}"
        _need(isinstance(value, str), path, where, "must be a version string")
        try:
            req = Requirement(f"{name}=={value}")
            version = Version(value)
        except (InvalidRequirement, InvalidVersion):
            raise CombinationError(f"{path}: {where}: {value!r} is not an exact version") from None
        _need(not req.extras and not req.marker, path, where, "extras and markers do not belong in a pin")
        key = canonicalize_name(name)
        _need(key not in exact, path, where, "pinned twice")
        exact[key] = version
    _need("torch" in exact, path, "pins.torch", "missing: every combination pins torch")
    return Combination(cid, path, cuda, variant, tuple(archs), python, exact, tuple(default_for), status,
                       meta.get("reason"), meta.get("nightly", True), hashlib.sha256(raw).hexdigest(), tuple(indexes),
                       tuple(tags))


def load_combinations(directory: str | Path = "constraints") -> list[Combination]:
    """Every `*.toml` in the folder except known-issues.toml; one alias per name across files."""
    combos = [load_combination(p) for p in sorted(Path(directory).glob("*.toml")) if p.name != "known-issues.toml"]
    seen: dict[str, str] = {}
    for c in combos:
        for alias in c.default_for:
            if alias in seen:
                raise CombinationError(f"{c.path}: combination.default_for: {alias!r} is already the default of "
                                       f"{seen[alias]}")
            seen[alias] = c.id
    return combos


def find_combination(name: str, directory: str | Path = "constraints") -> Combination:
    """A combination by id (`<directory>/<id>.toml`) or by the path of its file, as commands take it."""
    path = Path(name)
    if name.endswith(".toml") or path.is_file():
        if not path.is_file():
            raise CombinationError(f"{name}: no such combination file")
        return load_combination(path)
    path = Path(directory) / f"{name}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in Path(directory).glob("*.toml") if p.name != "known-issues.toml")
        raise CombinationError(f"no combination {name!r} in {directory}/ (known: {', '.join(known) or 'none'})")
    return load_combination(path)


def default_combination(combos: list[Combination], alias: str) -> Combination | None:
    return next((c for c in combos if alias in c.default_for), None)


def arch_env(arch: str) -> dict[str, str]:
    """FLASHINFER_CUDA_ARCH_LIST / TORCH_CUDA_ARCH_LIST for one arch (FlashInfer wants the
    arch-specific 'a' targets from sm90 on)."""
    major, minor = arch[2:-1], arch[-1]
    cc = f"{major}.{minor}"
    return {"FLASHINFER_CUDA_ARCH_LIST": f"{cc}a" if int(major) >= 9 else cc, "TORCH_CUDA_ARCH_LIST": cc}


def arch_of(compute_capability: str | tuple[int, int]) -> str:
    """sm90 from "9.0" or (9, 0)."""
    if isinstance(compute_capability, str):
        major, _, minor = compute_capability.strip().partition(".")
        return f"sm{int(major)}{int(minor or 0)}"
    return f"sm{compute_capability[0]}{compute_capability[1]}"

"""Known issues as data: `constraints/known-issues.toml`, applied to the reference tests as strict
xfail, so a combination that starts passing shows as xpass (and fails the run until the entry goes).

    [[issue]]
    id = "fi-cutlass-moe-jit-sm90"
    definitions = ["moe_fp8_block_scale_*"]        # globs over definition names
    sources = ["flashinfer"]                       # optional: ground-truth sources; none = every test
    packages = { flashinfer-python = ">=0.4" }     # packaging specifiers on installed versions
    archs = ["sm90"]                               # optional: the GPU's arch
    reason = "..."
    link = "https://github.com/..."
    expires = 2027-06-30                           # past this date the entry fails loudly
    run = false                                    # optional: do not even run (a hang, a crash)
    unless_jit_ready = true                        # optional: lifted for a test whose JIT module the
                                                   # session's prebuild has (built or cached) or deferred

An entry applies when every condition holds; a package it names that is not installed does not
satisfy it. An expired entry is an error at collection: it must be re-checked, not left to rot.
`unless_jit_ready` is for an entry that exists only because a build is too slow for a session (fp8 MoE's
fused_moe_90 on sm90): where the prebuild has the module, from another machine or a long build, the
test runs and its verdict is real; where the prebuild deferred it to the combination's `jit-` session, the test
runs too and records `not-run: building` with the command that builds it (sweep/jit/expect.py).
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .. import tables

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FIELDS = ("id", "definitions", "sources", "packages", "archs", "reason", "link", "expires", "run", "unless_jit_ready")


class KnownIssueError(ValueError):
    pass


@dataclass(frozen=True)
class KnownIssue:
    id: str
    definitions: tuple[str, ...]
    packages: dict[str, SpecifierSet]
    reason: str
    link: str
    expires: date
    sources: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()
    run: bool = True
    unless_jit_ready: bool = False

    def expired(self, today: date | None = None) -> bool:
        return (today or date.today()) > self.expires

    def applies(self, definition: str, source: str | None, versions: dict[str, Version | None],
                arch: str | None, jit_ready: bool = False) -> bool:
        if self.unless_jit_ready and jit_ready:
            return False
        if not any(fnmatch.fnmatchcase(definition, g) for g in self.definitions):
            return False
        if self.sources and source not in self.sources:
            return False
        if self.archs and arch not in self.archs:
            return False
        for name, spec in self.packages.items():
            v = versions.get(name)
            if v is None or v not in spec:
                return False
        return True

    def describe(self) -> str:
        return f"known issue {self.id}: {self.reason} ({self.link})"


def load_known_issues(path: str | Path) -> list[KnownIssue]:
    path = Path(path)
    if not path.exists():
        return []
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise KnownIssueError(f"{path}: {e}") from None
    out, ids = [], set()
    required = ("id", "definitions", "packages", "reason", "link", "expires")
    for where, raw in tables.entries(data.get("issue", []), f"{path}: issue", FIELDS, required, KnownIssueError):
        if not isinstance(raw["expires"], date):
            raise KnownIssueError(f"{where}.expires: {raw['expires']!r} is not a TOML date (2027-06-30)")
        if raw["id"] in ids:
            raise KnownIssueError(f"{where}.id: {raw['id']!r} is used twice")
        ids.add(raw["id"])
        packages = {}
        for name, spec in (raw["packages"] or {}).items():
            try:
                packages[name] = SpecifierSet(spec)
            except (InvalidSpecifier, TypeError):
                raise KnownIssueError(f"{where}.packages.{name}: {spec!r} is not a version specifier") from None
        lists = {}
        for key in ("definitions", "sources", "archs"):
            value = raw.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise KnownIssueError(f"{where}.{key}: must be a list of strings")
            lists[key] = tuple(value)
        if not lists["definitions"]:
            raise KnownIssueError(f"{where}.definitions: empty")
        out.append(KnownIssue(raw["id"], lists["definitions"], packages, str(raw["reason"]), str(raw["link"]),
                              raw["expires"], lists["sources"], lists["archs"], bool(raw.get("run", True)),
                              bool(raw.get("unless_jit_ready", False))))
    return out


def installed_versions(names: set[str]) -> dict[str, Version | None]:
    out: dict[str, Version | None] = {}
    for n in names:
        try:
            out[n] = Version(importlib.metadata.version(n))
        except (importlib.metadata.PackageNotFoundError, InvalidVersion):
            out[n] = None
    return out


def pinned_versions(names: set[str], pins: dict) -> dict[str, Version | None]:
    """installed_versions for a combination read from its results (the matrix): the versions it pins."""
    out: dict[str, Version | None] = {}
    for n in names:
        try:
            out[n] = Version(str(pins[n])) if pins.get(n) else None
        except InvalidVersion:
            out[n] = None
    return out

"""Adding extracted definitions to a dataset without duplicates or silent overwrites.

Two definitions are the same kernel when everything but prose and tags matches: op type, axes,
constraints, inputs, outputs and the reference (every `description` is left out of the
comparison, tags are merged). Then:

* no definition of that name: **new**, written;
* the same kernel: **shared** (this model's tags are added to the existing file) or **unchanged**
  (it already had them);
* the same name, different content: **conflict**: an earlier version suffix (`_v2`, `_v3`, ...)
  that matches is used, otherwise the new content is saved under the next free suffix, and the
  fields that differ are reported (JSON paths).

Files are only rewritten when their content changes, so a rerun is a no-op.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

VERSION = re.compile(r"^(?P<base>.+)_v(?P<n>\d+)$")


@dataclass
class Outcome:
    name: str  # the definition's name as written (with a version suffix for conflicts)
    status: str  # new | shared | unchanged | conflict
    path: str
    model: str
    roles: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)  # conflicts: JSON paths that differ
    conflicts_with: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def semantic(d: Any) -> Any:
    """The definition without prose, tags and name: what decides whether two are one kernel."""
    if isinstance(d, dict):
        return {k: semantic(v) for k, v in d.items() if k not in ("description", "tags", "name")}
    if isinstance(d, list):
        return [semantic(v) for v in d]
    return d


def differences(a: Any, b: Any, path: str = "$") -> list[str]:
    """JSON paths where two (semantic) definitions differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                out.append(f"{path}.{k}")
            else:
                out += differences(a[k], b[k], f"{path}.{k}")
        if not out and list(a) != list(b):
            out.append(f"{path} (key order)")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b, strict=True)) for p in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


def dump(d: dict[str, Any]) -> str:
    return json.dumps(d, indent=2) + "\n"


def merge_tags(existing: list[str], new: list[str]) -> list[str]:
    return existing + [t for t in new if t not in existing]


class Dataset:
    """The definitions folder as extraction sees it: name -> (path, JSON)."""

    def __init__(self, root: Path):
        self.root = root
        self.files: dict[str, Path] = {p.stem: p for p in sorted(root.rglob("*.json"))} if root.is_dir() else {}
        self.pending: dict[str, tuple[Path, dict[str, Any]]] = {}  # written in this run (dry runs too)

    def get(self, name: str) -> tuple[Path, dict[str, Any]] | None:
        if name in self.pending:
            return self.pending[name]
        path = self.files.get(name)
        return (path, json.loads(path.read_text())) if path else None

    def versions(self, name: str) -> list[str]:
        names = set(self.files) | set(self.pending)
        found = [(int(m["n"]), n) for n in names if (m := VERSION.match(n)) and m["base"] == name]
        return [n for _, n in sorted(found)]

    def put(self, name: str, op_type: str, data: dict[str, Any], path: Path | None = None) -> Path:
        path = path or self.root / op_type / f"{name}.json"
        self.pending[name] = (path, data)
        return path


def add(ds: Dataset, definition: dict[str, Any], model: str, roles: list[str]) -> Outcome:
    name, op_type = definition["name"], definition["op_type"]
    existing = ds.get(name)
    if existing is None:
        path = ds.put(name, op_type, definition)
        return Outcome(name, "new", str(path), model, roles)
    for candidate in [name, *ds.versions(name)]:
        path, data = ds.get(candidate)
        if semantic(data) == semantic(definition):
            tags = merge_tags(data.get("tags", []), definition.get("tags", []))
            if tags == data.get("tags", []):
                return Outcome(candidate, "unchanged", str(path), model, roles)
            ds.put(candidate, op_type, {**data, "tags": tags}, path)
            return Outcome(candidate, "shared", str(path), model, roles)
    taken = [name, *ds.versions(name)]
    version = f"{name}_v{len(taken) + 1}"
    path = ds.put(version, op_type, {**definition, "name": version})
    _, first = ds.get(name)
    return Outcome(version, "conflict", str(path), model, roles, differences(semantic(first), semantic(definition)),
                   conflicts_with=name)


def write(ds: Dataset) -> list[Path]:
    """Write what changed; returns the files written."""
    written = []
    for path, data in ds.pending.values():
        text = dump(data)
        if path.exists() and path.read_text() == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written

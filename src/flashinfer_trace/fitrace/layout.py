"""Writing emitted fi_trace definitions in the `definitions/` layout, with a manifest.

`<out>/<op_type>/<name>.json` (file name == definition name, FlashInfer's JSON unchanged but for the
`fi_api:` tags of every API that emitted the same definition) and `<out>/MANIFEST_NAME`: the
FlashInfer version, the count, every file with its APIs, every failure with its reason. The manifest
is JSON but not named `*.json`, so `validate DIR` and a Dataset never take it for a definition.

What arrives here came back from the worker that ran FlashInfer's templates: it is checked like any
untrusted input (names and op types must be plain file names; sizes are bounded) before a byte is
written. Standard library only (the emit script uses it in a bare FlashInfer environment).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = ["MANIFEST_NAME", "write_layout"]

MANIFEST_NAME = "manifest.fi-trace"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}$")
_SAFE_OP = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
MAX_DEFINITION_CHARS = 4 << 20


def _text(value: Any, limit: int = 300) -> str:
    s = value if isinstance(value, str) else repr(value)
    return s if len(s) <= limit else s[:limit] + "..."


def _without_api_tags(d: dict[str, Any]) -> dict[str, Any]:
    return {**d, "tags": [t for t in d.get("tags", []) if not (isinstance(t, str) and t.startswith("fi_api:"))]}


def _of(r: dict[str, Any], key: str, kind: type) -> Any:
    value = r.get(key)
    return value if isinstance(value, kind) else kind()


def write_layout(emitted: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write the definitions of `emit.emit_all`'s result under `out`; return the manifest (also written)."""
    out = Path(out)
    results = emitted.get("results") if isinstance(emitted, dict) else None
    if not isinstance(results, list):
        raise ValueError("the emission result has no list of results")
    files: dict[str, dict[str, Any]] = {}  # name -> {"definition", "op_type", "fi_api": [...]}
    failures: list[dict[str, str]] = []
    for r in results:
        if not isinstance(r, dict):
            failures.append({"fi_api": "?", "reason": f"malformed result {_text(r, 80)}"})
            continue
        fi_api, label = _text(r.get("fi_api", "?"), 200), _text(r.get("label", ""), 200)
        where = {"fi_api": fi_api, "label": label, "op_type": _text(r.get("op_type"), 100)}
        d = r.get("definition")
        if d is None:
            failures.append(where | {"reason": _text(r.get("error", "no definition and no reason"), 500)})
            continue
        name, op_type = (d.get("name"), d.get("op_type")) if isinstance(d, dict) else (None, None)
        if not isinstance(d, dict) or not isinstance(name, str) or not _SAFE_NAME.fullmatch(name):
            failures.append(where | {"reason": f"unusable definition name {_text(name, 80)} (a file name must be "
                                               "letters, digits, '_', '.', '-')"})
            continue
        if not isinstance(op_type, str) or not _SAFE_OP.fullmatch(op_type):
            failures.append(where | {"reason": f"{name}: op_type {_text(op_type, 80)} is not an identifier"})
            continue
        if len(json.dumps(d)) > MAX_DEFINITION_CHARS:
            failures.append(where | {"reason": f"{name}: definition larger than {MAX_DEFINITION_CHARS} characters"})
            continue
        tags = d.get("tags") if isinstance(d.get("tags"), list) else []
        if f"fi_api:{fi_api}" not in tags:
            d = {**d, "tags": [*tags, f"fi_api:{fi_api}"]}
        seen = files.get(name)
        if seen is None:
            files[name] = {"definition": d, "op_type": op_type, "fi_api": [fi_api],
                           "inlined": [_text(h, 100) for h in _of(r, "inlined", list)],
                           "params": {_text(k, 100): _text(v, 100) for k, v in _of(r, "params", dict).items()}}
        elif _without_api_tags(seen["definition"]) == _without_api_tags(d):
            for t in d["tags"]:  # the same definition from another API: one file, both APIs tagged
                if t not in seen["definition"]["tags"]:
                    seen["definition"] = {**seen["definition"], "tags": [*seen["definition"]["tags"], t]}
            seen["fi_api"].append(fi_api)
        else:
            failures.append(where | {"reason": f"name-collision: {name} is also emitted by {seen['fi_api'][0]} "
                                               "with a different definition; the first one is kept"})
    out.mkdir(parents=True, exist_ok=True)
    for name, f in files.items():
        folder = out / f["op_type"]
        folder.mkdir(exist_ok=True)
        (folder / f"{name}.json").write_text(json.dumps(f["definition"], indent=2) + "\n", encoding="utf-8")
    manifest = {
        "flashinfer_version": _text(emitted.get("flashinfer_version", "unknown"), 100),
        "count": len(files),
        "op_types": len({f["op_type"] for f in files.values()}),
        "failed": len(failures),
        # what import-fi-trace added to FlashInfer's file: `params`, inputs' `param` the template declares
        # and the file leaves out; `inlined`, helpers the reference calls that the file leaves out
        "definitions": [{"name": n, "op_type": f["op_type"], "file": f"{f['op_type']}/{n}.json",
                         "fi_api": f["fi_api"], **{k: f[k] for k in ("params", "inlined") if f[k]}}
                        for n, f in sorted(files.items())],
        "failures": failures,
        "import_failures": {_text(k, 200): _text(v, 500)
                            for k, v in (emitted.get("import_failures") or {}).items()},
    }
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest

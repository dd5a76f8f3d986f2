"""The drift reports (`flashinfer-trace drift`, fitrace/drift.py) as the matrix shows them: every
`drift-*.json` under the results paths, one per FlashInfer version, folded into a per-definition entry
that the Markdown adds as a column and the HTML page as a badge linking to its drift section.

Standard library only, like the rest of the matrix build.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..fitrace.drift import category

PATTERN = "drift-*.json"


def _files(paths: list[str | Path]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file() and p.match(PATTERN):
            found.append(p)
        elif p.is_dir():
            found += sorted(p.rglob(PATTERN))
    return list(dict.fromkeys(found))



def load(paths: list[str | Path]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """One record per readable report, newest file last per version (a later file of the same version
    replaces an earlier one); unreadable ones are problems."""
    by_version: dict[str, dict[str, Any]] = {}
    problems: list[dict[str, str]] = []
    for f in _files(paths):
        try:
            data = json.loads(f.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            problems.append({"path": str(f), "problem": f"corrupt drift report: {e}"})
            continue
        if not isinstance(data, dict) or not isinstance(data.get("pairs"), list):
            problems.append({"path": str(f), "problem": "corrupt drift report: no pairs list"})
            continue
        version = str(data.get("flashinfer") or f.stem.removeprefix("drift-"))
        definitions: dict[str, dict[str, Any]] = {}
        for p in data["pairs"]:
            if not isinstance(p, dict) or not isinstance(p.get("ours"), str):
                continue
            diffs = [d for d in p.get("differences") or [] if isinstance(d, dict) and "field" in d]
            result = p.get("result") if isinstance(p.get("result"), dict) else {}
            fields = sorted({category(str(d["field"])) for d in diffs})
            if result.get("outcome") == "differ":
                fields.append("results")
            definitions[p["ours"]] = {"state": "drift" if fields else "same", "theirs": p.get("theirs"),
                                      "pairing": p.get("pairing"), "fields": fields, "differences": diffs,
                                      "result": result.get("outcome"), "result_reason": result.get("reason")}
        unpaired = (data.get("unpaired") or {}).get("ours") or []
        for u in unpaired:
            if isinstance(u, dict) and isinstance(u.get("name"), str):
                definitions.setdefault(u["name"], {"state": "unpaired", "reason": u.get("reason"), "fields": []})
        by_version[version] = {"flashinfer": version, "file": str(f), "generated": data.get("generated"),
                               "summary": data.get("summary") or {}, "definitions": definitions,
                               "unpaired_upstream": [u.get("name") for u in (data.get("unpaired") or {})
                                                     .get("upstream") or [] if isinstance(u, dict)]}
    return [by_version[v] for v in sorted(by_version)], problems


def attach(definitions: list[dict[str, Any]], reports: list[dict[str, Any]]) -> None:
    """Each definition record gets `drift`: {version: its entry} for the reports that name it."""
    for d in definitions:
        entries = {r["flashinfer"]: r["definitions"][d["name"]] for r in reports if d["name"] in r["definitions"]}
        if entries:
            d["drift"] = entries


def label(entry: dict[str, Any] | None) -> str:
    """Short text: `=` (no drift), `Δ eps, outputs.names`, `unpaired`, `·` (not in the report)."""
    if not entry:
        return "·"
    if entry.get("state") == "unpaired":
        return "unpaired"
    if entry.get("state") == "drift":
        return "Δ " + ", ".join(entry.get("fields") or [])
    return "="


def detail(entry: dict[str, Any] | None) -> str:
    """A tooltip: the pair, each difference (ours vs theirs) and the result comparison."""
    if not entry:
        return "not in this drift report"
    if entry.get("state") == "unpaired":
        return f"unpaired: {entry.get('reason') or ''}"
    lines = [f"paired with {entry.get('theirs')} ({entry.get('pairing')})"]
    lines += [f"{d['field']}: ours {d.get('ours')!r}, theirs {d.get('theirs')!r}"
              for d in entry.get("differences") or []]
    result = entry.get("result")
    lines.append(f"results: {result}" + (f" ({entry['result_reason']})" if entry.get("result_reason") else ""))
    return "\n".join(lines)

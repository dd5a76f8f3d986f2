"""matrix.md: definitions grouped by op type down, environments across, a symbol and the median
device time per cell, then the legend, the environments and any problems with the inputs."""

from __future__ import annotations

from typing import Any

from ..escape import for_markdown as _esc
from . import drift_view
from .build import fi_trace_label, jit_label


def _code(text: Any) -> str:
    return _esc(text, code=True)


def header(env: dict[str, Any]) -> str:
    parts = [_esc(p) for p in env["label"].split(" / ")]
    if env.get("status") not in (None, "ok", "tests-failed"):
        parts.append(f"**{_esc(env['status'])}**")
    return "<br>".join(parts)


def cell_text(cell: dict[str, Any] | None, symbols: dict[str, str]) -> str:
    if cell is None:
        return symbols["not-run"]
    text = symbols.get(cell["state"]) or _esc(cell["state"])
    if cell.get("kind") == "building":  # not run: its module is the combination's jit- session's to build
        text += " building"
    timing = cell.get("timing")
    if timing and timing.get("median_us") is not None:
        text += f" {timing['median_us']:.1f} µs"
    torch = (cell.get("sources") or {}).get("torch")
    if cell["state"].startswith("skip") and torch and torch["state"] in ("pass", "fail"):
        text += f" (torch {symbols[torch['state']]})"
    return text


def render_md(matrix: dict[str, Any]) -> str:
    symbols, envs = matrix["symbols"], matrix["environments"]
    cells = {(c["definition"], c["environment"]): c for c in matrix["cells"]}
    lines = ["# Compatibility matrix", "",
             f"Generated {_esc(matrix['generated'])} from {_esc(', '.join(matrix['inputs']))}: "
             f"{len(envs)} environment(s), "
             f"{len(matrix['definitions'])} definition(s). A cell is the reference checked against the kernel's "
             "ground truth (FlashInfer, else SGLang) in that environment, with its median device time when the "
             "environment was benchmarked; `(torch ✅)` marks a cell where no kernel ran but the reference agreed "
             "with the independent torch computation.", ""]
    ops: dict[str, list[dict[str, Any]]] = {}
    for d in matrix["definitions"]:  # FlashInfer's own (fi_trace) in groups of their own, after ours
        ops.setdefault(d.get("group") or d["op_type"] or "unknown", []).append(d)
    versions = [str(r.get("flashinfer")) for r in matrix.get("drift") or []]  # flashinfer-trace drift reports
    drift_headers = "".join(f" drift (fi {_esc(v)}) |" for v in versions)
    for op, defs in ops.items():
        own = defs[0].get("set") == "fi_trace"
        lines += [f"## {_esc(op)}" + (" (FlashInfer's own definitions: import-fi-trace)" if own else ""), "",
                  "| definition |" + drift_headers + " " + " | ".join(header(e) for e in envs) + " |",
                  "|---|" + "---|" * (len(versions) + len(envs))]
        for d in defs:
            row = [cell_text(cells.get((d["name"], e["id"])), symbols) for e in envs]
            drift = "".join(f" {_esc(drift_view.label((d.get('drift') or {}).get(v)))} |" for v in versions)
            lines.append(f"| {_code(d['name'])} |" + drift + " " + " | ".join(row) + " |")
        lines.append("")
    lines += ["## Legend", "", " · ".join(f"{symbols[s]} {s}: {text}" for s, text in matrix["states"].items()), ""]
    lines += ["## Environments", "",
              "| environment | GPU | status | references ran | JIT prebuild | fi_trace | sessions | reason |",
              "|---|---|---|---|---|---|---|---|"]
    for e in envs:
        lines.append(f"| {_esc(e['label'])} | {_esc(e.get('gpu') or '-')} | {_esc(e['status'])} | "
                     f"{_esc(e.get('sandbox') or 'not recorded')} | {_esc(jit_label(e.get('jit')))} | "
                     f"{_esc(fi_trace_label(e.get('fi_trace')))} | "
                     f"{_esc(', '.join(e['sessions']))} | {_esc(e.get('reason') or '')} |")
    if matrix.get("not_run"):
        lines += ["", "## Combinations not run", "", "| combination | CUDA | archs | why |", "|---|---|---|---|"]
        lines += [f"| {_esc(c['label'])} ({_code(c['combination'])}) | {_esc(c['cuda'])} | "
                  f"{_esc(', '.join(c['archs']))} | {_esc(c['reason'])} |" for c in matrix["not_run"]]
    building = [c for c in matrix["cells"] if c.get("kind") == "building"]
    if building:
        labels = {e["id"]: e["label"] for e in envs}
        lines += ["", "## Not run: modules still building", "",
                  "Cases whose JIT module takes longer to build than a session's budget: the session's prebuild left "
                  "it to the combination's `jit-` session (docs/matrix-sessions.md); they run once it is built.", "",
                  "| environment | definition | reason |", "|---|---|---|"]
        lines += [f"| {_esc(labels.get(c['environment'], c['environment']))} | {_code(c['definition'])} | "
                  f"{_esc(c.get('reason') or '')} |" for c in building]
    built = [e for e in envs if (e.get("jit") or {}).get("modules")]
    if built:
        lines += ["", "## JIT builds per module", "",
                  "Wall seconds of each module's first compilation (the prebuild runs modules in parallel, so "
                  "a module's time includes the load of the others).", "",
                  "| environment | module | seconds | first needed by |", "|---|---|---|---|"]
        lines += [f"| {_esc(e['label'])} | {_code(m['module'])} | {_esc(m['seconds'])} | {_code(m.get('definition'))} |"
                  for e in built for m in e["jit"]["modules"]]
    if matrix["problems"]:
        lines += ["", "## Problems with the inputs", ""]
        lines += [f"- {_code(p['path'])}: {_esc(p['problem'])}" for p in matrix["problems"]]
    return "\n".join(lines) + "\n"

"""What an extraction did, for people (Markdown) and machines (JSON): per model the kernels and
whether each was new, shared with what the dataset had, unchanged or in conflict (with the fields
that differ), what the model runs that has no template, and the kernels shared across models."""

from __future__ import annotations

from typing import Any

from ..escape import for_markdown as md
from . import Extraction, shared_kernels


def build_report(ex: Extraction, definitions: str) -> dict[str, Any]:
    models = []
    for p in ex.plans:
        cfg = p.config
        models.append({"model": cfg.name, "config": cfg.source, "architecture": cfg.get("model_type"),
                       "tp": cfg.tp, "ep": cfg.ep, "fp8_block": cfg.fp8_block, "counts": ex.counts(cfg.name),
                       "kernels": [o.as_dict() for o in ex.outcomes if o.model == cfg.name],
                       "left_out": p.left_out})
    return {"dry_run": ex.dry_run, "definitions": definitions, "models": models,
            "conflicts": [o.as_dict() for o in ex.outcomes if o.status == "conflict"],
            "written": [str(p) for p in ex.written], "shared_across_models": shared_kernels(definitions)}


def render_report_md(report: dict[str, Any]) -> str:
    lines = ["# Extraction report" + (" (dry run: nothing written)" if report["dry_run"] else ""), ""]
    for m in report["models"]:
        counts = md(", ".join(f"{k} {v}" for k, v in sorted(m["counts"].items())))
        lines += [f"## {md(m['model'])} ({md(m['architecture'])}, tp {md(m['tp'])}, ep {md(m['ep'])}"
                  f"{', fp8 block ' + md(m['fp8_block']) if m['fp8_block'] else ''})", "",
                  f"{len(m['kernels'])} kernel(s): {counts}. Config: {md(m['config'], code=True)}.", "",
                  "| definition | status | where the model runs it |", "|---|---|---|"]
        for k in m["kernels"]:
            lines.append(f"| {md(k['name'], code=True)} | {md(k['status'])} | {md('; '.join(k['roles']))} |")
        if m["left_out"]:
            lines += ["", "Left out (no template): " + md("; ".join(m["left_out"]))]
        lines.append("")
    if report["conflicts"]:
        lines += ["## Conflicts", "", "Same name, different content: saved under a version suffix.", "",
                  "| saved as | conflicts with | differing fields |", "|---|---|---|"]
        for c in report["conflicts"]:
            lines.append(f"| {md(c['name'], code=True)} | {md(c['conflicts_with'], code=True)} | "
                         f"{md(', '.join(c['differences']))} |")
        lines.append("")
    shared = report["shared_across_models"]
    lines += ["## Kernels shared across models", ""]
    if shared:
        lines += ["| definition | models |", "|---|---|"]
        lines += [f"| {md(n, code=True)} | {md(', '.join(ms))} |" for n, ms in sorted(shared.items())]
    else:
        lines.append("none")
    return "\n".join(lines) + "\n"

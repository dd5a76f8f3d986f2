"""extract: the definitions of every kernel a model runs, from its config."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..escape import for_rich
from .common import add_common_options, err, out, print_json


def add_commands(sub) -> None:
    s = sub.add_parser("extract", help="definitions of every kernel a model runs, from its config")
    add_common_options(s)
    which = s.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a bundled model (llama-3.1-8b, ...) or an architecture "
                                       "(llama, mixtral, qwen2_moe, qwen3_moe, deepseek_v3)")
    which.add_argument("--config", metavar="FILE", help="a Hugging Face style config.json")
    s.add_argument("--name", help="the model tag (default: from the config)")
    s.add_argument("--tp", type=int, help="tensor parallelism (default: the bundled config's, else 1)")
    s.add_argument("--ep", type=int, help="expert parallelism (default: the bundled config's, else 1)")
    s.add_argument("--page-size", type=int, default=1, help="KV-cache page size (default 1)")
    s.add_argument("--dry-run", action="store_true", help="show what would change; write nothing")
    s.add_argument("--report", default="results/extract", metavar="DIR", help="where the reports go")
    s.set_defaults(func=cmd_extract)


def cmd_extract(args: argparse.Namespace) -> int:
    from ..dataset import definitions_dir
    from ..extract import ConfigError, extract, load_config, select_models
    from ..extract.report import build_report, render_report_md
    from ..sweep.results import write_atomic

    overrides = {"tp": args.tp, "ep": args.ep}
    try:
        if args.config:
            configs = [load_config(args.config, name=args.name, **overrides)]
        else:
            configs = select_models(args.model, **overrides)
            if args.name and len(configs) == 1:
                configs = [select_models(args.model, name=args.name, **overrides)[0]]
        folder = str(definitions_dir(args.definitions))
        ex = extract(configs, folder, page_size=args.page_size, dry_run=args.dry_run)
    except ConfigError as e:
        err.print(f"error: {for_rich(e)}", highlight=False, style="red")
        return 2
    report = build_report(ex, folder)
    if not args.dry_run:
        path = Path(args.report)
        write_atomic(path / "extract-report.json", json.dumps(report, indent=2) + "\n")
        write_atomic(path / "extract-report.md", render_report_md(report))
    if args.json:
        print_json(report)
        return 0
    for m in report["models"]:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(m["counts"].items()))
        out.print(f"[bold]{for_rich(m['model'])}[/] (tp {m['tp']}, ep {m['ep']}): {len(m['kernels'])} kernel(s): "
                  f"{for_rich(counts)}", highlight=False)
        for k in m["kernels"]:
            if k["status"] in ("new", "conflict"):
                extra = f" (conflicts with {k['conflicts_with']}: {', '.join(k['differences'])})" \
                    if k["status"] == "conflict" else ""
                out.print(for_rich(f"  {k['status']:9s} {k['name']}{extra}"), highlight=False)
        for why in m["left_out"]:
            out.print(f"  [dim]left out: {for_rich(why)}[/]", highlight=False)
    out.print(f"{len(report['shared_across_models'])} definition(s) shared across models; "
              + ("dry run: nothing written" if args.dry_run else
                 f"{len(ex.written)} file(s) written; report in {for_rich(args.report)}/extract-report.md"),
              highlight=False)
    return 0

"""FlashInfer's own definitions (fi_trace, >= 0.7): import-fi-trace, drift."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..escape import for_rich
from .common import add_common_options, add_sandbox_options, configure_sandbox, err, out, print_json


def add_commands(sub) -> None:
    s = sub.add_parser("import-fi-trace",
                       help="write the installed FlashInfer's own definitions (fi_trace, >= 0.7) as "
                            "<out>/<op_type>/<name>.json; its templates run in the confined worker")
    add_common_options(s)
    add_sandbox_options(s)
    s.add_argument("--out", default="fi_trace_definitions", metavar="DIR",
                   help="output folder (default: ./fi_trace_definitions)")
    s.add_argument("--op-type", action="append", metavar="T", help="only these op types (repeatable)")
    s.add_argument("--device", default=None,
                   help="where the templates' inits run after the meta device: cpu or cuda (default: cuda when "
                        "available); a GPU lets the inits that need CUDA emit")
    s.set_defaults(func=cmd_import_fi_trace)

    s = sub.add_parser("drift", help="our definitions against FlashInfer's own (fi_trace) definitions of one version")
    add_common_options(s)
    add_sandbox_options(s)
    s.add_argument("--ours", metavar="DIR", help="our definitions (default: --definitions, else ./definitions)")
    s.add_argument("--upstream", metavar="DIR", required=True, help="FlashInfer's definitions of one version")
    s.add_argument("--out", metavar="FILE", help="the report (default: results/drift-<version>.json)")
    s.add_argument("--fi-version", help="the upstream FlashInfer version (default: from the --upstream path)")
    s.add_argument("--size", default="small", choices=("small", "medium", "large"), help="inputs' size tier")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--no-results", action="store_true", help="compare fields only; run no reference")
    s.set_defaults(func=cmd_drift)


def cmd_import_fi_trace(args: argparse.Namespace) -> int:
    """The installed FlashInfer's own definitions (fi_trace, >= 0.7), emitted in a confined worker."""
    from ..fitrace.importer import MANIFEST_NAME, FiTraceUnavailable, import_fi_trace
    from ..sandbox import ConfinementUnavailable, ReferenceFailure

    configure_sandbox(args)
    try:
        manifest = import_fi_trace(args.out, args.op_type, device=args.device)
    except (FiTraceUnavailable, ConfinementUnavailable, ReferenceFailure) as e:
        err.print(f"[red]import-fi-trace: {for_rich(e)}[/]", highlight=False)
        return 2
    if args.json:
        print_json(manifest)
        return 0
    for f in manifest["failures"]:
        out.print(f"[yellow]-[/] {for_rich(f['fi_api'])} ({for_rich(f.get('label', ''))}): "
                  f"{for_rich(f['reason'])}", highlight=False)
    out.print(f"flashinfer {for_rich(manifest['flashinfer_version'])}: {manifest['count']} definition(s) over "
              f"{manifest['op_types']} op type(s) written to {for_rich(args.out)}, {manifest['failed']} "
              f"template(s) not emitted; manifest: {for_rich(Path(args.out) / MANIFEST_NAME)}", highlight=False)
    return 0


def cmd_drift(args: argparse.Namespace) -> int:
    """Our definitions against FlashInfer's own (fi_trace) of one version: fields and reference results."""
    from ..fitrace.drift import ResultSettings, report, summary_lines, write

    configure_sandbox(args)
    r = report(args.ours or args.definitions or "definitions", args.upstream, version=args.fi_version,
               settings=ResultSettings(size=args.size, seed=args.seed, enabled=not args.no_results))
    path = write(r, args.out or f"results/drift-{r['flashinfer']}.json")
    if args.json:
        print_json(r)
    else:
        for line in summary_lines(r):
            out.print(for_rich(line), highlight=False)
        for p in r["problems"]:
            err.print(for_rich(f"problem: {p['path']}: {p['problem']}"), highlight=False)
        out.print(for_rich(f"wrote {path}"), highlight=False)
    return 0

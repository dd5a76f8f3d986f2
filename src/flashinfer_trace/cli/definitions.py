"""Reading definitions: validate, schema, list, show, inputs, coverage."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.table import Table

from ..escape import for_rich
from .common import add_common_options, add_input_options, describe, generate, out, print_json


def _add_follow_links(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--follow-links", action="store_true",
                        help="read definition files that are symlinks out of the definitions folder (refused by "
                             "default: docs/sandbox.md)")


def add_commands(sub) -> None:
    s = sub.add_parser("validate", help="check definition files; exit 1 on any problem")
    add_common_options(s)
    _add_follow_links(s)
    s.add_argument("paths", nargs="*", help="files or folders (default: the definitions folder)")
    s.set_defaults(func=cmd_validate)

    s = sub.add_parser("schema", help="print the definition JSON Schema")
    add_common_options(s)
    s.set_defaults(func=cmd_schema)

    s = sub.add_parser("list", help="list definitions")
    add_common_options(s)
    s.add_argument("--op-type")
    s.add_argument("--tag")
    s.add_argument("--model")
    _add_follow_links(s)
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("show", help="show one definition")
    add_common_options(s)
    s.add_argument("name", help="definition name or path to its JSON file")
    s.add_argument("--reference", action="store_true", help="print the reference source too")
    s.add_argument("--ground-truths", action="store_true",
                   help="the kernel path each source takes here, the ones it passes over, or why none runs")
    s.add_argument("--device", default=None, help="for --ground-truths: cpu or cuda (default: cuda when available)")
    _add_follow_links(s)
    s.set_defaults(func=cmd_show)

    s = sub.add_parser("inputs", help="shapes and dtypes of generated inputs")
    add_common_options(s)
    add_input_options(s)
    s.add_argument("name", help="definition name or path to its JSON file")
    s.set_defaults(func=cmd_inputs)

    s = sub.add_parser("coverage", help="tests, ground truths and axis values per op type")
    add_common_options(s)
    s.add_argument("--tests", default="tests/references", help="the generated tests folder")
    s.set_defaults(func=cmd_coverage)


def cmd_validate(args: argparse.Namespace) -> int:
    from ..dataset import definitions_dir
    from ..validate import validate_paths

    paths = args.paths or [definitions_dir(args.definitions)]
    reports, summary = validate_paths(paths, follow_links=args.follow_links)
    if args.json:
        print_json({
            "ok": summary.ok,
            "summary": asdict(summary),
            "problems": [asdict(p) for r in reports for p in r.problems],
            "notes": [asdict(p) for r in reports for p in r.notes],
        })
    else:
        for r in reports:
            for p in r.problems:
                out.print(f"[red]✗[/] {for_rich(p.file)}: [bold]{for_rich(p.path)}[/]: {for_rich(p.message)} "
                          f"[dim]\\[{p.kind}][/]", highlight=False)
            for p in r.notes:  # accepted by a documented fi_trace rule (docs/definitions.md)
                out.print(f"[dim]note[/] {for_rich(p.file)}: {for_rich(p.path)}: {for_rich(p.message)} "
                          f"[dim]\\[{p.kind}][/]", highlight=False)
        colour = "green" if summary.ok else "red"
        kinds = ", ".join(f"{k}: {n}" for k, n in summary.by_kind.items())
        out.print(f"[{colour}]{summary.files} file(s), {summary.files_with_problems} with problems, "
                  f"{summary.problems} problem(s)[/]" + (f" ({kinds})" if kinds else "")
                  + (f", {summary.notes} note(s)" if summary.notes else ""), highlight=False)
    return 0 if summary.ok else 1


def cmd_schema(args: argparse.Namespace) -> int:
    from ..definition import json_schema

    print_json(json_schema())
    return 0


class _AtLeast:
    """A renderable laid out at least `width` columns wide, wider than the terminal if need be: a line the
    terminal wraps can still be copied whole, a cell rich shortens cannot."""

    def __init__(self, renderable: Any, width: int) -> None:
        self.renderable, self.width = renderable, width

    def __rich_console__(self, console, options):
        yield from console.render(self.renderable, options.update_width(max(options.max_width, self.width)))


# the narrowest the tags column may get before the table is laid out wider than the terminal
_MIN_TAGS_WIDTH = 20


def cmd_list(args: argparse.Namespace) -> int:
    from ..dataset import Dataset

    defs = Dataset(args.definitions, follow_links=args.follow_links).select(op_type=args.op_type, tag=args.tag,
                                                                            model=args.model)
    if args.json:
        print_json([{"name": d.name, "op_type": d.op_type, "tags": d.tags,
                     "file": str(d.source) if d.source else None} for d in defs])
        return 0
    # names are never shortened (they are what `show`, `run` and `check` take): the name and op_type
    # columns do not wrap, only the tags do, and the table grows past a narrow terminal before a name is cut
    table = Table(title=f"{len(defs)} definition(s)")
    table.add_column("op_type", no_wrap=True)
    table.add_column("name", no_wrap=True)
    table.add_column("tags", overflow="fold")
    rows = [(for_rich(d.op_type), for_rich(d.name), for_rich(" ".join(d.tags)))
            for d in sorted(defs, key=lambda d: (d.op_type, d.name))]
    for row in rows:
        table.add_row(*row)
    widest = [max((len(d.op_type) for d in defs), default=0), max((len(d.name) for d in defs), default=0)]
    # four borders and a space either side of each of the three cells
    out.print(_AtLeast(table, sum(widest) + _MIN_TAGS_WIDTH + 4 + 6))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from ..dataset import load_definition

    d = load_definition(args.name, definitions=args.definitions, follow_links=args.follow_links)
    paths = _ground_truth_paths(d, args.device) if args.ground_truths else None
    if args.json:
        print_json(d.as_dict | ({"ground_truths": paths} if paths is not None else {}))
        return 0
    out.print(f"[bold]{for_rich(d.name)}[/]  op_type={for_rich(d.op_type)}  {for_rich(d.source or '')}",
              highlight=False)
    if d.description:
        out.print(for_rich(d.description, multiline=True), highlight=False)
    out.print("tags: " + for_rich(" ".join(d.tags)), highlight=False)
    axes = Table(title="axes")
    for col in ("axis", "type", "value", "description"):
        axes.add_column(col)
    for name, a in d.axes.items():
        axes.add_row(for_rich(name), for_rich(a.type), for_rich(getattr(a, "value", "")),
                     for_rich(a.description or ""))
    out.print(axes)
    for section in ("inputs", "outputs"):
        t = Table(title=section)
        for col in ("name", "shape", "dtype", "description"):
            t.add_column(col)
        for name, s in getattr(d, section).items():
            shape = "scalar" if s.shape is None else "[" + ", ".join(s.shape) + "]"
            t.add_row(for_rich(name), for_rich(shape), for_rich(s.dtype.value if s.dtype is not None else "unknown"),
                      for_rich(s.description or ""))
        out.print(t)
    if d.constraints:
        out.print("constraints: " + for_rich("; ".join(d.constraints)), highlight=False)
    if args.reference:
        out.print(for_rich(d.reference, multiline=True), highlight=False)
    if paths is not None:
        t = Table(title=f"ground truths on {for_rich(next(iter(paths.values()))['device'])}")
        for col in ("source", "runs", "passed over / why not"):
            t.add_column(col, overflow="fold")
        for source, p in paths.items():
            notes = [f"{o['api']}: {o['reason']}" for o in p.get("passed_over", [])]
            t.add_row(for_rich(source), for_rich(p.get("api") or "-"),
                      for_rich("\n".join(notes) if p.get("api") else p["unavailable"], multiline=True))
        out.print(t)
    return 0


def _ground_truth_paths(d, device: str | None) -> dict[str, dict]:
    """Per source: what runs here (describe(), with what it passed over) or why nothing does."""
    from ..groundtruth import GroundTruthUnavailable, default_device, ground_truths

    device = device or default_device()
    return {s: {"device": device, "unavailable": str(g)} if isinstance(g, GroundTruthUnavailable) else g.describe()
            for s, g in ground_truths(d, device=device).items()}


def cmd_inputs(args: argparse.Namespace) -> int:
    d, inputs = generate(args, args.name)
    described = {k: describe(v) for k, v in inputs.values.items()}
    if args.json:
        print_json({"definition": d.name, "size": args.size, "seed": args.seed, "case": args.case,
                    "source": inputs.source, "axes": inputs.axes, "inputs": described})
        return 0
    out.print("axes: " + for_rich(", ".join(f"{k}={v}" for k, v in inputs.axes.items())), highlight=False)
    t = Table(title=for_rich(f"{d.name} inputs (size={args.size}, seed={args.seed}, case={args.case}, "
                              f"from: {inputs.source})"))
    for col in ("name", "shape", "dtype", "value"):
        t.add_column(col)
    for k, info in described.items():
        t.add_row(for_rich(k), "scalar" if info["shape"] is None else str(tuple(info["shape"])),
                  for_rich(info["dtype"]), for_rich(info.get("value", "")))
    out.print(t)
    return 0


def cmd_coverage(args: argparse.Namespace) -> int:
    from ..coverage import coverage
    from ..dataset import Dataset

    defs = list(Dataset(args.definitions))
    cov = coverage(defs, Path(args.tests))
    if args.json:
        print_json(cov.as_dict())
        return 0
    t = Table(title=f"tests: {len(cov.with_tests)} of {len(defs)} definition(s)")
    for col in ("op_type", "defs", "tested", "generator", "flashinfer", "sglang", "torch"):
        t.add_column(col, overflow="fold")
    for op in cov.op_types.values():
        t.add_row(for_rich(op.op_type), str(op.definitions), str(op.tested), "yes" if op.has_generator else "no",
                  *(for_rich("\n".join(op.ground_truths[s]) or "-", multiline=True)
                    for s in ("flashinfer", "sglang", "torch")))
    out.print(t)
    a = Table(title="axis coverage")
    for col in ("op_type", "dtype", "stage", "page_size", "causal", "const axes"):
        a.add_column(col, overflow="fold")
    for op in cov.op_types.values():
        d = op.as_dict()
        a.add_row(*map(for_rich, (
            op.op_type, ", ".join(d["dtypes"]), ", ".join(d["stages"]) or "-",
            ", ".join(map(str, d["page_sizes"])) or "-", ", ".join(map(str, d["causal"])) or "-",
            "; ".join(f"{k}={','.join(map(str, v))}" for k, v in d["const_axes"].items()))))
    out.print(a)
    if cov.without_tests:
        out.print(f"[yellow]without tests:[/] {for_rich(', '.join(cov.without_tests))}", highlight=False)
    if cov.stale_tests:
        out.print(f"[yellow]tests for definitions that no longer exist:[/] {for_rich(', '.join(cov.stale_tests))}",
                  highlight=False)
    return 0

"""tests generate: write the generated reference tests (tests/references/)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_common_options, err, out, print_json, safe_text


def add_commands(sub) -> None:
    tests = sub.add_parser("tests", help="the generated reference tests")
    tsub = tests.add_subparsers(dest="tests_command", required=True)
    s = tsub.add_parser("generate", help="write tests/references/conftest.py and test_<op>.py")
    add_common_options(s)
    which = s.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true")
    which.add_argument("--op-type")
    which.add_argument("--definition")
    s.add_argument("--force", action="store_true", help="overwrite existing files")
    s.add_argument("--output", default="tests/references", metavar="DIR")
    s.set_defaults(func=cmd_tests_generate)


def cmd_tests_generate(args: argparse.Namespace) -> int:
    from ..coverage import coverage
    from ..dataset import Dataset
    from ..testgen import generate, write

    if not (args.all or args.op_type or args.definition):
        err.print("error: pass --all, --op-type T or --definition NAME", style="red")
        return 2
    defs = list(Dataset(args.definitions))
    out_dir = Path(args.output)
    files = generate(defs, out_dir, op_type=args.op_type, name=args.definition)
    if len(files) == 1:
        err.print("error: no definition matched (or its op type has no input generator)", style="red")
        return 2
    done = write(files, force=args.force)
    cov = coverage(defs, out_dir)
    if args.json:
        print_json({k: [str(p) for p in v] for k, v in done.items()} | {"coverage": cov.as_dict()})
        return 0
    for kind, paths in done.items():
        for p in paths:
            note = " (exists; --force to overwrite)" if kind == "skipped" else ""
            out.print(f"{kind:9s} {safe_text(p)}{note}", highlight=False)
    out.print(f"{len(cov.with_tests)} of {len(defs)} definition(s) have generated tests; without: "
              f"{safe_text(', '.join(cov.without_tests) or 'none')}", highlight=False)
    for op in cov.op_types.values():
        out.print(f"  {safe_text(op.op_type)}: {op.tested}/{op.definitions} tested", highlight=False)
    return 0

"""python -m flashinfer_trace.matrix build RESULTS... -o OUT | diff OLD NEW | releases M --pair A B... |
portable FILES  (what `nox -s matrix` runs: no torch needed)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..escape import for_terminal
from . import build, diff_environments, diff_matrices, render_diff_md, render_releases_md, write_matrix
from .diff import bisect_commands, release_sequence
from .portable import portable, portable_file

TEXT_SUFFIXES = (".json", ".jsonl", ".log", ".txt", ".md", ".html", ".toml")


def add_commands(sub) -> None:
    b = sub.add_parser("build", help="results folders -> matrix.json, matrix.md, index.html")
    b.add_argument("results", nargs="+", help="results/ folders or single session folders")
    b.add_argument("-o", "--output", default="matrix", help="output folder (default: matrix)")
    b.add_argument("--definitions", default="definitions", help="definitions folder, for op types and models")
    b.add_argument("--root", default=".", help="paths under it are written relative to it (default: .)")
    b.add_argument("--constraints", default="constraints",
                   help="combinations folder: those without results are listed as not run (default: constraints)")
    b.add_argument("--known-issues", default="constraints/known-issues.toml",
                   help="a kernel source with no records that a `run = false` entry covers is shown as not run, "
                        "with the entry ('' for none; default: constraints/known-issues.toml)")
    b.add_argument("--not-run-note", action="append",
                   help="why combinations have no results here: 'PREFIX=why' for the combinations whose id starts "
                        "with PREFIX, or 'why' for the rest (repeatable)")
    b.set_defaults(run=run_build)
    p = sub.add_parser("portable", help="rewrite result files (.json, .jsonl, logs; folders: all below) in place so "
                                        "they name no machine: paths under --root relative, $HOME as ~")
    p.add_argument("paths", nargs="+")
    p.add_argument("--root", default=".")
    p.set_defaults(run=run_portable)
    d = sub.add_parser("diff", help="status and performance regressions between two matrix.json; exit 1 on any")
    d.add_argument("old")
    d.add_argument("new")
    d.add_argument("--markdown", help="also write the Markdown report here (e.g. $GITHUB_STEP_SUMMARY)")
    d.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    d.add_argument("--envs", nargs=2, metavar=("OLD_ENV", "NEW_ENV"),
                   help="compare OLD_ENV's column of OLD with NEW_ENV's of NEW (an id, or a unique start of one)")
    d.add_argument("--bisect-out", metavar="FILE",
                   help="write the bisect of each wrong-result regression here as JSON (a list; [] when none)")
    d.set_defaults(run=run_diff)
    r = sub.add_parser("releases", help="one matrix.json's environments diffed pair by pair (release to release) "
                                        "-> one Markdown page")
    r.add_argument("matrix")
    r.add_argument("--pair", nargs=2, action="append", default=[], metavar=("OLD_ENV", "NEW_ENV"),
                   help="an id, or a unique start of one (repeatable: the page keeps their order)")
    r.add_argument("--sequence", metavar="PREFIX",
                   help="instead of pairs: every environment whose id starts with PREFIX (e.g. cu130-torch2.11-fi), "
                        "ordered by flashinfer-python version, each diffed with the one before")
    r.add_argument("--arch", help="with --sequence: only this arch's environments (e.g. sm90)")
    r.add_argument("-o", "--output", help="write the page here (default: print it)")
    r.add_argument("--note", help="a paragraph under the heading: how the timings compare, what is missing")
    r.set_defaults(run=run_releases)


def run_build(args: argparse.Namespace) -> int:
    combos = None
    if args.constraints and Path(args.constraints).is_dir():
        from ..sweep.combos import load_combinations

        combos = load_combinations(Path(args.constraints))
    issues = None
    if args.known_issues and Path(args.known_issues).is_file():
        from .known_issues import load_known_issues

        issues = load_known_issues(args.known_issues)
    matrix = portable(build(args.results, definitions_dir=args.definitions, combinations=combos,
                            not_run_note=args.not_run_note, known_issues=issues), args.root)
    files = write_matrix(matrix, args.output)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(matrix["summary"].items()))
    print(f"{len(matrix['environments'])} environment(s) x {len(matrix['definitions'])} definition(s): {counts}")
    for p in matrix["problems"]:
        print(f"problem: {for_terminal(p['path'])}: {for_terminal(p['problem'])}", file=sys.stderr)
    for f in files:
        print(f"wrote {f}")
    return 0


def run_portable(args: argparse.Namespace) -> int:
    files = [f for p in map(Path, args.paths) for f in ([p] if p.is_file() else sorted(p.rglob("*")))
             if f.is_file() and f.suffix in TEXT_SUFFIXES]
    changed = [f for f in files if portable_file(f, args.root)]
    print(f"{len(changed)} of {len(files)} file(s) rewritten")
    return 0


def _load(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"error: {path}: {e}") from None


def run_diff(args: argparse.Namespace) -> int:
    old, new = _load(args.old), _load(args.new)
    try:
        d = diff_environments(old, new, *args.envs) if args.envs else diff_matrices(old, new)
        d.bisect = bisect_commands(old, new, d, tuple(args.envs) if args.envs else None)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if args.bisect_out:
        Path(args.bisect_out).write_text(json.dumps(d.bisect, indent=1) + "\n")
    text = render_diff_md(d)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(text)
    print(json.dumps(d.as_dict(), indent=1) if args.json else text)
    return 1 if d.regressed else 0


def run_releases(args: argparse.Namespace) -> int:
    """A report, not a gate: exit 0 whatever changed (`diff` is the gate)."""
    if bool(args.pair) == bool(args.sequence):
        raise SystemExit("error: give either --pair OLD NEW (repeatable) or --sequence PREFIX")
    matrix = _load(args.matrix)
    try:
        if args.sequence:
            order = release_sequence(matrix, args.sequence, args.arch)
            pairs = list(zip(order, order[1:], strict=False))
            command = f"matrix releases M --sequence {args.sequence}" + (f" --arch {args.arch}" if args.arch else "")
        else:
            pairs = [tuple(p) for p in args.pair]
            command = "matrix releases M " + " ".join(f"--pair {a} {b}" for a, b in pairs)
        text = render_releases_md(matrix, pairs, args.note, command)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}: {len(pairs)} pair(s)")
    else:
        print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashinfer_trace.matrix")
    add_commands(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

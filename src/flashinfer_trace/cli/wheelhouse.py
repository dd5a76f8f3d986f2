"""`flashinfer-trace wheelhouse build | verify`: a combination's wheels for an offline node (wheelhouse.py)."""

from __future__ import annotations

import argparse
import json
import sys

from ..escape import for_terminal
from ..sweep import wheelhouse
from ..sweep.combos import CombinationError, find_combination


def add_commands(top) -> None:
    sub = top.add_parser("wheelhouse", help="a combination's wheels for an offline machine").add_subparsers(
        dest="wheelhouse_command", required=True)
    b = sub.add_parser("build", help="download a combination's pins and their closure for another machine's Python "
                                     "and platform into one folder, with wheelhouse.json (sizes, sha256)")
    b.add_argument("--combination", required=True, metavar="C", help="a combination id or its constraints file")
    b.add_argument("--out", required=True, metavar="DIR", help="the wheelhouse folder (empty, or an earlier build's)")
    b.add_argument("--python-version", metavar="3.X",
                   help="the target's Python (default: the version of --python, the interpreter that resolves)")
    b.add_argument("--platform", action="append", metavar="TAG",
                   help="a wheel platform tag of the target (repeatable; default manylinux_2_28_x86_64); a manylinux "
                        "tag takes the older manylinux tags of its architecture along")
    b.add_argument("--exclude", action="append", default=[], metavar="NAME",
                   help="leave this package out, with what only it requires (repeatable), e.g. torch for a node "
                        "whose torch is preinstalled (--preinstalled-torch)")
    b.add_argument("--add", action="append", default=[], metavar="REQ",
                   help="another requirement to resolve with the combination (repeatable), e.g. nox for the node")
    b.add_argument("--no-project", action="store_true",
                   help="leave out the project's own requirements (pydantic, rich, pytest, ...), which the offline "
                        "install resolves from the same folder")
    b.add_argument("--torch-index", metavar="URL",
                   help="where torch's CUDA wheels are (default https://download.pytorch.org/whl/<variant>; "
                        "none for a CPU combination; '' for none: torch then comes from the main index)")
    b.add_argument("--index-url", metavar="URL",
                   help="the main index, e.g. a mirror (default: the one --python's pip is configured with, else "
                        "PyPI). Each index is checked first: one that does not answer in "
                        f"{wheelhouse.INDEX_TIMEOUT:g} s stops the build")
    b.add_argument("--python", default=sys.executable, metavar="PYTHON",
                   help="the interpreter whose pip resolves (default: this one); pip evaluates markers for it")
    b.add_argument("--constraints", default="constraints", metavar="DIR", help="the combinations' folder")
    b.add_argument("--json", action="store_true", help="print the manifest")
    b.set_defaults(func=run_build)

    v = sub.add_parser("verify", help="check a wheelhouse's wheels against its wheelhouse.json; exit 1 on a mismatch")
    v.add_argument("folder", metavar="DIR")
    v.add_argument("--combination", metavar="C", help="also require it to be built for this combination")
    v.add_argument("--constraints", default="constraints", metavar="DIR", help="the combinations' folder")
    v.set_defaults(func=run_verify)


def _error(message: str) -> int:
    print(f"error: {for_terminal(message, multiline=True)}", file=sys.stderr)
    return 2


def run_build(args: argparse.Namespace) -> int:
    try:
        combo = find_combination(args.combination, args.constraints)
        version = args.python_version or wheelhouse.interpreter_version(args.python)
        manifest = wheelhouse.build(combo, args.out, version=version,
                                    platforms=args.platform or wheelhouse.DEFAULT_PLATFORMS, exclude=args.exclude,
                                    add=args.add, project=not args.no_project, torch_index=args.torch_index,
                                    index_url=args.index_url or wheelhouse.configured_index(args.python),
                                    pip=wheelhouse.pip_runner(args.python))
    except (CombinationError, wheelhouse.WheelhouseError) as e:
        return _error(str(e))
    if args.json:
        print(json.dumps(manifest, indent=1))
        return 0
    wheels = manifest["wheels"]
    size = sum(w["size"] for w in wheels) / 2**20
    print(f"{len(wheels)} wheel(s), {size:.1f} MiB, for {combo.id} on Python {manifest['python_version']} "
          f"({', '.join(manifest['platforms'])}) in {args.out}; manifest {args.out}/{wheelhouse.MANIFEST}")
    if manifest["left_out"]:
        print("left out: " + ", ".join(f"{w['name']} {w['version']}" for w in manifest["left_out"]))
    for note in manifest["notes"]:
        print(f"note: {note}", file=sys.stderr)
    return 0


def run_verify(args: argparse.Namespace) -> int:
    try:
        combination = find_combination(args.combination, args.constraints).id if args.combination else None
    except CombinationError as e:
        return _error(str(e))
    try:
        manifest = wheelhouse.verify(args.folder, combination)
    except wheelhouse.WheelhouseError as e:
        print(f"error: {for_terminal(e, multiline=True)}", file=sys.stderr)
        return 1
    if manifest is None:
        return _error(f"{args.folder}: no {wheelhouse.MANIFEST} (not built by `flashinfer-trace wheelhouse build`)")
    print(f"{len(manifest['wheels'])} wheel(s) of {for_terminal(manifest['combination'])} match "
          f"{args.folder}/{wheelhouse.MANIFEST}")
    return 0

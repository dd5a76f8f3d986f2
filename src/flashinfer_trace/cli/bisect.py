"""`flashinfer-trace bisect`: the first release of a package that computes a definition wrong."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..escape import for_rich
from .common import err, out, print_json


def add_commands(sub) -> None:
    b = sub.add_parser("bisect", help="the first bad release between a good and a bad one: each probed in its own "
                                      "venv, the definition's cases checked there; exit 0 when found")
    b.add_argument("definition", help="a definition name, or the path of its JSON file")
    b.add_argument("--cell", nargs=3, metavar=("MATRIX", "ENV_OLD", "ENV_NEW"),
                   help="a matrix cell: the package, the good and bad releases and the combination from the two "
                        "environments of matrix.json (instead of --package/--good/--bad/--combination)")
    b.add_argument("--package", default="flashinfer-python",
                   help="the distribution bisected (default flashinfer-python)")
    b.add_argument("--good", help="a release that computes the definition right")
    b.add_argument("--bad", help="a later release that computes it wrong")
    b.add_argument("--combination", help="the bad release's combination (an id in --constraints, or a .toml): each "
                                         "probe is it with the package pinned to one release")
    b.add_argument("--constraints", default="constraints", metavar="DIR", help="combinations folder")
    b.add_argument("--definitions", metavar="DIR", help="definitions folder (default: ./definitions)")
    b.add_argument("--ground-truth", choices=("flashinfer", "sglang", "kernel"),
                   help="the source checked (default: the package's; 'kernel' with --kernel)")
    b.add_argument("--kernel", metavar="MODULE:FUNCTION", help="bisect your own kernel's package (check --kernel)")
    b.add_argument("--wheelhouse", type=Path, metavar="DIR",
                   help="offline: the releases are the package's wheels in DIR, and everything installs from it")
    b.add_argument("--index-url", help="list the releases on this index (default: pip's configured one)")
    b.add_argument("--torch-index", help="the torch wheel index of a fresh install (install.py)")
    b.add_argument("--preinstalled-torch", nargs="?", const=sys.executable, metavar="PYTHON",
                   help="layer this interpreter's torch into every probe instead of installing one (default: this "
                        "python)")
    b.add_argument("--pre", action="store_true", help="pre-releases are candidates too")
    b.add_argument("--versions", help="the releases to search, comma separated (no listing)")
    b.add_argument("--out", type=Path, default=Path("results/bisect"), metavar="DIR",
                   help="each probe under DIR/<definition>/<version>/ (a rerun resumes); the report is "
                        "DIR/<definition>/bisect.json")
    for flag, kw in (("--repeats", {"metavar": "N"}), ("--sizes", {}), ("--seeds", {})):
        b.add_argument(flag, help=f"passed to each probe's check ({flag})", **kw)
    b.add_argument("--no-edge-cases", action="store_true", help="passed to each probe's check")
    b.add_argument("--allow-unconfined-references", action="store_true", help="passed to each probe's check")
    b.add_argument("--json", action="store_true", help="print the report as JSON")
    b.set_defaults(func=cmd_bisect)


def config_from_args(args: argparse.Namespace):
    """The BisectConfig the arguments describe; BisectError naming the bad one."""
    from packaging.version import InvalidVersion, Version

    from ..bisect import BisectConfig, BisectError
    from ..bisect.cell import from_cell, load_matrix
    from ..sweep.combos import CombinationError, find_combination

    if args.cell:
        if args.good or args.bad or args.combination:
            raise BisectError("--cell gives the releases and the combination: drop --good/--bad/--combination")
        found = from_cell(load_matrix(args.cell[0]), args.cell[1], args.cell[2])
        package, good, bad, combination = found["package"], found["good"], found["bad"], found["combination"]
    else:
        missing = [f"--{n}" for n in ("good", "bad", "combination") if not getattr(args, n)]
        if missing:
            raise BisectError(f"{', '.join(missing)} missing (or give --cell MATRIX ENV_OLD ENV_NEW)")
        package, good, bad, combination = args.package, args.good, args.bad, args.combination
    try:
        good, bad = Version(good), Version(bad)
        versions = tuple(Version(v.strip()) for v in args.versions.split(",") if v.strip()) if args.versions else None
    except InvalidVersion as e:
        raise BisectError(f"not a version: {e}") from None
    try:
        combo = find_combination(combination, args.constraints)
    except CombinationError as e:
        raise BisectError(f"--combination: {e}") from None
    check_args = [a for flag, v in (("--repeats", args.repeats), ("--sizes", args.sizes), ("--seeds", args.seeds))
                  if v for a in (flag, v)]
    check_args += ["--no-edge-cases"] * args.no_edge_cases + ["--allow-unconfined-references"] * \
        args.allow_unconfined_references
    if args.wheelhouse is not None and not args.wheelhouse.is_dir():
        raise BisectError(f"--wheelhouse {args.wheelhouse}: not a folder")
    source = args.ground_truth or ("kernel" if args.kernel else None)
    return BisectConfig(definition=args.definition, package=package, good=good, bad=bad, combination=combo,
                        out=args.out, source=source, kernel=args.kernel, wheelhouse=args.wheelhouse,
                        preinstalled_torch=args.preinstalled_torch, torch_index=args.torch_index,
                        index_url=args.index_url, pre=args.pre, versions=versions, check_args=tuple(check_args),
                        definitions_dir=args.definitions, project=Path.cwd())


def cmd_bisect(args: argparse.Namespace) -> int:
    from ..bisect import BisectError, between, list_versions, search
    from ..bisect.probe import check_wheelhouse, probe_release

    try:
        config = config_from_args(args)
        check_wheelhouse(config)
        candidates = between(list_versions(config), config)
        if not args.json:
            out.print(f"bisect {for_rich(config.name)}: {config.package} {config.good}..{config.bad}, "
                      f"{len(candidates)} release(s) between" + (f" ({', '.join(map(str, candidates))})"
                                                                 if candidates else ""), highlight=False)

        def show(p) -> None:
            if not args.json:
                colour = {"good": "green", "bad": "red"}.get(p.verdict.value, "yellow")
                err.print(f"[{colour}]{p.verdict.value}[/] {p.version} ({p.state.value}) "
                          f"{for_rich(p.detail)}", highlight=False)

        report = search(candidates, lambda v: probe_release(v, config), config, on_probe=show)
    except BisectError as e:
        err.print(f"error: {for_rich(str(e), multiline=True)}", style="red", highlight=False)
        return 2
    path = config.out / config.name / "bisect.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.as_dict(), indent=1) + "\n")
    if args.json:
        print_json(report.as_dict())
    else:
        out.print(for_rich(report.text(), multiline=True), highlight=False)
        out.print(f"report: {for_rich(str(path))}", highlight=False)
    return 0

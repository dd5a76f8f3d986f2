"""`flashinfer-trace combination new`: a release's combination file, pinned from its metadata (sweep/newcombo.py)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..escape import for_terminal
from ..sweep import newcombo


def add_commands(top) -> None:
    sub = top.add_parser("combination", help="write pinned combinations (constraints/)").add_subparsers(
        dest="combination_command", required=True)
    n = sub.add_parser("new", help="a combination for one flashinfer-python release (and sglang release): each "
                                   "runtime dependency the kernels need pinned to the newest version satisfying the "
                                   "release's own requirements, the specifier in a comment")
    n.add_argument("--flashinfer", required=True, metavar="V", help="the flashinfer-python release, e.g. 0.6.9")
    n.add_argument("--torch", required=True, metavar="V", help="the torch pin, e.g. 2.11.0")
    n.add_argument("--cuda", required=True, choices=sorted(newcombo.VARIANTS), help="the CUDA major")
    n.add_argument("--sglang", metavar="V", help="also this sglang release, with its own pins")
    n.add_argument("--torch-variant", metavar="cuXYZ", help="the torch wheel variant (default cu128 / cu130)")
    n.add_argument("--arch", action="append", metavar="SM", help="a GPU arch (repeatable; default sm90)")
    n.add_argument("--python", default=">=3.10,<3.14", metavar="SPEC", help="the combination's Python range")
    n.add_argument("--python-version", default="3.12", metavar="3.X",
                   help="the target's Python, whose wheels and markers count (default 3.12)")
    n.add_argument("--platform", default=newcombo.DEFAULT_PLATFORM, metavar="TAG",
                   help=f"the target's wheel platform (default {newcombo.DEFAULT_PLATFORM})")
    n.add_argument("--tag", action="append", default=[], metavar="TAG",
                   help="a nox tag for its per-arch sessions (repeatable), e.g. release-axis")
    n.add_argument("--nightly", action="store_true", help="in the nightly sweep (default: not)")
    n.add_argument("--uninstallable", action="store_true",
                   help="where the release's metadata rules this torch / CUDA / Python out, write the combination "
                        "as uninstallable with the reason (default: refuse)")
    n.add_argument("--id", dest="combination_id", metavar="ID", help="the file's id (default cu130-torch2.11-fiV)")
    n.add_argument("--out", default="constraints", type=Path, metavar="DIR", help="where to write (default "
                                                                                   "constraints/)")
    n.add_argument("--force", action="store_true", help="replace an existing file")
    n.add_argument("--index-url", metavar="URL", help="the index to read (default: pip's configured one)")
    n.add_argument("--find-links", action="append", default=[], metavar="DIR", help="also wheels from here")
    n.add_argument("--isolated", action="store_true",
                   help="ignore pip's configuration: only --index-url (none: no index) and --find-links")
    n.add_argument("--pip-python", default=sys.executable, metavar="PYTHON", help="whose pip reads the index")
    n.set_defaults(func=run_new)


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces the file, written into its comment."""
    parts = ["flashinfer-trace combination new", f"--flashinfer {args.flashinfer}", f"--torch {args.torch}",
             f"--cuda {args.cuda}"]
    parts += [f"--sglang {args.sglang}"] if args.sglang else []
    parts += [f"--arch {a}" for a in args.arch or ["sm90"]] + [f"--tag {t}" for t in args.tag]
    parts += [f"--platform {args.platform}"] if args.platform != newcombo.DEFAULT_PLATFORM else []
    parts += ["--nightly"] if args.nightly else []
    parts += ["--uninstallable"] if args.uninstallable else []
    return " ".join(shlex.quote(p) if " " not in p else p for p in parts)


def run_new(args: argparse.Namespace) -> int:
    config = newcombo.NewCombinationConfig(
        flashinfer=args.flashinfer, torch=args.torch, cuda=args.cuda, sglang=args.sglang,
        torch_variant=args.torch_variant, archs=tuple(args.arch or ["sm90"]), python=args.python,
        python_version=args.python_version, platform=args.platform, tags=tuple(args.tag), nightly=args.nightly,
        uninstallable=args.uninstallable, out=args.out, combination_id=args.combination_id, force=args.force)
    pip = newcombo.pip_runner(args.pip_python, isolated=args.isolated, index_url=args.index_url,
                              find_links=tuple(args.find_links))
    try:
        path, result = newcombo.write(config, pip, _command(args))
    except newcombo.NewCombinationError as e:
        print(f"error: {for_terminal(str(e), multiline=True)}", file=sys.stderr)
        return 2
    state = f"uninstallable: {result.conflict}" if result.conflict else f"{len(result.pins)} pin(s)"
    print(f"wrote {path} ({for_terminal(state)})")
    return 0

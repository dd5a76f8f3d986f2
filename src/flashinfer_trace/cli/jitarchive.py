"""`flashinfer-trace jit export | import`: built FlashInfer JIT modules to another machine (jitarchive.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from packaging.version import Version

from ..escape import for_terminal
from ..sweep import jitarchive, prebuilt
from ..sweep.combos import CombinationError, find_combination
from ..sweep.compiler_cache import DEFAULT_DIR as DEFAULT_CCACHE
from ..sweep.jitarchive import Build, JitArchiveError


def add_commands(sub) -> None:
    e = sub.add_parser("export", help="pack a combination's built JIT modules into one archive with their "
                                      "FlashInfer version, CUDA version, arch and sha256s")
    e.add_argument("--out", required=True, metavar="ARCHIVE",
                   help="the archive: .tar, .tar.gz / .tgz, .tar.xz / .txz or .tar.bz2 (the suffix picks)")
    e.add_argument("--combination", required=True, metavar="C", help="a combination id or its constraints file")
    e.add_argument("--jit-cache", type=Path, metavar="ROOT",
                   help="the JIT cache root (default $FLASHINFER_TRACE_JIT_CACHE or ~/.cache/flashinfer-trace/jit)")
    e.add_argument("--arch", help="the arch to export, e.g. sm90 (default: this GPU's, else the only one built)")
    e.add_argument("--cuda", metavar="X.Y", help="the CUDA version they were built with (default: --python's "
                                                 "torch, else the combination's torch variant)")
    e.add_argument("--python", metavar="PYTHON", help="the interpreter of the environment that built them")
    e.add_argument("--constraints", default="constraints", metavar="DIR", help="the combinations' folder")
    e.add_argument("--with-ccache", nargs="?", const=str(DEFAULT_CCACHE), type=Path, metavar="DIR",
                   help="also carry the compiler cache's entries (default folder ~/.cache/flashinfer-trace/ccache)")
    e.add_argument("--json", action="store_true", help="print the manifest")
    e.set_defaults(func=run_export)

    i = sub.add_parser("import", help="check an archive of `jit export` against this machine and unpack it where "
                                      "sessions load it from (--jit-modules); refused whole on any mismatch")
    i.add_argument("archive", metavar="ARCHIVE")
    i.add_argument("--dest", type=Path, default=jitarchive.DEFAULT_DEST, metavar="ROOT",
                   help="where the modules go, laid out for --jit-modules ROOT (default ~/.cache/flashinfer-trace/"
                        "jit-modules)")
    i.add_argument("--combination", metavar="C", help="the target combination: the archive must be of it; its pins "
                                                      "say the FlashInfer and CUDA versions where --python does not")
    i.add_argument("--python", metavar="PYTHON",
                   help="the interpreter whose FlashInfer and torch the modules are for (default: this one, unless "
                        "--combination says)")
    i.add_argument("--flashinfer-version", metavar="V", help="the target's FlashInfer version")
    i.add_argument("--cuda", metavar="X.Y", help="the target's CUDA version")
    i.add_argument("--arch", help="the target's arch, e.g. sm90 (default: this GPU's)")
    i.add_argument("--place", action="store_true",
                   help="also copy them into --python's FlashInfer AOT folder (FlashInfer < 0.7), for runs outside "
                        "the sessions")
    i.add_argument("--constraints", default="constraints", metavar="DIR", help="the combinations' folder")
    i.add_argument("--ccache-dir", type=Path, default=DEFAULT_CCACHE, metavar="DIR",
                   help="where the archive's compiler cache entries go, if it has any (default "
                        "~/.cache/flashinfer-trace/ccache)")
    i.add_argument("--no-ccache", action="store_true", help="leave the archive's compiler cache entries out")
    i.add_argument("--json", action="store_true", help="print the manifest and where each module went")
    i.set_defaults(func=run_import)


def _error(message: str) -> int:
    print(f"error: {for_terminal(message, multiline=True)}", file=sys.stderr)
    return 2


def _describe(m: dict) -> str:
    return f"{m['combination']} (flashinfer {m['flashinfer']}, CUDA {m['cuda']}, {m['arch']})"


def run_export(args: argparse.Namespace) -> int:
    try:
        combo = find_combination(args.combination, args.constraints)
        if not combo.gpu or combo.flashinfer is None:
            raise JitArchiveError(f"{combo.id} pins no flashinfer-python for a GPU: it has no FlashInfer JIT modules")
        root = args.jit_cache or prebuilt.jit_cache_root()
        version = str(combo.flashinfer)
        found = jitarchive.probe(args.python) if args.python and not args.cuda else {}
        cuda = args.cuda or found.get("cuda") or jitarchive.cuda_of_variant(combo.torch_variant)
        cuda = jitarchive.cuda_version(cuda)
        arch = args.arch or jitarchive.detect_arch()
        if arch is None:
            built = jitarchive.built_archs(root, combo.id, version)
            if len(built) != 1:
                raise JitArchiveError(f"no GPU here to tell the arch, and {root}/{combo.id} has modules of "
                                      f"{', '.join(built) or 'no arch'} for flashinfer {version}: pass --arch")
            arch = built[0]
        manifest = jitarchive.export(root, combo, args.out, Build(version, cuda, jitarchive.check_arch(arch)),
                                     ccache_dir=args.with_ccache)
    except (CombinationError, JitArchiveError) as e:
        return _error(str(e))
    if args.json:
        print(json.dumps(manifest, indent=1))
        return 0
    size = sum(m["size"] for m in manifest["modules"]) / 2**20
    print(f"exported {len(manifest['modules'])} module(s), {size:.1f} MiB, of {_describe(manifest)} to {args.out}: "
          + ", ".join(m["name"] for m in manifest["modules"]))
    if "ccache" in manifest:
        print(f"with {len(manifest['ccache'])} compiler cache file(s) of {args.with_ccache}, "
              f"{sum(e['size'] for e in manifest['ccache']) / 2**20:.1f} MiB")
    return 0


def _target(args: argparse.Namespace, combo) -> Build:
    """The FlashInfer and CUDA versions and the arch the modules must be for: what the flags say, else
    --python's environment, else the combination's pins; the arch, else this GPU's."""
    python = args.python or sys.executable
    found = jitarchive.probe(python) if (args.python or args.place or combo is None) else {}
    flashinfer = args.flashinfer_version or found.get("flashinfer") or (
        str(combo.flashinfer) if combo is not None and combo.flashinfer else None)
    cuda = args.cuda or found.get("cuda") or (jitarchive.cuda_of_variant(combo.torch_variant) if combo else None)
    arch = args.arch or jitarchive.detect_arch()
    asks = "--combination C, --python PYTHON (the session's interpreter)"
    if flashinfer is None:
        raise JitArchiveError(f"cannot tell which FlashInfer the modules are for: {python} has no flashinfer-python; "
                              f"pass {asks} or --flashinfer-version")
    if cuda is None:
        raise JitArchiveError(f"cannot tell the CUDA version: {python} has no CUDA torch; pass {asks} or --cuda")
    if arch is None:
        raise JitArchiveError("cannot tell the arch: nvidia-smi finds no GPU here; pass --arch")
    return Build(jitarchive.flashinfer_version(flashinfer), jitarchive.cuda_version(cuda), jitarchive.check_arch(arch))


def run_import(args: argparse.Namespace) -> int:
    try:
        combo = find_combination(args.combination, args.constraints) if args.combination else None
        expect = _target(args, combo)
        package = None
        if args.place:
            if Version(expect.flashinfer) >= prebuilt.SUPPORTED_BELOW:
                raise JitArchiveError(f"--place: flashinfer {expect.flashinfer} finds AOT modules through an index "
                                      "of artifacts, which this does not write")
            package = prebuilt.flashinfer_package(args.python or sys.executable)
            if package is None:
                raise JitArchiveError(f"--place: {args.python or sys.executable} finds no flashinfer package")
        manifest, placed = jitarchive.import_archive(args.archive, args.dest, expect, combo.id if combo else None,
                                                     ccache_dest=None if args.no_ccache else args.ccache_dir)
        aot = prebuilt.place(placed, package) if package is not None else []
    except (CombinationError, JitArchiveError, OSError) as e:
        return _error(str(e))
    if args.json:
        print(json.dumps({"manifest": manifest, "modules": {k: str(v) for k, v in placed.items()},
                          "placed_in": str(package / "data" / "aot") if aot else None}, indent=1))
        return 0
    # the manifest is the archive's, and an archive may come from anywhere
    print(f"imported {len(placed)} module(s) of {for_terminal(_describe(manifest))} into {args.dest}: sessions load "
          f"them with --jit-modules {args.dest}")
    if aot:
        print(f"placed {len(aot)} into {package / 'data' / 'aot'}")
    if manifest.get("ccache"):
        print(f"{len(manifest['ccache'])} compiler cache file(s) " + (
            "left out (--no-ccache)" if args.no_ccache else f"into {args.ccache_dir} (those it had stay)"))
    if Version(expect.flashinfer) >= prebuilt.SUPPORTED_BELOW:
        print(f"note: flashinfer {expect.flashinfer} finds AOT modules through an index of artifacts: --jit-modules "
              "places nothing for it, the modules compile", file=sys.stderr)
    return 0

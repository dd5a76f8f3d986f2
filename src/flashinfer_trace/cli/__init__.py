"""The `flashinfer-trace` command: parses arguments, calls the package, renders tables or JSON."""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from collections.abc import Sequence

from .. import __version__
from ..escape import for_rich
from . import bisect, combination, definitions, extract, fitrace, jit, run, sweep, wheelhouse
from .common import err

__all__ = ["build_parser", "main"]

# torch warns on import when numpy is missing; the project does not use numpy, so it is noise on every command
_NUMPY_WARNING = re.escape("Failed to initialize NumPy: No module named 'numpy'")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flashinfer-trace", description=__doc__)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for group in (definitions, run, jit, sweep, wheelhouse, combination, fitrace, extract, bisect):
        group.add_commands(sub)

    from ..matrix.__main__ import add_commands

    m = sub.add_parser("matrix", help="build the compatibility matrix from results; diff two matrices")
    add_commands(m.add_subparsers(dest="matrix_command", required=True))
    m.set_defaults(func=lambda a: a.run(a))

    return p


# errors whose message says all, by the module that defines them: each is caught only where a command imported
# its module (importing them here would import torch, which the commands that run no kernel must not need)
_CLEAR_ERRORS = (("sandbox.errors", "SandboxError"), ("inputs.common", "InputGenerationError"),
                 ("verdict.compare", "ToleranceConfigError"))


def _clear_errors() -> tuple[type[BaseException], ...]:
    package = __name__.rpartition(".")[0]
    loaded = (sys.modules.get(f"{package}.{module}") for module, _ in _CLEAR_ERRORS)
    return (KeyError, FileNotFoundError,
            *(getattr(m, name) for m, (_, name) in zip(loaded, _CLEAR_ERRORS, strict=True) if m is not None))


def main(argv: Sequence[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message=_NUMPY_WARNING, category=UserWarning)  # before torch is imported
    args = build_parser().parse_args(argv)
    from ..validate import DefinitionError  # no torch

    try:
        return args.func(args)
    except DefinitionError as e:  # one line per problem, each escaped whole: a file name cannot forge a line
        err.print(f"error: {len(e.problems)} problem(s) in definition:", highlight=False, style="red")
        for p in e.problems:
            err.print(f"  {for_rich(p)}", highlight=False, style="red")
        return 2
    except _clear_errors() as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        err.print(f"error: {for_rich(msg, multiline=True)}", highlight=False, style="red")
        return 2

"""What the command groups share: the consoles, JSON output, a progress bar, and the
options several commands take (each defined here once, with the code that reads it)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console

from ..escape import for_rich

# emoji off: a `:name:` in a definition's text prints as written, not as a picture
out = Console(soft_wrap=True, emoji=False)
err = Console(stderr=True, soft_wrap=True, emoji=False)

def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


@contextmanager
def progress(total: int, *, enabled: bool) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr (done / total, the current case, ETA); `advance(description)`."""
    if not enabled or total == 0:
        yield lambda _text: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("check", total=total)
        yield lambda text: bar.update(task, advance=1, description=for_rich(text[:60]))


# -- options shared by several commands -----------------------------------------------------------
def add_common_options(parser: argparse.ArgumentParser) -> None:
    """--definitions and --json, which every command that reads definitions takes."""
    parser.add_argument("--definitions", metavar="DIR",
                        help="definitions folder (default: $FLASHINFER_TRACE_DEFINITIONS or ./definitions)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def add_sandbox_options(parser: argparse.ArgumentParser) -> None:
    """How the commands that run references confine them; `configure_sandbox(args)` applies them."""
    parser.add_argument("--allow-unconfined-references", action="store_true",
                        help="run references even where the worker cannot be fully confined (recorded; "
                             "docs/sandbox.md)")
    parser.add_argument("--reference-timeout", type=float, metavar="S",
                        help="seconds per reference call (default 900)")
    parser.add_argument("--reference-memory", type=float, metavar="GB",
                        help="memory a reference worker may use (default: 80%% of RAM)")


def configure_sandbox(args: argparse.Namespace) -> None:
    from ..sandbox import configure

    configure(timeout=args.reference_timeout, memory_gb=args.reference_memory,
              allow_unconfined=True if args.allow_unconfined_references else None)


def add_input_options(parser: argparse.ArgumentParser) -> None:
    """The one generated case `inputs` and `run` work on; `generate(args, name)` makes it."""
    parser.add_argument("--size", default="small", choices=("small", "medium", "large"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case", default=None, help="an edge case of the op family, e.g. single_token")
    parser.add_argument("--device", default="cpu")


def generate(args: argparse.Namespace, name: str):
    """(definition, inputs) for `name` under the add_input_options arguments."""
    from ..dataset import load_definition
    from ..inputs import generate_inputs

    d = load_definition(name, definitions=args.definitions)
    return d, generate_inputs(d, size=args.size, seed=args.seed, device=args.device, case=args.case)


def describe(value: Any) -> dict[str, Any]:
    """A generated input or a reference output as JSON: shape, dtype and device, or a scalar's value."""
    if hasattr(value, "shape"):
        return {"shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", ""),
                "device": str(value.device)}
    return {"shape": None, "dtype": type(value).__name__, "value": value}


def add_tolerance_options(parser: argparse.ArgumentParser) -> None:
    """The command line's layer of the tolerance (over the config's); `tolerance_args(args)` reads it."""
    parser.add_argument("--atol", type=float)
    parser.add_argument("--rtol", type=float)
    parser.add_argument("--matched-ratio", type=float)
    parser.add_argument("--min-cosine", type=float, help="each output's cosine with the expected one must reach this")


def tolerance_args(args: argparse.Namespace) -> dict[str, float]:
    return {k: v for k, v in (("atol", args.atol), ("rtol", args.rtol), ("matched_ratio", args.matched_ratio),
                              ("min_cosine", args.min_cosine))
            if v is not None}

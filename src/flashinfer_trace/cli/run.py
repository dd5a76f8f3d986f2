"""Running references: sandbox, run, check, mutants."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.table import Table

from ..escape import for_rich
from ..options import add_check_options
from ..status import Status
from .common import (
    add_common_options,
    add_input_options,
    add_sandbox_options,
    configure_sandbox,
    describe,
    err,
    generate,
    out,
    print_json,
    progress,
)


def add_commands(sub) -> None:
    s = sub.add_parser("sandbox", help="how references are confined here; exit 1 if not fully")
    add_common_options(s)
    add_sandbox_options(s)
    s.set_defaults(func=cmd_sandbox)

    s = sub.add_parser("run", help="run references on generated inputs")
    add_common_options(s)
    add_input_options(s)
    add_sandbox_options(s)
    s.add_argument("names", nargs="*", help="definition names or paths to JSON files")
    s.add_argument("--all", action="store_true", help="every definition in the definitions folder")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("check", help="check references against ground truth outside pytest; exit 1 on any failure")
    add_common_options(s)
    add_check_options(s.add_argument)  # the engine's options, the same as the pytest suite's (check.py)
    s.add_argument("targets", nargs="*", help="definition files, folders or names (default: the definitions folder)")
    s.add_argument("--ground-truth", default="all", choices=("all", "torch", "flashinfer", "sglang", "kernel"),
                   help="the source compared with; 'kernel' is the function --kernel names (default: all, with "
                        "that kernel among them when --kernel is given)")
    s.add_argument("--kernel", metavar="MODULE:FUNCTION",
                   help="check your own kernel: FUNCTION of MODULE, called with the definition's inputs in its "
                        "order, returning its outputs (a tensor, a tuple, or a dict by output name)")
    s.add_argument("--case", action="append", help="only these edge cases (repeatable)")
    s.add_argument("--no-edge-cases", action="store_true")
    s.add_argument("--results", default="results/check.jsonl", metavar="FILE",
                   help="each record appended here as it completes, fsynced ('' to disable)")
    s.add_argument("--resume", action="store_true", help="skip the cases already in --results, reuse their records")
    s.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    s.add_argument("--no-prebuild", action="store_true",
                   help="on a GPU, do not build the kernels' JIT modules in parallel first (they then build "
                        "one at a time, inside the checks)")
    s.add_argument("--jit-budget", type=_positive_seconds, default=600.0, metavar="S",
                   help="seconds each prebuild job may take (default 600); past it the module is build-timeout "
                        "and its checks skip with that reason")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("mutants",
                       help="planted bugs: which the comparisons catch (kill rate); exit 1 if one is missed")
    add_common_options(s)
    add_sandbox_options(s)
    s.add_argument("--ground-truth", default="torch", choices=("torch", "flashinfer", "sglang"))
    s.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    s.add_argument("--only", action="append", help="mutants whose name contains this (repeatable)")
    s.add_argument("--stream", metavar="FILE", help="append each mutant's verdict to FILE (JSONL) as it is judged")
    s.set_defaults(func=cmd_mutants)


# -- sandbox ------------------------------------------------------------------------------------
def cmd_sandbox(args: argparse.Namespace) -> int:
    """Start a worker and say how it is confined here; exit 1 when a mechanism is missing."""
    from ..sandbox import status
    from ..sandbox.pool import describe_settings

    configure_sandbox(args)
    info = status(probe=True) or {}
    if args.json:
        print_json({"confinement": info, "settings": describe_settings()})
    else:
        for mechanism, what in (info.get("active") or {}).items():
            out.print(f"[green]✓[/] {for_rich(mechanism)}: {for_rich(what)}", highlight=False)
        for mechanism, why in (info.get("missing") or {}).items():
            out.print(f"[red]✗[/] {for_rich(mechanism)}: {for_rich(why)}", highlight=False)
        if info.get("error"):
            out.print(f"[red]✗ the worker did not start: {for_rich(info['error'])}[/]", highlight=False)
        verdict = ("references run confined" if info.get("complete") else
                   "references run WITHOUT full confinement (allowed)" if info.get("allow_unconfined") else
                   "references are refused here unless --allow-unconfined-references")
        out.print(("[green]" if info.get("complete") else "[red]") + verdict + "[/]", highlight=False)
    return 0 if info.get("complete") else 1


# -- run ----------------------------------------------------------------------------------------
def _run_one(args: argparse.Namespace, name: str) -> dict[str, Any]:
    from ..inputs import UnsupportedOpType
    from ..reference import output_problems, run_reference

    try:
        d, inputs = generate(args, name)
    except UnsupportedOpType as e:
        return {"definition": name, "status": "skip", "reason": str(e), "outputs": {}, "problems": []}
    start = time.perf_counter()
    try:
        outputs = run_reference(d, inputs)
    except Exception as e:  # a broken reference is a result to report, not a crash of the whole run
        return {"definition": d.name, "status": "error", "outputs": {},
                "problems": [f"reference failed: {type(e).__name__}: {e}"]}
    seconds = time.perf_counter() - start
    problems = output_problems(d, inputs, outputs)
    stats = {}
    for out_name, value in zip(d.outputs, outputs, strict=False):
        info = describe(value)
        if hasattr(value, "is_floating_point") and value.is_floating_point() and value.numel():
            v = value.float()
            finite = v[v.isfinite()]
            info.update(nonfinite=int(v.numel() - finite.numel()),
                        mean=float(finite.mean()) if finite.numel() else None,
                        absmax=float(finite.abs().max()) if finite.numel() else None)
        stats[out_name] = info
    return {"definition": d.name, "status": "fail" if problems else "ok", "seconds": seconds,
            "outputs": stats, "problems": problems}


def cmd_run(args: argparse.Namespace) -> int:
    from ..dataset import Dataset

    configure_sandbox(args)

    names = Dataset(args.definitions).names() if args.all else args.names
    if not names:
        err.print("error: name a definition or pass --all", style="red")
        return 2
    results = [_run_one(args, n) for n in names]
    if args.json:
        from ..sandbox import status

        print_json({"size": args.size, "seed": args.seed, "case": args.case, "device": args.device,
                    "sandbox": status(), "results": results})
    else:
        t = Table(title=f"reference runs on {for_rich(args.device)} (size={args.size}, seed={args.seed})")
        for col in ("definition", "status", "ms", "outputs (shape dtype absmax)"):
            t.add_column(col, overflow="fold")
        for r in results:
            ms = f"{r['seconds'] * 1e3:.1f}" if "seconds" in r else ""
            outs = "\n".join(f"{o} {'x'.join(map(str, s['shape'] or []))} {s['dtype']} {_fmt(s.get('absmax'))}"
                             for o, s in r["outputs"].items())
            t.add_row(for_rich(r["definition"]), r["status"], ms, for_rich(outs, multiline=True))
        out.print(t)
        for r in results:
            for p in r["problems"]:
                out.print(f"[red]✗ {for_rich(r['definition'])}: {for_rich(p)}[/]", highlight=False)
            if r["status"] == "skip":
                out.print(f"[yellow]skip {for_rich(r['definition'])}: {for_rich(r['reason'])}[/]",
                          highlight=False)
    return 1 if any(r["status"] in ("fail", "error") for r in results) else 0


def _fmt(x: Any) -> str:
    return "" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


# -- check --------------------------------------------------------------------------------------
def _watch(report: str):
    """The prebuild's answers from its report (jit.jsonl) as it grows: the engine reads them through its config."""
    from ..sweep.jit.report import watch

    return watch(report).outcome


def cmd_check(args: argparse.Namespace) -> int:
    from ..check import config_from_options, configure_sandbox, discover, plan, run, summarise
    from ..dataset import definitions_dir
    from ..groundtruth import KERNEL, SOURCES
    from ..groundtruth.kernel import KernelSpec
    from ..sandbox import status

    if args.kernel is not None and args.ground_truth not in ("all", KERNEL):
        err.print(f"error: --kernel is checked as --ground-truth kernel (or all), not {args.ground_truth}", style="red",
                  highlight=False)
        return 2
    if args.kernel is not None:
        try:
            KernelSpec.parse(args.kernel)
        except ValueError as e:
            err.print(f"error: {for_rich(str(e))}", style="red", highlight=False)
            return 2
    elif args.ground_truth == KERNEL:
        err.print("error: --ground-truth kernel needs --kernel MODULE:FUNCTION", style="red", highlight=False)
        return 2
    configure_sandbox(lambda name: getattr(args, name))
    sources = (*SOURCES, *((KERNEL,) if args.kernel else ())) if args.ground_truth == "all" else (args.ground_truth,)
    lookup = _watch(args.jit_report) if args.jit_report else None
    config = config_from_options(lambda name: getattr(args, name), sources=sources, kernel=args.kernel,
                                 cases=(tuple(args.case) if args.case else None) if not args.no_edge_cases else (),
                                 definitions_dir=args.definitions, results_file=args.results or None,
                                 resume=args.resume, prebuild_lookup=lookup)
    targets = args.targets or [str(definitions_dir(args.definitions))]
    found = discover(targets, config)
    where = (f"each record appended to {Path(config.results_file).resolve()} (--results FILE to choose, '' for none)"
             if config.results_file else "no records file (--results '')")
    err.print(for_rich(f"check: {len(found.definitions)} definition(s); {where}"), highlight=False)
    kernels = tuple(s for s in sources if s in ("flashinfer", "sglang"))  # the JIT-built ones
    background, ready = None, {}
    if kernels and config.resolved_device.startswith("cuda") and not args.no_prebuild:
        background, report, ready = _prebuild(found.definitions, kernels, config.resolved_device, args)
        config.prebuild_lookup = _watch(report)
    planned = ready_first(plan(found, config), ready)
    results = []
    try:
        with progress(len(planned), enabled=not args.no_progress) as advance:
            for r in run(planned, config):
                results.append(r)
                advance(f"{r.definition} {r.check} {r.source or ''}")
                if not args.json and r.status in (Status.FAIL, Status.ERROR, Status.INFO):  # info: not promised
                    tint = "blue" if r.status is Status.INFO else "red"
                    out.print(f"[{tint}]{r.status.value.upper()}[/] " + for_rich(
                        f"{r.definition} {r.check} {r.source or ''} {r.size or ''} seed={r.seed} {r.case or ''}: "
                        f"{r.detail or ''}", multiline=True), highlight=False)
        if background is not None:
            _, built = background.join()
            if built["jobs"]:
                err.print("prebuild: " + ", ".join(f"{k} {v}" for k, v in sorted(built["counts"].items()))
                          + f" in {built['wall_seconds']} s", highlight=False)
    except KeyboardInterrupt:
        if background is not None:
            background.stop()
        kept = f"; the {len(results)} finished are in {config.results_file} (--resume goes on)" \
            if config.results_file else ""
        err.print(f"interrupted after {len(results)} of {len(planned)} case(s){for_rich(kept)}", style="yellow")
        return 130
    summary = summarise(results)
    if args.json:
        print_json({"device": config.resolved_device, "summary": asdict(summary), "sandbox": status(),
                    "results": [r.as_dict() for r in results]})
        return 0 if summary.ok else 1
    t = Table(title=f"check on {for_rich(config.resolved_device)}: {summary.total} case(s)")
    columns = ("pass", "fail", "error", "skip", *(("info",) if summary.by_status.get("info") else ()))
    for col in ("definition", *columns):
        t.add_column(col)
    per: dict[str, dict[str, int]] = {}
    for r in results:
        per.setdefault(r.definition, {}).setdefault(r.status.value, 0)
        per[r.definition][r.status.value] += 1
    for name, counts in per.items():
        t.add_row(for_rich(name), *(str(counts.get(k, 0)) for k in columns))
    out.print(t)
    for reason, n in summary.skip_reasons.items():
        out.print(f"[yellow]skip x{n}[/] {for_rich(reason or '')}", highlight=False)
    colour = "green" if summary.ok else "red"
    out.print(f"[{colour}]" + ", ".join(f"{k} {v}" for k, v in sorted(summary.by_status.items())) + "[/]",
              highlight=False)
    return 0 if summary.ok else 1


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _prebuild(definitions, sources, device: str, args: argparse.Namespace):
    """check on a GPU builds every module in the background while it checks: a definition's cases wait for its
    jobs (the engine's lookup of the report), its ground truths then skip what could not be built
    (build-failed / build-timeout) instead of compiling inside the checks. (the prebuild or None when it has
    nothing to build, the report the checks read, each definition's expected seconds until its modules are ready)."""
    import tempfile

    from ..sweep import jit
    from ..sweep.jit.pipeline import Background, readiness

    report = str(Path(args.results).with_name("jit.jsonl")) if args.results else \
        str(Path(tempfile.mkdtemp(prefix="flashinfer-trace-jit-")) / "jit.jsonl")
    config = jit.JitConfig(sources=sources, device=device, report=report, resume=args.resume,
                           log_dir=str(Path(report).with_name("jit-logs")), stamps=jit.default_stamps(),
                           budget=args.jit_budget)
    jobs = jit.plan(definitions, config)
    if not jobs:
        return None, report, {}
    ready = readiness(jobs, jit.read_report(report) if args.resume else ())
    return Background(jobs, config, progress=None if args.no_progress else sys.stderr), report, ready


def ready_first(cases: list, ready: dict[str, float]) -> list:
    """The cases of the definitions whose modules are expected ready first (a definition's cases stay together,
    in their order)."""
    def name(case) -> str:
        d = case.definition
        return d if isinstance(d, str) else d.name

    return sorted(cases, key=lambda c: ready.get(name(c), 0.0))


# -- mutants ------------------------------------------------------------------------------------
def cmd_mutants(args: argparse.Namespace) -> int:
    """The planted-bug suite against one ground truth: which bugs each comparison catches."""
    from ..groundtruth import default_device
    from ..mutants import KERNELS, MUTANTS, PlantedKernel, kill, kill_kernel, kill_rate, rates_by_class

    configure_sandbox(args)
    device = args.device or default_device()
    chosen = [m for m in (*MUTANTS, *KERNELS) if not args.only or any(o in m.name for o in args.only)]
    stream = None
    if args.stream:
        from ..sweep.results import JsonlStream

        stream = JsonlStream(args.stream)
    kills = []
    for m in chosen:  # each verdict streamed as it comes: a run cut short keeps what it judged
        kills.append(kill_kernel(m, device=device) if isinstance(m, PlantedKernel) else
                     kill(m, args.ground_truth, device=device))
        if stream:
            stream.write(asdict(kills[-1]) | {"bug": m.bug, "known_gap": m.survives, "ground_truth": args.ground_truth,
                                              "device": device, "class": m.cls})
    if stream:
        stream.close()
    killed, ran = kill_rate(kills)
    by_class = rates_by_class(zip(chosen, kills, strict=True))
    unexpected = [k for m, k in zip(chosen, kills, strict=True) if k.killed is False and not m.survives]
    if args.json:
        print_json({"ground_truth": args.ground_truth, "device": device, "killed": killed, "ran": ran,
                    "by_class": {c: {"killed": a, "ran": b} for c, (a, b) in by_class.items()},
                    "mutants": [asdict(k) | {"bug": m.bug, "known_gap": m.survives}
                                for m, k in zip(chosen, kills, strict=True)]})
    else:
        t = Table(title=f"planted bugs vs {args.ground_truth} on {for_rich(device)}: {killed}/{ran} caught")
        for col in ("mutant", "bug", "caught", "how", "closest: bug / true reference"):
            t.add_column(col, overflow="fold")
        for m, k in zip(chosen, kills, strict=True):
            caught = "n/a" if k.killed is None else "yes" if k.killed else "known gap" if m.survives else "NO"
            t.add_row(for_rich(m.name), for_rich(m.bug), caught,
                      for_rich(k.how if k.killed is not False or not m.survives else m.survives),
                      f"{_margin(k.margin)} / {_margin(k.baseline_margin)}")
        out.print(t)
        out.print("by class: " + ", ".join(f"{c} {a}/{b}" for c, (a, b) in by_class.items()), highlight=False)
    return 1 if unexpected else 0


def _margin(m) -> str:
    """A run's closest approach to failing: the share of its tolerance used, the lowest cosine."""
    if m is None:
        return "-"
    used = "-" if m.tolerance_used is None else f"{m.tolerance_used:.3g}"
    return f"{used} of tol, cos {'-' if m.cosine is None else f'{m.cosine:.5f}'}"

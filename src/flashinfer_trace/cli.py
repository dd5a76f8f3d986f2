"""The `flashinfer-trace` command: parses arguments, calls the package, renders tables or JSON."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__

_out = Console(soft_wrap=True)
_err = Console(stderr=True, soft_wrap=True)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


# -- validate -----------------------------------------------------------------------------------
def cmd_validate(args: argparse.Namespace) -> int:
    from .dataset import definitions_dir
    from .validate import validate_paths

    paths = args.paths or [definitions_dir(args.definitions)]
    reports, summary = validate_paths(paths)
    if args.json:
        _print_json({
            "ok": summary.ok,
            "summary": asdict(summary),
            "problems": [asdict(p) for r in reports for p in r.problems],
            "notes": [asdict(p) for r in reports for p in r.notes],
        })
    else:
        for r in reports:
            for p in r.problems:
                _out.print(f"[red]✗[/] {escape(p.file)}: [bold]{escape(p.path)}[/]: {escape(p.message)} "
                           f"[dim]\\[{p.kind}][/]", highlight=False)
            for p in r.notes:  # accepted by a documented fi_trace rule (docs/definitions.md)
                _out.print(f"[dim]note[/] {escape(p.file)}: {escape(p.path)}: {escape(p.message)} "
                           f"[dim]\\[{p.kind}][/]", highlight=False)
        colour = "green" if summary.ok else "red"
        kinds = ", ".join(f"{k}: {n}" for k, n in summary.by_kind.items())
        _out.print(f"[{colour}]{summary.files} file(s), {summary.files_with_problems} with problems, "
                   f"{summary.problems} problem(s)[/]" + (f" ({kinds})" if kinds else "")
                   + (f", {summary.notes} note(s)" if summary.notes else ""), highlight=False)
    return 0 if summary.ok else 1


# -- schema -------------------------------------------------------------------------------------
def cmd_schema(args: argparse.Namespace) -> int:
    from .definition import json_schema

    _print_json(json_schema())
    return 0


# -- list / show --------------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    from .dataset import Dataset

    defs = Dataset(args.definitions).select(op_type=args.op_type, tag=args.tag, model=args.model)
    if args.json:
        _print_json([{"name": d.name, "op_type": d.op_type, "tags": d.tags,
                      "file": str(d.source) if d.source else None} for d in defs])
        return 0
    table = Table(title=f"{len(defs)} definition(s)")
    for col in ("op_type", "name", "tags"):
        table.add_column(col)
    for d in sorted(defs, key=lambda d: (d.op_type, d.name)):
        table.add_row(d.op_type, d.name, " ".join(d.tags))
    _out.print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from .dataset import load_definition

    d = load_definition(args.name, definitions=args.definitions)
    paths = _ground_truth_paths(d, args.device) if args.ground_truths else None
    if args.json:
        _print_json(d.as_dict | ({"ground_truths": paths} if paths is not None else {}))
        return 0
    _out.print(f"[bold]{d.name}[/]  op_type={d.op_type}  {d.source or ''}", highlight=False)
    if d.description:
        _out.print(d.description)
    _out.print("tags: " + " ".join(d.tags))
    axes = Table(title="axes")
    for col in ("axis", "type", "value", "description"):
        axes.add_column(col)
    for name, a in d.axes.items():
        axes.add_row(name, a.type, str(getattr(a, "value", "")), a.description or "")
    _out.print(axes)
    for section in ("inputs", "outputs"):
        t = Table(title=section)
        for col in ("name", "shape", "dtype", "description"):
            t.add_column(col)
        for name, s in getattr(d, section).items():
            t.add_row(name, "scalar" if s.shape is None else "[" + ", ".join(s.shape) + "]",
                      s.dtype.value if s.dtype is not None else "unknown", s.description or "")
        _out.print(t)
    if d.constraints:
        _out.print("constraints: " + "; ".join(d.constraints))
    if args.reference:
        _out.print(d.reference, highlight=False, markup=False)
    if paths is not None:
        t = Table(title=f"ground truths on {next(iter(paths.values()))['device']}")
        for col in ("source", "runs", "passed over / why not"):
            t.add_column(col, overflow="fold")
        for source, p in paths.items():
            notes = [f"{o['api']}: {o['reason']}" for o in p.get("passed_over", [])]
            t.add_row(source, p.get("api") or "-", escape("\n".join(notes) if p.get("api") else p["unavailable"]))
        _out.print(t)
    return 0


def _ground_truth_paths(d, device: str | None) -> dict[str, dict]:
    """Per source: what runs here (describe(), with what it passed over) or why nothing does."""
    from .groundtruth import GroundTruthUnavailable, default_device, ground_truths

    device = device or default_device()
    return {s: {"device": device, "unavailable": str(g)} if isinstance(g, GroundTruthUnavailable) else g.describe()
            for s, g in ground_truths(d, device=device).items()}


# -- inputs / run -------------------------------------------------------------------------------
def _describe(value: Any) -> dict[str, Any]:
    if hasattr(value, "shape"):
        return {"shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", ""),
                "device": str(value.device)}
    return {"shape": None, "dtype": type(value).__name__, "value": value}


def _generate(args: argparse.Namespace, name: str):
    from .dataset import load_definition
    from .inputs import generate_inputs

    d = load_definition(name, definitions=args.definitions)
    return d, generate_inputs(d, size=args.size, seed=args.seed, device=args.device, case=args.case)


def cmd_inputs(args: argparse.Namespace) -> int:
    d, inputs = _generate(args, args.name)
    described = {k: _describe(v) for k, v in inputs.values.items()}
    if args.json:
        _print_json({"definition": d.name, "size": args.size, "seed": args.seed, "case": args.case,
                     "axes": inputs.axes, "inputs": described})
        return 0
    _out.print("axes: " + ", ".join(f"{k}={v}" for k, v in inputs.axes.items()), highlight=False)
    t = Table(title=f"{d.name} inputs (size={args.size}, seed={args.seed}, case={args.case})")
    for col in ("name", "shape", "dtype", "value"):
        t.add_column(col)
    for k, info in described.items():
        t.add_row(k, "scalar" if info["shape"] is None else str(tuple(info["shape"])), info["dtype"],
                  str(info.get("value", "")))
    _out.print(t)
    return 0


def _run_one(args: argparse.Namespace, name: str) -> dict[str, Any]:
    from .inputs import UnsupportedOpType
    from .testing import output_problems, run_reference

    try:
        d, inputs = _generate(args, name)
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
        info = _describe(value)
        if hasattr(value, "is_floating_point") and value.is_floating_point() and value.numel():
            v = value.float()
            finite = v[v.isfinite()]
            info.update(nonfinite=int(v.numel() - finite.numel()),
                        mean=float(finite.mean()) if finite.numel() else None,
                        absmax=float(finite.abs().max()) if finite.numel() else None)
        stats[out_name] = info
    return {"definition": d.name, "status": "fail" if problems else "ok", "seconds": seconds,
            "outputs": stats, "problems": problems}


def _configure_sandbox(args: argparse.Namespace) -> None:
    from .sandbox import configure

    configure(timeout=args.reference_timeout, memory_gb=args.reference_memory,
              allow_unconfined=True if args.allow_unconfined_references else None)


def cmd_sandbox(args: argparse.Namespace) -> int:
    """Start a worker and say how it is confined here; exit 1 when a mechanism is missing."""
    from .sandbox import status
    from .sandbox.pool import describe_settings

    _configure_sandbox(args)
    info = status(probe=True) or {}
    if args.json:
        _print_json({"confinement": info, "settings": describe_settings()})
    else:
        for mechanism, what in (info.get("active") or {}).items():
            _out.print(f"[green]✓[/] {mechanism}: {escape(what)}", highlight=False)
        for mechanism, why in (info.get("missing") or {}).items():
            _out.print(f"[red]✗[/] {mechanism}: {escape(why)}", highlight=False)
        if info.get("error"):
            _out.print(f"[red]✗ the worker did not start: {escape(info['error'])}[/]", highlight=False)
        verdict = ("references run confined" if info.get("complete") else
                   "references run WITHOUT full confinement (allowed)" if info.get("allow_unconfined") else
                   "references are refused here unless --allow-unconfined-references")
        _out.print(("[green]" if info.get("complete") else "[red]") + verdict + "[/]", highlight=False)
    return 0 if info.get("complete") else 1


def cmd_run(args: argparse.Namespace) -> int:
    from .dataset import Dataset

    _configure_sandbox(args)

    names = Dataset(args.definitions).names() if args.all else args.names
    if not names:
        _err.print("error: name a definition or pass --all", style="red")
        return 2
    results = [_run_one(args, n) for n in names]
    if args.json:
        from .sandbox import status

        _print_json({"size": args.size, "seed": args.seed, "case": args.case, "device": args.device,
                     "sandbox": status(), "results": results})
    else:
        t = Table(title=f"reference runs on {args.device} (size={args.size}, seed={args.seed})")
        for col in ("definition", "status", "ms", "outputs (shape dtype absmax)"):
            t.add_column(col, overflow="fold")
        for r in results:
            ms = f"{r['seconds'] * 1e3:.1f}" if "seconds" in r else ""
            outs = "\n".join(f"{o} {'x'.join(map(str, s['shape'] or []))} {s['dtype']} {_fmt(s.get('absmax'))}"
                             for o, s in r["outputs"].items())
            t.add_row(r["definition"], r["status"], ms, outs)
        _out.print(t)
        for r in results:
            for p in r["problems"]:
                _out.print(f"[red]✗ {r['definition']}: {escape(p)}[/]", highlight=False)
            if r["status"] == "skip":
                _out.print(f"[yellow]skip {r['definition']}: {escape(r['reason'])}[/]", highlight=False)
    return 1 if any(r["status"] in ("fail", "error") for r in results) else 0


def _fmt(x: Any) -> str:
    return "" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


# -- check ------------------------------------------------------------------------------------
def _tolerance_args(args: argparse.Namespace) -> dict[str, float]:
    return {k: v for k, v in (("atol", args.atol), ("rtol", args.rtol), ("matched_ratio", args.matched_ratio),
                              ("min_cosine", args.min_cosine))
            if v is not None}


def cmd_check(args: argparse.Namespace) -> int:
    from .check import CheckConfig, discover, plan, run, summarise
    from .groundtruth import SOURCES
    from .sandbox import status

    _configure_sandbox(args)

    sources = SOURCES if args.ground_truth == "all" else (args.ground_truth,)
    sizes = tuple(args.size) if args.size else ("small", "medium")
    config = CheckConfig(sources=sources, sizes=sizes, seeds=tuple(args.seed or (0,)),
                         cases=(tuple(args.case) if args.case else None) if not args.no_edge_cases else (),
                         device=args.device, tolerance=_tolerance_args(args), draws=args.draws,
                         definitions_dir=args.definitions, save_failures=args.save_failures,
                         save_inputs=args.save_inputs, results_file=args.results or None, resume=args.resume)
    from .dataset import definitions_dir

    targets = args.targets or [str(definitions_dir(args.definitions))]
    found = discover(targets, config)
    kernels = tuple(s for s in sources if s != "torch")
    if kernels and config.resolved_device.startswith("cuda") and not args.no_prebuild:
        code = _prebuild(found.definitions, kernels, config.resolved_device, args)
        if code:
            return code
    planned = plan(found, config)
    results = []
    try:
        with _progress(len(planned), enabled=not args.no_progress) as advance:
            for r in run(planned, config):
                results.append(r)
                advance(f"{r.definition} {r.check} {r.source or ''}")
                if not args.json and r.status in ("fail", "error"):
                    _out.print(f"[red]{r.status.upper()}[/] {escape(r.definition)} {r.check} {r.source or ''} "
                               f"{r.size or ''} seed={r.seed} {r.case or ''}: {escape(r.reason or '')}",
                               highlight=False)
    except KeyboardInterrupt:
        kept = f"; the {len(results)} finished are in {config.results_file} (--resume goes on)" \
            if config.results_file else ""
        _err.print(f"interrupted after {len(results)} of {len(planned)} case(s){kept}", style="yellow")
        return 130
    summary = summarise(results)
    if args.json:
        _print_json({"device": config.resolved_device, "summary": asdict(summary), "sandbox": status(),
                     "results": [r.as_dict() for r in results]})
        return 0 if summary.ok else 1
    t = Table(title=f"check on {config.resolved_device}: {summary.total} case(s)")
    for col in ("definition", "pass", "fail", "error", "skip"):
        t.add_column(col)
    per: dict[str, dict[str, int]] = {}
    for r in results:
        per.setdefault(r.definition, {}).setdefault(r.status, 0)
        per[r.definition][r.status] += 1
    for name, counts in per.items():
        t.add_row(name, *(str(counts.get(k, 0)) for k in ("pass", "fail", "error", "skip")))
    _out.print(t)
    for reason, n in summary.skip_reasons.items():
        _out.print(f"[yellow]skip x{n}[/] {escape(reason or '')}", highlight=False)
    colour = "green" if summary.ok else "red"
    _out.print(f"[{colour}]" + ", ".join(f"{k} {v}" for k, v in sorted(summary.by_status.items())) + "[/]",
               highlight=False)
    return 0 if summary.ok else 1


@contextmanager
def _progress(total: int, *, enabled: bool):
    """A progress bar on stderr (done / total, the current case, ETA); `advance(description)`."""
    if not enabled or total == 0:
        yield lambda _text: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=_err, transient=True) as bar:
        task = bar.add_task("check", total=total)
        yield lambda text: bar.update(task, advance=1, description=text[:60])


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _prebuild(definitions, sources, device: str, args: argparse.Namespace) -> int:
    """check on a GPU builds every module first, in parallel, and its ground truths then skip what
    could not be built (build-failed / build-timeout) instead of compiling inside the checks."""
    import os

    from .sweep import jit

    report = str(Path(args.results).with_name("jit.jsonl")) if args.results else None
    config = jit.JitConfig(sources=sources, device=device, report=report, resume=args.resume,
                           log_dir=str(Path(report).with_name("jit-logs")) if report else None,
                           stamps=jit.default_stamps(), budget=args.jit_budget)
    records = _run_builds(jit.plan(definitions, config), config, progress=not args.no_progress)
    if records is None:
        return 130
    counts = jit.summarise(records)["counts"]
    if records:
        _err.print("prebuild: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), highlight=False)
    if report:
        os.environ[jit.REPORT_ENV] = report
    return 0


# -- jit ----------------------------------------------------------------------------------------
def _run_builds(jobs, config, *, progress: bool, on_record=None) -> list | None:
    """The prebuild's records as each job ends, under a progress bar; None when interrupted."""
    from .sweep import jit

    records = []
    try:
        with _progress(len(jobs), enabled=progress) as advance:
            for r in jit.run(jobs, config):
                records.append(r)
                advance(f"build {r.definition} {r.source}")
                if on_record:
                    on_record(r)
    except KeyboardInterrupt:
        _err.print(f"interrupted after {len(records)} of {len(jobs)} build job(s); the finished ones are in "
                   f"{config.report} (--resume goes on; ninja keeps finished objects)", style="yellow")
        return None
    return records


def cmd_jit_build(args: argparse.Namespace) -> int:
    """Build every kernel module the ground truths need, in parallel; the tests then never compile."""
    from .check import CheckConfig, discover
    from .dataset import definitions_dir
    from .sweep import jit

    budgets = {}
    for item in args.budget_for or []:
        name, eq, seconds = item.partition("=")
        try:
            budgets[name] = float(seconds) if eq else float("nan")
        except ValueError:
            budgets[name] = float("nan")
        if not budgets[name] > 0:
            _err.print(f"error: --budget-for {item!r}: expected NAME=SECONDS, seconds > 0 (an op type or a "
                       "definition)", style="red", highlight=False, markup=False)
            return 2
    sources = jit.KERNEL_SOURCES if args.source == "all" else (args.source,)
    config = jit.JitConfig(sources=sources, device=args.device, workers=args.workers, max_jobs=args.max_jobs,
                           budget=args.budget, budgets=budgets, report=args.report or None,
                           log_dir=args.log_dir or None, resume=args.resume, select=jit.select_k(args.k),
                           stamps=jit.default_stamps(), recheck=args.recheck)
    targets = args.targets or [str(definitions_dir(args.definitions))]
    jobs = jit.plan(discover(targets, CheckConfig(definitions_dir=args.definitions)).definitions, config)

    def show(r) -> None:
        if not args.json and r.status != "cached":
            colour = {"built": "green", "error": "yellow"}.get(r.status, "red")
            mods = f" ({', '.join(r.modules)})" if r.modules else ""
            _out.print(f"[{colour}]{r.status}[/] {escape(r.definition)} {r.source} {r.seconds:.1f} s"
                       f"{escape(mods)}{': ' + escape(r.message) if r.message else ''}", highlight=False)

    records = _run_builds(jobs, config, progress=not args.no_progress, on_record=show)
    if records is None:
        return 130
    summary = jit.summarise(records)
    if args.json:
        _print_json({"summary": summary, "records": [r.as_dict() for r in records]})
    else:
        _out.print(f"{len(records)} job(s): " + ", ".join(f"{k} {v}" for k, v in sorted(summary["counts"].items()))
                   + f"; {len(summary['modules_built'])} module(s) built", highlight=False)
    return 1 if any(r.status in ("build-failed", "build-timeout") for r in records) else 0


# -- mutants ------------------------------------------------------------------------------------
def cmd_mutants(args: argparse.Namespace) -> int:
    """The planted-bug suite against one ground truth: which bugs each comparison catches."""
    from .groundtruth import default_device
    from .mutants import MUTANTS, kill, kill_rate

    _configure_sandbox(args)
    device = args.device or default_device()
    chosen = [m for m in MUTANTS if not args.only or any(o in m.name for o in args.only)]
    stream = None
    if args.stream:
        from .sweep.results import JsonlStream

        stream = JsonlStream(args.stream)
    kills = []
    for m in chosen:  # each verdict streamed as it comes: a run cut short keeps what it judged
        kills.append(kill(m, args.ground_truth, device=device))
        if stream:
            stream.write(asdict(kills[-1]) | {"bug": m.bug, "known_gap": m.survives, "ground_truth": args.ground_truth,
                                              "device": device})
    if stream:
        stream.close()
    killed, ran = kill_rate(kills)
    unexpected = [k for m, k in zip(chosen, kills, strict=True) if k.killed is False and not m.survives]
    if args.json:
        _print_json({"ground_truth": args.ground_truth, "device": device, "killed": killed, "ran": ran,
                     "mutants": [asdict(k) | {"bug": m.bug, "known_gap": m.survives}
                                 for m, k in zip(chosen, kills, strict=True)]})
    else:
        t = Table(title=f"planted bugs vs {args.ground_truth} on {device}: {killed}/{ran} caught")
        for col in ("mutant", "bug", "caught", "how", "closest: bug / true reference"):
            t.add_column(col, overflow="fold")
        for m, k in zip(chosen, kills, strict=True):
            caught = "n/a" if k.killed is None else "yes" if k.killed else "known gap" if m.survives else "NO"
            t.add_row(m.name, m.bug, caught, escape(k.how if k.killed is not False or not m.survives else m.survives),
                      f"{_margin(k.margin)} / {_margin(k.baseline_margin)}")
        _out.print(t)
    return 1 if unexpected else 0


def _margin(m) -> str:
    """A run's closest approach to failing: the share of its tolerance used, the lowest cosine."""
    if m is None:
        return "-"
    used = "-" if m.tolerance_used is None else f"{m.tolerance_used:.3g}"
    return f"{used} of tol, cos {'-' if m.cosine is None else f'{m.cosine:.5f}'}"


# -- tests generate / coverage --------------------------------------------------------------------
def cmd_tests_generate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .coverage import coverage
    from .dataset import Dataset
    from .testgen import generate, write

    if not (args.all or args.op_type or args.definition):
        _err.print("error: pass --all, --op-type T or --definition NAME", style="red")
        return 2
    defs = list(Dataset(args.definitions))
    out_dir = Path(args.output)
    files = generate(defs, out_dir, op_type=args.op_type, name=args.definition)
    if len(files) == 1:
        _err.print("error: no definition matched (or its op type has no input generator)", style="red")
        return 2
    done = write(files, force=args.force)
    cov = coverage(defs, out_dir)
    if args.json:
        _print_json({k: [str(p) for p in v] for k, v in done.items()} | {"coverage": cov.as_dict()})
        return 0
    for kind, paths in done.items():
        for p in paths:
            note = " (exists; --force to overwrite)" if kind == "skipped" else ""
            _out.print(f"{kind:9s} {p}{note}", highlight=False)
    _out.print(f"{len(cov.with_tests)} of {len(defs)} definition(s) have generated tests; without: "
               f"{', '.join(cov.without_tests) or 'none'}", highlight=False)
    for op in cov.op_types.values():
        _out.print(f"  {op.op_type}: {op.tested}/{op.definitions} tested", highlight=False)
    return 0


def cmd_coverage(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .coverage import coverage
    from .dataset import Dataset

    defs = list(Dataset(args.definitions))
    cov = coverage(defs, Path(args.tests))
    if args.json:
        _print_json(cov.as_dict())
        return 0
    t = Table(title=f"tests: {len(cov.with_tests)} of {len(defs)} definition(s)")
    for col in ("op_type", "defs", "tested", "generator", "flashinfer", "sglang", "torch"):
        t.add_column(col, overflow="fold")
    for op in cov.op_types.values():
        t.add_row(op.op_type, str(op.definitions), str(op.tested), "yes" if op.has_generator else "no",
                  *("\n".join(op.ground_truths[s]) or "-" for s in ("flashinfer", "sglang", "torch")))
    _out.print(t)
    a = Table(title="axis coverage")
    for col in ("op_type", "dtype", "stage", "page_size", "causal", "const axes"):
        a.add_column(col, overflow="fold")
    for op in cov.op_types.values():
        d = op.as_dict()
        a.add_row(op.op_type, ", ".join(d["dtypes"]), ", ".join(d["stages"]) or "-",
                  ", ".join(map(str, d["page_sizes"])) or "-", ", ".join(map(str, d["causal"])) or "-",
                  "; ".join(f"{k}={','.join(map(str, v))}" for k, v in d["const_axes"].items()))
    _out.print(a)
    if cov.without_tests:
        _out.print(f"[yellow]without tests:[/] {', '.join(cov.without_tests)}", highlight=False)
    if cov.stale_tests:
        _out.print(f"[yellow]tests for definitions that no longer exist:[/] {', '.join(cov.stale_tests)}",
                   highlight=False)
    return 0


# -- extract ------------------------------------------------------------------------------------
def cmd_extract(args: argparse.Namespace) -> int:
    import json as _json
    from pathlib import Path

    from .dataset import definitions_dir
    from .extract import ConfigError, extract, load_config, select_models
    from .extract.report import build_report, render_report_md
    from .sweep.results import write_atomic

    overrides = {"tp": args.tp, "ep": args.ep}
    try:
        if args.config:
            configs = [load_config(args.config, name=args.name, **overrides)]
        else:
            configs = select_models(args.model, **overrides)
            if args.name and len(configs) == 1:
                configs = [select_models(args.model, name=args.name, **overrides)[0]]
        folder = str(definitions_dir(args.definitions))
        ex = extract(configs, folder, page_size=args.page_size, dry_run=args.dry_run)
    except ConfigError as e:
        _err.print(f"error: {e}", highlight=False, markup=False, style="red")
        return 2
    report = build_report(ex, folder)
    if not args.dry_run:
        out = Path(args.report)
        write_atomic(out / "extract-report.json", _json.dumps(report, indent=2) + "\n")
        write_atomic(out / "extract-report.md", render_report_md(report))
    if args.json:
        _print_json(report)
        return 0
    for m in report["models"]:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(m["counts"].items()))
        _out.print(f"[bold]{m['model']}[/] (tp {m['tp']}, ep {m['ep']}): {len(m['kernels'])} kernel(s): {counts}",
                   highlight=False)
        for k in m["kernels"]:
            if k["status"] in ("new", "conflict"):
                extra = f" (conflicts with {k['conflicts_with']}: {', '.join(k['differences'])})" \
                    if k["status"] == "conflict" else ""
                _out.print(f"  {k['status']:9s} {k['name']}{extra}", highlight=False, markup=False)
        for why in m["left_out"]:
            _out.print(f"  [dim]left out: {escape(why)}[/]", highlight=False)
    _out.print(f"{len(report['shared_across_models'])} definition(s) shared across models; "
               + ("dry run: nothing written" if args.dry_run else
                  f"{len(ex.written)} file(s) written; report in {args.report}/extract-report.md"), highlight=False)
    return 0


# -- drift ------------------------------------------------------------------------------------
def cmd_drift(args: argparse.Namespace) -> int:
    """Our definitions against FlashInfer's own (fi_trace) of one version: fields and reference results."""
    from .fitrace.drift import ResultSettings, report, summary_lines, write

    _configure_sandbox(args)
    r = report(args.ours or args.definitions or "definitions", args.upstream, version=args.fi_version,
               settings=ResultSettings(size=args.size, seed=args.seed, enabled=not args.no_results))
    out = write(r, args.out or f"results/drift-{r['flashinfer']}.json")
    if args.json:
        _print_json(r)
    else:
        for line in summary_lines(r):
            _out.print(line, highlight=False, markup=False)
        for p in r["problems"]:
            _err.print(f"problem: {p['path']}: {p['problem']}", highlight=False, markup=False)
        _out.print(f"wrote {out}", highlight=False, markup=False)
    return 0


# -- import-fi-trace --------------------------------------------------------------------------
def cmd_import_fi_trace(args: argparse.Namespace) -> int:
    """The installed FlashInfer's own definitions (fi_trace, >= 0.7), emitted in a confined worker."""
    from .fitrace.importer import MANIFEST_NAME, FiTraceUnavailable, import_fi_trace
    from .sandbox import ConfinementUnavailable, ReferenceFailure

    _configure_sandbox(args)
    try:
        manifest = import_fi_trace(args.out, args.op_type, device=args.device)
    except (FiTraceUnavailable, ConfinementUnavailable, ReferenceFailure) as e:
        _err.print(f"[red]import-fi-trace: {escape(str(e))}[/]", highlight=False)
        return 2
    if args.json:
        _print_json(manifest)
        return 0
    for f in manifest["failures"]:
        _out.print(f"[yellow]-[/] {escape(f['fi_api'])} ({escape(f.get('label', ''))}): {escape(f['reason'])}",
                   highlight=False)
    _out.print(f"flashinfer {escape(manifest['flashinfer_version'])}: {manifest['count']} definition(s) over "
               f"{manifest['op_types']} op type(s) written to {escape(str(args.out))}, {manifest['failed']} "
               f"template(s) not emitted; manifest: {escape(str(Path(args.out) / MANIFEST_NAME))}", highlight=False)
    return 0


# -- wiring -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flashinfer-trace", description=__doc__)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--definitions", metavar="DIR",
                        help="definitions folder (default: $FLASHINFER_TRACE_DEFINITIONS or ./definitions)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("validate", parents=[common], help="check definition files; exit 1 on any problem")
    s.add_argument("paths", nargs="*", help="files or folders (default: the definitions folder)")
    s.set_defaults(func=cmd_validate)

    s = sub.add_parser("schema", parents=[common], help="print the definition JSON Schema")
    s.set_defaults(func=cmd_schema)

    s = sub.add_parser("list", parents=[common], help="list definitions")
    s.add_argument("--op-type")
    s.add_argument("--tag")
    s.add_argument("--model")
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("show", parents=[common], help="show one definition")
    s.add_argument("name", help="definition name or path to its JSON file")
    s.add_argument("--reference", action="store_true", help="print the reference source too")
    s.add_argument("--ground-truths", action="store_true",
                   help="the kernel path each source takes here, the ones it passes over, or why none runs")
    s.add_argument("--device", default=None, help="for --ground-truths: cpu or cuda (default: cuda when available)")
    s.set_defaults(func=cmd_show)

    box = argparse.ArgumentParser(add_help=False)
    box.add_argument("--allow-unconfined-references", action="store_true",
                     help="run references even where the worker cannot be fully confined (recorded; docs/sandbox.md)")
    box.add_argument("--reference-timeout", type=float, metavar="S", help="seconds per reference call (default 900)")
    box.add_argument("--reference-memory", type=float, metavar="GB",
                     help="memory a reference worker may use (default: 80%% of RAM)")

    s = sub.add_parser("import-fi-trace", parents=[common, box],
                       help="write the installed FlashInfer's own definitions (fi_trace, >= 0.7) as "
                            "<out>/<op_type>/<name>.json; its templates run in the confined worker")
    s.add_argument("--out", default="fi_trace_definitions", metavar="DIR",
                   help="output folder (default: ./fi_trace_definitions)")
    s.add_argument("--op-type", action="append", metavar="T", help="only these op types (repeatable)")
    s.add_argument("--device", default=None,
                   help="where the templates' inits run after the meta device: cpu or cuda (default: cuda when "
                        "available); a GPU lets the inits that need CUDA emit")
    s.set_defaults(func=cmd_import_fi_trace)

    s = sub.add_parser("sandbox", parents=[common, box], help="how references are confined here; exit 1 if not fully")
    s.set_defaults(func=cmd_sandbox)

    gen = argparse.ArgumentParser(add_help=False)
    gen.add_argument("--size", default="small", choices=("small", "medium", "large"))
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--case", default=None, help="an edge case of the op family, e.g. single_token")
    gen.add_argument("--device", default="cpu")

    s = sub.add_parser("inputs", parents=[common, gen], help="shapes and dtypes of generated inputs")
    s.add_argument("name", help="definition name or path to its JSON file")
    s.set_defaults(func=cmd_inputs)

    s = sub.add_parser("run", parents=[common, gen, box], help="run references on generated inputs")
    s.add_argument("names", nargs="*", help="definition names or paths to JSON files")
    s.add_argument("--all", action="store_true", help="every definition in the definitions folder")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("check", parents=[common, box],
                       help="check references against ground truth outside pytest; exit 1 on any failure")
    s.add_argument("targets", nargs="*", help="definition files, folders or names (default: the definitions folder)")
    s.add_argument("--ground-truth", default="all", choices=("all", "torch", "flashinfer", "sglang"))
    s.add_argument("--size", action="append", choices=("small", "medium", "large"),
                   help="repeatable (default: small and medium)")
    s.add_argument("--seed", action="append", type=int, help="repeatable (default: 0)")
    s.add_argument("--case", action="append", help="only these edge cases (repeatable)")
    s.add_argument("--no-edge-cases", action="store_true")
    s.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    s.add_argument("--atol", type=float)
    s.add_argument("--rtol", type=float)
    s.add_argument("--matched-ratio", type=float)
    s.add_argument("--min-cosine", type=float, help="each output's cosine with the expected one must reach this")
    s.add_argument("--draws", type=int, help="sampler draws per row")
    s.add_argument("--save-failures", default="results/failures", metavar="DIR",
                   help="where failing cases are saved for replay ('' to disable)")
    s.add_argument("--save-inputs", action="store_true", help="also save failing inputs as safetensors")
    s.add_argument("--results", default="results/check.jsonl", metavar="FILE",
                   help="each result appended here as it completes, fsynced ('' to disable)")
    s.add_argument("--resume", action="store_true", help="skip the cases already in --results, reuse their results")
    s.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    s.add_argument("--no-prebuild", action="store_true",
                   help="on a GPU, do not build the kernels' JIT modules in parallel first (they then build "
                        "one at a time, inside the checks)")
    s.add_argument("--jit-budget", type=_positive_seconds, default=600.0, metavar="S",
                   help="seconds each prebuild job may take (default 600); past it the module is build-timeout "
                        "and its checks skip with that reason")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("mutants", parents=[common, box],
                       help="planted bugs: which the comparisons catch (kill rate); exit 1 if one is missed")
    s.add_argument("--ground-truth", default="torch", choices=("torch", "flashinfer", "sglang"))
    s.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    s.add_argument("--only", action="append", help="mutants whose name contains this (repeatable)")
    s.add_argument("--stream", metavar="FILE", help="append each mutant's verdict to FILE (JSONL) as it is judged")
    s.set_defaults(func=cmd_mutants)

    s = sub.add_parser("coverage", parents=[common], help="tests, ground truths and axis values per op type")
    s.add_argument("--tests", default="tests/references", help="the generated tests folder")
    s.set_defaults(func=cmd_coverage)

    s = sub.add_parser("extract", parents=[common], help="definitions of every kernel a model runs, from its config")
    which = s.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a bundled model (llama-3.1-8b, ...) or an architecture "
                                       "(llama, mixtral, qwen2_moe, qwen3_moe, deepseek_v3)")
    which.add_argument("--config", metavar="FILE", help="a Hugging Face style config.json")
    s.add_argument("--name", help="the model tag (default: from the config)")
    s.add_argument("--tp", type=int, help="tensor parallelism (default: the bundled config's, else 1)")
    s.add_argument("--ep", type=int, help="expert parallelism (default: the bundled config's, else 1)")
    s.add_argument("--page-size", type=int, default=1, help="KV-cache page size (default 1)")
    s.add_argument("--dry-run", action="store_true", help="show what would change; write nothing")
    s.add_argument("--report", default="results/extract", metavar="DIR", help="where the reports go")
    s.set_defaults(func=cmd_extract)

    j = sub.add_parser("jit", help="the JIT prebuild: compile every kernel module before the tests")
    jsub = j.add_subparsers(dest="jit_command", required=True)
    s = jsub.add_parser("build", parents=[common], help="build in parallel, each job with its own budget; exit 1 "
                                                        "if any failed or ran out of time")
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
    s.set_defaults(func=cmd_jit_build)
    from .sweep.jitarchive_cli import add_commands as add_jit_archive_commands

    add_jit_archive_commands(jsub)

    s = sub.add_parser("drift", parents=[common, box],
                       help="our definitions against FlashInfer's own (fi_trace) definitions of one version")
    s.add_argument("--ours", metavar="DIR", help="our definitions (default: --definitions, else ./definitions)")
    s.add_argument("--upstream", metavar="DIR", required=True, help="FlashInfer's definitions of one version")
    s.add_argument("--out", metavar="FILE", help="the report (default: results/drift-<version>.json)")
    s.add_argument("--fi-version", help="the upstream FlashInfer version (default: from the --upstream path)")
    s.add_argument("--size", default="small", choices=("small", "medium", "large"), help="inputs' size tier")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--no-results", action="store_true", help="compare fields only; run no reference")
    s.set_defaults(func=cmd_drift)

    from .sweep.wheelhouse_cli import add_commands as add_wheelhouse_commands

    w = sub.add_parser("wheelhouse", help="a combination's wheels for an offline machine")
    add_wheelhouse_commands(w.add_subparsers(dest="wheelhouse_command", required=True))

    from .matrix.__main__ import add_commands

    m = sub.add_parser("matrix", help="build the compatibility matrix from results; diff two matrices")
    add_commands(m.add_subparsers(dest="matrix_command", required=True))
    m.set_defaults(func=lambda a: a.run(a))

    tests = sub.add_parser("tests", help="the generated reference tests")
    tsub = tests.add_subparsers(dest="tests_command", required=True)
    s = tsub.add_parser("generate", parents=[common], help="write tests/references/conftest.py and test_<op>.py")
    which = s.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true")
    which.add_argument("--op-type")
    which.add_argument("--definition")
    s.add_argument("--force", action="store_true", help="overwrite existing files")
    s.add_argument("--output", default="tests/references", metavar="DIR")
    s.set_defaults(func=cmd_tests_generate)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .compare import ToleranceConfigError
    from .inputs import InputGenerationError
    from .sandbox import SandboxError
    from .validate import DefinitionError

    try:
        return args.func(args)
    except (DefinitionError, SandboxError, InputGenerationError, ToleranceConfigError, KeyError,
            FileNotFoundError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        _err.print(f"error: {msg}", highlight=False, markup=False, style="red")
        return 2


if __name__ == "__main__":
    sys.exit(main())

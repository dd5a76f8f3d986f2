"""`flashinfer-trace sweep run`: a set of nox sessions over every GPU of this host (sweep/host.py)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from ..escape import for_rich
from .common import err, out, print_json


def add_commands(sub) -> None:
    s = sub.add_parser("sweep", help="run matrix sessions over the host's GPUs")
    ssub = s.add_subparsers(dest="sweep_command", required=True)
    r = ssub.add_parser("run", help="nox sessions (by tag or name), one per GPU at a time, CUDA_VISIBLE_DEVICES "
                                    "pinned, the cores shared; a summary at the end. Exit 1 if any failed")
    r.add_argument("-t", "--tag", action="append", default=[],
                   help="nox tag (repeatable), e.g. nightly: every session of every -t and -s runs")
    r.add_argument("-s", "--session", action="append", default=[], help="nox session name (repeatable)")
    r.add_argument("--gpus", help="GPU indices to use, e.g. 0,1 (default: every GPU nvidia-smi lists)")
    r.add_argument("--per-gpu", type=int, default=1, metavar="N",
                   help="sessions at once on each GPU (default 1); they share its memory budget and run without "
                        "MPS daemons of their own")
    r.add_argument("--cores", type=int, help="the cores to share among the sessions (default: all)")
    r.add_argument("--all-archs", action="store_true",
                   help="keep sessions tagged for another arch than this host's (they record arch-mismatch)")
    r.add_argument("--with-cpu", action="store_true",
                   help="also run the selected CPU sessions (tag cpu), each in a GPU slot (default: left out)")
    r.add_argument("--nox", default=f"{shlex.quote(sys.executable)} -m nox", help="the nox command")
    r.add_argument("--results", type=Path, help="the sessions' results (default $FLASHINFER_TRACE_RESULTS or "
                                                "results/)")
    r.add_argument("--log-dir", type=Path, help="one console log per session and summary.json (default "
                                                "RESULTS/host)")
    r.add_argument("--dry-run", action="store_true",
                   help="the plan: which session on which GPU, with how many cores; run nothing")
    r.add_argument("--json", action="store_true", help="print the summary as JSON")
    r.add_argument("posargs", nargs=argparse.REMAINDER, help="after --: every session's arguments (nox posargs)")
    r.set_defaults(func=cmd_sweep_run)


def cmd_sweep_run(args: argparse.Namespace) -> int:
    from ..sweep import host

    posargs = args.posargs[1:] if args.posargs[:1] == ["--"] else args.posargs
    if not args.tag and not args.session:
        err.print("error: name the sessions: -t TAG or -s NAME (e.g. -t nightly)", style="red", highlight=False)
        return 2
    results = args.results or Path(os.environ.get("FLASHINFER_TRACE_RESULTS") or "results")
    nox = shlex.split(args.nox)
    try:
        selected = host.select(host.list_sessions(nox), args.session, args.tag)
        gpus, arch = host.host_gpus()
        gpus = host.parse_gpus(args.gpus) if args.gpus else gpus
        todo, left = host.sessions(selected, None if args.all_archs else arch, cpu=args.with_cpu)
        config = host.HostConfig(gpus=gpus, command=host.nox_command(nox, posargs), results=results,
                                 log_dir=args.log_dir or results / "host", cores=args.cores or os.cpu_count() or 1,
                                 per_gpu=args.per_gpu, mps=host.mps_requested(posargs))
    except host.HostError as e:
        err.print(f"error: {for_rich(str(e))}", style="red", highlight=False)
        return 2
    if left and not args.json:
        other_arch = f"for another arch than this host's {arch}, " if arch and not args.all_archs else ""
        out.print(f"left out ({other_arch}uninstallable, or CPU sessions without --with-cpu): {len(left)}"
                  + (f": {for_rich(', '.join(left))}" if args.dry_run else ""), highlight=False)
    if not todo:
        err.print("error: no session selected", style="red", highlight=False)
        return 2
    if args.dry_run:
        return _show_plan(todo, left, config, args.json)

    def ended(r) -> None:
        out.print(f"GPU {r.gpu}: {for_rich(r.session)} {for_rich(r.status)} in {r.wall_seconds} s", highlight=False)

    summary = host.run(todo, config, on_end=None if args.json else ended)
    if args.json:
        print_json(summary)
    else:
        out.print(f"{len(summary['sessions'])} session(s) on {len(summary['gpus'])} GPU(s) in "
                  f"{summary['wall_seconds']} s (the sessions' own times add up to {summary['session_seconds']} s): "
                  + ", ".join(f"{k} {v}" for k, v in sorted(summary["counts"].items()))
                  + f"; summary in {for_rich(str(config.log_dir / 'summary.json'))}", highlight=False)
    return 1 if summary["failed"] else 0


def _show_plan(todo, left: list[str], config, as_json: bool) -> int:
    """What would run on which GPU slot, with its share of the cores, in the order of an equal-length run."""
    from ..sweep import host

    slots = host.slots_for(todo, config.gpus, config.per_gpu)
    cores, on_shared = max(1, config.cores // len(slots)), host.shared(slots)
    order = host.plan(todo, config.gpus, config.per_gpu)

    def takes_turns(gpu: str, s) -> bool:  # on a shared GPU without the runner's MPS daemon (host.py)
        return gpu in on_shared and not host.uses_runner_mps(config, s)

    if as_json:
        print_json({"gpus": slots, "per_gpu": config.per_gpu, "cores": config.cores, "cores_per_session": cores,
                    "left_out": left,
                    "mps": "runner" if config.mps and on_shared else "sessions" if config.mps else "off",
                    "plan": [{"gpu": g, "session": s.name, "group": s.group,
                              "command": config.command(s, cores, takes_turns(g, s))} for g, s in order]})
        return 0
    gpus = list(dict.fromkeys(slots))
    at_once = f"{config.per_gpu} sessions at once per GPU" if config.per_gpu > 1 else "one session per GPU at a time"
    out.print(f"{len(todo)} session(s) over GPU(s) {', '.join(gpus)}, {at_once}, {cores} cores each; each slot takes "
              "the next session as its last one ends, one session of a combination at a time (the order if all took "
              "as long):", highlight=False)
    if on_shared and config.mps:
        out.print("  (one CUDA MPS daemon per shared GPU, started by the runner for its reference sessions; where it "
                  "cannot start, they run with --no-mps)", highlight=False)
    for gpu in gpus:
        out.print(f"  GPU {gpu}:", highlight=False)
        for s in (s for g, s in order if g == gpu):
            out.print(f"    {for_rich(' '.join(config.command(s, cores, takes_turns(gpu, s))))}", highlight=False)
    return 0

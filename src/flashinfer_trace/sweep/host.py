"""Every GPU of a host: a set of nox sessions spread over the GPUs, one session per GPU at a time (or `per_gpu`).

The nightly sessions ran one after another on one GPU while the others idled. Here each GPU takes the next
session as its last one ends, with CUDA_VISIBLE_DEVICES pinned to it (the session's MPS daemon, its test
processes and reference workers see that one GPU; mps.py gives each daemon private directories). The host's
cores are shared: a session gets cores / (sessions at once), passed as `--cores N` (MAX_JOBS for its JIT
builds, the prebuild's pool, the test processes' CPU threads). Two sessions of one group (`group_of`: a
combination) never run at once: they share its install folder and its JIT cache, and the second would wait on
the first's locks or redo its builds. Each session writes results/<session>/ exactly as alone; its console
output goes to <log_dir>/<session>.log; a failing session does not stop the others. The end is a summary (per
session: GPU, status, wall time; the total wall time), written as JSON.

`per_gpu` > 1 runs that many sessions at once on each GPU: a session whose kernels wait on its own Python, its
builds or its reference workers leaves the GPU idle much of the time, and the sessions of several releases fill
it. Their device memory needs no split: every session on a GPU takes its cases' memory from that GPU's one
ledger (budget/). Nor their MPS daemon: a daemon started by one session would be quit when that session ends,
under the others, so with `--mps` the runner owns one per shared GPU (mps.py), started before its first session
and quit after its last; its reference sessions use it, and a session whose GPU has none (the daemon could not
start) runs with `--no-mps`, its processes then taking turns on the GPU (the summary's `mps` says which). Without
`--mps` (the default) every process takes turns.

The sessions are selected here, not by nox: nox keeps only the last of several `-s`, ignores `-s` beside `-t`,
and `nox -l --json` alone lists only the default sessions. So every session is listed once (`-k True`: a
keyword expression every session matches) and the names and tags are matched in Python.

    list_sessions(nox)              -> every entry of `nox -l --json`
    select(entries, names, tags)    -> the entries they select (HostError naming an unknown one)
    sessions(entries, arch)         -> [HostSession]   those for this host's arch, grouped (group_of)
    plan(sessions, gpus, per_gpu)   -> [(gpu, session)]  the order they would run in if all took as long
    run(sessions, config)           -> summary dict    config.command(session, cores, shared) builds the command
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import mps
from .combos import ARCHS


class HostError(ValueError):
    pass


@dataclass(frozen=True)
class HostSession:
    name: str
    group: str  # sessions of one group (a combination) run one at a time


@dataclass
class HostConfig:
    gpus: list[str]  # CUDA_VISIBLE_DEVICES values
    # the session's command line, given its share of the cores and whether other sessions share its GPU
    command: Callable[[HostSession, int, bool], list[str]]
    results: Path  # where the sessions write results/<session>/ (their session.json is read back)
    log_dir: Path  # one console log per session, and summary.json
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    env: dict[str, str] | None = None  # the sessions' environment (default: this process's)
    cwd: str | None = None
    per_gpu: int = 1  # sessions at once on each GPU
    mps: bool = False  # one MPS daemon per shared GPU, owned by the runner (`--mps` among the posargs)

    def __post_init__(self):
        if not self.gpus:
            raise HostError("no GPUs to run on: nvidia-smi finds none; pass --gpus 0,1")
        if len(set(self.gpus)) != len(self.gpus):
            raise HostError(f"--gpus {','.join(self.gpus)}: a GPU named twice")
        if self.cores < 1:
            raise HostError(f"--cores {self.cores}: at least 1")
        if self.per_gpu < 1:
            raise HostError(f"--per-gpu {self.per_gpu}: at least 1")


@dataclass
class SessionRun:
    session: str
    gpu: str
    cores: int
    rc: int | None = None
    status: str | None = None  # session.json's status when this run wrote it, else from the exit status
    reason: str | None = None
    started: float = 0.0
    finished: float = 0.0
    wall_seconds: float = 0.0
    log: str | None = None


def parse_gpus(text: str) -> list[str]:
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise HostError(f"--gpus {text!r}: expected GPU indices separated by commas, e.g. 0,1")
    return parts


def host_gpus() -> tuple[list[str], str | None]:
    """(the indices nvidia-smi lists, the first one's arch)."""
    from .combos import arch_of
    from .manifest import nvidia_smi

    rows = nvidia_smi()
    arch = arch_of(rows[0]["compute_cap"]) if rows and rows[0].get("compute_cap") else None
    return [str(i) for i in range(len(rows))], arch


LIST_ALL = ("-l", "--json", "-k", "True")  # a keyword expression every session matches: all, not the defaults
SESSION_KINDS = ("references", "bench", "jit")  # the noxfile's per-combination sessions: <kind>-<id>[-<arch>]


def list_sessions(nox: Sequence[str], cwd: str | None = None) -> list[dict]:
    """Every session nox knows: the entries (session, name, tags, ...) of `nox -l --json -k True`."""
    cmd = [*nox, *LIST_ALL]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        raise HostError(f"{' '.join(cmd)}: {e}") from None
    if p.returncode != 0:
        raise HostError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    try:
        entries = json.loads(p.stdout)
    except ValueError:
        raise HostError(f"{' '.join(cmd)}: not JSON: {p.stdout[:200]!r}") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("session"), str)
                                                for e in entries):
        raise HostError(f"{' '.join(cmd)}: expected a list of {{session, tags}}: {p.stdout[:200]!r}")
    return entries


def _unknown(kind: str, wanted: Sequence[str], known: set[str]) -> list[str]:
    problems = []
    for w in dict.fromkeys(wanted):
        if w not in known:
            close = difflib.get_close_matches(w, sorted(known), n=4)
            problems.append(f"no {kind} {w!r}" + (f" (close: {', '.join(close)})" if close else ""))
    return problems


def select(entries: list[dict], names: Sequence[str] = (), tags: Sequence[str] = ()) -> list[dict]:
    """The entries named (a session's full name, or its function's name for every parametrization), in the order
    named (the queue a host runs them in), then those carrying one of `tags` in nox's order: each once. HostError
    naming every unknown name and tag, with the close matches, before anything runs."""
    known_names = {e["session"] for e in entries} | {e["name"] for e in entries if isinstance(e.get("name"), str)}
    known_tags = {t for e in entries for t in e.get("tags") or ()}
    problems = _unknown("session", names, known_names) + _unknown("tag", tags, known_tags)
    if problems:
        raise HostError("; ".join(problems) + " (`nox -l` lists them)")
    order = {n: i for i, n in enumerate(dict.fromkeys(names))}
    tags = set(tags)

    def rank(e: dict) -> int | None:
        return order.get(e["session"], order.get(e.get("name")))

    named = sorted((e for e in entries if rank(e) is not None), key=rank)  # the order the user named them in
    return named + [e for e in entries if rank(e) is None and tags & set(e.get("tags") or ())]


def combination_of(session_name: str) -> str | None:
    """The combination a `<kind>-<combination>[-<arch>]` session name runs (kind: references, bench, jit)."""
    kind, _, rest = session_name.partition("-")
    if kind not in SESSION_KINDS or not rest:
        return None
    head, _, arch = rest.rpartition("-")
    return head if head and arch in ARCHS else rest


def group_of(session_name: str, tags: Sequence[str] = ()) -> str:
    """The sessions that must not run at once share a group: those of one combination (its `combo:` tag, else
    its name), which share its install folder and JIT cache. A `jit-<combination>` session is its own group,
    `jit:<combination>`: it may run beside its combination's other sessions, never beside another prebuild
    of that combination. A session of no combination is a group of its own."""
    combo = next((t.removeprefix("combo:") for t in tags if t.startswith("combo:")), None)
    combo = combo or combination_of(session_name)
    if combo is None:
        return session_name
    return f"jit:{combo}" if session_name.startswith("jit-") else combo


def sessions(entries: list[dict], arch: str | None, *, cpu: bool = False) -> tuple[list[HostSession], list[str]]:
    """(the sessions to run, those left out: tagged for another arch than this host's, uninstallable, or, unless
    `cpu`, CPU sessions: they need no GPU, and each would hold one of the host's GPU slots for its whole run)."""
    keep, left = [], []
    for e in entries:
        tags = e.get("tags") or []
        archs = [t for t in tags if t in ARCHS]
        if "uninstallable" in tags or (arch and archs and arch not in archs) or (not cpu and "cpu" in tags):
            left.append(e["session"])
            continue
        keep.append(HostSession(e["session"], group_of(e["session"], tags)))
    return keep, left


def slots_for(todo: Sequence[HostSession], gpus: Sequence[str], per_gpu: int = 1) -> list[str]:
    """The GPU of each slot (a slot runs one session at a time): each GPU `per_gpu` times, the GPUs taken in turn
    (0, 1, 0, 1, ...), so that fewer sessions than slots spread over every GPU; no more slots than groups (a slot
    whose every candidate belongs to a running group would wait idle, holding a share of the cores)."""
    slots = [g for _ in range(per_gpu) for g in gpus]
    return slots[:max(1, min(len(slots), len({s.group for s in todo})))]


def shared(slots: Sequence[str]) -> set[str]:
    """The GPUs that more than one slot runs on."""
    return {g for g in slots if slots.count(g) > 1}


def plan(todo: Sequence[HostSession], gpus: Sequence[str], per_gpu: int = 1) -> list[tuple[str, HostSession]]:
    """(gpu, session) in the order `run` would start them if every session took as long: each round, each GPU in
    turn takes the first session whose group is not running. Real durations differ, so which GPU runs which
    session may too; the order of the queue and the groups' one-at-a-time hold."""
    slots, todo, order = slots_for(todo, gpus, per_gpu), list(todo), []
    while todo:
        running: set[str] = set()
        for gpu in slots:
            ready = next((s for s in todo if s.group not in running), None)
            if ready is None:
                break
            todo.remove(ready)
            running.add(ready.group)
            order.append((gpu, ready))
    return order


def nox_command(nox: Sequence[str], posargs: Sequence[str]) -> Callable[[HostSession, int, bool], list[str]]:
    """A session's command: nox -s NAME -- --cores N [--no-mps, on a shared GPU] POSARGS."""
    off = not mps_requested(posargs)
    return lambda s, cores, shared: [*nox, "-s", s.name, "--", "--cores", str(cores),
                                     *(["--no-mps"] * (shared and not off)), *posargs]


class _Queue:
    """The sessions not started yet; a slot takes the first whose group is not running."""

    def __init__(self, todo: list[HostSession]):
        self.todo, self.running = list(todo), set()
        self.cond = threading.Condition()

    def take(self) -> HostSession | None:
        with self.cond:
            while self.todo:
                ready = next((s for s in self.todo if s.group not in self.running), None)
                if ready is not None:
                    self.todo.remove(ready)
                    self.running.add(ready.group)
                    return ready
                self.cond.wait()  # every waiting session's group is running: one ends, then look again
            return None

    def done(self, session: HostSession) -> None:
        with self.cond:
            self.running.discard(session.group)
            self.cond.notify_all()


def _status(results: Path, run: SessionRun) -> tuple[str, str | None]:
    """session.json's status and reason when this run wrote it; else what the exit status says."""
    path = results / run.session / "session.json"
    try:
        if path.stat().st_mtime >= run.started - 1:
            data = json.loads(path.read_text())
            return str(data.get("status")), data.get("reason")
    except (OSError, ValueError):
        pass
    return ("ok" if run.rc == 0 else f"exit {run.rc}"), None


def _base_env(config: HostConfig, gpu: str) -> dict[str, str]:
    return dict(config.env if config.env is not None else os.environ) | {"CUDA_VISIBLE_DEVICES": gpu}


def start_mps(config: HostConfig, gpus: set[str]) -> dict[str, tuple[dict, dict[str, str]]]:
    """One MPS daemon per GPU that several sessions share: {gpu: (state, the environment its clients need)}."""
    daemons = {}
    for gpu in sorted(gpus):
        state, env = mps.start(environ=_base_env(config, gpu))
        if state.get("own"):
            env[mps.OWNER_ENV] = f"the host runner's daemon for GPU {gpu} (sweep run)"
        daemons[gpu] = (state, env)
    return daemons


def stop_mps(config: HostConfig, daemons: dict[str, tuple[dict, dict[str, str]]]) -> None:
    for gpu, (state, env) in daemons.items():
        mps.stop(state, env, environ=_base_env(config, gpu))


def mps_requested(posargs: Sequence[str]) -> bool:
    """Whether the sessions' arguments ask for CUDA MPS (`--mps`, and no `--no-mps`)."""
    return "--mps" in posargs and "--no-mps" not in posargs


def uses_runner_mps(config: HostConfig, session: HostSession) -> bool:
    """Whether a session on a shared GPU joins the runner's daemon there: reference sessions do; benchmarks time
    kernels alone, and a jit- session builds."""
    return config.mps and session.name.startswith("references")


def _client_env(daemon: tuple[dict, dict[str, str]] | None) -> dict[str, str] | None:
    """What a session needs to use the runner's daemon; None where there is none (it could not start)."""
    return daemon[1] if daemon is not None and daemon[0].get("own") else None


def _slot(gpu: str, shared_gpu: bool, queue: _Queue, config: HostConfig, cores: int, runs: list[SessionRun],
          lock: threading.Lock, on_end: Callable[[SessionRun], None] | None, daemon: dict[str, str] | None) -> None:
    while (s := queue.take()) is not None:
        run = SessionRun(s.name, gpu, cores, log=str(config.log_dir / f"{s.name}.log"))
        env = _base_env(config, gpu) | {"MAX_JOBS": str(cores)}
        uses = daemon is not None and uses_runner_mps(config, s)
        if uses:
            env |= daemon
        run.started = time.time()
        try:
            with open(run.log, "wb") as log:
                run.rc = subprocess.run(config.command(s, cores, shared_gpu and not uses), stdout=log,
                                        stderr=subprocess.STDOUT, env=env, cwd=config.cwd).returncode
        except OSError as e:  # the command could not start: this session's failure, not the host's
            run.rc, run.reason = 127, f"{type(e).__name__}: {e}"
        run.finished = time.time()
        run.wall_seconds = round(run.finished - run.started, 1)
        run.status, reason = _status(config.results, run)
        run.reason = run.reason or reason
        queue.done(s)
        with lock:
            runs.append(run)
        if on_end:
            on_end(run)


def run(todo: list[HostSession], config: HostConfig, on_end: Callable[[SessionRun], None] | None = None) -> dict:
    """Run every session, `config.per_gpu` per GPU at a time; the summary (also written to log_dir/summary.json)."""
    config.log_dir.mkdir(parents=True, exist_ok=True)
    slots = slots_for(todo, config.gpus, config.per_gpu)
    on_shared = shared(slots)
    cores = max(1, config.cores // len(slots))
    queue, runs, lock = _Queue(todo), [], threading.Lock()
    t0 = time.time()
    daemons = start_mps(config, on_shared) if config.mps else {}
    try:
        threads = [threading.Thread(target=_slot, args=(g, g in on_shared, queue, config, cores, runs, lock, on_end,
                                                        _client_env(daemons.get(g))), daemon=True) for g in slots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        stop_mps(config, daemons)
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.status or "?"] = counts.get(r.status or "?", 0) + 1
    summary = {"gpus": slots, "per_gpu": config.per_gpu, "cores": config.cores, "cores_per_session": cores,
               "started": t0,
               "wall_seconds": round(time.time() - t0, 1),
               "session_seconds": round(sum(r.wall_seconds for r in runs), 1),
               "counts": counts, "failed": sorted(r.session for r in runs if r.rc != 0),
               "mps": {g: state for g, (state, _) in daemons.items()},
               "sessions": [asdict(r) for r in sorted(runs, key=lambda r: r.started)]}
    (config.log_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary

"""`flashinfer-trace matrix build RESULTS... -o OUT`: session results -> one matrix.

A pipeline of plain functions, each taking the previous result:

    discover(paths)            -> session folders, and problems (a folder without a readable session)
    read_session(folder)       -> SessionData, or a problem: a corrupt or missing file never
                                  stops the build; it is reported and its environment shown as such
    environments(sessions)     -> one environment per (combination, arch): references and bench
                                  sessions of the same environment merge (statuses + timings)
    cells(environments)        -> one cell per (definition, environment); FlashInfer's own definitions
                                  (records of definition_set fi_trace) are rows of their own, `fi_trace/<name>`,
                                  grouped apart from ours (`group`: `fi_trace/<op_type>`)
    assemble(...)              -> the matrix.json dict (schema_version 1)

Imports nothing heavy (no torch): `nox -s matrix` runs it with the standard library, packaging and pydantic
(the records' model).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..results.record import CaseRecord, parse
from ..status import MEANING, SYMBOL, WORST_FIRST, CellState, Status, cell_state
from ..sweep.manifest import sandbox_label
from ..sweep.results import RAN, read_jsonl, read_latest
from . import drift_view

SCHEMA_VERSION = 1
STATES = {state.value: text for state, text in MEANING.items()}
SYMBOLS = {state.value: symbol for state, symbol in SYMBOL.items()}
BAD = tuple(s.value for s in WORST_FIRST)
INFO = CellState.INFO.value  # differs where the API promises nothing (verdict/contract.py): apart from both
KERNEL_SOURCES = ("flashinfer", "sglang")
TIMING_FIELDS = ("median_us", "q1_us", "q3_us", "iqr_us", "timer", "l2_flushed", "gb_per_s", "tflop_per_s",
                 "pct_of_peak_bandwidth", "pct_of_peak_flops", "includes_setup")


@dataclass
class SessionData:
    folder: Path
    session: dict[str, Any]
    manifest: dict[str, Any] = field(default_factory=dict)
    tests: list[CaseRecord] | None = None
    benchmarks: list[dict[str, Any]] = field(default_factory=list)
    builds: list[dict[str, Any]] = field(default_factory=list)  # jit.jsonl: the prebuild's records, one per job


@dataclass
class Environment:
    id: str
    combination: str
    arch: str
    sessions: list[SessionData] = field(default_factory=list)


# -- discover / read --------------------------------------------------------------------------------
def discover(paths: list[str | Path]) -> tuple[list[Path], list[dict[str, str]]]:
    """Session folders under the given paths (a folder with any result file is one)."""
    found: list[Path] = []
    problems: list[dict[str, str]] = []
    for p in map(Path, paths):
        if not p.exists():
            problems.append({"path": str(p), "problem": "missing: no such file or folder"})
            continue
        candidates = [p] if _is_session(p) else sorted(d for d in p.iterdir() if d.is_dir() and _is_session(d))
        if not candidates:
            problems.append({"path": str(p), "problem": "no session results (session.json / tests.json) found"})
        found += candidates
    return found, problems


def _is_session(folder: Path) -> bool:
    return any((folder / f).exists() for f in ("session.json", "tests.json", "env.json"))


def _load_json(path: Path, problems: list[dict[str, str]], required: bool) -> Any:
    """`path`, or `path`.gz where a committed snapshot keeps its large files compressed."""
    packed = path.with_name(path.name + ".gz")
    if not path.exists() and packed.exists():
        path = packed
    if not path.exists():
        if required:
            problems.append({"path": str(path), "problem": "missing"})
        return None
    try:
        if path.suffix == ".gz":
            import gzip

            return json.loads(gzip.decompress(path.read_bytes()))
        return json.loads(path.read_text())
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        problems.append({"path": str(path), "problem": f"corrupt: {e}"})
        return None


def read_session(folder: Path, problems: list[dict[str, str]]) -> SessionData | None:
    session = _load_json(folder / "session.json", problems, required=True)
    if not isinstance(session, dict) or "combination" not in session:
        if session is not None:
            problems.append({"path": str(folder / "session.json"), "problem": "corrupt: no combination field"})
        return SessionData(folder, {"session": folder.name, "combination": folder.name, "status": "corrupt",
                                    "reason": "session.json missing or unreadable"})
    manifest = _load_json(folder / "env.json", problems, required=False) or {}
    streamed = (folder / "tests.jsonl").is_file()
    runs_tests = not str(session.get("session", "")).startswith("jit")  # a jit session only builds
    tests_doc = _load_json(folder / "tests.json", problems,
                           required=session.get("status") in RAN and not streamed and runs_tests)
    tests = None
    if isinstance(tests_doc, dict) and isinstance(tests_doc.get("tests"), list):
        tests = _records(tests_doc["tests"], folder / "tests.json", problems)
    elif tests_doc is not None:
        problems.append({"path": str(folder / "tests.json"), "problem": "corrupt: no tests list"})
    if tests is None and streamed:  # a session killed before it wrote tests.json: what it streamed
        tests = read_latest(folder / "tests.jsonl", parse, lambda r: r.nodeid or r.key)  # a bad line is skipped
        if session.get("status") == "running":
            session = {**session, "status": "interrupted",
                       "reason": f"the session stopped while running; {len(tests)} streamed test record(s)"}
    if tests is None and session.get("status") in RAN and runs_tests:
        session = {**session, "status": "corrupt", "reason": "tests.json missing or unreadable"}
    bench = _load_json(folder / "benchmark.json", problems, required=False)
    benchmarks = bench.get("benchmarks", []) if isinstance(bench, dict) else []
    streamed_bench = read_jsonl(folder / "benchmark.jsonl")  # every child's, as each finished
    if streamed_bench:
        seen = {b.get("fullname") for b in streamed_bench}
        benchmarks = streamed_bench + [b for b in benchmarks if isinstance(b, dict) and b.get("fullname") not in seen]
    builds = [b for b in read_jsonl(folder / "jit.jsonl") if isinstance(b, dict)]
    return SessionData(folder, session, manifest if isinstance(manifest, dict) else {}, tests, benchmarks, builds)


def _records(items: list, path: Path, problems: list[dict[str, str]]) -> list[CaseRecord]:
    """The case records of a tests.json of any schema version; one that does not parse is a problem."""
    out = []
    for i, item in enumerate(items):
        try:
            out.append(parse(item))
        except (TypeError, KeyError, ValueError) as e:
            why = " ".join(str(e).split())[:200]
            problems.append({"path": str(path), "problem": f"test {i}: not a case record: {why}"})
    return out


# -- environments -----------------------------------------------------------------------------------
def environment_key(s: SessionData) -> tuple[str, str]:
    arch = s.session.get("arch") or _manifest_arch(s.manifest) or "any"
    return s.session.get("combination", s.folder.name), arch


def _manifest_arch(manifest: dict) -> str | None:
    devices = (manifest.get("torch") or {}).get("devices") or []
    if devices and devices[0].get("compute_capability"):
        major, _, minor = devices[0]["compute_capability"].partition(".")
        return f"sm{major}{minor}"
    return None


def environments(sessions: list[SessionData]) -> list[Environment]:
    envs: dict[tuple[str, str], Environment] = {}
    for s in sessions:
        combo, arch = environment_key(s)
        env = envs.setdefault((combo, arch), Environment(f"{combo}@{arch}", combo, arch))
        env.sessions.append(s)
    for env in envs.values():  # the latest reference session decides; ties keep discovery order
        env.sessions.sort(key=lambda s: str(s.session.get("finished") or ""), reverse=True)
    return sorted(envs.values(), key=lambda e: version_order(e.id))


def version_order(text: str) -> tuple:
    """A sort key that reads the numbers in an id as numbers: the torch axis' columns go cpu-torch2.8, 2.9,
    2.10 .. 2.15 (and fi0.6.6 before fi0.6.14), where plain string order would put 2.10 before 2.8. A post
    release follows its release (fi0.7.2 before fi0.7.2.post1) and a pre-release precedes it (fi0.7.0rc1 before
    fi0.7.0): `.post` sorts after any other text, `rc` / `a` / `b` / `.dev` before it."""
    def key(part: str) -> tuple:
        if part.isdigit():
            return (0, int(part), "")
        return (1, 1 if part == ".post" else -1 if part in ("rc", "a", "b", ".dev") else 0, part)

    return tuple(key(part) for part in re.split(r"(\d+)", text) if part)


def _references(env: Environment) -> SessionData | None:
    refs = [s for s in env.sessions if not s.session.get("session", "").startswith(("bench", "jit"))]
    return refs[0] if refs else None


def environment_status(env: Environment) -> tuple[str, str | None]:
    ref = _references(env) or env.sessions[0]
    return ref.session.get("status", "corrupt"), ref.session.get("reason")


def _combination_file(path: str | None) -> dict[str, Any]:
    """The combination's metadata from its constraints file, for sessions that wrote no manifest
    (an install that failed, a known-uninstallable combination)."""
    from ..sweep.combos import CombinationError, load_combination

    try:
        return load_combination(path).metadata() if path else {}
    except (OSError, CombinationError):
        return {}


def _manifest_and_combination(env: Environment) -> tuple[dict[str, Any], dict[str, Any]]:
    """The environment's manifest and its combination (from the manifest, or the constraints file it names)."""
    ref = _references(env) or env.sessions[0]
    manifest = ref.manifest or next((s.manifest for s in env.sessions if s.manifest), {})
    return manifest, manifest.get("combination") or _combination_file(ref.session.get("constraints_file"))


def environment_pins(env: Environment) -> dict[str, Any]:
    """The combination's pins: torch, flashinfer-python, sglang, ..."""
    return _manifest_and_combination(env)[1].get("pins") or {}


def environment_record(env: Environment) -> dict[str, Any]:
    status, reason = environment_status(env)
    ref = _references(env) or env.sessions[0]
    manifest, combo = _manifest_and_combination(env)
    pins = combo.get("pins") or {}
    devices = (manifest.get("torch") or {}).get("devices") or []
    cuda = combo.get("cuda")
    label = [f"CUDA {cuda}" if cuda and cuda != "none" else ("CPU" if cuda == "none" else env.combination),
             f"torch {pins['torch']}" if pins.get("torch") else None,
             f"flashinfer {pins['flashinfer-python']}" if pins.get("flashinfer-python") else
             ("no flashinfer" if pins else None),
             f"sglang {pins['sglang']}" if pins.get("sglang") else None,
             env.arch if env.arch not in ("cpu", "any") else None]
    return {"id": env.id, "combination": env.combination, "arch": env.arch,
            "label": " / ".join(p for p in label if p), "cuda": cuda, "torch": pins.get("torch"),
            "flashinfer": pins.get("flashinfer-python"), "sglang": pins.get("sglang"),
            "gpu": devices[0]["name"] if devices else None, "status": status, "reason": reason,
            "sessions": [s.session.get("session", s.folder.name) for s in env.sessions],
            "sandbox": sandbox_label(manifest), "jit": jit_summary(env), "fi_trace": ref.session.get("fi_trace"),
            "finished": ref.session.get("finished"), "manifest": manifest}


def jit_summary(env: Environment) -> dict[str, Any] | None:
    """The environment's JIT prebuild that compiled the most (a jit session's, typically: the sessions of a
    combination share one cache, so the references session after it finds everything cached), and every
    module's build time from the sessions' jit.jsonl: what a cold machine pays for this release."""
    found = [s for s in env.sessions if isinstance(s.session.get("jit"), dict)
             and isinstance(s.session["jit"].get("counts"), dict)]
    if not found:
        return None
    s = max(found, key=lambda s: s.session["jit"]["counts"].get("built", 0))  # max keeps the first of a tie
    jit = s.session["jit"]
    return {"session": s.session.get("session"), "counts": jit["counts"],
            "wall_seconds": jit.get("wall_seconds"), "modules_built": len(jit.get("modules_built") or []),
            "slowest": (jit.get("slowest") or [])[:5], "compiled_during_tests": jit.get("compiled_during_tests"),
            "modules": module_builds(env.sessions)}


def module_builds(sessions: list[SessionData]) -> list[dict[str, Any]]:
    """Each module a prebuild compiled: its seconds (wall, under that run's load), the job that built it."""
    best: dict[str, dict[str, Any]] = {}
    for s in sessions:
        for b in s.builds:
            if b.get("status") != "built" or not isinstance(b.get("seconds"), (int, float)):
                continue
            for m in b.get("modules") or []:
                if isinstance(m, str) and m not in best:
                    best[m] = {"module": m, "seconds": round(float(b["seconds"]), 1), "definition": b.get("definition"),
                               "session": s.session.get("session")}
    return sorted(best.values(), key=lambda r: -r["seconds"])


def fi_trace_label(note: dict[str, Any] | None) -> str:
    """The environment's fi_trace step in a few words: what it imported from which FlashInfer, or why not."""
    if not isinstance(note, dict):
        return "not recorded"
    if note.get("status") == "pass":
        return (f"{note.get('count')} definition(s) of flashinfer {note.get('flashinfer')}"
                + (f", {note['not_emitted']} template(s) not emitted" if note.get("not_emitted") else ""))
    return f"{note.get('status')}" + (f": {note['kind']}" if note.get("kind") else "")


def jit_label(jit: dict[str, Any] | None) -> str:
    if not jit:
        return "none"
    counts = ", ".join(f"{k} {v}" for k, v in sorted(jit["counts"].items()))
    late = jit.get("compiled_during_tests")
    return f"{counts} in {jit.get('wall_seconds')} s" + (f"; {len(late)} compiled during tests" if late else "")


# -- cells ------------------------------------------------------------------------------------------
def test_state(record: CaseRecord) -> str:
    return cell_state(record.status, record.kind).value


def _summarise(states: list[str], reasons: list[str | None]) -> tuple[str, str | None]:
    """The state of a group of tests: the worst failure, else info (a difference where the API promises nothing:
    not red, and no pass either), else pass, else xfail, else the commonest skip."""
    for bad in (*BAD, INFO):
        if bad in states:
            return bad, next((r for s, r in zip(states, reasons, strict=True) if s == bad and r), None)
    if "pass" in states:
        return "pass", None
    if "xfail" in states:
        return "xfail", next((r for s, r in zip(states, reasons, strict=True) if s == "xfail" and r), None)
    if not states:
        return "not-run", None
    state = Counter(states).most_common(1)[0][0]
    return state, next((r for s, r in zip(states, reasons, strict=True) if s == state and r), None)


def cell(definition: str, env: Environment, tests: list[CaseRecord], issues: list | None = None) -> dict[str, Any]:
    by_source: dict[str, list[CaseRecord]] = {}
    checks: list[CaseRecord] = []
    tolerance = next((t.tolerance for t in tests if t.tolerance), None)
    for t in tests:
        if t.source:
            by_source.setdefault(t.source, []).append(t)
        else:
            checks.append(t)
    sources = {}
    for src, group in sorted(by_source.items()):
        states = [test_state(t) for t in group]
        state, reason = _summarise(states, [t.detail for t in group])
        apis = sorted({t.ground_truth.api for t in group if t.ground_truth} - {None})
        sources[src] = {"state": state, "counts": dict(Counter(t.status.value for t in group)), "reason": reason,
                        "api": apis[0] if len(apis) == 1 else apis or None}  # which kernel path ran
        why = {t.kind for t in group if t.status is Status.NOT_RUN}
        if state == "not-run" and len(why) == 1 and None not in why:  # why not run (building: a jit- session's)
            sources[src]["kind"] = next(iter(why)).value
        used = tolerance_used(group)
        if used is not None:
            sources[src]["tolerance_used"] = used
        over = passed_over(group)
        if over:
            sources[src]["passed_over"] = over
        by_path = path_states(group)
        if by_path:
            sources[src]["paths"] = by_path
    sources.update(not_run_by_known_issue(definition, env, sources, issues or []))
    all_states = [test_state(t) for t in tests]
    worst = next((b for b in BAD if b in all_states), None)
    kind = None
    if worst:
        state = worst
        reason = next((t.detail for t in tests if test_state(t) == worst and t.detail), None)
    else:  # the kernels decide: a pass of FlashInfer or SGLang, else why none ran (FlashInfer first)
        kernel = [sources[s] for s in KERNEL_SOURCES if s in sources]
        if any(k["state"] == INFO for k in kernel):
            state, reason = INFO, next(k["reason"] for k in kernel if k["state"] == INFO)
        elif any(k["state"] == "pass" for k in kernel):
            state, reason = "pass", None
        elif any(k["state"] == "xfail" for k in kernel):
            state, reason = "xfail", next(k["reason"] for k in kernel if k["state"] == "xfail")
        elif any(k["state"] == "not-run" for k in kernel):  # left out on purpose: that, not another's skip
            first = next(k for k in kernel if k["state"] == "not-run")
            state, reason, kind = "not-run", first["reason"], first.get("kind")
        elif kernel:
            state, reason = kernel[0]["state"], kernel[0]["reason"]
        else:
            state, reason = _summarise(all_states, [t.detail for t in tests])
    return {"definition": definition, "environment": env.id, "state": state, "reason": reason, "sources": sources,
            "checks": dict(Counter(t.status.value for t in checks)), "tolerance": tolerance,
            "timing": timing(definition, env), "tests": len(tests), **({"kind": kind} if kind else {})}


def not_run_by_known_issue(definition: str, env: Environment, sources: dict[str, Any], issues: list
                           ) -> dict[str, dict[str, Any]]:
    """A kernel source with no record where a `run = false` known issue covers it: the session left those tests
    out on purpose (FlashInfer's fp8 MoE on sm90: a 41-minute module), and the cell says so instead of
    letting another source's skip stand for it. Nothing is invented for a source that has records."""
    from .known_issues import pinned_versions

    left_out = [i for i in issues if not i.run]
    if not left_out:
        return {}
    versions = pinned_versions({n for i in left_out for n in i.packages}, environment_pins(env))
    out: dict[str, dict[str, Any]] = {}
    for issue in left_out:
        for src in issue.sources or KERNEL_SOURCES:
            if src not in sources and src not in out and issue.applies(definition, src, versions, env.arch):
                out[src] = {"state": "not-run", "counts": {}, "reason": f"not run: {issue.describe()}", "api": None}
    return out


def path_states(tests: list[CaseRecord]) -> dict[str, dict[str, Any]]:
    """Each path of a source checked (its plain call "plain", tensor cores, fa3, plan reuse, CUDA graph) with its
    state: which were checked and which failed. Empty when the source has only its plain path."""
    groups: dict[str, list[CaseRecord]] = {}
    for t in tests:
        groups.setdefault(t.path or "plain", []).append(t)
    if list(groups) == ["plain"]:
        return {}
    out = {}
    for name, group in groups.items():
        state, reason = _summarise([test_state(t) for t in group], [t.detail for t in group])
        out[name] = {"state": state, "counts": dict(Counter(t.status.value for t in group)), "reason": reason}
    return out


def passed_over(tests: list[CaseRecord]) -> list[dict[str, str]]:
    """The kernel paths the source tried first and could not run here (trtllm-gen's fp8 MoE on sm90), from
    the ground truth each test recorded: a pass of the path that ran must not hide the gate of the other."""
    seen = {}
    for t in tests:
        for p in t.ground_truth.passed_over if t.ground_truth else ():
            seen.setdefault(p.api, p.reason)
    return [{"api": api, "reason": reason} for api, reason in sorted(seen.items())]


def tolerance_used(tests: list[CaseRecord]) -> float | None:
    """The closest a passing comparison came to its tolerance (the largest `compared` margin, <= 1): how
    loose the tolerance is for this kernel, which a pass alone does not say."""
    used = [t.tolerance_used for t in tests if t.status is Status.PASS]
    finite = [u for u in used if u is not None and math.isfinite(u)]
    return round(max(finite), 4) if finite else None


def timing(definition: str, env: Environment) -> dict[str, Any] | None:
    """The bench session's device time for this definition: FlashInfer's, else SGLang's, else torch's."""
    found: dict[str, dict[str, Any]] = {}
    for s in env.sessions:
        for b in s.benchmarks:
            info = b.get("extra_info") or {}
            if info.get("definition") == definition and info.get("median_us") is not None:
                found.setdefault(info.get("source", "?"), {**{k: info.get(k) for k in TIMING_FIELDS},
                                                           "source": info.get("source"), "size": info.get("size"),
                                                           "session": s.session.get("session")})
    for src in (*KERNEL_SOURCES, "torch"):
        if src in found:
            return found[src]
    return next(iter(found.values()), None)


def environment_cells(env: Environment, definitions: list[str], issues: list | None = None) -> list[dict[str, Any]]:
    status, reason = environment_status(env)
    if status in ("install-failed", "uninstallable", "arch-mismatch", "no-gpu", "corrupt"):
        state = {"install-failed": "install-failed", "uninstallable": "install-failed",
                 "arch-mismatch": "skip:arch", "no-gpu": "skip:other", "corrupt": "error"}[status]
        return [{"definition": d, "environment": env.id, "state": state, "reason": reason or status, "sources": {},
                 "checks": {}, "tolerance": None, "timing": None, "tests": 0} for d in definitions]
    ref = _references(env)
    grouped: dict[str, list[CaseRecord]] = {}
    for t in (ref.tests or []) if ref else []:
        if t.definition:  # FlashInfer's own `rmsnorm_h4096` is not ours: `fi_trace/rmsnorm_h4096`
            grouped.setdefault(t.qualified, []).append(t)
    out = [cell(d, env, grouped[d], issues) for d in definitions if d in grouped]
    for d in definitions:  # benchmarks without reference results still show their timing
        if d not in grouped and timing(d, env):
            out.append({"definition": d, "environment": env.id, "state": "not-run", "reason": None, "sources": {},
                        "checks": {}, "tolerance": None, "timing": timing(d, env), "tests": 0})
    return out


# -- assemble ---------------------------------------------------------------------------------------
def definition_records(sessions: list[SessionData], definitions_dir: Path | None) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for s in sessions:
        for t in s.tests or []:
            if t.definition and t.qualified not in seen:
                seen[t.qualified] = {"name": t.qualified, "op_type": t.op_type, "models": [],
                                     **({"set": t.definition_set, "definition": t.definition,
                                         "group": f"{t.definition_set}/{t.op_type or 'unknown'}"}
                                        if t.definition_set else {})}
        for b in s.benchmarks:
            info = b.get("extra_info") or {}
            d = info.get("definition")
            if d and d not in seen:
                seen[d] = {"name": d, "op_type": info.get("op_type"), "models": []}
    if definitions_dir and definitions_dir.is_dir():
        for path in definitions_dir.rglob("*.json"):
            if path.stem in seen:
                try:
                    data = json.loads(path.read_text())
                except (OSError, json.JSONDecodeError):
                    continue
                tags = [t for t in data.get("tags", []) if isinstance(t, str)]
                seen[path.stem].update(op_type=data.get("op_type") or seen[path.stem]["op_type"],
                                       models=[t.removeprefix("model:") for t in tags if t.startswith("model:")])
    # ours first, by op type; then each other set's, by op type
    return sorted(seen.values(), key=lambda d: (d.get("set") or "", d["op_type"] or "", d["name"]))


def not_run(combinations: list | None, envs: list[Environment], note: str | list[str] | None
            ) -> list[dict[str, Any]]:
    """The combinations of constraints/ with no session in these inputs: the matrix says which it lacks and
    why, rather than leaving them out unseen. Each note is `PREFIX=why` (combinations whose id starts with
    PREFIX: a CUDA 12 one has no node, a torch 2.14 one no such torch) or a bare `why` for the rest."""
    notes = [note] if isinstance(note, str) else list(note or [])
    by_prefix = [n.partition("=")[::2] for n in notes if "=" in n.split(" ", 1)[0]]
    rest = next((n for n in notes if "=" not in n.split(" ", 1)[0]), None)

    def why(combo_id: str) -> str | None:
        return next((w for prefix, w in by_prefix if combo_id.startswith(prefix)), rest)

    ran = {e.combination for e in envs}
    return [{"combination": c.id, "label": c.label, "cuda": c.cuda, "archs": list(c.archs),
             "reason": "no session results in these inputs" + (f": {w}" if (w := why(c.id)) else "")}
            for c in combinations or [] if c.id not in ran]


def build(paths: list[str | Path], *, definitions_dir: str | Path | None = None, combinations: list | None = None,
          not_run_note: str | list[str] | None = None, known_issues: list | None = None) -> dict[str, Any]:
    folders, problems = discover(paths)
    sessions = [s for s in (read_session(f, problems) for f in folders) if s is not None]
    envs = environments(sessions)
    defs = definition_records(sessions, Path(definitions_dir) if definitions_dir else None)
    names = [d["name"] for d in defs]
    cells = [c for env in envs for c in environment_cells(env, names, known_issues)]
    drift, drift_problems = drift_view.load(paths)  # results/**/drift-*.json (flashinfer-trace drift)
    problems += drift_problems
    drift_view.attach(defs, drift)
    return {"schema_version": SCHEMA_VERSION, "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "inputs": [str(p) for p in paths], "problems": problems, "states": STATES, "symbols": SYMBOLS,
            "environments": [environment_record(e) for e in envs], "definitions": defs, "cells": cells,
            "not_run": not_run(combinations, envs, not_run_note),
            "summary": dict(Counter(c["state"] for c in cells)),
            "drift": [{k: v for k, v in r.items() if k != "definitions"} for r in drift]}

"""`flashinfer-trace matrix diff OLD NEW [--envs A B]`: what changed between two matrix.json files, or
between two environments' columns (two releases: `--envs` with the same file twice).

Status: a cell that was fine (pass, xfail, a skip) and is now broken (fail, error, timeout,
install-failed) is a regression, and so is a new cell that is broken (but a new definition's
install-failed cell in an environment that was install-failed before: that is no change); cells that appeared or
vanished, and known issues now passing (xpass), are listed. Performance: the same definition,
environment, source, timer and size in both, and the new quartile range wholly above the old one
by more than three times the larger recorded spread. The spread is the IQR each run recorded,
floored at 1% of the old median: a graph timer's IQR can be 0.01 us, far below the clock-to-clock
drift between two nightly runs, and a floor keeps that drift from reading as a regression.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ..escape import for_markdown

BROKEN = ("fail", "flaky-wrong", "mutates-inputs", "error", "timeout", "install-failed")
SPREAD_FACTOR = 3.0
SPREAD_FLOOR = 0.01


@dataclass
class MatrixDiff:
    regressions: list[dict[str, Any]] = field(default_factory=list)
    fixed: list[dict[str, Any]] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)
    new: list[dict[str, Any]] = field(default_factory=list)
    vanished: list[dict[str, Any]] = field(default_factory=list)
    slower: list[dict[str, Any]] = field(default_factory=list)
    faster: list[dict[str, Any]] = field(default_factory=list)
    timed: list[dict[str, Any]] = field(default_factory=list)  # a timing where the old matrix had none
    untimed: list[dict[str, Any]] = field(default_factory=list)  # a timing the new matrix lost
    # the `flashinfer-trace bisect` command of each wrong-result regression between two releases of one package
    bisect: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return bool(self.regressions or self.slower)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "regressed": self.regressed}


def _cells(matrix: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["definition"], c["environment"]): c for c in matrix.get("cells", [])}


def perf_change(old: dict[str, Any] | None, new: dict[str, Any] | None) -> dict[str, Any] | None:
    if not old or not new:
        return None
    if any(old.get(k) != new.get(k) for k in ("timer", "source", "size")):
        return None  # not like for like
    try:
        o_med, n_med = float(old["median_us"]), float(new["median_us"])
        o_q1, o_q3, n_q1, n_q3 = (float(old["q1_us"]), float(old["q3_us"]), float(new["q1_us"]), float(new["q3_us"]))
    except (KeyError, TypeError, ValueError):
        return None
    spread = max(o_q3 - o_q1, n_q3 - n_q1, SPREAD_FLOOR * o_med)
    delta = n_med - o_med
    if n_q1 > o_q3 and delta > SPREAD_FACTOR * spread:
        kind = "slower"
    elif o_q1 > n_q3 and -delta > SPREAD_FACTOR * spread:
        kind = "faster"
    else:
        return None
    return {"kind": kind, "old_median_us": o_med, "new_median_us": n_med, "ratio": n_med / o_med if o_med else None,
            "spread_us": spread, "timer": new.get("timer"), "source": new.get("source")}


def diff_matrices(old: dict[str, Any], new: dict[str, Any]) -> MatrixDiff:
    out = MatrixDiff()
    for m, name in ((old, "old"), (new, "new")):
        if m.get("schema_version") != 1:
            out.problems.append(f"{name} matrix has schema_version {m.get('schema_version')!r}, expected 1")
    a, b = _cells(old), _cells(new)
    uninstallable = {e.get("id") for e in old.get("environments") or [] if e.get("status") == "install-failed"}
    for key in sorted(a.keys() | b.keys()):
        o, n = a.get(key), b.get(key)
        base = {"definition": key[0], "environment": key[1]}
        if o is None:
            out.new.append({**base, "state": n["state"]})
            if n["state"] in BROKEN and not (n["state"] == "install-failed" and key[1] in uninstallable):
                out.regressions.append({**base, "old": None, "new": n["state"], "reason": n.get("reason")})
            continue
        if n is None:
            out.vanished.append({**base, "state": o["state"]})
            continue
        if o["state"] != n["state"]:
            entry = {**base, "old": o["state"], "new": n["state"], "reason": n.get("reason")}
            if n["state"] in BROKEN and o["state"] not in BROKEN:
                out.regressions.append(entry)
            elif o["state"] in BROKEN and n["state"] not in BROKEN or n["state"] == "xpass":
                out.fixed.append(entry)
            else:
                out.changed.append(entry)
        ot, nt = o.get("timing"), n.get("timing")
        if nt and not ot:
            out.timed.append({**base, "timer": nt.get("timer"), "source": nt.get("source")})
        elif ot and not nt:
            out.untimed.append({**base, "timer": ot.get("timer"), "source": ot.get("source")})
        change = perf_change(ot, nt)
        if change:
            (out.slower if change["kind"] == "slower" else out.faster).append({**base, **change})
    return out


def resolve_environment(matrix: dict[str, Any], environment: str) -> str:
    """An environment id of `matrix`: the exact id, or the one id that starts with `environment`."""
    ids = [e.get("id") for e in matrix.get("environments") or [] if e.get("id")]
    found = [i for i in ids if i == environment] or [i for i in ids if i.startswith(environment)]
    if len(found) != 1:
        raise ValueError(f"environment {environment!r}: {'matches ' + ', '.join(found) if found else 'not found'}"
                         f" (environments: {', '.join(ids)})")
    return found[0]


def environment_column(matrix: dict[str, Any], environment: str, label: str) -> dict[str, Any]:
    """One environment's cells as a matrix of their own under `label`, so two releases' columns diff like
    two runs: a pass turned fail, an API that appeared or vanished (a skip turned pass, or back), a speed
    change beyond the recorded spread (like for like: the same timer, source and size)."""
    env_id = resolve_environment(matrix, environment)
    env = next(e for e in matrix["environments"] if e.get("id") == env_id)
    return {"schema_version": matrix.get("schema_version"), "environments": [{**env, "id": label}],
            "cells": [{**c, "environment": label} for c in matrix.get("cells", []) if c["environment"] == env_id]}


def diff_environments(old: dict[str, Any], new: dict[str, Any], env_old: str, env_new: str) -> MatrixDiff:
    """`env_old`'s column of `old` against `env_new`'s of `new` (one file twice: two releases of one snapshot)."""
    label = f"{resolve_environment(old, env_old)} -> {resolve_environment(new, env_new)}"
    return diff_matrices(environment_column(old, env_old, label), environment_column(new, env_new, label))


# what bisect can search: the packages whose releases it installs one by one, and the states it looks for
BISECTABLE = ("flashinfer-python", "sglang")
BISECT_STATES = ("fail", "flaky-wrong")


def environment_record(matrix: dict[str, Any], environment: str) -> dict[str, Any]:
    env_id = resolve_environment(matrix, environment)
    return next(e for e in matrix["environments"] if e.get("id") == env_id)


def environment_pins(matrix: dict[str, Any], environment: str) -> dict[str, str]:
    """An environment's pins: its manifest's combination, else the versions its record names."""
    env = environment_record(matrix, environment)
    pins = ((env.get("manifest") or {}).get("combination") or {}).get("pins") or {
        name: env.get(key) for name, key in (("torch", "torch"), ("flashinfer-python", "flashinfer"),
                                             ("sglang", "sglang")) if env.get(key)}
    return {canonicalize_name(k): str(v) for k, v in pins.items()}


def bisectable_change(old: dict[str, str], new: dict[str, str]) -> tuple[str, str, str]:
    """(package, good, bad) where two environments' pins move one of BISECTABLE forward and torch not at all;
    ValueError saying why not otherwise."""
    if old.get("torch") != new.get("torch"):
        raise ValueError(f"torch differs ({old.get('torch')} -> {new.get('torch')}): bisect moves one package")
    moved = [p for p in BISECTABLE if old.get(p) != new.get(p)]
    if len(moved) != 1:
        raise ValueError(f"{'neither' if not moved else 'both'} of {', '.join(BISECTABLE)} differ: bisect moves one")
    package = moved[0]
    good, bad = old.get(package), new.get(package)
    try:
        forward = good is not None and bad is not None and Version(good) < Version(bad)
    except InvalidVersion:
        forward = False
    if not forward:
        raise ValueError(f"{package} does not move forward ({good} -> {bad}): nothing to bisect")
    return package, good, bad


def bisect_commands(old: dict[str, Any], new: dict[str, Any], d: MatrixDiff,
                    envs: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """For each regression to a wrong result between two environments whose pins differ in one package's release,
    the bisect that finds the first bad release (`envs`: the two environments diffed; else each regressed
    environment in both files)."""
    out = []
    # FlashInfer's own definitions (set fi_trace) are each release's files, not one definition bisect can carry
    # from release to release: their regressions are listed, not bisected
    theirs = {x.get("name") for x in new.get("definitions") or [] if isinstance(x, dict) and x.get("set")}
    for r in d.regressions:
        if r["old"] is None or r["new"] not in BISECT_STATES or r["definition"] in theirs:
            continue  # no good release to start from, or nothing bisect can tell from a release that cannot run
        env_old, env_new = envs or (r["environment"], r["environment"])
        try:
            package, good, bad = bisectable_change(environment_pins(old, env_old), environment_pins(new, env_new))
        except ValueError:
            continue
        env = environment_record(new, env_new)
        command = (f"flashinfer-trace bisect {r['definition']} --package {package} --good {good} --bad {bad} "
                   f"--combination {env.get('combination')}")
        out.append({"definition": r["definition"], "environment": env.get("id"), "combination": env.get("combination"),
                    "arch": env.get("arch"), "package": package, "good": good, "bad": bad, "command": command})
    return out


def release_sequence(matrix: dict[str, Any], prefix: str, arch: str | None = None,
                     package: str = "flashinfer-python") -> list[str]:
    """The environments whose id starts with `prefix` (and on `arch`), oldest `package` release first by version
    (0.6.9 before 0.6.10, 0.7.2 before 0.7.2.post1), those with sglang left out when `package` is not sglang:
    the release axis as one sequence. ValueError when two environments hold one release (name the arch)."""
    name = canonicalize_name(package)
    found: dict[Version, str] = {}
    for env in matrix.get("environments") or []:
        env_id = env.get("id") or ""
        if not env_id.startswith(prefix) or (arch and env.get("arch") != arch):
            continue
        pins = environment_pins(matrix, env_id)
        if name not in pins or (name != "sglang" and "sglang" in pins):
            continue
        try:
            version = Version(pins[name])
        except InvalidVersion:
            raise ValueError(f"environment {env_id}: {package} {pins[name]!r} is not a version") from None
        if version in found:
            raise ValueError(f"{package} {version} is in both {found[version]} and {env_id}: name one arch (--arch)")
        found[version] = env_id
    if len(found) < 2:
        raise ValueError(f"--sequence {prefix}: {len(found)} environment(s) with {package} match; two are needed")
    return [found[v] for v in sorted(found)]


def render_releases_md(matrix: dict[str, Any], pairs: list[tuple[str, str]], note: str | None = None,
                       command: str | None = None) -> str:
    """Release to release within one snapshot: each (old, new) pair's columns diffed like two runs, in order,
    under one heading, so the page is rebuilt by a command rather than by hand. A table of every pair's counts
    comes first: with thirty releases the page is long, and the table says which pairs to read."""
    out = ["# Release to release" + (f" ({for_markdown(command, code=True)})" if command else ""), ""]
    if note:
        out += [note.strip(), ""]
    sections, rows = [], []
    for old_env, new_env in pairs:
        d = diff_environments(matrix, matrix, old_env, new_env)
        old_id, new_id = (resolve_environment(matrix, e) for e in (old_env, new_env))
        rows.append(f"| {for_markdown(old_id)} | {for_markdown(new_id)} | {len(d.regressions)} | {len(d.slower)} | "
                    f"{len(d.faster)} | {len(d.fixed)} | {len(d.changed)} | {len(d.new)} | {len(d.vanished)} |")
        sections += [f"**{for_markdown(old_id)} → {for_markdown(new_id)}**", "", render_diff_md(d).strip(), ""]
    out += ["| old | new | regressions | slower | faster | fixed | other | new cells | vanished |",
            "|---|---|---|---|---|---|---|---|---|", *rows, ""]
    return "\n".join(out + sections)


def render_diff_md(d: MatrixDiff) -> str:
    head = "❌ regressions" if d.regressed else "✅ no regressions"
    lines = [f"## Matrix diff: {head}", "",
             f"{len(d.regressions)} status regression(s), {len(d.slower)} slower, {len(d.faster)} faster, "
             f"{len(d.fixed)} fixed, {len(d.changed)} other change(s), {len(d.new)} new cell(s), "
             f"{len(d.vanished)} vanished; {len(d.timed)} newly timed, {len(d.untimed)} no longer timed", ""]

    def table(title: str, rows: list[dict[str, Any]], cols: list[str]) -> None:
        if not rows:
            return
        lines.extend([f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)])
        for r in rows:
            vals = []
            for c in cols:
                v = r.get(c)
                text = "" if v is None else for_markdown(" ".join(str(v).split()))  # one table row per cell
                vals.append(f"{v:.3g}" if isinstance(v, float) else text)
            lines.append("| " + " | ".join(vals) + " |")
        lines.append("")

    table("Status regressions", d.regressions, ["definition", "environment", "old", "new", "reason"])
    table("Slower", d.slower, ["definition", "environment", "old_median_us", "new_median_us", "ratio", "spread_us",
                               "timer"])
    table("Fixed", d.fixed, ["definition", "environment", "old", "new"])
    table("Faster", d.faster, ["definition", "environment", "old_median_us", "new_median_us", "ratio"])
    table("Other changes", d.changed, ["definition", "environment", "old", "new", "reason"])
    table("New cells", d.new, ["definition", "environment", "state"])
    # timings appear and go by the session (a bench run added or lost): one row per environment and timer
    for title, rows in (("Newly timed", d.timed), ("No longer timed", d.untimed)):
        counts = Counter((r["environment"], r.get("timer"), r.get("source")) for r in rows)
        table(title, [{"environment": e, "timer": t, "source": src, "cells": n} for (e, t, src), n in sorted(
            counts.items(), key=str)], ["environment", "timer", "source", "cells"])
    table("Vanished cells", d.vanished, ["definition", "environment", "state"])
    if d.bisect:
        lines += ["### Bisect", "", "The first bad release of each wrong result between two releases:", ""]
        lines += [f"    {b['command']}" for b in d.bisect] + [""]
    if d.problems:
        lines += ["### Problems", ""] + [f"- {for_markdown(p)}" for p in d.problems]
    return "\n".join(lines) + "\n"

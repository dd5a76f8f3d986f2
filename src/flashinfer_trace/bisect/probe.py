"""One probe: a release installed in a venv of its own and the definition checked there.

    out/<definition>/<version>/venv/         the release's environment (install.py: fresh, offline, preinstalled torch)
                               install.log   the install's commands and output
                               check.jsonl   one CaseRecord per case, streamed (`check --resume` goes on from it)
                               jit.jsonl     the JIT prebuild of this definition's modules only (on a GPU)
                               check.log     the check's output
                               probe.json    the verdict: a rerun takes it as it is

The check is `flashinfer-trace check DEFINITION --ground-truth SOURCE` in that environment with every path of the
source (call modes) and the fixed seeds only (`--fresh-seed off`: every release sees the same inputs); on a GPU
it prebuilds only the modules that definition needs, then repeats each comparison (`--repeats`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from packaging.version import Version

from ..results.record import CaseRecord, parse
from ..status import CellState
from ..sweep.install import InstallOptions, install
from ..sweep.results import read_latest
from .search import BisectConfig, BisectError, Probe, Verdict, classify, pinned

PROBE = "probe.json"


def check_command(python: str, config: BisectConfig, folder: Path) -> list[str]:
    """The probe's `check`: one definition, one source, every path, the same inputs for every release."""
    target = str(Path(config.definition).resolve()) if config.definition.endswith(".json") else config.definition
    return [python, "-m", "flashinfer_trace.cli", "check", target, "--ground-truth", str(config.source),
            *(["--kernel", config.kernel] if config.kernel else []),
            *(["--definitions", str(Path(config.definitions_dir).resolve())] if config.definitions_dir else []),
            "--results", str(folder / "check.jsonl"), "--resume", "--no-progress", "--fresh-seed", "off",
            *config.check_args]


def _save(probe: Probe, folder: Path) -> Probe:
    tmp = folder / f".{PROBE}.{os.getpid()}"
    tmp.write_text(json.dumps(probe.as_dict(), indent=1) + "\n")
    os.replace(tmp, folder / PROBE)
    return probe


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def venv_python(folder: Path, config: BisectConfig) -> str:
    """A fresh venv (kept where an earlier run made it: the install then finds nothing to do). With a preinstalled
    torch it gets no pip of its own: the install layers that interpreter's packages in first, pip among them
    (seeding pip costs more than the rest of a CPU probe's install)."""
    python = folder / "venv" / "bin" / "python"
    if not python.exists():
        bare = ["--without-pip"] if config.preinstalled_torch else []
        subprocess.run([config.python, "-m", "venv", *bare, str(folder / "venv")], check=True, capture_output=True,
                       text=True, timeout=600)
    return str(python)


def probe_release(version: Version, config: BisectConfig) -> Probe:
    """Install the release beside the bad combination's other pins, check the definition, classify its records.
    A release checked before (its probe.json) is not checked again."""
    folder = config.folder(version)
    if (folder / PROBE).is_file():
        return Probe.from_dict(json.loads((folder / PROBE).read_text()))
    folder.mkdir(parents=True, exist_ok=True)
    combo = pinned(config.combination, config.package, version)
    options = InstallOptions(wheelhouse=config.wheelhouse, preinstalled_torch=config.preinstalled_torch,
                             torch_index=config.torch_index)
    try:
        python = venv_python(folder, config)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        return _save(Probe(str(version), Verdict.UNTESTABLE, CellState.INSTALL_FAILED, f"no venv: {e}",
                           folder=str(folder)), folder)
    result = install(combo, python, options, project=config.project, log=folder / "install.log")
    if not result.ok:
        return _save(Probe(str(version), Verdict.UNTESTABLE, CellState.INSTALL_FAILED,
                           f"{result.error}: {_tail(folder / 'install.log', 4)}", folder=str(folder)), folder)
    cmd = check_command(python, config, folder)
    with (folder / "check.log").open("w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        try:
            proc = subprocess.run(cmd, cwd=config.project, stdout=log, stderr=subprocess.STDOUT, timeout=config.timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
    records: list[CaseRecord] = read_latest(folder / "check.jsonl", parse, lambda r: r.key)
    if code not in (0, 1):  # 0 all passed, 1 a failure; anything else: the check itself did not finish
        what = f"ran past {config.timeout:.0f} s" if code is None else f"exit {code}"
        return Probe(str(version), Verdict.UNTESTABLE, CellState.TIMEOUT if code is None else CellState.ERROR,
                     f"check {what}: {_tail(folder / 'check.log', 4)}", folder=str(folder))  # not saved: rerun
    return _save(classify(version, records, str(config.source), str(folder)), folder)


def check_wheelhouse(config: BisectConfig) -> None:
    """A wheelhouse built for one combination (its wheelhouse.json) cannot serve the probes' other ones."""
    if config.wheelhouse is not None and (config.wheelhouse / "wheelhouse.json").is_file():
        raise BisectError(f"--wheelhouse {config.wheelhouse}: its wheelhouse.json was built for one combination and "
                          "refuses the others' wheels; give bisect a folder without one, holding the releases' wheels "
                          "and the combination's other wheels (pip download ... --no-deps into one folder)")

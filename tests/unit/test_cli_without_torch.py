"""The commands that run no kernel work in an interpreter without torch: the one that drives nox sessions on a
GPU node, builds wheelhouses, moves JIT archives, builds matrices or plans a bisect. Each runs here in a fresh
interpreter where importing torch raises ImportError; the run fails on the first command that reaches for it."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from samples import VALID

import flashinfer_trace
from flashinfer_trace.cli import build_parser
from flashinfer_trace.sweep.results import SessionInfo, TestRecord, write_session

ROOT = Path(__file__).resolve().parents[2]
SRC = str(Path(flashinfer_trace.__file__).resolve().parents[1])

# runs each argv of argv.json through main() with torch unimportable; one JSON outcome per argv
DRIVER = """
import contextlib, io, json, sys, traceback

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch is not installed here (import of {name})")
        return None

sys.meta_path.insert(0, NoTorch())
from flashinfer_trace.cli import main

outcomes = []
for argv in json.load(open(sys.argv[1])):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
            err.write("" if isinstance(e.code, int) or e.code is None else str(e.code))
        except BaseException:
            code = "raised"
            err.write(traceback.format_exc())
    outcomes.append({"argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue()})
outcomes.append({"torch_imported": "torch" in sys.modules})
print(json.dumps(outcomes))
"""

# a nox whose listing is all this needs (sweep run --dry-run runs no session)
NOX = """#!{python}
import json, sys
assert "-l" in sys.argv, sys.argv
print(json.dumps([{{"session": "references-c1-sm90", "name": "references-c1-sm90", "tags": ["nightly", "combo:c1"]}},
                  {{"session": "bench-c1-sm90", "name": "bench-c1-sm90", "tags": ["nightly", "combo:c1"]}},
                  {{"session": "references-c2-sm90", "name": "references-c2-sm90", "tags": ["combo:c2"]}}]))
"""


def command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand of the parser, as its argv prefix."""
    found = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += command_paths(sub, (*path, name))
    return found


def _closed_port() -> tuple[socket.socket, int]:
    """A port on 127.0.0.1 that refuses connections: bound (no one else takes it), never listening."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]


@pytest.fixture
def workspace(tmp_path):
    nox = tmp_path / "nox"
    nox.write_text(NOX.format(python=sys.executable))
    nox.chmod(0o755)
    (tmp_path / "definitions").mkdir()
    (tmp_path / "definitions" / "rmsnorm_h8.json").write_text(json.dumps(VALID))
    records = [TestRecord("tests/references/test_rmsnorm.py::test_output_shape[small-rmsnorm_h8]", "passed", 0.1,
                          None, {"definition": "rmsnorm_h8"})]
    write_session(tmp_path / "results" / "references-cpu",
                  SessionInfo("references-cpu", "cpu-torch2.13", arch="cpu", finished="2026-11-22T10:00:00"),
                  records=records, manifest={"combination": {"id": "cpu-torch2.13", "cuda": "none",
                                                             "pins": {"torch": "2.13.0"}}})
    (tmp_path / "empty").mkdir()
    return tmp_path


def test_the_commands_that_run_no_kernel_need_no_torch(workspace):
    t = workspace
    constraints = str(ROOT / "constraints")
    combo = "cu130-torch2.11-fi0.6.6"
    sock, port = _closed_port()
    closed = f"http://127.0.0.1:{port}/simple"
    helps = [[*path, "--help"] for path in command_paths(build_parser())]
    work = [
        ["sweep", "run", "-s", "references-c2-sm90", "-t", "nightly", "--gpus", "0,1", "--cores", "4", "--nox",
         str(t / "nox"), "--dry-run", "--json"],
        ["sweep", "run", "-s", "referencs-c2-sm90", "--gpus", "0", "--nox", str(t / "nox"), "--dry-run"],
        ["matrix", "build", str(t / "results"), "-o", str(t / "matrix"), "--definitions", str(t / "definitions"),
         "--constraints", constraints, "--known-issues", "", "--root", str(t)],
        ["matrix", "diff", str(t / "matrix" / "matrix.json"), str(t / "matrix" / "matrix.json"), "--json"],
        ["matrix", "portable", str(t / "results"), "--root", str(t)],
        ["wheelhouse", "build", "--combination", combo, "--out", str(t / "wh"), "--constraints", constraints,
         "--torch-index", closed, "--index-url", closed],
        ["wheelhouse", "verify", str(t / "empty")],
        ["jit", "export", "--combination", combo, "--constraints", constraints, "--jit-cache", str(t / "empty"),
         "--arch", "sm90", "--cuda", "13.0", "--out", str(t / "jit.tar")],
        ["jit", "import", str(t / "missing.tar"), "--combination", combo, "--constraints", constraints, "--arch",
         "sm90", "--dest", str(t / "modules")],
        ["bisect", "rmsnorm_h8", "--good", "0.6.5"],
        ["bisect", "rmsnorm_h8", "--good", "0.6.5", "--bad", "0.6.6", "--combination", "cu999-nothing",
         "--constraints", constraints],
    ]
    (t / "argv.json").write_text(json.dumps(helps + work))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run([sys.executable, "-c", DRIVER, str(t / "argv.json")], capture_output=True, text=True,
                              env=env, cwd=t, timeout=600)
    finally:
        sock.close()
    assert done.returncode == 0, done.stderr[-3000:]
    *outcomes, last = json.loads(done.stdout)
    assert last == {"torch_imported": False}
    by = {tuple(o["argv"]): o for o in outcomes}
    for o in outcomes:  # whatever else a command says, never that it wanted torch
        assert o["code"] != "raised" and "torch is not installed here" not in o["err"] + o["out"], o

    assert len(helps) > 30 and ("sweep", "run", "--help") in by and ("combination", "--help") in by
    for argv in helps:
        o = by[tuple(argv)]
        assert o["code"] == 0 and o["out"].startswith("usage: flashinfer-trace"), o

    plan = json.loads(by[tuple(work[0])]["out"])
    assert plan["cores_per_session"] == 2 and [(p["gpu"], p["session"]) for p in plan["plan"]] == [
        ("0", "references-c2-sm90"), ("1", "references-c1-sm90"), ("0", "bench-c1-sm90")]  # the named one first
    unknown = by[tuple(work[1])]
    assert unknown["code"] == 2 and "no session 'referencs-c2-sm90' (close: references-c2-sm90" in unknown["err"]

    built = by[tuple(work[2])]
    assert built["code"] == 0, built
    matrix = json.loads((t / "matrix" / "matrix.json").read_text())
    assert [e["id"] for e in matrix["environments"]][:1] and "rmsnorm_h8" in json.dumps(matrix["definitions"])
    assert by[tuple(work[3])]["code"] == 0 and by[tuple(work[4])]["code"] == 0

    wheels = by[tuple(work[5])]
    assert wheels["code"] == 2 and f"the torch index {closed} is unreachable" in wheels["err"]
    assert f"the main index {closed} is unreachable" in wheels["err"] and "--index-url URL" in wheels["err"]
    assert by[tuple(work[6])]["code"] == 2 and "no wheelhouse.json" in by[tuple(work[6])]["err"]

    for argv in work[7:9]:  # nothing to export, no archive to import: refused by name, no traceback
        assert by[tuple(argv)]["code"] == 2 and by[tuple(argv)]["err"].startswith("error: "), by[tuple(argv)]
    assert by[tuple(work[9])]["code"] == 2 and "--bad, --combination missing" in by[tuple(work[9])]["err"]
    assert by[tuple(work[10])]["code"] == 2 and "cu999-nothing" in by[tuple(work[10])]["err"]

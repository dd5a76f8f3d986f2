"""FlashInfer's own definitions (fi_trace) in the sweep: a references session imports them into
results/<session>/fi_trace/ (sweep/fitrace_step.py), runs tests/references/test_fi_trace.py over them beside
the reference suite, and the records and the matrix keep them apart from ours (definition_set)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flashinfer_trace.matrix.build import build
from flashinfer_trace.matrix.render_md import render_md
from flashinfer_trace.results.record import CaseRecord, parse
from flashinfer_trace.status import Kind, Status
from flashinfer_trace.sweep.combos import load_combination
from flashinfer_trace.sweep.fitrace_step import FiTraceConfig, FiTraceStep, fi_trace_step, fi_trace_targets
from flashinfer_trace.sweep.results import read_jsonl
from flashinfer_trace.sweep.session import run_session, shard

ROOT = Path(__file__).resolve().parents[2]
CPU = ROOT / "constraints" / "cpu-torch2.13.toml"
SMALL = ["--sizes", "small", "--seeds", "0", "--fresh-seed", "off"]

# Two files as FlashInfer 0.7's fi_trace writes them (no run(): a named reference taking the inputs by keyword,
# an input's `param`, the fi_api tag, an `init`), small. The first has the name of one of ours on purpose.
RMSNORM = {
    "name": "rmsnorm_h128", "description": "RMSNorm, eps 1e-6.", "op_type": "rmsnorm",
    "tags": ["fi_api:flashinfer.norm.rmsnorm", "param:eps=1e-06"],
    "axes": {"batch_size": {"type": "var"}, "hidden_size": {"type": "const", "value": 128}},
    "inputs": {"hidden_states": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16", "param": "input"},
               "weight": {"shape": ["hidden_size"], "dtype": "bfloat16"}},
    "outputs": {"output": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"}},
    "reference": "from __future__ import annotations\nimport torch\n\n@torch.no_grad()\n"
                 "def _rmsnorm_reference(hidden_states, weight):\n    EPS = 1e-6\n"
                 "    x = hidden_states.to(torch.float32)\n"
                 "    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.to(torch.float32)\n"
                 "    return y.to(hidden_states.dtype)\n",
}
SILU = {
    "name": "silu_and_mul_h256", "description": "silu(x[:H]) * x[H:]", "op_type": "activation",
    "tags": ["fi_api:flashinfer.activation.silu_and_mul"],
    "axes": {"num_tokens": {"type": "var"}, "hidden_size": {"type": "const", "value": 256},
             "hidden_div_2": {"type": "var"}},
    "constraints": ["hidden_size == 2 * hidden_div_2"],
    "inputs": {"input": {"shape": ["num_tokens", "hidden_size"], "dtype": "bfloat16"}},
    "outputs": {"output": {"shape": ["num_tokens", "hidden_div_2"], "dtype": "bfloat16"}},
    "reference": "from __future__ import annotations\nimport torch\nimport torch.nn.functional as F\n\n"
                 "@torch.no_grad()\ndef _silu_and_mul_reference(input):\n    half = input.shape[-1] // 2\n"
                 "    return F.silu(input[..., :half]) * input[..., half:]\n",
    "init": "from __future__ import annotations\nimport torch\n\n"
            "def _gated_act_init(*, num_tokens: int, hidden_size: int = 256, device: str = 'cuda', seed: int = 0):\n"
            "    torch.manual_seed(seed)\n"
            "    return {'input': torch.randn(num_tokens, hidden_size, dtype=torch.bfloat16, device=device)}\n",
}


class StandIn:
    """The importer seam: writes the two files and a manifest as import-fi-trace would, and notes its calls."""

    def __init__(self, definitions=(RMSNORM, SILU)):
        self.definitions, self.calls = list(definitions), []

    def __call__(self, out: Path, op_types, device):
        self.calls.append((Path(out), op_types, device))
        Path(out).mkdir(parents=True, exist_ok=True)
        for d in self.definitions:
            (Path(out) / d["op_type"]).mkdir(parents=True, exist_ok=True)
            (Path(out) / d["op_type"] / f"{d['name']}.json").write_text(json.dumps(d))
        manifest = {"flashinfer_version": "0.7.2.post1", "count": len(self.definitions),
                    "op_types": len({d["op_type"] for d in self.definitions}), "failed": 1,
                    "definitions": [{"name": d["name"], "op_type": d["op_type"]} for d in self.definitions],
                    "failures": [{"fi_api": "flashinfer.x", "reason": "needs-gpu: stand-in"}]}
        (Path(out) / "manifest.fi-trace").write_text(json.dumps(manifest))
        return manifest


def _tree(tmp_path: Path, ours: bool = True) -> Path:
    """A checkout with test_fi_trace.py and, with `ours`, our rmsnorm_h128 and its test file."""
    tree = tmp_path / "repo"
    refs = tree / "tests" / "references"
    refs.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "references" / "conftest.py", refs)
    shutil.copy(ROOT / "tests" / "references" / "test_fi_trace.py", refs)
    if ours:
        shutil.copy(ROOT / "tests" / "references" / "test_rmsnorm.py", refs)
        (tree / "definitions" / "rmsnorm").mkdir(parents=True)
        shutil.copy(ROOT / "definitions" / "rmsnorm" / "rmsnorm_h128.json", tree / "definitions" / "rmsnorm")
    else:
        (refs / "test_other.py").write_text("def test_ok():\n    assert 2 + 2 == 4\n")
    return tree


def test_a_references_session_checks_flashinfers_own_definitions_apart_from_ours(tmp_path):
    tree, out, importer = _tree(tmp_path), tmp_path / "results" / "references-cpu", StandIn()
    rc = run_session("references", load_combination(CPU), "references-cpu", out, install={"mode": "fresh"}, jobs=2,
                     test_timeout=300, cwd=tree, extra=SMALL,
                     fi_trace=FiTraceConfig(flashinfer="0.7.2.post1", device="cpu", importer=importer))
    assert importer.calls == [(out / "fi_trace", None, "cpu")]
    assert (out / "fi_trace" / "manifest.fi-trace").is_file()  # kept beside the definitions
    note = json.loads((out / "session.json").read_text())["fi_trace"]
    assert note["status"] == "pass" and note["count"] == 2 and note["not_emitted"] == 1
    assert note["manifest"] == "fi_trace/manifest.fi-trace" and note["flashinfer"] == "0.7.2.post1"
    records = [parse(r) for r in read_jsonl(out / "tests.jsonl")]  # streamed, as the suite's own
    theirs = [r for r in records if r.definition_set == "fi_trace"]
    ours = [r for r in records if r.definition_set is None]
    assert {r.definition for r in theirs} == {"rmsnorm_h128", "silu_and_mul_h256"}
    assert {r.definition for r in ours} == {"rmsnorm_h128"}  # the same name, another definition
    assert all("test_fi_trace.py" in r.nodeid for r in theirs) and all("test_rmsnorm.py" in r.nodeid for r in ours)
    torch_match = [r for r in theirs
                   if r.definition == "rmsnorm_h128" and r.source == "torch" and r.check.value == "match"]
    assert torch_match and all(r.status is Status.PASS for r in torch_match), [r.detail for r in torch_match]
    assert any(r.status is Status.PASS for r in ours)
    assert rc == (1 if any(r.status in (Status.FAIL, Status.ERROR) for r in records) else 0)

    matrix = build([tmp_path / "results"])
    rows = {d["name"]: d for d in matrix["definitions"]}
    assert rows["fi_trace/rmsnorm_h128"]["set"] == "fi_trace" and rows["fi_trace/rmsnorm_h128"]["group"] == \
        "fi_trace/rmsnorm"
    assert rows["fi_trace/rmsnorm_h128"]["definition"] == "rmsnorm_h128" and "set" not in rows["rmsnorm_h128"]
    assert list(rows)[0] == "rmsnorm_h128"  # ours first, then FlashInfer's own
    cells = {c["definition"]: c for c in matrix["cells"]}
    assert cells["fi_trace/rmsnorm_h128"]["tests"] == sum(r.definition == "rmsnorm_h128" for r in theirs)
    assert cells["rmsnorm_h128"]["tests"] == len(ours)
    assert matrix["environments"][0]["fi_trace"]["count"] == 2
    md = render_md(matrix)
    assert "## fi_trace/rmsnorm (FlashInfer's own definitions: import-fi-trace)" in md
    assert "## rmsnorm\n" in md and "2 definition(s) of flashinfer 0.7.2.post1" in md


@pytest.mark.parametrize(("version", "kind"), [(None, Kind.NOT_INSTALLED), ("0.6.6", Kind.API_MISSING)])
def test_no_flashinfer_or_one_before_0_7_is_a_session_note_not_an_error(tmp_path, version, kind):
    tree, out = _tree(tmp_path, ours=False), tmp_path / "results" / "references-cpu"

    def importer(*args):
        raise AssertionError("nothing to import from this FlashInfer")

    rc = run_session("references", load_combination(CPU), "references-cpu", out, install={"mode": "fresh"},
                     test_timeout=120, cwd=tree, fi_trace=FiTraceConfig(flashinfer=version, importer=importer))
    session = json.loads((out / "session.json").read_text())
    assert rc == 0 and session["status"] == "ok"
    assert session["fi_trace"]["status"] == "skip" and session["fi_trace"]["kind"] == kind.value
    assert (version or "flashinfer-python") in session["fi_trace"]["detail"]
    nodeids = [r["nodeid"] for r in read_jsonl(out / "tests.jsonl")]
    assert nodeids == ["tests/references/test_other.py::test_ok"]  # test_fi_trace.py left out, not a skip row
    assert not (out / "fi_trace").exists()


def test_the_step_records_a_failed_emission_and_reuses_an_interrupted_runs_import(tmp_path):
    def broken(*args):
        raise RuntimeError("the worker died: SIGKILL")

    step = fi_trace_step(tmp_path, FiTraceConfig(flashinfer="0.7.2.post1", importer=broken))
    assert step.status is Status.ERROR and step.kind is Kind.EXCEPTION and "SIGKILL" in step.detail
    assert not step.imported and fi_trace_targets(step, tmp_path, ["t/test_fi_trace.py", "t/test_x.py"])[0] == \
        ["t/test_x.py"]
    first = StandIn()
    assert fi_trace_step(tmp_path, FiTraceConfig(flashinfer="0.7.2.post1", importer=first)).imported
    again = StandIn()
    step = fi_trace_step(tmp_path, FiTraceConfig(flashinfer="0.7.2.post1", importer=again, reuse=True))
    assert step.imported and step.count == 2 and not again.calls  # --resume: the same files as its records
    only = fi_trace_step(tmp_path, FiTraceConfig(flashinfer="0.8.0", importer=StandIn(), op_types=("rmsnorm",)))
    assert only.as_dict()["only_op_types"] == ["rmsnorm"]
    assert fi_trace_step(tmp_path, FiTraceConfig(flashinfer="0.7.2", enabled=False)).status is Status.NOT_RUN
    empty = fi_trace_step(tmp_path / "e", FiTraceConfig(flashinfer="0.7.2", importer=StandIn(definitions=())))
    assert empty.status is Status.SKIP and not empty.imported


def test_the_fi_trace_file_gets_its_folder_and_shards_by_the_imported_definitions(tmp_path):
    folder = tmp_path / "fi_trace"
    for op in ("a", "b"):
        (folder / op).mkdir(parents=True)
        for i in range(20):
            (folder / op / f"d{i}.json").write_text("{}")
    step = FiTraceStep(Status.PASS, count=40)
    files, own = fi_trace_targets(step, tmp_path, ["tests/references/test_fi_trace.py",
                                                   "tests/references/test_rmsnorm.py"])
    assert own == {"tests/references/test_fi_trace.py": ("--fi-trace-definitions", str(folder))}
    assert shard(files, 1, ROOT / "definitions", own) == [
        ("tests/references/test_fi_trace.py", ("--fi-trace-definitions", str(folder))),
        "tests/references/test_rmsnorm.py"]
    plan = shard(files, 4, ROOT / "definitions", own)
    theirs = [t for t in plan if not isinstance(t, str) and t[0].endswith("test_fi_trace.py")]
    assert len(theirs) > 1  # 40 definitions, every op type: more than one process
    assert all(t[1][:2] == ("--fi-trace-definitions", str(folder)) and t[1][2] == "--shard" for t in theirs)


def test_records_of_the_two_sets_do_not_collide_and_old_records_read_as_ours():
    old = {"schema_version": 2, "definition": "rmsnorm_h128", "check": "match", "status": "pass"}
    ours, theirs = parse(old), parse({**old, "definition_set": "fi_trace"})
    assert ours.definition_set is None and ours.qualified == "rmsnorm_h128"
    assert theirs.qualified == "fi_trace/rmsnorm_h128" and ours.key != theirs.key
    with pytest.raises(ValueError, match="definition_set"):
        CaseRecord.model_validate({**old, "definition_set": "elsewhere"})


def test_the_engine_does_not_reuse_one_sets_inputs_for_the_other():
    from flashinfer_trace.check import Case, Memo
    from flashinfer_trace.dataset import load_path
    from flashinfer_trace.memo import Phases
    from flashinfer_trace.results.record import Check

    d = load_path(ROOT / "definitions" / "rmsnorm" / "rmsnorm_h128.json")
    memo = Memo("cpu")
    first = memo.pristine(Case(d, Check.MATCH, "small", 0), Phases())
    assert memo.pristine(Case(d, Check.SHAPE, "small", 0), Phases()) is first  # the same case's checks share them
    other = memo.pristine(Case(d, Check.MATCH, "small", 0, definition_set="fi_trace"), Phases())
    assert other is not first


def test_without_the_option_the_fi_trace_test_is_one_skip_and_a_missing_folder_is_named(tmp_path):
    test = str(ROOT / "tests" / "references" / "test_fi_trace.py")
    run = [sys.executable, "-m", "pytest", test, "-q", "-p", "no:cacheprovider", "-n", "0", "-rs"]
    plain = subprocess.run(run, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert "1 skipped" in plain.stdout and "no --fi-trace-definitions DIR" in plain.stdout, plain.stdout[-2000:]
    missing = subprocess.run([*run, "--fi-trace-definitions", str(tmp_path / "nowhere")], capture_output=True,
                             text=True, timeout=300, cwd=ROOT)
    assert missing.returncode != 0 and f"--fi-trace-definitions {tmp_path / 'nowhere'}: no such folder" in \
        missing.stdout + missing.stderr


def test_session_flags_choose_the_fi_trace_step():
    from flashinfer_trace.sweep.install import parse_session_args

    opts, rest = parse_session_args(["--fi-trace-op-type", "rmsnorm", "--fi-trace-op-type=sampling", "-k", "x"],
                                    environ={})
    assert opts.fi_trace and opts.fi_trace_op_types == ["rmsnorm", "sampling"] and rest == ["-k", "x"]
    assert not parse_session_args(["--no-fi-trace"], environ={})[0].fi_trace
    with pytest.raises(ValueError, match="--fi-trace-op-type 'rms norm'"):
        parse_session_args(["--fi-trace-op-type", "rms norm"], environ={})


def test_a_regression_of_flashinfers_own_definition_is_listed_but_not_bisected():
    from flashinfer_trace.matrix.diff import bisect_commands, diff_environments

    pins = {"torch": "2.11.0"}
    envs = [{"id": f"fi{v}@sm90", "combination": f"cu130-torch2.11-fi{v}", "arch": "sm90",
             "manifest": {"combination": {"pins": {**pins, "flashinfer-python": v}}}} for v in ("0.7.1", "0.7.2")]
    cells = [{"definition": name, "environment": e["id"], "state": state, "reason": None}
             for name in ("rmsnorm_h4096", "fi_trace/rmsnorm_h4096")
             for e, state in zip(envs, ("pass", "fail"), strict=True)]
    m = {"schema_version": 1, "environments": envs, "cells": cells,
         "definitions": [{"name": "rmsnorm_h4096"}, {"name": "fi_trace/rmsnorm_h4096", "set": "fi_trace"}]}
    d = diff_environments(m, m, "fi0.7.1", "fi0.7.2")
    assert {r["definition"] for r in d.regressions} == {"rmsnorm_h4096", "fi_trace/rmsnorm_h4096"}
    assert [b["definition"] for b in bisect_commands(m, m, d, ("fi0.7.1", "fi0.7.2"))] == ["rmsnorm_h4096"]

"""check.py's pipeline (discover, plan, run, summarise), failure records, and the `check` and `coverage`
commands."""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

import pytest
from samples import VALID

from flashinfer_trace.check import (
    Case,
    CheckConfig,
    Discovered,
    check,
    config_from_options,
    discover,
    plan,
    run,
    summarise,
)
from flashinfer_trace.cli import main
from flashinfer_trace.definition import Definition
from flashinfer_trace.failures import replay_command
from flashinfer_trace.groundtruth import paths
from flashinfer_trace.inputs import norm as norm_inputs
from flashinfer_trace.inputs.common import fixed_bytes
from flashinfer_trace.results.record import CaseRecord

# The weight multiply is missing: right shape and dtype, wrong values.
NO_WEIGHT = (
    "import torch\n\nEPS = 1e-5\n\n\n@torch.no_grad()\ndef run(hidden_states, weight):\n"
    "    x = hidden_states.to(torch.float32)\n"
    "    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)\n"
    "    return y.to(hidden_states.dtype)\n"
)

REFERENCE_TEST = "from flashinfer_trace.pytest_plugin import reference_test\n\ntest_{op} = reference_test({op!r})\n"
ROOT = Path(__file__).resolve().parents[2]

CONFIG = dict(sources=("torch", "flashinfer"), sizes=("small",), seeds=(0,), cases=(), device="cpu")


def definitions_folder(tmp_path, *defs: dict, name: str = "definitions"):
    """definitions/<op_type>/<name>.json for each definition dict."""
    folder = tmp_path / name
    for d in defs:
        path = folder / d["op_type"] / f"{d['name']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(d, indent=2))
    return folder


def bad_rmsnorm() -> dict:
    return {**copy.deepcopy(VALID), "reference": NO_WEIGHT}


def by_check(results: list[CaseRecord]) -> dict[tuple[str, str | None], CaseRecord]:
    return {(r.check, r.source): r for r in results}


# -- discover ---------------------------------------------------------------------------------------
def test_discover_folder_with_a_broken_file_keeps_the_good_one(tmp_path):
    folder = definitions_folder(tmp_path, VALID)
    broken = folder / "rmsnorm" / "broken.json"
    broken.write_text("[")
    found = discover([str(folder)], CheckConfig(device="cpu"))
    assert [d.name for d in found.definitions] == ["rmsnorm_h8"]
    (error,) = found.errors
    assert error.status == "error" and error.check == "load"
    assert "broken.json" in error.definition or "broken.json" in (error.detail or "")


def test_discover_file_name_and_missing_target(tmp_path):
    folder = definitions_folder(tmp_path, VALID)
    config = CheckConfig(device="cpu", definitions_dir=str(folder))
    by_path = discover([str(folder / "rmsnorm" / "rmsnorm_h8.json")], config)
    by_name = discover(["rmsnorm_h8"], config)
    assert [d.name for d in by_path.definitions] == [d.name for d in by_name.definitions] == ["rmsnorm_h8"]
    missing = discover(["nope"], config)
    assert not missing.definitions and missing.errors[0].status == "error"
    assert "no definition named 'nope'" in missing.errors[0].detail


def test_discover_deduplicates_by_name(tmp_path):
    folder = definitions_folder(tmp_path, VALID)
    found = discover([str(folder), str(folder / "rmsnorm" / "rmsnorm_h8.json")], CheckConfig(device="cpu"))
    assert len(found.definitions) == 1 and not found.errors


# -- plan -------------------------------------------------------------------------------------------
def test_an_op_type_without_a_generator_is_checked_from_its_declaration():
    d = Definition.model_validate({**VALID, "name": "conv_h8", "op_type": "conv2d"})
    config = CheckConfig(**{**CONFIG, "cases": None})
    cases = plan(Discovered([d], []), config)
    assert all(isinstance(c, Case) for c in cases)  # every check, no edge cases (they need a family)
    assert [c.check.value for c in cases] == ["shape", "dtype", "match", "match", "deterministic"]
    records = {(r.check.value, r.source): r for r in run(cases, config)}
    for key in (("shape", None), ("dtype", None), ("deterministic", None)):  # the reference's own checks
        assert records[key].status == "pass" and records[key].inputs == "declared"
    assert records[("match", "torch")].status == "skip"  # no torch ground truth for conv2d: says so
    assert "unsupported" in records[("match", "torch")].detail


def test_plan_lists_every_check():
    d = Definition.model_validate(VALID)
    config = CheckConfig(sources=("torch",), sizes=("small", "medium"), seeds=(0, 1), cases=None, device="cpu")
    cases = plan(Discovered([d], []), config)
    assert all(isinstance(c, Case) for c in cases)
    ids = [c.id for c in cases]
    assert ids[:4] == ["rmsnorm_h8-shape-small-0", "rmsnorm_h8-dtype-small-0", "rmsnorm_h8-match-torch-small-0",
                       "rmsnorm_h8-match-torch-small-1"]
    assert "rmsnorm_h8-deterministic-small-0" in ids
    edges = [(c.size, c.case) for c in cases if c.check == "edge"]  # every edge case at every size
    assert sorted(edges) == [(s, c) for s in ("medium", "small") for c in sorted(norm_inputs.CASES)]
    assert ids.index("rmsnorm_h8-edge-torch-small-0-single_token") < ids.index("rmsnorm_h8-shape-medium-0")
    only = plan(Discovered([d], []), CheckConfig(**{**CONFIG, "cases": ("single_token",)}))
    routes = sum(len(paths(s, d)) for s in CONFIG["sources"])  # every path of each source (rmsnorm: out=, pdl)
    assert [c.case for c in only if c.check == "edge"] == ["single_token"] * routes * len(CONFIG["sizes"])


def test_a_run_over_its_weight_limit_records_each_case_a_skip_naming_the_limit():
    """--max-fixed-mib (CI's reference tier): a definition with more fixed-size input bytes is left out, every case
    a skip saying how many MiB and which limit; one at the limit runs."""
    d = Definition.model_validate(VALID)
    weights = fixed_bytes(d)
    assert weights == 8 * 2  # rmsnorm_h8's bfloat16 weight [8]
    over = plan(Discovered([d], []), CheckConfig(sources=("torch",), sizes=("small",), device="cpu",
                                                 max_fixed_bytes=weights - 1))
    assert over and all(c.skip is not None and c.skip[0] == "input-limit" for c in over)
    assert "over this run's --max-fixed-mib" in over[0].skip[1]
    at = plan(Discovered([d], []), CheckConfig(sources=("torch",), sizes=("small",), device="cpu",
                                               max_fixed_bytes=weights))
    assert all(c.skip is None for c in at)
    options = {"max_fixed_mib": 0.5}  # the option, as pytest and the CLI hand it over, in MiB
    assert config_from_options(options.get).max_fixed_bytes == 1 << 19
    assert config_from_options({}.get).max_fixed_bytes is None


# -- run / summarise --------------------------------------------------------------------------------
def test_run_good_definition(tmp_path):
    config = CheckConfig(**CONFIG, save_failures=str(tmp_path / "failures"))
    results = list(run(plan(Discovered([Definition.model_validate(VALID)], []), config), config))
    got = by_check(results)
    assert set(got) == {("shape", None), ("dtype", None), ("match", "torch"), ("match", "flashinfer"),
                        ("deterministic", None)}
    for key in [("shape", None), ("dtype", None), ("match", "torch"), ("deterministic", None)]:
        assert got[key].status == "pass", got[key]
    skipped = got[("match", "flashinfer")]
    assert skipped.status == "skip" and skipped.detail.startswith("not-installed: flashinfer")
    match = got[("match", "torch")]
    assert match.tolerance["origin"] == "dtype:bfloat16" and match.ground_truth.source == "torch"
    assert match.compared[0]["output"] == "output" and match.compared[0]["tolerance_used"] <= 1 and not match.reports
    assert not (tmp_path / "failures").exists()

    summary = summarise(results)  # flashinfer's three paths (plain, out=, pdl) each skip: not installed
    assert summary.total == 7 and summary.ok
    assert summary.by_status == {"pass": 4, "skip": 3}
    assert summary.skip_reasons == {skipped.detail: 3}
    assert summary.failures == []


def test_run_wrong_reference_fails_and_saves_a_replayable_record(tmp_path):
    config = CheckConfig(**CONFIG, save_failures=str(tmp_path / "failures"))
    d = Definition.model_validate(bad_rmsnorm())
    results = list(run(plan(Discovered([d], []), config), config))
    got = by_check(results)
    assert got[("shape", None)].status == got[("dtype", None)].status == "pass"
    assert got[("deterministic", None)].status == "pass"
    fail = got[("match", "torch")]
    assert fail.status == "fail" and fail.verdict in ("bug", "precision")
    assert "output:" in fail.detail and fail.reports[0]["mismatched"] > 0
    assert fail.failure_file is not None
    saved = Path(fail.failure_file)
    assert saved.parent == tmp_path / "failures" and list(saved.parent.glob("*.json")) == [saved]
    record = json.loads(saved.read_text())
    assert record["definition"] == "rmsnorm_h8" and record["status"] == "fail"
    assert record["replay"] == replay_command("rmsnorm_h8", "small", 0, None, "torch", "cpu")
    replay = record["replay"].split()
    assert replay[:3] == ["flashinfer-trace", "check", "rmsnorm_h8"]
    assert replay[replay.index("--size") + 1] == "small" and replay[replay.index("--seed") + 1] == "0"
    assert replay[replay.index("--ground-truth") + 1] == "torch"

    summary = summarise(results)
    assert not summary.ok and summary.by_status == {"pass": 3, "fail": 1, "skip": 3}  # flashinfer: 3 paths
    (line,) = summary.failures
    assert line.startswith("rmsnorm_h8 match torch small seed=0: ")


def test_run_without_save_failures_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = CheckConfig(**CONFIG)
    results = list(run(plan(Discovered([Definition.model_validate(bad_rmsnorm())], []), config), config))
    assert any(r.status == "fail" and r.failure_file is None for r in results)
    assert list(tmp_path.iterdir()) == []


def test_reference_that_raises_is_an_error_result():
    data = {**copy.deepcopy(VALID),
            "reference": "EPS = 1e-5\n\n\ndef run(hidden_states, weight):\n    raise ValueError('boom')\n"}
    config = CheckConfig(**{**CONFIG, "sources": ("torch",)})
    results = list(run(plan(Discovered([Definition.model_validate(data)], []), config), config))
    assert {r.status for r in results} == {"error"}
    assert all("ValueError: boom" in r.detail for r in results)
    assert summarise(results).by_status == {"error": 4} and not summarise(results).ok


def test_ground_truth_that_cannot_read_the_definition_is_a_skip():
    # The torch rmsnorm reads eps from the definition (an input or a param:eps tag), never from the reference;
    # without either it raises GroundTruthUnavailable ("unsupported: ... declares no eps"), a skip reason like
    # any other, not an error of the run.
    data = {**copy.deepcopy(VALID), "tags": [t for t in VALID["tags"] if not t.startswith("param:")]}
    config = CheckConfig(**{**CONFIG, "sources": ("torch",)})
    results = list(run(plan(Discovered([Definition.model_validate(data)], []), config), config))
    match = by_check(results)[("match", "torch")]
    assert match.status == "skip", match
    assert match.detail.startswith("unsupported: ") and "declares no eps" in match.detail
    assert summarise(results).ok


def test_check_runs_the_whole_pipeline(tmp_path):
    folder = definitions_folder(tmp_path, VALID)
    results, summary = check([str(folder)], CheckConfig(**{**CONFIG, "sources": ("torch",), "cases": None}))
    assert summary.ok and summary.by_status == {"pass": len(results)}
    assert {r.case for r in results if r.check == "edge"} == set(norm_inputs.CASES)


# -- the CLI ----------------------------------------------------------------------------------------
def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def check_cli(capsys, path, failures):
    return run_cli(capsys, "check", path, "--ground-truth", "torch", "--size", "small", "--no-edge-cases",
                   "--device", "cpu", "--json", "--save-failures", failures)


def test_cli_check_good_definition_exits_zero(capsys, tmp_path, write_def, valid):
    path = write_def(valid)
    code, out, _ = check_cli(capsys, path, tmp_path / "failures")
    report = json.loads(out)
    assert code == 0 and report["device"] == "cpu"
    # seeds 0 and 1, and the run's fresh one (recorded as a number, marked fresh)
    assert report["summary"]["by_status"] == {"pass": 6} and report["summary"]["total"] == 6
    assert {r["check"] for r in report["results"]} == {"shape", "dtype", "match", "deterministic"}
    matches = [r for r in report["results"] if r["check"] == "match"]
    assert [r["fresh"] for r in matches] == [False, False, True] and matches[2]["seed"] not in (0, 1)
    assert not (tmp_path / "failures").exists()


def test_cli_check_bad_definition_exits_one(capsys, tmp_path, write_def):
    path = write_def(bad_rmsnorm())
    code, out, _ = check_cli(capsys, path, tmp_path / "failures")
    report = json.loads(out)
    assert code == 1
    assert report["summary"]["by_status"] == {"pass": 3, "fail": 3}  # seeds 0 and 1 and the fresh one
    fail = next(r for r in report["results"] if r["status"] == "fail")
    assert fail["check"] == "match" and fail["source"] == "torch"
    saved = json.loads(open(fail["failure_file"]).read())
    assert "rmsnorm_h8" in saved["replay"] and "--size small" in saved["replay"] and "--seed 0" in saved["replay"]
    assert saved["definition_path"] == str(path.resolve())


def test_cli_check_human_output_names_the_failure(capsys, tmp_path, write_def, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_def(bad_rmsnorm())
    code, out, _ = run_cli(capsys, "check", path, "--ground-truth", "torch", "--size", "small", "--no-edge-cases",
                           "--device", "cpu", "--save-failures", "")
    assert code == 1 and "FAIL" in out and "rmsnorm_h8" in out
    assert [p.name for p in tmp_path.rglob("*.json")] == ["rmsnorm_h8.json"]  # --save-failures '' saves nothing


def test_cli_check_tolerance_flags_reach_the_comparison(capsys, tmp_path, write_def):
    path = write_def(bad_rmsnorm())
    code, out, _ = run_cli(capsys, "check", path, "--ground-truth", "torch", "--size", "small", "--no-edge-cases",
                           "--device", "cpu", "--json", "--save-failures", "", "--atol", "10")
    report = json.loads(out)
    match = next(r for r in report["results"] if r["check"] == "match")
    assert code == 0 and match["status"] == "pass"
    assert match["tolerance"]["atol"] == 10.0 and match["tolerance"]["origin"].endswith("cli")


def test_coverage_function(tmp_path):
    from flashinfer_trace.coverage import coverage

    tests = tmp_path / "refs"
    tests.mkdir()
    (tests / "test_rmsnorm.py").write_text(REFERENCE_TEST.format(op="rmsnorm"))
    (tests / "test_gone.py").write_text(REFERENCE_TEST.format(op="gone"))
    (tests / "test_conv2d.py").write_text(REFERENCE_TEST.format(op="conv2d"))  # no generator: not tested
    (tests / "test_broken.py").write_text("DEFINITIONS = [\n")  # unparsable: ignored
    defs = [Definition.model_validate(VALID), Definition.model_validate({**VALID, "name": "rmsnorm_h8_b"}),
            Definition.model_validate({**VALID, "name": "conv_h8", "op_type": "conv2d"}),
            Definition.model_validate({**VALID, "name": "gemm_x", "op_type": "gemm"})]
    cov = coverage(defs, tests)
    assert cov.with_tests == ["rmsnorm_h8", "rmsnorm_h8_b"] and cov.without_tests == ["conv_h8", "gemm_x"]
    assert cov.stale_tests == ["gone"]
    op = cov.op_types["rmsnorm"]
    assert (op.definitions, op.tested, op.has_generator) == (2, 2, True)
    assert op.dtypes == {"bfloat16"} and dict(op.const_axes) == {"hidden_size": {8}}
    assert cov.op_types["conv2d"].has_generator is False
    assert cov.op_types["conv2d"].ground_truths == {"flashinfer": [], "sglang": [], "torch": []}


def test_cli_coverage_lists_definitions_without_tests(capsys, tmp_path):
    other = {**copy.deepcopy(VALID), "name": "rmsnorm_h8_b"}
    folder = definitions_folder(tmp_path, VALID, other)
    tests = tmp_path / "refs"
    tests.mkdir()
    (tests / "test_gone.py").write_text(REFERENCE_TEST.format(op="gone"))
    code, out, _ = run_cli(capsys, "coverage", "--definitions", folder, "--tests", tests, "--json")
    cov = json.loads(out)
    assert code == 0
    assert cov["with_tests"] == [] and cov["without_tests"] == ["rmsnorm_h8", "rmsnorm_h8_b"]
    assert cov["stale_tests"] == ["gone"]
    (tests / "test_rmsnorm.py").write_text(REFERENCE_TEST.format(op="rmsnorm"))
    code, out, _ = run_cli(capsys, "coverage", "--definitions", folder, "--tests", tests, "--json")
    cov = json.loads(out)
    assert cov["with_tests"] == ["rmsnorm_h8", "rmsnorm_h8_b"] and cov["without_tests"] == []
    op = cov["op_types"]["rmsnorm"]
    assert (op["definitions"], op["tested"], op["has_generator"]) == (2, 2, True)
    assert op["dtypes"] == ["bfloat16"] and op["const_axes"] == {"hidden_size": [8]}
    assert op["ground_truths"]["torch"] and op["ground_truths"]["flashinfer"]


def test_cli_coverage_with_no_tests_folder(capsys, tmp_path):
    folder = definitions_folder(tmp_path, VALID)
    code, out, _ = run_cli(capsys, "coverage", "--definitions", folder, "--tests", tmp_path / "none", "--json")
    assert code == 0 and json.loads(out)["without_tests"] == ["rmsnorm_h8"]


def test_every_op_type_with_a_generator_has_its_reference_test_file():
    """The suite's files hold no list of definitions: a definition added to an op type is tested at once,
    and a new op type with a generator needs its one-line file (coverage says so)."""
    from flashinfer_trace.coverage import tested_op_types
    from flashinfer_trace.dataset import Dataset
    from flashinfer_trace.inputs import supported_op_types

    shipped = {d.op_type for d in Dataset(ROOT / "definitions")} & set(supported_op_types())
    files = tested_op_types(ROOT / "tests" / "references")
    assert shipped <= set(files), sorted(shipped - set(files))
    for op, path in files.items():  # a docstring, one import, one assignment: no logic of its own
        body = ast.parse(Path(path).read_text()).body
        assert Path(path).name == f"test_{op}.py" and len(body) == 3
        assert [type(n) for n in body] == [ast.Expr, ast.ImportFrom, ast.Assign]


# -- streaming and resuming ---------------------------------------------------------------------------
def test_results_stream_as_they_complete_and_an_interrupt_keeps_them(tmp_path, monkeypatch):
    import flashinfer_trace.check as check_mod
    from flashinfer_trace.check import recorded, run

    d = Definition.model_validate(VALID)
    stream = tmp_path / "check.jsonl"
    config = CheckConfig(**{**CONFIG, "sources": ("torch",)}, results_file=str(stream))
    cases = plan(Discovered([d], []), config)
    real, calls = check_mod.run_case, []

    def flaky(case, memo, cfg):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(case.id)
        return real(case, memo, cfg)

    monkeypatch.setattr(check_mod, "run_case", flaky)
    got = []
    with pytest.raises(KeyboardInterrupt):
        for r in run(cases, config):
            got.append(r)
    kept = recorded(stream)
    assert len(got) == len(kept) == 3 and all(r.key in kept for r in got)
    with open(stream, "a") as f:
        f.write('{"definition": "rmsnorm_h8", "check": "sha')  # a line torn by a kill

    calls.clear()
    def counted(case, memo, cfg):
        calls.append(case.id)
        return real(case, memo, cfg)

    monkeypatch.setattr(check_mod, "run_case", counted)
    resumed = list(run(cases, CheckConfig(**{**CONFIG, "sources": ("torch",)}, results_file=str(stream), resume=True)))
    assert len(resumed) == len(cases) and len(calls) == len(cases) - 3  # the first three were not run again
    assert [r.key for r in resumed] == [c.key for c in cases]
    assert len(recorded(stream)) == len(cases)


def test_cli_check_writes_the_stream(tmp_path, capsys):
    folder = tmp_path / "defs" / "rmsnorm"
    folder.mkdir(parents=True)
    (folder / "rmsnorm_h8.json").write_text(json.dumps(VALID))
    stream = tmp_path / "out.jsonl"
    code = main(["check", str(folder), "--ground-truth", "torch", "--size", "small", "--device", "cpu",
                 "--results", str(stream), "--no-progress", "--save-failures", "", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["summary"]["total"] == len(stream.read_text().splitlines()) > 0
    assert out["sandbox"]["complete"] in (True, False)


def test_a_definition_too_large_for_the_machine_is_a_skip_with_its_size(monkeypatch):
    from flashinfer_trace import check
    from flashinfer_trace.check import CheckConfig, Discovered, plan, too_large
    from flashinfer_trace.dataset import load_definition
    from flashinfer_trace.inputs.common import fixed_bytes, peak_bytes

    d = load_definition("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048")
    weights = fixed_bytes(d)
    assert weights > 32 * 2 * 2048 * 7168  # gemm1 alone: 32 experts x [4096, 7168] fp8
    assert too_large(d, budget=weights * 100) is None
    why = too_large(d, budget=weights)
    assert why.startswith("its fixed-size inputs alone are") and "more than the" in why
    # the fp8 weights cost 15x their bytes at the check's peak (a flat 12x let a check be killed for memory)
    assert peak_bytes(d) >= 15 * weights * 0.99
    assert too_large(d, budget=int(12.5 * weights)) is not None
    small = load_definition("rmsnorm_h4096")
    assert fixed_bytes(small) == 4096 * 2  # only the weight: hidden_states has a var axis
    assert peak_bytes(small) == 4096 * (3 * 2 + 12)
    monkeypatch.setattr(check, "memory_budget", lambda device: 16 * weights)
    planned = plan(Discovered([d, small], []), CheckConfig(device="cpu", sources=("torch",)))
    assert not any(getattr(p, "skip", None) for p in planned)  # both fit 16x the weights
    monkeypatch.setattr(check, "memory_budget", lambda device: 14 * weights)
    planned = plan(Discovered([d, small], []), CheckConfig(device="cpu", sources=("torch",)))
    assert {p.definition.name for p in planned if getattr(p, "skip", None)} == {d.name}


def test_the_cpu_budget_is_a_share_of_the_memory_available_now(monkeypatch):
    from flashinfer_trace.inputs import common

    monkeypatch.setattr(common, "_mem_available", lambda: 10 * 2**30)
    assert common.memory_budget("cpu") == int(10 * 2**30 * common.CPU_MEMORY_SHARE)
    monkeypatch.setattr(common, "_mem_available", lambda: None)  # no /proc/meminfo: the RAM installed
    assert common.memory_budget("cpu") > 0


def test_a_definition_whose_inputs_fail_never_runs_on_the_previous_ones():
    """The memo once kept the last definition's inputs when generating the next one's failed: its
    dtype and determinism checks then ran its reference on them (TypeError: run() takes ...)."""
    broken = copy.deepcopy(VALID)
    broken["name"] = "rmsnorm_h64"
    broken["axes"]["hidden_size"]["value"] = 64
    broken["inputs"]["mode"] = {"shape": None, "dtype": "str"}  # no generator knows a string's value
    broken["reference"] = broken["reference"].replace("def run(hidden_states, weight)",
                                                      "def run(hidden_states, weight, mode)")
    config = CheckConfig(**{**CONFIG, "sources": ("torch",)})
    defs = [Definition.model_validate(VALID), Definition.model_validate(broken)]
    results = [r for r in run(plan(Discovered(defs, []), config), config) if r.definition == "rmsnorm_h64"]
    assert results and {r.status for r in results} == {"error"}
    assert all(r.detail.startswith("inputs: ") and "'mode'" in r.detail for r in results), [r.detail for r in results]


def test_a_reference_only_failure_saves_a_replay_of_every_ground_truth(tmp_path):
    """A failed shape / dtype / determinism check has no ground-truth source (None): its record still
    saves, replaying with `--ground-truth all` (on the H100 this crashed `check` mid-run)."""
    from flashinfer_trace.failures import save_failure

    record = {"definition": "rmsnorm_h8", "check": "deterministic", "status": "fail", "size": "small", "seed": 0,
              "case": None, "source": None, "device": "cuda:0", "definition_path": None}
    saved = json.loads(save_failure(record, tmp_path).read_text())
    assert saved["replay"] == ("flashinfer-trace check rmsnorm_h8 --size small --seed 0 --fresh-seed off "
                               "--ground-truth all --device cuda:0")
    fresh = json.loads(save_failure({**record, "seed": 9912, "fresh": True}, tmp_path).read_text())
    assert "--seed 9912 --fresh-seed 9912 " in fresh["replay"]  # the fresh seed's counts drawn again


# -- a reference that writes into its inputs ---------------------------------------------------------
WRITES_WEIGHT = VALID["reference"].replace("    return (y * weight.to(torch.float32)).to(hidden_states.dtype)",
                                           "    out = (y * weight.to(torch.float32)).to(hidden_states.dtype)\n"
                                           "    weight.mul_(0.5)\n    return out")


def test_a_reference_that_writes_into_its_inputs_fails_every_case_it_ran():
    """Its outputs are right, and each consumer gets its own copy of the inputs, so only the bytes of the
    copy it was handed show it: every case that ran it says mutates-inputs, and the cell shows that state."""
    from flashinfer_trace.matrix.build import test_state as cell_state_of

    assert WRITES_WEIGHT != VALID["reference"]
    d = Definition.model_validate({**VALID, "reference": WRITES_WEIGHT})
    config = CheckConfig(**{**CONFIG, "sources": ("torch",)})
    results = list(run(plan(Discovered([d], []), config), config))
    assert {r.check for r in results} == {"shape", "dtype", "match", "deterministic"}
    for r in results:
        assert r.status == "fail" and r.kind == "mutates-inputs" and "weight" in r.detail, r
        assert cell_state_of(r) == "mutates-inputs"
    clean = list(run(plan(Discovered([Definition.model_validate(VALID)], []), config), config))
    assert {r.status for r in clean} == {"pass"}


def test_written_inputs_compares_bytes_and_allows_declared_in_place_outputs():
    import torch

    from flashinfer_trace.inputs import generate_inputs
    from flashinfer_trace.memo import written_inputs

    d = Definition.model_validate(VALID)
    pristine = generate_inputs(d, "small", 0)
    pristine.values["hidden_states"][0, 0] = float("nan")  # NaN != NaN, but the bytes are the same
    used = pristine.to("cpu", copy=True)
    assert written_inputs(d, pristine, used) == []
    used.values["weight"].add_(1)
    assert written_inputs(d, pristine, used) == ["weight"]
    in_place = d.model_copy(update={"outputs": {**d.outputs, "weight": d.inputs["weight"]}})
    assert "weight" in in_place.in_place_outputs and written_inputs(in_place, pristine, used) == []
    assert torch.isnan(used.values["hidden_states"][0, 0])


def test_memory_gone_since_the_plan_makes_a_case_too_large_not_a_crash(monkeypatch):
    """The plan saw enough memory; by the time the case starts, other processes took it: a too-large skip."""
    from flashinfer_trace import check
    from flashinfer_trace.check import CheckConfig, Discovered, Memo, plan, run_case
    from flashinfer_trace.dataset import load_definition
    from flashinfer_trace.inputs.common import peak_bytes
    from flashinfer_trace.status import Kind, Status

    d = load_definition("rmsnorm_h4096")
    config = CheckConfig(device="cpu", sources=("torch",), sizes=("small",), seeds=(0,), fresh_seed=None)
    monkeypatch.setattr(check, "memory_budget", lambda device: 10 * peak_bytes(d))
    case = next(c for c in plan(Discovered([d], []), config) if c.check.value == "shape")
    assert case.skip is None
    from flashinfer_trace import memo

    monkeypatch.setattr(memo, "memory_budget", lambda device: peak_bytes(d) // 2)  # what the memo judges by
    record = run_case(case, Memo("cpu"), config)
    assert (record.status, record.kind) == (Status.SKIP, Kind.TOO_LARGE) and "now: its fixed-size" in record.detail
    monkeypatch.setattr(memo, "memory_budget", lambda device: 10 * peak_bytes(d))
    assert run_case(case, Memo("cpu"), config).status is Status.PASS


def test_a_crash_record_keeps_the_cases_path_so_it_does_not_take_the_plain_calls_key():
    """The record of a test that died (SIGFPE in a kernel) is made from the identity streamed before it ran; without
    the path, fa3-hnd's crashes took the key of the plain call's record and stood in its matrix cell."""
    from flashinfer_trace.check import Case, Check
    from flashinfer_trace.dataset import load_definition
    from flashinfer_trace.pytest_plugin import identity
    from flashinfer_trace.results.record import from_test
    from flashinfer_trace.status import Kind, Status

    d = load_definition("rmsnorm_h4096")
    case = Case(d, Check.MATCH, source="flashinfer", path="graph", fresh=True, seed=7)
    crashed = from_test({"nodeid": f"tests/references/test_rmsnorm.py::test_rmsnorm[{case.id}]", "status": "error",
                         "message": "process died with SIGFPE (signal 8)", "properties": {"case": identity(case)}})
    plain = Case(d, Check.MATCH, source="flashinfer", fresh=True, seed=7).record(Status.PASS)
    assert (crashed.path, crashed.fresh, crashed.kind) == ("graph", True, Kind.CRASH)
    assert crashed.key != plain.key and crashed.key == case.record(Status.PASS).key

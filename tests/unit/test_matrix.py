"""The matrix: building it from session results (every cell state, merged bench timings, corrupt
inputs), Markdown, the diff with planted regressions, known issues, and the CI job plan."""

import copy
import importlib.util
import json
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import pytest

from flashinfer_trace.matrix import build, diff_environments, diff_matrices, render_diff_md, render_md
from flashinfer_trace.matrix.__main__ import main as matrix_main
from flashinfer_trace.matrix.diff import BROKEN
from flashinfer_trace.matrix.known_issues import KnownIssueError, installed_versions, load_known_issues
from flashinfer_trace.results.record import from_v1
from flashinfer_trace.sweep.results import SessionInfo, TestRecord, write_json, write_session

ROOT = Path(__file__).resolve().parents[2]
FILE = "tests/references/test_rmsnorm.py::"


def rec(name, status, definition="rmsnorm_h4096", source=None, message=None, **props):
    p = {"definition": definition, **({"source": source} if source else {}), **props}
    return TestRecord(FILE + name, status, 0.1, message, p)


def manifest(combo_id, pins, cuda, cc=None):
    devices = [{"name": "NVIDIA H100 80GB HBM3", "compute_capability": cc}] if cc else []
    return {"combination": {"id": combo_id, "cuda": cuda, "pins": pins}, "torch": {"devices": devices}}


def bench_json(definition, median, iqr, source="flashinfer", timer="graph"):
    return {"benchmarks": [{"extra_info": {"definition": definition, "source": source, "median_us": median,
                                           "q1_us": median - iqr / 2, "q3_us": median + iqr / 2, "iqr_us": iqr,
                                           "timer": timer, "size": "medium", "op_type": "rmsnorm"}}]}


@pytest.fixture
def results(tmp_path):
    root = tmp_path / "results"
    cpu = [rec("test_output_shape[small-rmsnorm_h4096]", "passed"),
           rec("test_matches_ground_truth[small-0-rmsnorm_h4096-torch]", "passed", source="torch"),
           rec("test_matches_ground_truth[small-0-rmsnorm_h4096-flashinfer]", "skipped", source="flashinfer",
               message="not-installed: flashinfer", skip_kind="not-installed"),
           rec("test_matches_ground_truth[small-0-gemm_n4096_k4096-flashinfer]", "skipped", "gemm_n4096_k4096",
               "flashinfer", "api-missing: flashinfer 0.5.3 has no mm_bf16", skip_kind="api-missing")]
    write_session(root / "references-cpu", SessionInfo("references-cpu", "cpu-torch2.13", arch="cpu",
                                                       finished="2026-11-22T10:00:00"),
                  records=cpu, manifest=manifest("cpu-torch2.13", {"torch": "2.13.0"}, "none"))
    gpu = [rec("test_matches_ground_truth[small-0-rmsnorm_h4096-flashinfer]", "passed", source="flashinfer",
               compared=[{"output": "output", "tolerance_used": 0.21}]),
           rec("test_matches_ground_truth[medium-0-rmsnorm_h4096-flashinfer]", "passed", source="flashinfer",
               compared=[{"output": "output", "tolerance_used": 0.34}]),
           rec("test_matches_ground_truth[small-0-gemm_n4096_k4096-flashinfer]", "failed", "gemm_n4096_k4096",
               "flashinfer", "Mismatch: 1 of 1 output(s) differ [bug]"),
           rec("test_matches_ground_truth[small-0-moe_x-flashinfer]", "skipped", "moe_x", "flashinfer",
               "arch-unsupported: needs sm100..sm103, have sm90", skip_kind="arch-unsupported"),
           rec("test_matches_ground_truth[small-0-mla_x-flashinfer]", "timeout", "mla_x", "flashinfer",
               "no result after 900 s"),
           rec("test_matches_ground_truth[small-0-gqa_x-flashinfer]", "error", "gqa_x", "flashinfer",
               "process died with SIGSEGV"),
           rec("test_matches_ground_truth[small-0-rope_x-flashinfer]", "xfailed", "rope_x", "flashinfer",
               "known issue k1"),
           rec("test_matches_ground_truth[small-0-silu_x-flashinfer]", "failed", "silu_x", "flashinfer",
               "[XPASS(strict)] known issue k2")]
    pins = {"torch": "2.11.0", "flashinfer-python": "0.6.6"}
    write_session(root / "references-cuda13", SessionInfo("references-cuda13", "cu130-fi066", status="tests-failed",
                                                          arch="sm90", finished="2026-11-22T11:00:00"),
                  records=gpu, manifest=manifest("cu130-fi066", pins, "13", "9.0"))
    bench = root / "bench-cuda13"
    write_session(bench, SessionInfo("bench-cuda13", "cu130-fi066", arch="sm90", finished="2026-11-22T11:30:00"),
                  records=[], manifest=manifest("cu130-fi066", pins, "13", "9.0"))
    write_json(bench / "benchmark.json", bench_json("rmsnorm_h4096", 1.72, 0.02))
    write_session(root / "references-old", SessionInfo("references-old", "cu128-fi041", status="install-failed",
                                                       reason="apache-tvm-ffi==0.1.0b15 is gone", arch="any"))
    (root / "references-broken").mkdir()
    (root / "references-broken" / "session.json").write_text("{not json")
    return root


def cells_of(matrix):
    return {(c["definition"], c["environment"]): c for c in matrix["cells"]}


def test_build_gives_every_state_and_merges_bench_timings(results, tmp_path):
    m = build([results, tmp_path / "missing"], definitions_dir=ROOT / "definitions")
    envs = {e["id"]: e for e in m["environments"]}
    assert set(envs) == {"cpu-torch2.13@cpu", "cu130-fi066@sm90", "cu128-fi041@any", "references-broken@any"}
    gpu = envs["cu130-fi066@sm90"]
    assert gpu["sessions"] == ["bench-cuda13", "references-cuda13"] and gpu["gpu"] == "NVIDIA H100 80GB HBM3"
    assert gpu["label"] == "CUDA 13 / torch 2.11.0 / flashinfer 0.6.6 / sm90" and gpu["status"] == "tests-failed"
    c = cells_of(m)
    g = "cu130-fi066@sm90"
    assert c[("rmsnorm_h4096", g)]["state"] == "pass" and c[("rmsnorm_h4096", g)]["timing"]["median_us"] == 1.72
    assert c[("gemm_n4096_k4096", g)]["state"] == "fail" and "bug" in c[("gemm_n4096_k4096", g)]["reason"]
    assert c[("moe_x", g)]["state"] == "skip:arch"
    assert c[("mla_x", g)]["state"] == "timeout" and c[("gqa_x", g)]["state"] == "error"
    assert c[("rope_x", g)]["state"] == "xfail" and c[("silu_x", g)]["state"] == "xpass"
    cpu = c[("rmsnorm_h4096", "cpu-torch2.13@cpu")]
    assert cpu["state"] == "skip:not-installed" and cpu["sources"]["torch"]["state"] == "pass"
    assert cpu["checks"] == {"pass": 1}
    # the closest a pass came to its tolerance, where the records say (older results: no key at all)
    assert c[("rmsnorm_h4096", g)]["sources"]["flashinfer"]["tolerance_used"] == 0.34
    assert "tolerance_used" not in cpu["sources"]["torch"]
    assert c[("gemm_n4096_k4096", "cpu-torch2.13@cpu")]["state"] == "skip:api-missing"
    assert all(c[(d["name"], "cu128-fi041@any")]["state"] == "install-failed" for d in m["definitions"])
    assert all(c[(d["name"], "references-broken@any")]["state"] == "error" for d in m["definitions"])
    problems = {Path(p["path"]).name: p["problem"] for p in m["problems"]}
    assert problems["session.json"].startswith("corrupt") and problems["missing"].startswith("missing")
    ops = {d["name"]: (d["op_type"], d["models"]) for d in m["definitions"]}
    assert ops["rmsnorm_h4096"] == ("rmsnorm", ["llama-3.1-8b", "mixtral-8x7b", "nemotron-h-8b"])


def test_markdown_has_groups_symbols_legend_and_problems(results):
    md = render_md(build([results]))
    assert "## rmsnorm" in md and "| `rmsnorm_h4096` |" in md
    assert "✅ 1.7 µs" in md and "⬜ (torch ✅)" in md and "📦" in md and "⭐" in md and "🟡" in md
    assert "CUDA 13<br>torch 2.11.0<br>flashinfer 0.6.6<br>sm90" in md
    assert "## Legend" in md and "## Problems with the inputs" in md and "**install-failed**" in md


def test_cli_build_writes_the_three_files(results, tmp_path, capsys):
    out = tmp_path / "matrix"
    assert matrix_main(["build", str(results), "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "matrix.json", "matrix.md"]
    assert json.loads((out / "matrix.json").read_text())["schema_version"] == 1
    assert "problem:" in capsys.readouterr().err


def test_diff_catches_planted_regressions(results, tmp_path, capsys):
    old = build([results])
    new = copy.deepcopy(old)
    cells = cells_of(new)
    cells[("rmsnorm_h4096", "cu130-fi066@sm90")]["timing"].update(median_us=2.5, q1_us=2.49, q3_us=2.51)
    cells[("rmsnorm_h4096", "cpu-torch2.13@cpu")]["state"] = "fail"
    new["cells"] = [c for c in new["cells"] if c["definition"] != "mla_x"]
    d = diff_matrices(old, new)
    assert d.regressed
    assert [(r["definition"], r["old"], r["new"]) for r in d.regressions] == [("rmsnorm_h4096", "skip:not-installed",
                                                                              "fail")]
    assert [s["definition"] for s in d.slower] == ["rmsnorm_h4096"] and d.slower[0]["ratio"] > 1.4
    assert {v["definition"] for v in d.vanished} == {"mla_x"}
    md = render_diff_md(d)
    assert "❌ regressions" in md and "### Status regressions" in md and "### Slower" in md
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    summary = tmp_path / "summary.md"
    args = ["diff", str(tmp_path / "old.json"), str(tmp_path / "new.json"), "--markdown", str(summary)]
    assert matrix_main(args) == 1
    assert "Status regressions" in summary.read_text()
    assert matrix_main(["diff", str(tmp_path / "old.json"), str(tmp_path / "old.json")]) == 0
    assert "no regressions" in capsys.readouterr().out


def test_a_kernel_left_out_by_a_run_false_known_issue_shows_as_not_run(results, tmp_path):
    """The sweep leaves FlashInfer's fp8 MoE out on sm90 (a 41-minute module): its cell must say that, not
    the SGLang skip of the same definition; a source with records, another arch or release is untouched."""
    recs = [rec("test_matches_ground_truth[small-0-moe_z-torch]", "passed", "moe_z", "torch"),
            rec("test_matches_ground_truth[small-0-moe_z-sglang]", "skipped", "moe_z", "sglang",
                "not-installed: sglang", skip_kind="not-installed")]
    write_session(tmp_path / "references-x", SessionInfo("references-x", "cu130-fi066", arch="sm90",
                                                        finished="2026-11-22T12:00:00"),
                  records=recs, manifest=manifest("cu130-fi066", {"flashinfer-python": "0.6.6"}, "13", "9.0"))
    toml = tmp_path / "known.toml"
    toml.write_text('[[issue]]\nid = "slow-moe"\ndefinitions = ["moe_*"]\nsources = ["flashinfer"]\n'
                    'packages = { flashinfer-python = ">=0.4" }\narchs = ["sm90"]\nreason = "41 min to build"\n'
                    'link = "docs"\nexpires = 2099-01-01\nrun = false\n')
    issues = load_known_issues(toml)
    c = cells_of(build([tmp_path / "references-x"], known_issues=issues))[("moe_z", "cu130-fi066@sm90")]
    assert c["state"] == "not-run" and "known issue slow-moe" in c["reason"]
    assert c["sources"]["flashinfer"]["state"] == "not-run" and c["sources"]["sglang"]["state"] == "skip:not-installed"
    plain = cells_of(build([tmp_path / "references-x"]))[("moe_z", "cu130-fi066@sm90")]
    assert plain["state"] == "skip:not-installed" and "flashinfer" not in plain["sources"]
    ran = cells_of(build([results], known_issues=issues))  # moe_x has a FlashInfer record: it stands
    assert ran[("moe_x", "cu130-fi066@sm90")]["state"] == "skip:arch"
    toml.write_text(toml.read_text().replace('">=0.4"', '">=0.7"'))  # another release: not covered
    other = cells_of(build([tmp_path / "references-x"], known_issues=load_known_issues(toml)))
    assert other[("moe_z", "cu130-fi066@sm90")]["state"] == "skip:not-installed"


def test_a_source_keeps_the_paths_it_passed_over():
    """FlashInfer's fp8 MoE on sm90: the cutlass kernel passes, trtllm-gen's is arch-gated; the cell says both."""
    from flashinfer_trace.matrix.build import Environment, cell

    gate = {"api": "flashinfer.fused_moe.trtllm_fp8_block_scale_moe", "reason": "arch-unsupported: needs sm100..sm103"}
    gt = {"source": "flashinfer", "api": "flashinfer.fused_moe.cutlass_fused_moe", "passed_over": [gate]}
    tests = [rec(f"test_matches_ground_truth[small-{s}-moe_x-flashinfer]", "passed", "moe_x", "flashinfer",
                 ground_truth=gt).as_dict() for s in (0, 1)]
    tests.append(rec("test_matches_ground_truth[small-0-moe_x-torch]", "passed", "moe_x", "torch").as_dict())
    env = Environment(id="e", combination="c", arch="sm90")
    c = cell("moe_x", env, [from_v1(t) for t in tests])
    assert c["state"] == "pass" and c["sources"]["flashinfer"]["passed_over"] == [gate]
    assert "passed_over" not in c["sources"]["torch"]


def test_diff_says_which_sessions_gained_or_lost_timings(results):
    """A bench session added to a snapshot changes no state and no like-for-like timing: the diff still
    says so, per environment and timer, and a timing that went is said too (neither is a regression)."""
    old = build([results])
    key = ("rmsnorm_h4096", "cu130-fi066@sm90")
    timing = cells_of(old)[key]["timing"]
    untimed = copy.deepcopy(old)
    cells_of(untimed)[key]["timing"] = None
    gained, lost = diff_matrices(untimed, old), diff_matrices(old, untimed)
    assert [(t["definition"], t["timer"]) for t in gained.timed] == [("rmsnorm_h4096", timing["timer"])]
    assert [t["definition"] for t in lost.untimed] == ["rmsnorm_h4096"] and not lost.timed
    assert not gained.regressed and not lost.regressed
    md = render_diff_md(gained)
    assert "1 newly timed, 0 no longer timed" in md and "### Newly timed" in md
    assert f"| cu130-fi066@sm90 | {timing['timer']} | {timing['source']} | 1 |" in md


def test_two_releases_columns_diff_like_two_runs(results, tmp_path, capsys):
    """--envs: one environment's column against another's (two releases of one snapshot)."""
    m = build([results])
    envs = [e["id"] for e in m["environments"]]
    old_env = next(i for i in envs if i.startswith("cu130-fi066"))
    new = copy.deepcopy(m)
    twin = copy.deepcopy([c for c in new["cells"] if c["environment"] == old_env])
    for c in twin:
        c["environment"] = "cu130-fi072@sm90"
    new["cells"] += twin
    new["environments"].append({**next(e for e in m["environments"] if e["id"] == old_env),
                                "id": "cu130-fi072@sm90"})
    moved = {c["definition"]: c for c in twin}
    moved["rmsnorm_h4096"]["timing"].update(median_us=2.5, q1_us=2.49, q3_us=2.51)
    name, cell = next((n, c) for n, c in moved.items() if c["state"] not in BROKEN and n != "rmsnorm_h4096")
    cell["state"] = "fail"
    d = diff_environments(new, new, old_env, "cu130-fi072")  # a unique start of an id will do
    assert [(r["definition"], r["environment"]) for r in d.regressions] == [(name, f"{old_env} -> cu130-fi072@sm90")]
    assert [s["definition"] for s in d.slower] == ["rmsnorm_h4096"] and not d.new and not d.vanished
    (tmp_path / "m.json").write_text(json.dumps(new))
    assert matrix_main(["diff", str(tmp_path / "m.json"), str(tmp_path / "m.json"), "--envs", old_env,
                        "cu130-fi072"]) == 1
    assert f"{old_env} -\\> cu130-fi072@sm90" in capsys.readouterr().out  # Markdown: ">" escaped
    with pytest.raises(SystemExit, match="environment 'cu130': matches"):
        matrix_main(["diff", str(tmp_path / "m.json"), str(tmp_path / "m.json"), "--envs", "cu130", old_env])
    with pytest.raises(SystemExit, match="'sm100': not found"):
        matrix_main(["diff", str(tmp_path / "m.json"), str(tmp_path / "m.json"), "--envs", "sm100", old_env])


def test_releases_page_is_the_pairs_diffs_in_order(results, tmp_path, capsys):
    """`matrix releases`: one snapshot's environments diffed pair by pair, the page rebuilt by a command."""
    m = build([results])
    (tmp_path / "m.json").write_text(json.dumps(m))
    gpu, cpu = (next(e["id"] for e in m["environments"] if e["id"].startswith(p)) for p in ("cu130-fi066", "cpu"))
    out = tmp_path / "releases.md"
    assert matrix_main(["releases", str(tmp_path / "m.json"), "--pair", "cpu", "cu130", "--pair", "cu130", "cpu",
                        "-o", str(out), "--note", "timed on one node"]) == 0  # a report: exit 0 with regressions
    page = out.read_text()
    assert page.startswith("# Release to release (`matrix releases M --pair cpu cu130 --pair cu130 cpu`)")
    assert "timed on one node" in page
    first, second = page.index(f"**{cpu} → {gpu}**"), page.index(f"**{gpu} → {cpu}**")
    assert first < second and page.count("## Matrix diff:") == 2
    # each section is `matrix diff --envs` of that pair: the gemm cell that fails on the GPU regresses cpu -> gpu
    assert "❌ regressions" in page[first:second] and "gemm_n4096_k4096" in page[first:second]
    with pytest.raises(SystemExit, match="'sm100': not found"):
        matrix_main(["releases", str(tmp_path / "m.json"), "--pair", "sm100", "cpu"])


def test_perf_within_the_recorded_spread_is_not_a_regression(results):
    old = build([results])
    new = copy.deepcopy(old)
    t = cells_of(new)[("rmsnorm_h4096", "cu130-fi066@sm90")]["timing"]
    t.update(median_us=1.73, q1_us=1.72, q3_us=1.74)  # inside 3x the spread (floored at 1% of the median)
    assert not diff_matrices(old, new).regressed
    t.update(timer="events", median_us=9.0, q1_us=8.9, q3_us=9.1)  # another timer: not like for like
    assert not diff_matrices(old, new).slower


ISSUE = """
[[issue]]
id = "k1"
definitions = ["rmsnorm_*"]
sources = ["torch"]
packages = {{ torch = ">=2" }}
reason = "planted"
link = "https://example.invalid/1"
expires = {expires}
"""


def test_known_issues_load_and_apply(tmp_path):
    path = tmp_path / "known-issues.toml"
    path.write_text(ISSUE.format(expires=date.today() + timedelta(days=30)))
    (issue,) = load_known_issues(path)
    versions = installed_versions({"torch"})
    assert issue.applies("rmsnorm_h4096", "torch", versions, None)
    assert not issue.applies("rmsnorm_h4096", "flashinfer", versions, None)
    assert not issue.applies("gemm_n4096_k4096", "torch", versions, None)
    assert not issue.applies("rmsnorm_h4096", "torch", {"torch": None}, None)  # not installed: no match
    assert not issue.expired() and issue.expired(date.today() + timedelta(days=31))
    assert load_known_issues(tmp_path / "none.toml") == []
    shipped = load_known_issues(ROOT / "constraints" / "known-issues.toml")
    assert shipped and all(not i.expired() for i in shipped), "a shipped known issue has expired"


@pytest.mark.parametrize("text,field", [
    ('[[issue]]\nid = "a"\n', "definitions"),
    (ISSUE.format(expires='"soon"'), "expires"),
    (ISSUE.format(expires="2030-01-01").replace('">=2"', '"two"'), "packages.torch"),
    (ISSUE.format(expires="2030-01-01").replace('id = "k1"', 'id = "k1"\ncolour = 1'), "unknown field"),
    (ISSUE.format(expires="2030-01-01") * 2, "used twice"),
])
def test_known_issue_errors_name_the_field(tmp_path, text, field):
    path = tmp_path / "known-issues.toml"
    path.write_text(text)
    with pytest.raises(KnownIssueError, match=field):
        load_known_issues(path)


PLANTED = '''
import pytest

from flashinfer_trace.results.record import CaseRecord

CASES = [CaseRecord(definition=d, check="match", source="torch", status="not-run")
         for d in ("rmsnorm_h4096", "rmsnorm_h8", "gemm_n4096_k4096")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.definition)
def test_case(case):
    assert case.definition != "rmsnorm_h4096"
'''


def _run_planted(tmp_path, expires):
    (tmp_path / "conftest.py").write_text("from flashinfer_trace.pytest_plugin import *  # noqa\n")
    (tmp_path / "test_planted.py").write_text(PLANTED)
    issues = tmp_path / "known-issues.toml"
    issues.write_text(ISSUE.format(expires=expires))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device=cpu",
                           f"--known-issues={issues}", str(tmp_path / "test_planted.py"), "-rxX"],
                          cwd=tmp_path, capture_output=True, text=True)


def test_known_issues_are_strict_xfail_and_an_expired_one_stops_the_run(tmp_path):
    out = _run_planted(tmp_path, date.today() + timedelta(days=30))
    # rmsnorm_h4096 fails as known (xfail); rmsnorm_h8 matches the glob but passes: a strict XPASS fails
    assert "1 failed" in out.stdout and "1 passed" in out.stdout and "1 xfailed" in out.stdout, out.stdout
    assert "XPASS(strict)" in out.stdout and "known issue k1" in out.stdout
    expired = _run_planted(tmp_path, date.today() - timedelta(days=1))
    assert expired.returncode == 4 and "expired known issue" in (expired.stdout + expired.stderr)


def test_a_not_run_known_issue_is_lifted_where_the_prebuild_has_the_module(tmp_path, monkeypatch):
    """`unless_jit_ready`: the fp8 MoE entry exists because its build outlasts a session; where the
    session's JIT report has the test's modules (built or cached), the test runs and fails for real."""
    (tmp_path / "conftest.py").write_text("from flashinfer_trace.pytest_plugin import *  # noqa\n")
    (tmp_path / "test_planted.py").write_text(PLANTED)
    issues = tmp_path / "known-issues.toml"
    entry = ISSUE.format(expires=date.today() + timedelta(days=30))
    issues.write_text(entry + "run = false\nunless_jit_ready = true\n")
    report = tmp_path / "jit.jsonl"

    def run(status):
        report.write_text(json.dumps({"definition": "rmsnorm_h4096", "source": "torch", "status": status}) + "\n")
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device=cpu",
                               f"--known-issues={issues}", f"--jit-report={report}", str(tmp_path / "test_planted.py"),
                               "-rxX"],
                              cwd=tmp_path, capture_output=True, text=True).stdout

    timed_out = run("build-timeout")  # the module is not there: both rmsnorm tests not run, as known
    assert "2 xfailed" in timed_out and "[NOTRUN]" in timed_out and " failed" not in timed_out, timed_out
    for status in ("cached", "built"):  # it is there: rmsnorm_h4096 runs and its planted failure shows;
        out = run(status)  # rmsnorm_h8, which the report does not name, stays not run
        assert "1 failed" in out and "1 xfailed" in out, (status, out)


def _ci_plan():
    spec = importlib.util.spec_from_file_location("ci_plan", ROOT / "scripts" / "ci_plan.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ci_plan_splits_gpu_and_cpu_jobs():
    listed = [{"name": "references-cpu-torch2.13", "tags": ["references", "cpu", "combo:cpu-torch2.13", "nightly"]},
              {"name": "references-x-sm90", "tags": ["references", "cuda13", "combo:x", "sm90", "nightly"]},
              {"name": "references-old", "tags": ["references", "cuda12", "combo:old", "uninstallable", "nightly"]}]
    plan = _ci_plan().plan(listed)
    assert plan["gpu"] == [{"session": "references-x-sm90", "combination": "x", "cuda": "cuda13", "arch": "sm90"}]
    assert [e["session"] for e in plan["cpu"]] == ["references-cpu-torch2.13", "references-old"]


def test_how_references_ran_is_labelled_from_the_manifest():
    from flashinfer_trace.sweep.manifest import sandbox_label

    confined = {"sandbox": {"confinement": {"complete": True, "active": {"landlock": "x"}, "missing": {}}}}
    allowed = {"sandbox": {"confinement": {"complete": False, "missing": {"landlock": "ENOSYS", "seccomp": "no lib"},
                                           "allow_unconfined": True}}}
    refused = {"sandbox": {"confinement": {"complete": False, "missing": {"seccomp": "no lib"}}}}
    assert sandbox_label(confined) == "confined"
    assert sandbox_label(allowed) == "unconfined (allowed): landlock, seccomp missing"
    assert sandbox_label(refused) == "refused: seccomp missing"
    assert sandbox_label({}) is None and sandbox_label({"sandbox": {"error": "boom"}}).startswith("unknown: boom")


def test_a_cell_says_which_kernel_path_ran():
    from flashinfer_trace.matrix.build import Environment, cell

    api = "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)"
    tests = [{"nodeid": f"tests/references/test_gqa_paged.py::test_matches_ground_truth[{i}]", "status": "passed",
              "properties": {"definition": "d", "source": "flashinfer", "ground_truth": {"api": api}}}
             for i in range(2)]
    c = cell("d", Environment("e", "c", "sm90"), [from_v1(t) for t in tests])
    assert c["state"] == "pass" and c["sources"]["flashinfer"]["api"] == api


def test_a_jit_session_gives_the_build_times_per_module_and_is_no_problem(results):
    """The sessions of a combination share one JIT cache: the jit session compiled, the references session
    after it found everything cached. The matrix reports the compiling prebuild and each module's time."""
    pins = {"torch": "2.11.0", "flashinfer-python": "0.6.6"}
    refs = json.loads((results / "references-cuda13" / "session.json").read_text())
    refs["jit"] = {"counts": {"cached": 3}, "wall_seconds": 1.2}
    write_json(results / "references-cuda13" / "session.json", refs)
    jit = results / "jit-cuda13"
    info = SessionInfo("jit-cuda13", "cu130-fi066", arch="sm90", finished="2026-11-22T10:30:00")
    info.jit = {"counts": {"built": 2, "cached": 1}, "wall_seconds": 300.0, "modules_built": ["norm", "sampling"]}
    write_session(jit, info, manifest=manifest("cu130-fi066", pins, "13", "9.0"))
    (jit / "jit.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"definition": "rmsnorm_h4096", "status": "built", "seconds": 40.04, "modules": ["norm"]},
        {"definition": "top_k_v1", "status": "built", "seconds": 108.6, "modules": ["sampling"]},
        {"definition": "rmsnorm_h2048", "status": "cached", "seconds": 0.1, "modules": []},
        {"definition": "moe_x", "status": "build-timeout", "seconds": 600.0, "modules": []}]))
    m = build([results], definitions_dir=ROOT / "definitions")
    assert not [p for p in m["problems"] if "jit-cuda13" in p["path"]]
    env = {e["id"]: e for e in m["environments"]}["cu130-fi066@sm90"]
    assert env["jit"]["session"] == "jit-cuda13" and env["jit"]["counts"] == {"built": 2, "cached": 1}
    assert [(x["module"], x["seconds"], x["definition"]) for x in env["jit"]["modules"]] == [
        ("sampling", 108.6, "top_k_v1"), ("norm", 40.0, "rmsnorm_h4096")]
    md = render_md(m)
    assert "## JIT builds per module" in md and "| `sampling` | 108.6 | `top_k_v1` |" in md


def test_a_snapshot_may_keep_tests_json_gzipped(results):
    """The committed snapshot's large files are compressed (the tree travels to the GPU node, 64 MiB a call)."""
    import gzip

    before = build([results], definitions_dir=ROOT / "definitions")
    tests = results / "references-cuda13" / "tests.json"
    tests.with_name("tests.json.gz").write_bytes(gzip.compress(tests.read_bytes()))
    tests.unlink()
    after = build([results], definitions_dir=ROOT / "definitions")
    assert cells_of(after) == cells_of(before) and after["problems"] == before["problems"]
    tests.with_name("tests.json.gz").write_bytes(b"\x1f\x8b truncated")
    broken = build([results], definitions_dir=ROOT / "definitions")
    assert any("tests.json.gz" in p["path"] and p["problem"].startswith("corrupt") for p in broken["problems"])


def test_combinations_without_results_are_listed_as_not_run_with_the_reason(results):
    """CUDA 12 combinations have no node here: the matrix says so instead of leaving them out unseen."""
    from flashinfer_trace.matrix.render_html import render_html
    from flashinfer_trace.sweep.combos import load_combinations

    combos = load_combinations(ROOT / "constraints")
    m = build([results], definitions_dir=ROOT / "definitions", combinations=combos, not_run_note="no CUDA 12 node")
    missing = {c["combination"]: c for c in m["not_run"]}
    assert "cu128-torch2.9-fi0.6.6" in missing and "cpu-torch2.13" not in missing  # the fixture ran the CPU one
    assert missing["cu128-torch2.9-fi0.6.6"]["cuda"] == "12"
    assert missing["cu128-torch2.9-fi0.6.6"]["reason"] == "no session results in these inputs: no CUDA 12 node"
    assert "## Combinations not run" in render_md(m) and "no CUDA 12 node" in render_html(m)
    assert build([results], definitions_dir=ROOT / "definitions")["not_run"] == []
    m = build([results], definitions_dir=ROOT / "definitions", combinations=combos,
              not_run_note=["cu128=no CUDA 12 node", "cu130-torch2.14.1=the node's torch is 2.11", "not carried"])
    why = {c["combination"]: c["reason"].split(": ", 1)[1] for c in m["not_run"]}
    assert why["cu128-torch2.9-fi0.6.6"] == "no CUDA 12 node"
    assert why["cu130-torch2.14.1-fi0.7.2-sglang0.5.23"] == "the node's torch is 2.11"
    assert why["cu130-torch2.11-fi0.6.15.post1-sglang0.5.17"] == "not carried"


def test_a_new_definition_in_a_known_uninstallable_environment_is_no_regression(results):
    """The 0.4.1 combination was install-failed before: a definition added since is install-failed there
    too, which changes nothing; a new broken cell anywhere else still counts."""
    old = build([results], definitions_dir=ROOT / "definitions")
    new = copy.deepcopy(old)
    new["cells"] += [{"definition": "new_def", "environment": "cu128-fi041@any", "state": "install-failed",
                      "reason": "known uninstallable"},
                     {"definition": "new_def", "environment": "cu130-fi066@sm90", "state": "fail", "reason": "bug"}]
    d = diff_matrices(old, new)
    assert [(r["definition"], r["environment"]) for r in d.regressions] == [("new_def", "cu130-fi066@sm90")]
    assert len(d.new) == 2


def test_a_multi_line_reason_stays_in_its_table_row(results):
    old = build([results], definitions_dir=ROOT / "definitions")
    new = copy.deepcopy(old)
    new["cells"].append({"definition": "new_def", "environment": "cu130-fi066@sm90", "state": "fail",
                         "reason": "Mismatch: 2 of 2 differ\n  query_out: 99% | out\n  key_out: 98%"})
    md = render_diff_md(diff_matrices(old, new))
    row = next(line for line in md.splitlines() if line.startswith("| new_def"))
    assert row.endswith("| Mismatch: 2 of 2 differ query_out: 99% \\| out key_out: 98% |")


def test_a_cell_shows_each_path_checked_and_which_failed():
    """Decode on CUDA cores passes, on tensor cores it fails at an edge case, its CUDA-graph path is flaky."""
    from flashinfer_trace.matrix.build import Environment, cell
    from flashinfer_trace.matrix.render_html import _cell_title
    from flashinfer_trace.results.record import CaseRecord

    def r(path, status, kind=None, detail=None):
        return CaseRecord(definition="dec", check="match", source="flashinfer", path=path, status=status, kind=kind,
                          detail=detail, size="small", seed=0)

    tests = [r(None, "pass"), r("tensor-cores", "pass"), r("tensor-cores", "fail", "mismatch", "lse off by 2.9e4"),
             r("graph", "fail", "flaky-wrong", "wrong in 2/5 runs"),
             CaseRecord(definition="dec", check="match", source="torch", status="pass")]
    c = cell("dec", Environment(id="e", combination="c", arch="sm90"), tests)
    paths = c["sources"]["flashinfer"]["paths"]
    assert {k: v["state"] for k, v in paths.items()} == {"plain": "pass", "tensor-cores": "fail",
                                                          "graph": "flaky-wrong"}
    assert paths["tensor-cores"]["reason"] == "lse off by 2.9e4" and c["state"] == "fail"
    assert "paths" not in c["sources"]["torch"]
    title = _cell_title("dec", {}, c, {})
    assert "path tensor-cores: fail — lse off by 2.9e4" in title and "path graph: flaky-wrong" in title


def test_the_torch_axis_gives_one_column_per_torch_version_and_a_difference_is_a_cell(tmp_path):
    """Two CPU sessions of the torch axis (cpu-torch2.8, cpu-torch2.13): each its own environment, labelled with its
    torch, in version order (2.8 before 2.13, not string order); a definition that passes on one and fails on the
    other is a differing cell, and `matrix diff --envs` between the two columns reports it."""
    root = tmp_path / "results"
    for minor, patch, state in ((13, "2.13.0", "passed"), (8, "2.8.0", "failed")):
        combo = f"cpu-torch2.{minor}"
        records = [rec("test_matches_ground_truth[small-0-rmsnorm_h4096-torch]", state, source="torch",
                       message=None if state == "passed" else "Mismatch: 1 of 1 output(s) differ [bug]"),
                   rec("test_matches_ground_truth[small-0-gemm_n4096_k4096-torch]", "passed", "gemm_n4096_k4096",
                       "torch")]
        write_session(root / f"references-{combo}", SessionInfo(f"references-{combo}", combo, arch="cpu",
                                                                finished="2026-11-26T10:00:00"),
                      records=records, manifest=manifest(combo, {"torch": patch}, "none"))
    m = build([root])
    envs = [(e["id"], e["torch"], e["label"]) for e in m["environments"]]
    assert envs == [("cpu-torch2.8@cpu", "2.8.0", "CPU / torch 2.8.0 / no flashinfer"),
                    ("cpu-torch2.13@cpu", "2.13.0", "CPU / torch 2.13.0 / no flashinfer")]
    c = cells_of(m)
    assert c[("rmsnorm_h4096", "cpu-torch2.8@cpu")]["state"] == "fail"
    assert c[("rmsnorm_h4096", "cpu-torch2.13@cpu")]["state"] == "pass"
    assert c[("gemm_n4096_k4096", "cpu-torch2.8@cpu")]["state"] == c[("gemm_n4096_k4096", "cpu-torch2.13@cpu")]["state"]
    md = render_md(m)
    assert "torch 2.8.0" in md and "torch 2.13.0" in md
    newer = diff_environments(m, m, "cpu-torch2.8", "cpu-torch2.13")  # old torch -> new torch: fixed
    assert [(f["definition"], f["old"], f["new"]) for f in newer.fixed] == [("rmsnorm_h4096", "fail", "pass")]
    assert not newer.regressions and not newer.changed
    older = diff_environments(m, m, "cpu-torch2.13", "cpu-torch2.8")  # the other way: a regression
    assert [(r["definition"], r["new"]) for r in older.regressions] == [("rmsnorm_h4096", "fail")]


def _release_axis(tmp_path, versions):
    """One sm90 references session per flashinfer release (synthetic), plus an sglang one and the CPU one."""
    root = tmp_path / "axis"
    for i, v in enumerate(versions):
        cid = f"cu130-torch2.11-fi{v}"
        state = "failed" if v == "0.6.10" else "passed"  # a wrong result that appears in 0.6.10 and stays fixed after
        write_session(root / f"references-{cid}-sm90", SessionInfo(f"references-{cid}-sm90", cid, arch="sm90",
                                                                   finished=f"2026-11-26T10:{i:02d}:00"),
                      records=[rec("test_matches_ground_truth[small-0-rmsnorm_h4096-flashinfer]", state,
                                   source="flashinfer")],
                      manifest=manifest(cid, {"torch": "2.11.0", "flashinfer-python": v}, "13", "9.0"))
    sg = "cu130-torch2.11-fi0.6.15.post1-sglang0.5.17"
    write_session(root / f"references-{sg}-sm90", SessionInfo(f"references-{sg}-sm90", sg, arch="sm90"),
                  records=[rec("test_matches_ground_truth[small-0-rmsnorm_h4096-flashinfer]", "passed",
                               source="flashinfer")],
                  manifest=manifest(sg, {"torch": "2.11.0", "flashinfer-python": "0.6.15.post1", "sglang": "0.5.17"},
                                    "13", "9.0"))
    return root


RELEASES = ["0.6.0", "0.6.1", "0.6.2", "0.6.3", "0.6.4", "0.6.5", "0.6.6", "0.6.7", "0.6.7.post1", "0.6.7.post2",
            "0.6.7.post3", "0.6.8", "0.6.8.post1", "0.6.9", "0.6.10", "0.6.10.post1", "0.6.11", "0.6.11.post1",
            "0.6.12", "0.6.13", "0.6.14", "0.6.15", "0.6.15.post1", "0.6.16", "0.6.17", "0.6.18", "0.6.18.post1",
            "0.7.0", "0.7.0.post1", "0.7.1", "0.7.2", "0.7.2.post1"]


def test_the_release_axis_orders_by_version_and_pages_thirty_releases(tmp_path, capsys):
    """32 releases written in shuffled order: the matrix's columns and `matrix releases --sequence` follow the
    version (0.6.9, 0.6.10; 0.7.2, 0.7.2.post1), not string order, and the page leads with one row per pair."""
    import random

    shuffled = RELEASES[:]
    random.Random(0).shuffle(shuffled)
    m = build([_release_axis(tmp_path, shuffled)])
    ids = [e["id"] for e in m["environments"] if "sglang" not in e["id"]]
    assert ids == [f"cu130-torch2.11-fi{v}@sm90" for v in RELEASES]
    sg = [e["id"] for e in m["environments"]].index("cu130-torch2.11-fi0.6.15.post1-sglang0.5.17@sm90")
    assert [e["id"] for e in m["environments"]][sg + 1] == "cu130-torch2.11-fi0.6.15.post1@sm90"  # beside its release
    (tmp_path / "m.json").write_text(json.dumps(m))
    out = tmp_path / "releases.md"
    assert matrix_main(["releases", str(tmp_path / "m.json"), "--sequence", "cu130-torch2.11-fi", "--arch", "sm90",
                        "-o", str(out)]) == 0
    page = out.read_text()
    assert page.startswith("# Release to release (`matrix releases M --sequence cu130-torch2.11-fi --arch sm90`)")
    assert page.count("## Matrix diff:") == len(RELEASES) - 1 and "sglang" not in page  # the sglang env is not a step
    heads = [page.index(f"**cu130-torch2.11-fi{a}@sm90 → cu130-torch2.11-fi{b}@sm90**")
             for a, b in zip(RELEASES, RELEASES[1:], strict=False)]
    assert heads == sorted(heads)
    table = page[:heads[0]]
    rows = [r for r in table.splitlines() if r.startswith("| cu130")]
    assert len(rows) == len(RELEASES) - 1
    assert rows[RELEASES.index("0.6.9")].split(" | ")[2] == "1"  # 0.6.9 -> 0.6.10: the one regression
    assert rows[RELEASES.index("0.6.10")].split(" | ")[5] == "1"  # 0.6.10 -> 0.6.10.post1: fixed
    with pytest.raises(SystemExit, match="either --pair"):
        matrix_main(["releases", str(tmp_path / "m.json")])
    with pytest.raises(SystemExit, match="0 environment"):
        matrix_main(["releases", str(tmp_path / "m.json"), "--sequence", "cu128"])


def test_version_order_puts_post_releases_after_and_pre_releases_before_their_release():
    from flashinfer_trace.matrix.build import version_order

    ids = ["fi0.7.2.post1@sm90", "fi0.7.0@sm90", "fi0.7.2@sm90", "fi0.7.0rc1@sm90", "fi0.6.10@sm90", "fi0.6.9@sm90"]
    assert sorted(ids, key=version_order) == ["fi0.6.9@sm90", "fi0.6.10@sm90", "fi0.7.0rc1@sm90", "fi0.7.0@sm90",
                                              "fi0.7.2@sm90", "fi0.7.2.post1@sm90"]


def test_an_info_case_is_a_cell_of_its_own_neither_red_nor_a_pass(tmp_path):
    """A kernel that differs only where its API promises nothing (Status.INFO, verdict/contract.py): the cell, its
    source and its path are `info` with the reason; a real failure beside it still makes the cell red; matrix.json
    counts info cells apart, and the Markdown shows their symbol and the legend's line."""
    from flashinfer_trace.results.record import CaseRecord
    from flashinfer_trace.status import SYMBOL, CellState

    def r(definition, status, path=None, kind=None, detail=None, source="flashinfer", case="subnormal_query"):
        return CaseRecord(definition=definition, check="edge", source=source, path=path, status=status, kind=kind,
                          detail=detail, size="small", seed=0, case=case,
                          nodeid=f"tests/references/test_gqa_paged.py::t[{definition}-{source}-{path}-{case}]")

    why = "outside the contract (flashinfer-jit-fast-math-ftz: float32-subnormals): ..."
    records = [r("dec_a", "pass", case=None), r("dec_a", "info", kind="outside-contract", detail=why),
               r("dec_a", "pass", "tensor-cores"), r("dec_a", "pass", source="torch"),
               r("dec_b", "info", kind="outside-contract", detail=why),
               r("dec_b", "fail", "tensor-cores", "mismatch", "lse off by 2.9e4", case="scores_far_negative")]
    pins = {"torch": "2.11.0", "flashinfer-python": "0.5.3"}
    write_session(tmp_path / "references-x", SessionInfo("references-x", "cu130-fi053", status="tests-failed",
                                                         arch="sm90", finished="2026-11-28T10:00:00"),
                  records=records, manifest=manifest("cu130-fi053", pins, "13", "9.0"))
    m = build([tmp_path])
    c = cells_of(m)
    a, b = c[("dec_a", "cu130-fi053@sm90")], c[("dec_b", "cu130-fi053@sm90")]
    assert a["state"] == "info" and a["reason"] == why
    assert a["sources"]["flashinfer"]["state"] == "info" and a["sources"]["torch"]["state"] == "pass"
    assert a["sources"]["flashinfer"]["paths"]["plain"]["state"] == "info"
    assert a["sources"]["flashinfer"]["paths"]["tensor-cores"]["state"] == "pass"
    assert a["sources"]["flashinfer"]["counts"] == {"pass": 2, "info": 1}
    assert b["state"] == "fail" and b["sources"]["flashinfer"]["paths"]["plain"]["state"] == "info"
    assert m["summary"] == {"info": 1, "fail": 1} and m["states"]["info"] == MEANING_INFO
    md = render_md(m)
    row = next(line for line in md.splitlines() if line.startswith("| `dec_a`"))
    assert row.endswith(f"| {SYMBOL[CellState.INFO]} |")
    assert f"{SYMBOL[CellState.INFO]} info: {MEANING_INFO}" in md


MEANING_INFO = "differs where the API promises nothing (docs/boundary/): informational, never red"

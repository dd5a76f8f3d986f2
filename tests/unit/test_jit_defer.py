"""Modules that cannot build within a session's budget do not hold the session: a references (or bench) session's
prebuild records a job expected past its budget as `deferred` at once (with the command that builds it), its cases
record `not-run: building`, the combination's `jit-` session builds it (resumably, beside the references session:
the install folder and the stamps they share are safe), and a later session that finds it cached runs the cases.
Stand-in builds (tests/unit/jit_standin_worker.py) keep it on the CPU."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from flashinfer_trace.sweep import jit

STANDIN = Path(__file__).with_name("jit_standin_worker.py")
ROOT = Path(__file__).resolve().parents[2]
FP8_MOE = "flashinfer.fused_moe.cutlass_fused_moe(use_deepseek_fp8_block_scale)"


def _job(name: str, op_type: str = "activation", budget: float = 30.0, api: str | None = None, **kw) -> jit.Job:
    return jit.Job(name, name, op_type, "flashinfer", api or f"flashinfer.{name}.call", budget, **kw)


def _config(folder: Path, plan: dict, **kw) -> jit.JitConfig:
    folder.mkdir(parents=True, exist_ok=True)
    plan = {**plan, "_timeline": str(folder / "timeline.jsonl")}
    (folder / "plan.json").write_text(json.dumps(plan))
    kw.setdefault("report", str(folder / "jit.jsonl"))
    return jit.JitConfig(device="cpu", log_dir=str(folder / "logs"), max_jobs=2,
                         worker_command=(sys.executable, str(STANDIN), str(folder / "plan.json")), **kw)


def _ran(folder: Path) -> set[str]:
    """The jobs a stand-in worker was given."""
    path = folder / "timeline.jsonl"
    return {json.loads(line)["definition"] for line in path.read_text().splitlines()} if path.is_file() else set()


# -- the plan's expectations ----------------------------------------------------------------------------
def test_an_expectation_says_where_it_comes_from():
    """The known fp8 CUTLASS MoE build on sm90 (> 600 s with 16 cores, measured), else the job's own last build,
    else the op type's guess; each expectation names its origin."""
    known = jit.known_build("flashinfer", FP8_MOE, "sm90", {"flashinfer-python": "0.5.3"})
    assert known is not None and known.seconds > jit.DEFAULT_BUDGET and "fused_moe_90" in known.modules
    assert "16 cores" in known.evidence
    assert jit.known_build("flashinfer", FP8_MOE, "sm100", {"flashinfer-python": "0.5.3"}) is None  # another arch
    assert jit.known_build("flashinfer", FP8_MOE, "sm90", {"flashinfer-python": "0.3.1"}) is None  # another release
    assert jit.known_build("flashinfer", FP8_MOE, "sm90", {}) is None  # not installed
    assert jit.known_build("flashinfer", "flashinfer.fused_moe.trtllm_bf16_moe", "sm90",
                           {"flashinfer-python": "0.5.3"}) is None
    assert jit.known_build("sglang", FP8_MOE, "sm90", {"flashinfer-python": "0.5.3"}) is None

    fp8 = _job("moe_fp8", "moe", api=FP8_MOE, expect=known.seconds, expect_from=known.evidence)
    bf16 = _job("moe_bf16", "moe")
    found = jit.expectations([fp8, bf16])
    assert found[fp8.key].seconds == known.seconds and found[fp8.key].origin == f"known: {known.evidence}"
    assert (found[bf16.key].seconds, found[bf16.key].origin) == (jit.GUESS["moe"], "guess: op type moe")
    built = jit.BuildRecord("moe_fp8", "flashinfer", "built", seconds=700.0)
    mine = jit.expectations([fp8], [built])[fp8.key]
    assert mine.seconds == 700.0 and mine.origin.startswith("report: built in 700 s")
    # a build-timeout is a lower bound: the larger of it and what else is known
    short = jit.expectations([fp8, bf16], [jit.BuildRecord("moe_fp8", "flashinfer", "build-timeout", seconds=600.4),
                                           jit.BuildRecord("moe_bf16", "flashinfer", "build-timeout", seconds=600.4)])
    assert short[fp8.key].seconds == known.seconds and "ran out of time after 600.4 s" in short[fp8.key].origin
    assert short[bf16.key].seconds == 600.4 and short[bf16.key].origin.startswith("report: build-timeout")
    assert jit.expected([fp8, bf16]) == {fp8.key: known.seconds, bf16.key: jit.GUESS["moe"]}


def test_the_plan_takes_a_known_build_for_its_arch_and_release(monkeypatch):
    import flashinfer_trace.groundtruth as gt

    monkeypatch.setattr(gt, "get_ground_truth", lambda source, d, **kw: SimpleNamespace(api=FP8_MOE))
    d = SimpleNamespace(name="moe_fp8_x", op_type="moe", source=None)
    config = jit.JitConfig(sources=("flashinfer",), arch="sm90")
    (job,) = jit.plan([d], config, versions={"flashinfer-python": "0.5.3"})
    assert job.expect and job.expect > config.budget and job.known_modules == ("fused_moe_90",)
    (other,) = jit.plan([d], jit.JitConfig(sources=("flashinfer",), arch="sm100"),
                        versions={"flashinfer-python": "0.5.3"})
    assert other.expect is None and other.known_modules == ()


# -- deferral --------------------------------------------------------------------------------------------
def test_a_job_expected_past_its_budget_is_deferred_at_once_while_the_short_ones_build(tmp_path):
    plan = {"long_a": {"seconds": 0.2}, "short_a": {"seconds": 0.5}, "short_b": {"seconds": 0.5}}
    jobs = [_job("long_a", "moe", budget=30.0, expect=5000.0, expect_from="planted"),
            _job("short_a"), _job("short_b", api="flashinfer.other.call")]
    config = _config(tmp_path / "refs", plan, workers=2, defer=True, defer_to="jit-cu130-x")
    builds = jit.run(jobs, config)
    # before a single build ended: the deferred record is in the report, its job ended in the state
    assert [(r.definition, r.status) for r in jit.read_report(config.report)] == [("long_a", "deferred")]
    state = json.loads(jit.state_path(config.report).read_text())
    assert state["jobs"]["flashinfer:long_a"]["ended"] and not state["jobs"]["flashinfer:short_a"]["ended"]
    assert jit.PrebuildWatch(config.report).outcome("long_a", "flashinfer").status == "deferred"  # no wait
    records = {r.definition: r for r in builds}
    long = records["long_a"]
    assert (long.status, long.seconds, long.expected, long.expected_from) == ("deferred", 0.0, 5000.0, "known: planted")
    assert "`nox -s jit-cu130-x -- -k long_a --jit-budget 7500`" in long.message
    assert "5000 s" in long.message and "budget of 30 s" in long.message
    assert long.covers == []  # no known build shares its module
    assert records["short_a"].status == records["short_b"].status == "built"
    assert records["short_a"].expected == jit.GUESS["activation"]  # every record says what was expected
    assert _ran(tmp_path / "refs") == {"short_a", "short_b"}  # the long one never reached a worker
    assert jit.summarise(records.values())["counts"] == {"deferred": 1, "built": 2}
    # the session starts the comparisons of the deferred definition first: nothing to wait for
    from flashinfer_trace.sweep.jit.pipeline import readiness

    assert readiness(jobs, settled=[long.key]) == {"long_a": 0.0, "short_a": jit.GUESS["activation"],
                                                   "short_b": jit.GUESS["activation"]}
    # a jit session's prebuild defers nothing: it builds the long job
    jit_config = _config(tmp_path / "jit", plan, workers=2)
    assert {r.definition: r.status for r in jit.run(jobs, jit_config)}["long_a"] == "built"
    assert "long_a" in _ran(tmp_path / "jit")


def test_a_long_job_whose_modules_are_here_is_not_deferred(tmp_path, monkeypatch):
    """Modules imported (`jit import` / `--jit-modules` place them in FlashInfer's AOT folder) or left in the JIT
    cache: the job runs (it loads them); one of its modules missing, and it is deferred."""
    aot, cache = tmp_path / "aot", tmp_path / "cache"
    (aot / "fused_moe_90").mkdir(parents=True)
    (aot / "fused_moe_90" / "fused_moe_90.so").write_bytes(b"\x7fELF")
    (cache / "90a" / "cached_ops" / "norm").mkdir(parents=True)
    (cache / "90a" / "cached_ops" / "norm" / "norm.so").write_bytes(b"\x7fELF")
    monkeypatch.setattr(jit.cache, "module_roots", lambda: [cache, aot])
    plan = {n: {"seconds": 0.1} for n in ("imported", "cached", "half", "unknown")}
    jobs = [_job("imported", "moe", expect=5000.0, known_modules=("fused_moe_90",)),
            _job("cached", "moe", expect=5000.0, known_modules=("norm",)),
            _job("half", "moe", expect=5000.0, known_modules=("fused_moe_90", "fused_moe_gone")),
            _job("unknown", "moe", expect=5000.0)]
    config = _config(tmp_path / "s", plan, workers=2, defer=True)
    found = {r.definition: r.status for r in jit.run(jobs, config)}
    assert found == {"imported": "built", "cached": "built", "half": "deferred", "unknown": "deferred"}
    assert _ran(tmp_path / "s") == {"imported", "cached"}


def test_a_stamp_of_the_jit_sessions_build_makes_the_long_job_cached(tmp_path):
    stamps = tmp_path / "flashinfer-trace-prebuilt.json"
    plan = {"long_a": {"seconds": 0.1}}
    job = _job("long_a", "moe", expect=5000.0)
    built = list(jit.run([job], _config(tmp_path / "jit", plan, workers=1, stamps=str(stamps))))
    assert [r.status for r in built] == ["built"]
    later = list(jit.run([job], _config(tmp_path / "refs", plan, workers=1, stamps=str(stamps), defer=True)))
    assert [(r.status, r.checked_by) for r in later] == [("cached", "stamp")]


def test_two_prebuilds_sharing_a_cache_keep_each_others_stamps(tmp_path):
    """A jit- session and its references session stamp into one file beside the combination's JIT cache, each from
    what it read at its start: neither may drop the other's entries."""
    path = tmp_path / "stamps.json"
    mine, theirs = jit.Stamps(path), jit.Stamps(path)
    for stamps, name in ((mine, "moe_fp8"), (theirs, "rmsnorm")):
        r = jit.BuildRecord(name, "flashinfer", "built")
        r.job, r.libraries = _job(name), {}
        stamps.record(r)
    assert set(json.loads(path.read_text())) == {"flashinfer:moe_fp8", "flashinfer:rmsnorm"}


# -- the cases -------------------------------------------------------------------------------------------
def _deferred_report(tmp_path: Path, definition: str, api: str) -> Path:
    report = tmp_path / "jit.jsonl"
    report.write_text(json.dumps(jit.BuildRecord(
        definition, "flashinfer", "deferred", api=api, message="not built here: expected 2460 s; build it with "
        f"`nox -s jit-x -- -k {definition} --jit-budget 3900`").as_dict()) + "\n")
    return report


def test_a_deferred_module_makes_its_cases_not_run_building_never_a_skip_or_an_error(tmp_path):
    from flashinfer_trace.check import Case, CheckConfig, Memo, outcome_of, run_case
    from flashinfer_trace.dataset import load_definition
    from flashinfer_trace.groundtruth import GroundTruthUnavailable, base
    from flashinfer_trace.pytest_plugin import _Engine
    from flashinfer_trace.results.record import Check
    from flashinfer_trace.status import Kind, Status

    d = load_definition("rmsnorm_h4096")
    fake = base.Adapter("flashinfer", "rmsnorm", "flashinfer.norm.rmsnorm", lambda call: ())
    report = _deferred_report(tmp_path, d.name, fake.api)
    with pytest.raises(GroundTruthUnavailable) as e:
        base._check_prebuild(fake, d, jit.JitReport.load(report).outcome)
    assert e.value.kind == "building" and "jit-x" in str(e.value)
    status, kind, detail = outcome_of(e.value)
    assert (status, kind) == (Status.NOT_RUN, Kind.BUILDING) and detail.startswith("not-run: building: ")

    def resolve(source, definition, *, prebuild, **kw):  # the adapter above, through the engine's lookup
        base._check_prebuild(fake, definition, prebuild)
        raise AssertionError("a deferred module must not be built here")

    config = CheckConfig(device="cpu", prebuild_lookup=jit.PrebuildWatch(str(report)).outcome, resolve=resolve)
    record = run_case(Case(d, Check.MATCH, "small", 0, source="flashinfer"), Memo("cpu"), config)
    assert (record.status, record.kind) == (Status.NOT_RUN, Kind.BUILDING)
    assert "not-run: building: flashinfer.norm.rmsnorm" in record.detail and "nox -s jit-x" in record.detail
    node = SimpleNamespace(user_properties=[])
    with pytest.raises(pytest.skip.Exception, match="not-run: building"):  # pytest's word: a skip, never a failure
        _Engine(config, Memo("cpu"), node).check(record)
    assert dict(node.user_properties)["record"]["status"] == "not-run"


def test_a_deferred_module_lifts_an_unless_jit_ready_known_issue(tmp_path):
    """fi-cutlass-moe-jit-sm90 keeps the fp8 MoE tests from building in a session; where the prebuild deferred the
    module the case says `not-run: building` (with the command) rather than the issue's xfail."""
    from flashinfer_trace.pytest_plugin import _jit_lifts

    lookup = jit.JitReport([jit.BuildRecord("m", "flashinfer", s) for s in ("deferred",)]).outcome
    assert _jit_lifts(lookup, "m", "flashinfer")
    for status in ("build-timeout", "build-failed", "error"):
        assert not _jit_lifts(jit.JitReport([jit.BuildRecord("m", "flashinfer", status)]).outcome, "m", "flashinfer")
    assert not _jit_lifts(lookup, "other", "flashinfer") and not _jit_lifts(None, "m", "flashinfer")


def test_the_matrix_shows_a_building_cell_as_not_run_with_the_command(tmp_path):
    from flashinfer_trace.matrix import build, render_md
    from flashinfer_trace.matrix.render_html import render_html
    from flashinfer_trace.results.record import CaseRecord, Check
    from flashinfer_trace.status import Kind, Status
    from flashinfer_trace.sweep.results import SessionInfo, write_session

    detail = ("not-run: building: flashinfer.fused_moe.cutlass_fused_moe: not built here; build it with "
              "`nox -s jit-cu130-x -- -k moe_fp8_x --jit-budget 3900`")
    records = [CaseRecord(definition="moe_fp8_x", op_type="moe", check=Check.MATCH, source="flashinfer",
                          status=Status.NOT_RUN, kind=Kind.BUILDING, detail=detail, size="small", seed=s,
                          nodeid=f"tests/references/test_moe.py::test[{s}]") for s in (0, 1)]
    records.append(CaseRecord(definition="moe_fp8_x", op_type="moe", check=Check.MATCH, source="torch",
                              status=Status.PASS, size="small", seed=0, nodeid="tests/references/test_moe.py::t"))
    info = SessionInfo("references-x", "cu130-x", arch="sm90", finished="2026-11-28T12:00:00",
                       jit={"counts": {"built": 3, "deferred": 1}, "wall_seconds": 40.0})
    write_session(tmp_path / "references-x", info, records=records,
                  manifest={"combination": {"id": "cu130-x", "cuda": "13", "pins": {"flashinfer-python": "0.5.3"}}})
    matrix = build([tmp_path / "references-x"])
    (c,) = [c for c in matrix["cells"] if c["definition"] == "moe_fp8_x"]
    assert c["state"] == "not-run" and c["reason"] == detail and c["kind"] == "building"
    assert c["sources"]["flashinfer"]["state"] == "not-run" and c["sources"]["flashinfer"]["counts"] == {"not-run": 2}
    (env,) = matrix["environments"]
    assert env["status"] == "ok" and env["jit"]["counts"]["deferred"] == 1
    md = render_md(matrix)
    assert "| · building |" in md and "## Not run: modules still building" in md and "jit-cu130-x" in md
    assert "not-run: building" in render_html(matrix)


# -- sessions --------------------------------------------------------------------------------------------
PLANTED = '''
import json, time
from types import SimpleNamespace

from flashinfer_trace.check import outcome_of
from flashinfer_trace.groundtruth import GroundTruthUnavailable, base
from flashinfer_trace.pytest_plugin import _Engine, _check_config
from flashinfer_trace.results.record import CaseRecord
from flashinfer_trace.status import Status


def _compare(request, definition):
    """The engine's path from the JIT report to the record, for a stand-in adapter of this definition's job."""
    with open({starts!r}, "a") as f:
        f.write(json.dumps({{"test": definition, "at": time.time()}}) + "\\n")
    fake = base.Adapter("flashinfer", "x", f"flashinfer.{{definition}}.call", lambda call: ())
    status, kind, detail = Status.PASS, None, None
    try:
        base._check_prebuild(fake, SimpleNamespace(name=definition), _check_config(request.config).prebuild())
    except GroundTruthUnavailable as e:
        status, kind, detail = outcome_of(e)
    record = CaseRecord(definition=definition, check="match", source="flashinfer", status=status, kind=kind,
                        detail=detail)
    _Engine(None, None, request.node).check(record)
'''


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    tree, starts = tmp_path / "repo", tmp_path / "starts.jsonl"
    (tree / "tests" / "references").mkdir(parents=True)
    (tree / "tests" / "references" / "conftest.py").write_text(
        "from flashinfer_trace.pytest_plugin import *  # noqa: F401,F403\n")
    head = PLANTED.format(starts=str(starts))
    (tree / "tests" / "references" / "test_moe.py").write_text(head + "\n\ndef test_long(request):\n"
                                                                      "    _compare(request, 'long_a')\n")
    (tree / "tests" / "references" / "test_act.py").write_text(head + "\n\ndef test_short(request):\n"
                                                                      "    _compare(request, 'short_a')\n")
    for op, name in (("moe", "long_a"), ("act", "short_a")):
        (tree / "definitions" / op).mkdir(parents=True, exist_ok=True)
        (tree / "definitions" / op / f"{name}.json").write_text("{}")
    return tree, starts


def _session(monkeypatch, tmp_path: Path, kind: str, name: str, plan: dict, **options):
    """One session of a GPU combination (the GPU check stood in) whose prebuild is planned by the session's own
    plan_prebuild, with stand-in jobs and builds; (exit status, session.json, {test: record}, the config)."""
    from flashinfer_trace.sweep import session as sess
    from flashinfer_trace.sweep.combos import load_combination
    from flashinfer_trace.sweep.results import read_records

    out = tmp_path / "results" / name
    seen = {}

    def planned(definitions, config, **kw):  # the session's config, with the stand-in worker and a shared stamp file
        seen["config"] = config
        config.worker_command = (sys.executable, str(STANDIN), str(tmp_path / name / "plan.json"))
        config.device, config.workers, config.max_jobs = "cpu", 2, 2
        config.stamps = str(tmp_path / "jit-cache" / "flashinfer-trace-prebuilt.json")
        return [_job("long_a", "moe", budget=config.budget, expect=2460.0, expect_from="planted: 41 min"),
                _job("short_a", budget=config.budget)]

    (tmp_path / name).mkdir(parents=True, exist_ok=True)
    (tmp_path / name / "plan.json").write_text(json.dumps({**plan, "_timeline": str(tmp_path / name /
                                                                                      "timeline.jsonl")}))
    monkeypatch.setattr(sess, "check_gpu", lambda combo, arch: ("ok", None, "sm90"))
    monkeypatch.setattr(jit, "plan", planned)
    combo = load_combination(ROOT / "constraints" / "cu130-torch2.11-fi0.5.3.toml")
    tree = tmp_path / "repo"
    rc = sess.run_session(kind, combo, name, out, jobs=2, test_timeout=120, cwd=tree, **options)
    info = json.loads((out / "session.json").read_text())
    tests = {r.nodeid.rsplit("::", 1)[1]: r for r in read_records(out / "tests.json")} \
        if (out / "tests.json").is_file() else {}
    return rc, info, tests, seen["config"]


def test_a_references_session_defers_then_the_jit_session_builds_then_the_cases_run(tmp_path, monkeypatch, capsys):
    """The cold H200 run's two fp8 MoE modules, with stand-ins: the references session defers the long job at once,
    its test starts while the short build goes on and records not-run: building, and the session is ok; the jit
    session (an hour a job) builds it; the next references session finds it cached and its test runs."""
    tree, starts = _tree(tmp_path)
    out = tmp_path / "results" / "references-x"
    # the short build ends only once the long definition's test has been recorded (or after 60 s)
    plan = {"long_a": {"seconds": 0.2}, "short_a": {"seconds": 60.0, "until": [str(out / "tests.jsonl"), "test_long"],
                                                    "then": 0.5}}
    rc, info, tests, config = _session(monkeypatch, tmp_path, "references", "references-x", plan)
    assert config.defer and config.defer_to == "jit-cu130-torch2.11-fi0.5.3" and config.budget == jit.DEFAULT_BUDGET
    assert rc == 0 and info["status"] == "ok", {k: (str(r.status), r.detail) for k, r in tests.items()}
    long = tests["test_long"]
    assert (str(long.status), str(long.kind)) == ("not-run", "building")
    assert "nox -s jit-cu130-torch2.11-fi0.5.3 -- -k long_a --jit-budget 3900" in long.detail
    assert str(tests["test_short"].status) == "pass"
    began = {e["test"]: e["at"] for e in map(json.loads, starts.read_text().splitlines())}
    short_end = json.loads((tmp_path / "references-x" / "timeline.jsonl").read_text().splitlines()[0])["end"]
    assert began["long_a"] < short_end  # it did not wait for the builds
    assert info["counts"] == {"pass": 1, "not-run": 1} and info["not_run"] == {"building": 1}
    assert info["jit"]["counts"] == {"deferred": 1, "built": 1}
    assert "nox -s jit-cu130-torch2.11-fi0.5.3 -- -k long_a" in capsys.readouterr().err

    rc, info, _, config = _session(monkeypatch, tmp_path, "jit", "jit-x", {"long_a": {"seconds": 0.2}})
    assert rc == 0 and not config.defer and config.budget == jit.JIT_SESSION_BUDGET
    built = {r["definition"]: r for r in map(json.loads, (tmp_path / "results" / "jit-x" / "jit.jsonl").open())}
    assert built["long_a"]["status"] == "built" and built["long_a"]["budget"] == jit.JIT_SESSION_BUDGET

    starts.unlink()
    rc, info, tests, _ = _session(monkeypatch, tmp_path, "references", "references-y", {})
    assert rc == 0 and str(tests["test_long"].status) == "pass", tests["test_long"].detail
    assert info["jit"]["counts"] == {"cached": 2} and info["not_run"] is None


def test_the_jit_session_resumes_what_it_built(tmp_path, monkeypatch):
    """`nox -s jit-<combination> -- --resume`: a job built stays built (not given to a worker again); one that ran
    out of time is tried again with its own budget."""
    _tree(tmp_path)
    plan = {"long_a": {"seconds": 5.0}, "short_a": {"seconds": 0.1}}
    rc, info, _, _ = _session(monkeypatch, tmp_path, "jit", "jit-x", plan, jit_budget=1.0)
    assert rc == 1 and info["jit"]["counts"] == {"build-timeout": 1, "built": 1}
    (tmp_path / "jit-x" / "timeline.jsonl").unlink()
    plan["long_a"]["seconds"] = 0.1
    rc, info, _, _ = _session(monkeypatch, tmp_path, "jit", "jit-x", plan, jit_budget=1.0, resume=True)
    assert rc == 0 and info["jit"]["counts"] == {"built": 2}
    assert _ran(tmp_path / "jit-x") == {"long_a"}  # the built one was not given to a worker again
    records = [json.loads(line) for line in (tmp_path / "results" / "jit-x" / "jit.jsonl").open()]
    assert [(r["definition"], r["status"]) for r in records] == [("short_a", "built"), ("long_a", "build-timeout"),
                                                                 ("long_a", "built")]


def test_a_bench_session_hands_its_tests_the_prebuild_report():
    from flashinfer_trace.sweep.combos import load_combination
    from flashinfer_trace.sweep.session import pytest_args

    combo = load_combination(ROOT / "constraints" / "cu130-torch2.11-fi0.5.3.toml")
    args = pytest_args("bench", combo, Path("results/bench-x"), [])
    assert f"--bench-jit-report={Path('results/bench-x') / 'jit.jsonl'}" in args


def test_gpu_reference_sessions_share_one_store_of_sampler_reference_draws(monkeypatch, tmp_path):
    """Every GPU references session of the node keeps its sampler references' draws in one store (the draws do not
    depend on the release); the CPU session keeps none; the user's own --draws-store wins."""
    from flashinfer_trace.sweep import session
    from flashinfer_trace.sweep.combos import load_combination

    gpu = load_combination(ROOT / "constraints" / "cu130-torch2.11-fi0.5.3.toml")
    cpu = load_combination(ROOT / "constraints" / "cpu-torch2.13.toml")
    monkeypatch.delenv(session.DRAWS_ENV, raising=False)
    assert f"--draws-store={session.DRAWS_DIR}" in session.pytest_args("references", gpu, Path("r"), [])
    monkeypatch.setenv(session.DRAWS_ENV, str(tmp_path))
    assert f"--draws-store={tmp_path}" in session.pytest_args("references", gpu, Path("r"), [])
    assert not any(a.startswith("--draws-store") for a in session.pytest_args("references", cpu, Path("r"), []))
    mine = session.pytest_args("references", gpu, Path("r"), ["--draws-store=/elsewhere"])
    assert [a for a in mine if a.startswith("--draws-store")] == ["--draws-store=/elsewhere"]


# -- the shared install folder ---------------------------------------------------------------------------
def _offline_install(tmp_path: Path, monkeypatch, spans: list, delay: float = 0.5):
    """`_install` of one combination offline, with pip stood in: its --target run records when it ran."""
    from flashinfer_trace.sweep import install as inst
    from flashinfer_trace.sweep.combos import load_combination

    site, wheels = tmp_path / "site", tmp_path / "wheels"
    site.mkdir(exist_ok=True)
    wheels.mkdir(exist_ok=True)

    def run(self, cmd):
        cmd = [str(c) for c in cmd]
        if "--target" in cmd:
            t0 = time.monotonic()
            target = Path(cmd[cmd.index("--target") + 1])
            target.mkdir(parents=True, exist_ok=True)
            (target / "marker").write_text(str(t0))
            time.sleep(delay)
            spans.append((t0, time.monotonic()))
        return ""

    monkeypatch.setattr(inst._Runner, "__call__", run)
    monkeypatch.setattr(inst, "site_packages", lambda python: site)
    monkeypatch.setenv("FLASHINFER_TRACE_SITE", str(tmp_path / "combos"))
    combo = load_combination(ROOT / "constraints" / "cu130-torch2.11-fi0.5.3.toml")
    return inst, combo, wheels


def test_two_sessions_of_one_combination_install_its_folder_one_at_a_time(tmp_path, monkeypatch):
    """A jit- session started beside its references session: both install into the combination's folder; the
    second waits for the first and then finds it installed, instead of a second pip writing the same files."""
    spans: list = []
    inst, combo, wheels = _offline_install(tmp_path, monkeypatch, spans)
    results: list = []

    def one(i):
        results.append(inst._install(combo, sys.executable, inst.InstallOptions(
            wheelhouse=wheels, preinstalled_torch=sys.executable), project=ROOT, log=tmp_path / f"{i}.log"))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    monkeypatch.setattr(inst, "probe_torch", lambda python: {"version": "2.11.0+cu130", "cuda": "13.0", "site": "/x"})
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r.ok for r in results] == [True, True], [r.error for r in results]
    assert len(spans) == 1, spans  # one pip into the folder; the other saw its stamp


def test_a_combination_folder_in_use_is_not_rewritten_under_a_running_session(tmp_path, monkeypatch):
    spans: list = []
    inst, combo, wheels = _offline_install(tmp_path, monkeypatch, spans, delay=0.0)
    monkeypatch.setattr(inst, "probe_torch", lambda python: {"version": "2.11.0+cu130", "cuda": "13.0", "site": "/x"})
    opts = inst.InstallOptions(wheelhouse=wheels, preinstalled_torch=sys.executable)
    assert inst._install(combo, sys.executable, opts, project=ROOT, log=tmp_path / "a.log").ok
    target = inst.combination_site(combo)
    with inst.combination_in_use(target):  # another session of the combination runs from the folder
        extra = tmp_path / "extra"
        extra.mkdir()
        (extra / "x-1.0-py3-none-any.whl").write_bytes(b"x")  # other wheels: the folder would be rewritten
        refused = inst._install(combo, sys.executable, inst.InstallOptions(
            wheelhouse=wheels, extra_wheels=extra, preinstalled_torch=sys.executable), project=ROOT,
            log=tmp_path / "b.log")
        assert not refused.ok and "in use by another session" in refused.error and str(target) in refused.error
        assert len(spans) == 1 and (target / "marker").is_file()  # untouched
        same = inst._install(combo, sys.executable, opts, project=ROOT, log=tmp_path / "c.log")
        assert same.ok and len(spans) == 1  # the same wheels: nothing to rewrite, it shares the folder


def test_a_definition_the_prebuild_did_not_plan_is_building_where_its_api_was_deferred(tmp_path):
    """FlashInfer's own traced fp8 MoE file was not among the prebuild's jobs: its test built the deferred module
    for ten minutes while holding device memory. A deferral of the same API (and source) now covers it."""
    from flashinfer_trace.dataset import load_definition
    from flashinfer_trace.groundtruth import GroundTruthUnavailable, base

    d = load_definition("rmsnorm_h4096")
    fake = base.Adapter("flashinfer", "rmsnorm", "flashinfer.norm.rmsnorm", lambda call: ())
    report = _deferred_report(tmp_path, "some_other_definition", fake.api)
    for lookup in (jit.JitReport.load(report).outcome, jit.PrebuildWatch(report).outcome):
        with pytest.raises(GroundTruthUnavailable) as e:
            base._check_prebuild(fake, d, lookup)
        assert e.value.kind == "building" and "deferred for some_other_definition" in str(e.value)
        assert lookup(d.name, "flashinfer") is None  # without the API: nothing of its own
        assert lookup(d.name, "sglang", api=fake.api) is None  # another source's module is another module
    other = base.Adapter("flashinfer", "rmsnorm", "flashinfer.norm.fused_add_rmsnorm", lambda call: ())
    base._check_prebuild(other, d, jit.JitReport.load(report).outcome)  # another API: nothing deferred, it runs


def test_every_path_of_a_deferred_definition_and_of_its_known_module_is_building(tmp_path):
    """The seventh run: top_k_varlen_n65536_k2048's job (flashinfer.top_k_varlen) was deferred, but its ragged and
    page-table paths (other APIs, the same `topk` module) ran, and each built the module inside its test until the
    test's 900 s ran out. A deferred definition's paths of that source all wait; another definition's path of an
    API of the same known module waits too; a failed build still names only its own API."""
    from flashinfer_trace.dataset import load_definition
    from flashinfer_trace.groundtruth import GroundTruthUnavailable, base

    d = load_definition("top_k_varlen_n65536_k2048")
    ragged = base.Adapter("flashinfer", "topk", "flashinfer.topk.top_k_ragged_transform", lambda call: ())
    report = tmp_path / "jit.jsonl"
    report.write_text(json.dumps(jit.BuildRecord(
        d.name, "flashinfer", "deferred", api="flashinfer.top_k_varlen", message="not built here",
        covers=jit.sharing_apis("flashinfer", "flashinfer.top_k_varlen")).as_dict()) + "\n")
    with pytest.raises(GroundTruthUnavailable) as e:
        base._check_prebuild(ragged, d, jit.JitReport.load(report).outcome)
    assert e.value.kind == "building" and "flashinfer.topk.top_k_ragged_transform" in str(e.value)
    other = load_definition("top_k_varlen_n8192_k1024_bf16")  # not planned: the known module's deferral covers it
    for lookup in (jit.JitReport.load(report).outcome, jit.PrebuildWatch(report).outcome):
        with pytest.raises(GroundTruthUnavailable) as e:
            base._check_prebuild(ragged, other, lookup)
        assert e.value.kind == "building" and "flashinfer.top_k_varlen, the same JIT module" in str(e.value)
    norm = base.Adapter("flashinfer", "rmsnorm", "flashinfer.norm.rmsnorm", lambda call: ())
    base._check_prebuild(norm, load_definition("rmsnorm_h4096"), jit.JitReport.load(report).outcome)  # runs
    assert jit.sharing_apis("flashinfer", "flashinfer.top_k_varlen") == [
        "flashinfer.sampling.top_k_top_p_sampling_from_logits", "flashinfer.topk.top_k",
        "flashinfer.topk.top_k_page_table_transform", "flashinfer.topk.top_k_ragged_transform"]
    assert jit.sharing_apis("flashinfer", "flashinfer.norm.rmsnorm") == []
    assert jit.sharing_apis("sglang", "flashinfer.top_k_varlen") == []
    failed = tmp_path / "failed.jsonl"
    failed.write_text(json.dumps(jit.BuildRecord(d.name, "flashinfer", "build-failed", api="flashinfer.top_k_varlen",
                                                 message="nvcc failed").as_dict()) + "\n")
    base._check_prebuild(ragged, d, jit.JitReport.load(failed).outcome)  # another API's failed build: it runs


@pytest.mark.parametrize("api", ["flashinfer.topk.top_k", "flashinfer.top_k_varlen",
                                 "flashinfer.sampling.top_k_top_p_sampling_from_logits",
                                 "flashinfer.topk.top_k_ragged_transform",
                                 "flashinfer.topk.top_k_page_table_transform"])
def test_the_topk_module_behind_three_apis_is_a_known_long_build_of_0_7_2_on_sm90(api):
    """The sixth run: three jobs of three Python modules built FlashInfer's `topk` at once, each past its 600 s, and
    280 cases were skipped; known now, the session defers them to its `jit-` session (not-run: building)."""
    known = jit.known_build("flashinfer", api, "sm90", {"flashinfer-python": "0.7.2.post1"})
    assert known is not None and known.modules == ("topk",) and known.seconds > jit.DEFAULT_BUDGET
    job = jit.Job("d", "d", "topk", "flashinfer", api, 600.0, expect=known.seconds, known_modules=known.modules)
    config = jit.JitConfig(device="cpu", defer=True)
    stamps = SimpleNamespace(fresh=lambda j: None)
    from flashinfer_trace.sweep.jit.expect import defer

    [record] = defer([job], jit.expectations([job]), config, stamps=stamps, roots=lambda: [])
    assert record.status == "deferred" and len(record.covers) == 4 and api not in record.covers
    assert jit.known_build("flashinfer", api, "sm90", {"flashinfer-python": "0.6.6"}) is None  # not measured there
    assert jit.known_build("flashinfer", "flashinfer.sampling.top_k_sampling_from_probs", "sm90",
                           {"flashinfer-python": "0.7.2.post1"}) is None  # the sampling module: built in seconds

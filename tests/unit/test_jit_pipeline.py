"""The pipelined JIT prebuild with stand-in jobs (tests/unit/jit_standin_worker.py: a job's "build" is a sleep,
through JitConfig.worker_command): short jobs first and long ones on a bounded share of the workers, budgets per
job, a running prebuild's report waited on per job, and a session whose comparisons start while builds go on."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from flashinfer_trace.sweep import jit
from flashinfer_trace.sweep.jit.pipeline import Background, readiness

STANDIN = Path(__file__).with_name("jit_standin_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _job(name: str, op_type: str = "activation", budget: float = 30.0, api: str | None = None) -> jit.Job:
    return jit.Job(name, name, op_type, "flashinfer", api or f"flashinfer.{name}.call", budget)


def _config(tmp_path: Path, plan: dict, **kw) -> jit.JitConfig:
    plan = {**plan, "_timeline": str(tmp_path / "timeline.jsonl")}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    kw.setdefault("report", str(tmp_path / "jit.jsonl"))
    return jit.JitConfig(device="cpu", log_dir=str(tmp_path / "logs"), max_jobs=2,
                         worker_command=(sys.executable, str(STANDIN), str(tmp_path / "plan.json")), **kw)


def _started(config: jit.JitConfig) -> dict[str, float]:
    """When the scheduler gave each job to a worker (the state file beside the report)."""
    jobs = json.loads(jit.state_path(config.report).read_text())["jobs"].values()
    return {j["definition"]: j["started"] for j in jobs}


def _timeline(tmp_path: Path) -> dict[str, dict]:
    return {e["definition"]: e for e in map(json.loads, (tmp_path / "timeline.jsonl").read_text().splitlines())}


def test_short_jobs_do_not_wait_behind_long_ones(tmp_path):
    """Two long jobs (MoE by the guess) and four short ones on two workers: one worker builds a long job, the
    other the short ones, all of which end before the first long one does (longest-first on every worker would
    have put both long jobs first and the short ones behind them)."""
    plan = {"moe_a": {"seconds": 2.0}, "moe_b": {"seconds": 2.0}, **{f"act_{i}": {"seconds": 0.2} for i in range(4)}}
    jobs = [_job("moe_a", "moe"), _job("moe_b", "moe"), *(_job(f"act_{i}") for i in range(4))]
    config = _config(tmp_path, plan, workers=2)
    records = {r.definition: r for r in jit.run(jobs, config)}
    assert {r.status for r in records.values()} == {"built"}
    t = _timeline(tmp_path)
    first_long_end = min(t["moe_a"]["end"], t["moe_b"]["end"])
    assert max(t[f"act_{i}"]["end"] for i in range(4)) < first_long_end
    taken = _started(config)
    assert min(taken["moe_a"], taken["moe_b"]) <= min(taken[f"act_{i}"] for i in range(4))  # a long one first
    # the long ones build below the short ones' priority; a worker that ran one is not reused for a short one
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert {t[n]["nice"] for n in ("moe_a", "moe_b")} == {max(base, jit.NICE)}
    assert {t[f"act_{i}"]["nice"] for i in range(4)} == {base}


def test_the_long_share_bound_holds(tmp_path):
    """Five long jobs on four workers with long_share 0.5: never more than two at once, and two did run at once."""
    plan = {**{f"moe_{i}": {"seconds": 0.6} for i in range(5)}, **{f"act_{i}": {"seconds": 0.3} for i in range(3)}}
    jobs = [*(_job(f"moe_{i}", "moe") for i in range(5)), *(_job(f"act_{i}") for i in range(3))]
    list(jit.run(jobs, _config(tmp_path, plan, workers=4, long_share=0.5)))
    spans = [(e["start"], e["end"]) for n, e in _timeline(tmp_path).items() if n.startswith("moe_")]
    most = max(sum(s <= start < e for s, e in spans) for start, _ in spans)
    assert most == 2, spans


def test_the_threshold_decides_what_is_long(tmp_path):
    """With long_seconds above the MoE guess nothing is long: all three start at once on three workers."""
    plan = {f"moe_{i}": {"seconds": 0.5} for i in range(3)}
    jobs = [_job(f"moe_{i}", "moe") for i in range(3)]
    list(jit.run(jobs, _config(tmp_path, plan, workers=3, long_seconds=10_000)))
    spans = [(e["start"], e["end"]) for e in _timeline(tmp_path).values()]
    assert max(s for s, _ in spans) < min(e for _, e in spans)
    with pytest.raises(ValueError, match="long_share"):
        jit.JitConfig(long_share=0)
    with pytest.raises(ValueError, match="long_seconds"):
        jit.JitConfig(long_seconds=-1)


def test_a_budget_counts_from_the_jobs_own_start(tmp_path):
    """Three 0.6 s jobs one after another on one worker, each with a 1.5 s budget: 1.8 s in all, every one built."""
    plan = {f"act_{i}": {"seconds": 0.6} for i in range(3)}
    jobs = [_job(f"act_{i}", budget=1.5) for i in range(3)]
    records = list(jit.run(jobs, _config(tmp_path, plan, workers=1)))
    assert [r.status for r in records] == ["built"] * 3
    assert all(r.seconds < 1.5 for r in records)


def test_a_sibling_is_tried_in_its_own_time_after_a_timeout(tmp_path):
    """A group's first job runs out of its budget: the others are not 'not tried'; each runs with its own
    budget, the next one alone (ninja resumes what the first built), then the rest."""
    plan = {"norm_a": {"seconds": 3.0}, "norm_b": {"seconds": 0.2}, "norm_c": {"seconds": 0.2}}
    jobs = [_job("norm_a", budget=0.5, api="flashinfer.norm.rmsnorm"),
            _job("norm_b", budget=5, api="flashinfer.norm.rmsnorm"),
            _job("norm_c", budget=5, api="flashinfer.norm.fused_add_rmsnorm")]
    config = _config(tmp_path, plan, workers=3)
    records = {r.definition: r for r in jit.run(jobs, config)}
    assert records["norm_a"].status == "build-timeout"
    assert records["norm_b"].status == records["norm_c"].status == "built"
    assert not any((r.message or "").startswith("not tried") for r in records.values())
    taken, t = _started(config), _timeline(tmp_path)
    # the first ran alone until its budget ran out; the next one alone after it; the last once that one was built
    assert taken["norm_b"] >= taken["norm_a"] + 0.5 and taken["norm_c"] >= t["norm_b"]["end"] - 0.05


def test_a_worker_whose_cuda_context_broke_is_replaced_and_the_jobs_after_it_are_their_own(tmp_path):
    """A warm-up's kernel left a sticky CUDA error: its worker answers and ends, and the next job runs in a new one
    (on the H200 one illegal address failed every later job of its worker, and 190 of the others under MPS)."""
    plan = {"a_broken": {"seconds": 0.1, "status": "error", "message": "AcceleratorError: CUDA error: an illegal "
                         "memory access was encountered", "retire": "AcceleratorError: illegal memory access"},
            "b_after": {"seconds": 0.1}, "c_after": {"seconds": 0.1}}
    jobs = [_job("a_broken", api="flashinfer.x.a"), _job("b_after", api="flashinfer.x.b"),
            _job("c_after", api="flashinfer.x.c")]
    records = {r.definition: r for r in jit.run(jobs, _config(tmp_path, plan, workers=1))}
    assert records["a_broken"].status == "error" and "illegal memory access" in records["a_broken"].message
    assert records["b_after"].status == records["c_after"].status == "built"
    pids = {name: e["pid"] for name, e in _timeline(tmp_path).items()}
    assert pids["b_after"] != pids["a_broken"] and pids["c_after"] == pids["b_after"]


def test_a_broken_context_is_told_from_a_healthy_one(monkeypatch):
    """worker.broken_context: None on the CPU, without CUDA, or when the device synchronises; the error's text
    when a synchronisation raises (a sticky error)."""
    import types

    from flashinfer_trace.sweep.jit.worker import broken_context

    def fake(initialized, error=None):
        def synchronize():
            if error:
                raise RuntimeError(error)
        return types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: initialized,
                                                                synchronize=synchronize))

    monkeypatch.setitem(sys.modules, "torch", fake(True, "CUDA error: an illegal memory access was encountered"))
    assert broken_context("cpu") is None
    assert broken_context("cuda:0") == "RuntimeError: CUDA error: an illegal memory access was encountered"
    monkeypatch.setitem(sys.modules, "torch", fake(True))
    assert broken_context("cuda") is None
    monkeypatch.setitem(sys.modules, "torch", fake(False, "never raised: CUDA not initialised"))
    assert broken_context("cuda") is None


def _write(report: Path, *records: jit.BuildRecord) -> None:
    with open(report, "a") as f:
        for r in records:
            f.write(json.dumps(r.as_dict()) + "\n")


def test_a_watch_waits_for_a_running_prebuild_and_says_why_it_stopped(tmp_path):
    report = tmp_path / "jit.jsonl"
    state = jit.report.StateWriter(report, [("a", "flashinfer", "flashinfer.x", 30.0, 10.0),
                                            ("b", "flashinfer", "flashinfer.y", 30.0, 10.0)])
    watch = jit.PrebuildWatch(report, poll=0.05)
    assert watch.outcome("c", "flashinfer") is None  # not planned: nothing to wait for
    built = jit.BuildRecord("a", "flashinfer", "built", api="flashinfer.x")

    def later():
        time.sleep(0.5)
        _write(report, built)
        state.ended("a", "flashinfer")

    t0 = time.monotonic()
    threading.Thread(target=later).start()
    assert watch.outcome("a", "flashinfer") == built and time.monotonic() - t0 >= 0.4
    assert watch.pending(["a", "b"]) == [("b", "flashinfer")]
    assert not watch.wait(["b"], timeout=0.2)
    state.finish()  # ended without b's record
    missing = watch.outcome("b", "flashinfer")
    assert missing.status == "build-timeout" and "ended without a record" in missing.message
    assert missing.api == "flashinfer.y" and watch.wait(["a", "b"], timeout=0)


def test_a_silent_prebuild_or_a_job_past_its_budget_stops_the_wait(tmp_path):
    report, now, beating = tmp_path / "jit.jsonl", [1000.0], [True]
    state = jit.report.StateWriter(report, [("a", "flashinfer", "x", 5.0, 1.0), ("b", "flashinfer", "y", 5.0, 1.0)],
                                   clock=lambda: now[0])

    def sleep(seconds: float) -> None:  # time passes; the prebuild beats while it lives
        now[0] += seconds
        if beating[0]:
            state.beat()

    watch = jit.PrebuildWatch(report, poll=1.0, stale=30.0, clock=lambda: now[0], sleep=sleep)
    state.started("a", "flashinfer", at=now[0])
    record = watch.outcome("a", "flashinfer")  # a beating prebuild, but the job is 5 + 30 s past its start
    assert record.status == "build-timeout" and "after its start" in record.message and now[0] > 1035
    beating[0] = False
    record = watch.outcome("b", "flashinfer")  # b never started, and the prebuild went silent
    assert record.status == "build-timeout" and "stopped answering" in record.message


def test_a_resumed_reports_earlier_lines_wait_for_the_jobs_new_end(tmp_path):
    report = tmp_path / "jit.jsonl"
    _write(report, jit.BuildRecord("a", "flashinfer", "build-failed", api="x"))
    state = jit.report.StateWriter(report, [("a", "flashinfer", "x", 30.0, 1.0)])
    watch = jit.PrebuildWatch(report, poll=0.05)
    assert watch.pending(["a"]) == [("a", "flashinfer")]  # the old failure is not this run's answer
    _write(report, jit.BuildRecord("a", "flashinfer", "built", api="x"))
    assert watch.outcome("a", "flashinfer").status == "built"
    state.finish()


def test_comparisons_of_a_ready_definition_start_before_the_last_build_ends(tmp_path):
    """The engine's lookup (CheckConfig.prebuild over a running prebuild): a short job's definition is answered
    while the long build goes on; a failed build makes its ground truth unavailable as build-failed meanwhile."""
    from flashinfer_trace.check import CheckConfig
    from flashinfer_trace.dataset import load_definition
    from flashinfer_trace.groundtruth import GroundTruthUnavailable, base

    plan = {"fast": {"seconds": 0.2}, "broken": {"seconds": 0.2, "status": "build-failed", "message": "nvcc: 1"},
            "slow": {"seconds": 3.0}}
    jobs = [_job("fast", api="flashinfer.norm.rmsnorm"), _job("broken", api="flashinfer.act.silu"),
            _job("slow", "moe", api="flashinfer.fused_moe.x")]
    config = _config(tmp_path, plan, workers=3)
    background = Background(jobs, config, progress=None)
    lookup = CheckConfig(prebuild_lookup=jit.PrebuildWatch(config.report).outcome).prebuild()
    assert lookup("fast", "flashinfer").status == "built"
    fake = base.Adapter("flashinfer", "activation", "flashinfer.act.silu", lambda call: (), None)
    d = load_definition("silu_and_mul_i256")
    with pytest.raises(GroundTruthUnavailable) as e:
        base._check_prebuild(fake, type(d).model_validate({**d.model_dump(), "name": "broken"}), lookup)
    assert e.value.kind == "build-failed"
    assert background.thread.is_alive()  # the long build still runs
    assert lookup("slow", "flashinfer").status == "built"
    records, summary = background.join()
    assert summary["counts"] == {"built": 2, "build-failed": 1}
    assert json.loads(jit.state_path(config.report).read_text())["finished"]


def test_readiness_orders_definitions_by_their_slowest_job():
    jobs = [_job("a", "moe"), _job("b"), jit.Job("b", "b", "gemm", "sglang", "s", 1.0)]
    assert readiness(jobs) == {"a": jit.GUESS["moe"], "b": jit.GUESS["gemm"]}
    earlier = [jit.BuildRecord("a", "flashinfer", "built", seconds=3.0)]
    assert readiness(jobs, earlier)["a"] == 3.0


PLANTED = '''
import json, time, pytest
from flashinfer_trace.pytest_plugin import _check_config


def _compare(request, name, definition):
    with open({starts!r}, "a") as f:
        f.write(json.dumps({{"test": name, "at": time.time()}}) + "\\n")
    record = _check_config(request.config).prebuild()(definition, "flashinfer")
    if record is not None and record.status in ("build-failed", "build-timeout"):
        pytest.skip(f"{{record.status}}: {{record.message}}")
    assert record is not None and record.status == "built"
'''


def test_a_session_compares_while_the_long_build_goes_on(tmp_path, monkeypatch):
    """A GPU session (the GPU check stood in) with stand-in builds: the fast definitions' tests start as soon as
    their jobs ended, before the long build's end, one of them skipping as build-failed; the slow one's test
    starts after its build; session.json says when the first and the last comparison came."""
    from flashinfer_trace.sweep import session as sess
    from flashinfer_trace.sweep.combos import load_combination
    from flashinfer_trace.sweep.results import read_records

    tree, out, starts = tmp_path / "repo", tmp_path / "results" / "references-x", tmp_path / "starts.jsonl"
    (tree / "tests" / "references").mkdir(parents=True)
    (tree / "tests" / "references" / "conftest.py").write_text(
        "from flashinfer_trace.pytest_plugin import *  # noqa: F401,F403\n")
    head = PLANTED.format(starts=str(starts))
    (tree / "tests" / "references" / "test_slow.py").write_text(
        head + "\n\ndef test_slow(request):\n    _compare(request, 'slow', 'slow_a')\n")
    (tree / "tests" / "references" / "test_fast.py").write_text(
        head + "\n\ndef test_fast_ok(request):\n    _compare(request, 'fast_ok', 'fast_ok')\n"
        "\n\ndef test_fast_broken(request):\n    _compare(request, 'fast_broken', 'fast_broken')\n")
    for op, name in (("fast", "fast_ok"), ("fast", "fast_broken"), ("slow", "slow_a")):
        (tree / "definitions" / op).mkdir(parents=True, exist_ok=True)
        (tree / "definitions" / op / f"{name}.json").write_text("{}")
    out.mkdir(parents=True)
    plan = {"fast_ok": {"seconds": 0.3}, "fast_broken": {"seconds": 0.3, "status": "build-failed"},
            # ends 1 s after both fast tests are recorded (or after 60 s): no race with the test processes' start-up
            "slow_a": {"seconds": 60.0, "until": [str(out / sess.STREAM), "test_fast_broken"], "then": 1.0}}
    jobs = [_job("fast_ok"), _job("fast_broken", api="flashinfer.other.x"), _job("slow_a", "moe")]
    config = _config(tmp_path, plan, workers=2, report=str(out / sess.JIT_STREAM))
    monkeypatch.setattr(sess, "check_gpu", lambda combo, arch: ("ok", None, "sm90"))
    monkeypatch.setattr(sess, "plan_prebuild", lambda *a, **k: (jobs, config))
    combo = load_combination(ROOT / "constraints" / "cu130-torch2.11-fi0.6.6.toml")
    rc = sess.run_session("references", combo, "references-x", out, jobs=1, test_timeout=120, cwd=tree)
    by_name = {r.nodeid.rsplit("::", 1)[1]: r for r in read_records(out / "tests.json")}
    assert rc == 0, {k: (str(r.status), r.detail) for k, r in by_name.items()}
    assert str(by_name["test_fast_ok"].status) == str(by_name["test_slow"].status) == "pass"
    assert str(by_name["test_fast_broken"].status) == "skip" and "build-failed" in by_name["test_fast_broken"].detail
    began = {e["test"]: e["at"] for e in map(json.loads, starts.read_text().splitlines())}
    slow_built = _timeline(tmp_path)["slow_a"]["end"]
    assert began["fast_ok"] < slow_built and began["fast_broken"] < slow_built <= began["slow"]
    info = json.loads((out / "session.json").read_text())
    line = info["timeline"]
    assert line["comparisons"] == 2
    assert line["first_comparison_s"] < line["prebuild_end_s"] <= line["last_comparison_s"]
    assert info["jit"]["counts"] == {"built": 2, "build-failed": 1}


def test_test_targets_run_in_the_order_their_modules_are_expected_ready(tmp_path):
    from flashinfer_trace.sweep.session import order_targets, target_definitions

    for op, names in (("moe", ("m1", "m2")), ("rmsnorm", ("r1", "r2", "r3")), ("gemm", ("g1",))):
        (tmp_path / op).mkdir()
        for n in names:
            (tmp_path / op / f"{n}.json").write_text("{}")
    targets = [("tests/references/test_rmsnorm.py", ("--shard", "0/2")), ("tests/references/test_rmsnorm.py",
               ("--shard", "1/2")), "tests/references/test_moe.py", "tests/references/test_gemm.py",
               "tests/references/test_unknown.py"]
    assert target_definitions(targets[0], tmp_path) == ["r1", "r3"]  # the plugin's round-robin over sorted names
    assert target_definitions(targets[1], tmp_path) == ["r2"]
    assert target_definitions(targets[4], tmp_path) is None
    ready = {"m1": 450.0, "m2": 10.0, "r1": 35.0, "r2": 5.0, "r3": 35.0, "g1": 176.0}
    assert order_targets(targets, ready, tmp_path) == [targets[1], targets[0], targets[3], targets[2], targets[4]]


def test_check_runs_the_cases_of_ready_definitions_first():
    from flashinfer_trace.cli.run import ready_first
    from flashinfer_trace.results.record import CaseRecord, Check
    from flashinfer_trace.status import Status

    cases = [CaseRecord(definition=n, check=Check.ALL, status=Status.SKIP, detail=str(i))
             for i, n in enumerate(("moe_a", "norm_a", "moe_a", "norm_b", "other"))]
    ordered = ready_first(cases, {"moe_a": 450.0, "norm_a": 35.0, "norm_b": 35.0})
    assert [(c.definition, c.detail) for c in ordered] == [("other", "4"), ("norm_a", "1"), ("norm_b", "3"),
                                                           ("moe_a", "0"), ("moe_a", "2")]


def test_stopping_the_background_prebuild_ends_its_running_jobs(tmp_path):
    """Ctrl-C in a session: the running build is killed as at a timeout, the state says the prebuild ended, and a
    later prebuild in the same process is not stopped by it."""
    config = _config(tmp_path, {"moe_a": {"seconds": 30.0}}, workers=1)
    background = Background([_job("moe_a", "moe")], config, progress=None)
    time.sleep(1.0)
    t0 = time.monotonic()
    background.stop()
    records, _ = background.join(timeout=20)
    assert time.monotonic() - t0 < 15 and [r.status for r in records] == ["build-timeout"]
    assert json.loads(jit.state_path(config.report).read_text())["finished"]
    (tmp_path / "again").mkdir()
    again = _config(tmp_path / "again", {"act_a": {"seconds": 0.1}}, workers=1)
    assert [r.status for r in jit.run([_job("act_a")], again)] == ["built"]


def test_a_test_target_starts_once_its_definitions_builds_have_ended(tmp_path):
    """The session's gate: a target waits while a job of its definitions is pending, not for other definitions'
    jobs, and gives up waiting when the run is stopped."""
    from flashinfer_trace.sweep.session import gate

    for op, name in (("fast", "f1"), ("slow", "s1")):
        (tmp_path / "defs" / op).mkdir(parents=True)
        (tmp_path / "defs" / op / f"{name}.json").write_text("{}")
    report = tmp_path / "jit.jsonl"
    state = jit.report.StateWriter(report, [("f1", "flashinfer", "x", 30.0, 1.0), ("s1", "flashinfer", "y", 30.0, 9.0)])
    before = gate(jit.PrebuildWatch(report, poll=0.05), tmp_path / "defs")
    _write(report, jit.BuildRecord("f1", "flashinfer", "built", api="x"))
    state.ended("f1", "flashinfer")
    never = threading.Event()
    t0 = time.monotonic()
    before("tests/references/test_fast.py", never)  # its job has ended: no wait for s1
    assert time.monotonic() - t0 < 2

    def later():
        time.sleep(0.6)
        _write(report, jit.BuildRecord("s1", "flashinfer", "built", api="y"))
        state.ended("s1", "flashinfer")

    threading.Thread(target=later).start()
    t0 = time.monotonic()
    before("tests/references/test_slow.py", never)
    assert time.monotonic() - t0 >= 0.5
    state2 = jit.report.StateWriter(tmp_path / "b.jsonl", [("s1", "flashinfer", "y", 30.0, 9.0)])
    stopped = threading.Event()
    stopped.set()
    t0 = time.monotonic()
    gate(jit.PrebuildWatch(tmp_path / "b.jsonl", poll=0.05), tmp_path / "defs")("tests/references/test_slow.py",
                                                                                stopped)
    assert time.monotonic() - t0 < 2
    state2.finish()


def test_a_bench_session_times_nothing_before_its_prebuild_has_ended(tmp_path, monkeypatch):
    """Benchmarks beside running compiles would time the compiles: a bench session waits for its whole prebuild."""
    from flashinfer_trace.sweep import session as sess
    from flashinfer_trace.sweep.combos import load_combination

    tree, out, starts = tmp_path / "repo", tmp_path / "results" / "bench-x", tmp_path / "starts.jsonl"
    (tree / "tests" / "bench").mkdir(parents=True)
    (tree / "tests" / "bench" / "conftest.py").write_text(  # the session passes the bench suite's own options
        "def pytest_addoption(parser):\n    parser.addoption('--bench-stream', default=None)\n"
        "    parser.addoption('--bench-jit-report', default=None)\n")
    (tree / "tests" / "bench" / "test_b.py").write_text(
        f"import json, time\n\n\ndef test_b():\n    with open({str(starts)!r}, 'a') as f:\n"
        "        f.write(json.dumps({'at': time.time()}) + '\\n')\n")
    out.mkdir(parents=True)
    config = _config(tmp_path, {"slow_a": {"seconds": 2.0}}, workers=1, report=str(out / sess.JIT_STREAM))
    monkeypatch.setattr(sess, "check_gpu", lambda combo, arch: ("ok", None, "sm90"))
    monkeypatch.setattr(sess, "plan_prebuild", lambda *a, **k: ([_job("slow_a", "moe")], config))
    combo = load_combination(ROOT / "constraints" / "cu130-torch2.11-fi0.6.6.toml")
    rc = sess.run_session("bench", combo, "bench-x", out, jobs=1, test_timeout=120, cwd=tree)
    assert rc == 0
    began = json.loads(starts.read_text().splitlines()[0])["at"]
    assert began >= _timeline(tmp_path)["slow_a"]["end"]
    assert json.loads((out / "session.json").read_text())["jit"]["counts"] == {"built": 1}

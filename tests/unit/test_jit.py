"""The JIT prebuild: job selection, ordering, the worker pool (timeouts, resume, streaming), how a
build failure is told from a kernel error, and how its outcome reaches the tests and the matrix.

On this CPU machine the pool runs the torch ground truth (nothing to compile: `cached`); the
same machinery builds FlashInfer's modules on a GPU."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashinfer_trace.cli import main
from flashinfer_trace.dataset import load_definition
from flashinfer_trace.groundtruth import GroundTruthUnavailable, get_ground_truth
from flashinfer_trace.matrix.build import jit_label
from flashinfer_trace.matrix.build import test_state as cell_state_of
from flashinfer_trace.results.record import from_v1
from flashinfer_trace.sweep import jit
from flashinfer_trace.sweep.session import k_expression


def _job(name: str, source: str = "torch", budget: float = 120.0) -> jit.Job:
    d = load_definition(name)
    return jit.Job(d.name, str(d.source), d.op_type, source, f"{source}:{d.op_type}", budget)


def _raise_from(filename: str, exc: BaseException) -> BaseException:
    code = compile("def build():\n    raise exc\n", filename, "exec")
    scope = {"exc": exc}
    exec(code, scope)  # noqa: S102 - a frame that claims to live in another package's file
    try:
        scope["build"]()
    except BaseException as e:  # noqa: BLE001
        return e
    raise AssertionError("did not raise")


def test_a_failure_inside_the_jit_package_is_a_build_failure():
    assert jit.is_build_failure(_raise_from("/site/flashinfer/jit/core.py", RuntimeError("nvcc exited 1")))
    assert jit.is_build_failure(subprocess.CalledProcessError(1, ["ninja"]))
    try:
        try:
            raise subprocess.CalledProcessError(2, ["nvcc"])
        except subprocess.CalledProcessError as inner:
            raise RuntimeError("could not load the module") from inner
    except RuntimeError as outer:
        assert jit.is_build_failure(outer)


def test_a_kernel_error_is_not_a_build_failure():
    kernel_error = RuntimeError("Unsupported group_size: 5")
    assert not jit.is_build_failure(_raise_from("/site/flashinfer/decode.py", kernel_error))
    assert not jit.is_build_failure(ValueError("shape mismatch"))


def test_select_k_keeps_what_the_tests_keep():
    keep = jit.select_k("not (moe and flashinfer)")
    fi = _job("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048", "flashinfer")
    sgl = _job("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048", "sglang")
    norm = _job("rmsnorm_h4096", "flashinfer")
    assert [keep(j) for j in (fi, sgl, norm)] == [False, True, True]
    assert jit.select_k(None) is None
    assert jit.select_k("rmsnorm_h4096")(norm) and not jit.select_k("rmsnorm_h4096")(fi)


def test_order_puts_the_shortest_expected_first():
    norm, moe = _job("rmsnorm_h4096"), jit.Job("m", "m", "moe", "flashinfer", "x", 1.0)
    assert jit.order([moe, norm]) == [norm, moe]
    earlier = [jit.BuildRecord("rmsnorm_h4096", "torch", "built", seconds=900.0)]
    assert jit.order([norm, moe], earlier) == [moe, norm]  # the recorded time beats the guess


def test_the_pool_runs_every_job_and_streams_each_record(tmp_path):
    report = tmp_path / "jit.jsonl"
    config = jit.JitConfig(device="cpu", workers=2, report=str(report), log_dir=str(tmp_path / "logs"))
    jobs = [_job("rmsnorm_h4096"), _job("silu_and_mul_i256")]
    records = list(jit.run(jobs, config))
    assert sorted(r.key for r in records) == sorted(j.key for j in jobs)
    assert {r.status for r in records} == {"cached"}, [r.message for r in records]
    assert all(r.seconds > 0 and r.budget == 120.0 for r in records)
    assert sorted(tuple(json.loads(line)[k] for k in ("definition", "source"))
                  for line in report.read_text().splitlines()) == sorted(j.key for j in jobs)
    # resumed: nothing runs again, the recorded results come back
    size = report.stat().st_size
    again = list(jit.run(jobs, jit.JitConfig(device="cpu", workers=2, report=str(report), resume=True)))
    assert sorted(r.key for r in again) == sorted(j.key for j in jobs) and report.stat().st_size == size


def test_a_job_past_its_budget_is_killed_and_the_next_one_still_runs(tmp_path):
    # the slow job: a GEMM over 32 MiB of weights, whose warm-up takes far longer than 1 ms (a norm's can take
    # less than the 10 ms this test once gave it)
    slow, same_api = _job("gemm_n4096_k4096", budget=0.001), _job("gemm_n4096_k4096_bf16")
    other = _job("silu_and_mul_i256")
    config = jit.JitConfig(device="cpu", workers=1, log_dir=str(tmp_path))
    records = {r.definition: r for r in jit.run([slow, same_api, other], config)}
    assert records["gemm_n4096_k4096"].status == "build-timeout"
    assert "budget of 0.001 s" in records["gemm_n4096_k4096"].message
    assert records["silu_and_mul_i256"].status == "cached"  # a new worker took the next job
    # the same API's other job is tried in its own time, not given up with its sibling
    assert records["gemm_n4096_k4096_bf16"].status == "cached"


def test_one_job_per_api_goes_first_and_the_rest_wait_for_it():
    jobs = [_job(n) for n in ("rmsnorm_h4096", "rmsnorm_h7168", "silu_and_mul_i256", "silu_and_mul_i2304")]
    schedule = jit._Schedule(jobs, jit.expected(jobs), jit.LONG_SECONDS, 1)
    first, second = schedule.take(), schedule.take()
    assert {first.definition, second.definition} == {"rmsnorm_h4096", "silu_and_mul_i256"}
    assert not schedule.ready  # the followers wait for their leaders
    schedule.done(first, jit.BuildRecord(first.definition, "torch", "built"))
    follower = {"rmsnorm_h4096": "rmsnorm_h7168", "silu_and_mul_i256": "silu_and_mul_i2304"}[first.definition]
    assert schedule.take().definition == follower


def test_apis_of_one_module_are_one_group():
    def key(api: str) -> tuple[str, str]:
        return jit.group_key(jit.Job("d", "d", "x", "flashinfer", api, 1.0))

    assert key("flashinfer.sampling.top_k_sampling_from_probs") == key("flashinfer.sampling.top_p_sampling_from_probs")
    assert key("flashinfer.norm.rmsnorm") == key("flashinfer.norm.fused_add_rmsnorm") != key("flashinfer.rope.x")
    assert key("flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)") == \
        key("flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper") == ("flashinfer", "flashinfer.decode")


def test_a_failed_build_makes_the_ground_truth_unavailable(tmp_path, monkeypatch):
    d = load_definition("rmsnorm_h4096")
    report = tmp_path / "jit.jsonl"
    adapter_api = "torch"  # the torch adapter needs no package: the prebuild is never consulted for it
    report.write_text(json.dumps(jit.BuildRecord(d.name, "torch", "build-failed", api=adapter_api,
                                                 message="nvcc: out of memory").as_dict()) + "\n")
    lookup = jit.JitReport.load(report).outcome
    get_ground_truth("torch", d, device="cpu", prebuild=lookup)  # a source without a package has nothing to build

    from flashinfer_trace.groundtruth import base

    fake = base.Adapter("flashinfer", "rmsnorm", "flashinfer.norm.rmsnorm", lambda call: (),
                        package=base.Package("json", ("nonexistent-dist",), "json"))
    report.write_text(json.dumps(jit.BuildRecord(d.name, "flashinfer", "build-timeout", api=fake.api,
                                                 message="not built within its budget of 600 s").as_dict()) + "\n")
    with pytest.raises(GroundTruthUnavailable) as e:
        base._check_prebuild(fake, d, jit.JitReport.load(report).outcome)
    assert e.value.kind == "build-timeout" and "600 s" in str(e.value)


def test_build_states_reach_the_matrix():
    skipped = {"nodeid": "t::x", "status": "skipped", "message": "build-failed: flashinfer.norm.rmsnorm: nvcc",
               "properties": {"skip_kind": "build-failed"}}
    assert cell_state_of(from_v1(skipped)) == "build-failed"
    assert cell_state_of(from_v1({**skipped, "properties": {"skip_kind": "build-timeout"}})) == "build-timeout"
    summary = {"counts": {"built": 3, "cached": 70}, "wall_seconds": 95.0, "compiled_during_tests": ["x"]}
    label = jit_label(summary)
    assert label == "built 3, cached 70 in 95.0 s; 1 compiled during tests"


def test_k_expression_is_found_in_pytest_arguments():
    assert k_expression(["-q", "-k", "not moe", "-x"]) == "not moe"
    assert k_expression(["-knorm"]) == "norm"
    assert k_expression(["-q"]) is None


def test_cli_rejects_a_malformed_budget(capsys):
    assert main(["jit", "build", "--budget-for", "moe", "--no-progress", "--report", ""]) == 2
    assert "NAME=SECONDS" in capsys.readouterr().err


def test_cli_on_a_machine_without_gpu_plans_nothing(tmp_path, capsys):
    # every kernel ground truth needs CUDA: nothing to build, nothing failed
    assert main(["jit", "build", "rmsnorm_h4096", "--device", "cpu", "--no-progress",
                 "--report", str(tmp_path / "r.jsonl"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records"] == [] and out["summary"]["jobs"] == 0


def test_check_builds_before_it_checks(tmp_path, monkeypatch):
    """check's prebuild stage writes its report beside --results and hands its path to the checks."""
    import argparse

    from flashinfer_trace.cli.run import _prebuild

    args = argparse.Namespace(results=str(tmp_path / "check.jsonl"), resume=False, no_progress=True,
                              jit_budget=jit.DEFAULT_BUDGET)
    # nothing to build on the CPU: no prebuild runs, the report's path is still handed over
    assert _prebuild([load_definition("rmsnorm_h4096")], ("flashinfer",), "cpu", args) == \
        (None, str(tmp_path / "jit.jsonl"), {})


def test_a_worker_that_cannot_start_is_a_record_not_a_hang(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("fork failed")

    monkeypatch.setattr(jit.scheduler, "_Worker", refuse)
    jobs = [_job("rmsnorm_h4096"), _job("rmsnorm_h7168"), _job("silu_and_mul_i256")]
    records = list(jit.run(jobs, jit.JitConfig(device="cpu", workers=2)))
    assert sorted(r.key for r in records) == sorted(j.key for j in jobs)
    assert {r.status for r in records} == {"error"}
    assert all("the prebuild worker failed: OSError: fork failed" in r.message for r in records)


def test_a_stamped_job_is_not_run_again_until_something_changes(tmp_path):
    stamps, lib = tmp_path / "stamps.json", tmp_path / "cache" / "norm.so"
    lib.parent.mkdir()
    lib.write_bytes(b"\x7fELF")
    config = jit.JitConfig(device="cpu", workers=1, stamps=str(stamps))
    job = _job("rmsnorm_h4096")
    first = list(jit.run([job], config))
    assert [(r.status, r.checked_by) for r in first] == [("cached", "warm-up")]
    assert json.loads(stamps.read_text())["torch:rmsnorm_h4096"]["libraries"] == {}  # torch loads no JIT module
    again = list(jit.run([job], config))
    assert [(r.status, r.checked_by, r.seconds) for r in again] == [("cached", "stamp", 0.0)]
    assert "not run again" in again[0].message and jit.summarise(again)["stamped"] == 1
    # a library it loaded changed: the stamp no longer holds, the job runs
    entry = json.loads(stamps.read_text())
    entry["torch:rmsnorm_h4096"]["libraries"] = {str(lib): lib.stat().st_mtime - 1}
    stamps.write_text(json.dumps(entry))
    assert [r.checked_by for r in jit.run([job], config)] == ["warm-up"]
    # another definition file (another fingerprint) is not covered by this one's stamp
    other = jit.Job(job.definition, str(tmp_path / "copy.json"), job.op_type, job.source, job.api, job.budget)
    (tmp_path / "copy.json").write_text("{}")
    assert jit.Stamps(stamps).fresh(other) is None and jit.Stamps(stamps).fresh(job) is not None
    # --recheck runs it anyway
    recheck = jit.JitConfig(device="cpu", workers=1, stamps=str(stamps), recheck=True)
    assert [r.checked_by for r in jit.run([job], recheck)] == ["warm-up"]


def test_a_job_names_the_libraries_its_own_process_loaded(tmp_path):
    root = tmp_path / "cache"
    (root / "a").mkdir(parents=True)
    mine, other = root / "a" / "norm.so", root / "a" / "gemm_sm90.so"
    mine.write_bytes(b"x")
    other.write_bytes(b"y")
    maps = tmp_path / "maps"
    maps.write_text(f"7f00-7f10 r-xp 00000000 08:01 42 {mine}\n7f10-7f20 r--p 00001000 08:01 42 {mine}\n"
                    f"7f20-7f30 r-xp 00000000 08:01 43 /usr/lib/libc.so.6\n7f30-7f40 rw-p 00000000 00:00 0\n")
    assert jit.loaded_libraries([root], str(maps)) == {str(mine): mine.stat().st_mtime}


def test_the_long_jobs_build_below_the_short_ones_priority():
    jobs = [_job(n) for n in ("rmsnorm_h4096", "silu_and_mul_i256", "gemm_n4096_k4096")]
    config = jit.JitConfig(device="cpu", workers=3, long_seconds=100)  # gemm (176 s by the guess) is long
    base = os.getpriority(os.PRIO_PROCESS, 0)
    nice = {r.definition: r.nice for r in jit.run(jobs, config)}
    assert nice == {"gemm_n4096_k4096": max(base, jit.NICE), "rmsnorm_h4096": base, "silu_and_mul_i256": base}


def test_a_report_is_read_by_path_without_the_environment(tmp_path, monkeypatch):
    """JitReport.load(path).outcome(): a torn line, a record of an unknown status and an unreadable path are
    skipped; the last record of a pair wins."""
    report = tmp_path / "jit.jsonl"
    first = jit.BuildRecord("rmsnorm_h4096", "flashinfer", "build-timeout", api="flashinfer.norm.rmsnorm")
    last = jit.BuildRecord("rmsnorm_h4096", "flashinfer", "built", api="flashinfer.norm.rmsnorm", modules=["norm"])
    other = jit.BuildRecord("gemm_n4096_k4096", "flashinfer", "build-failed", message="nvcc")
    lines = [json.dumps(r.as_dict()) for r in (first, other, last)]
    lines.insert(1, json.dumps({**other.as_dict(), "status": "melted"}))
    report.write_text("\n".join(lines) + '\n{"definition": "torn", "sou')
    loaded = jit.JitReport.load(report)
    assert len(loaded) == 2
    assert loaded.outcome("rmsnorm_h4096", "flashinfer") == last
    assert loaded.outcome("gemm_n4096_k4096", "flashinfer") == other
    assert loaded.outcome("rmsnorm_h4096", "sglang") is None
    assert len(jit.JitReport.load(tmp_path / "missing.jsonl")) == 0 and len(jit.JitReport.load(None)) == 0
    assert [r.key for r in jit.read_report(report)] == [other.key, last.key]  # in the order last written


JIT_PACKAGE = Path(jit.__file__).parent


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it (TYPE_CHECKING blocks and function bodies too), absolute."""
    package = "flashinfer_trace.sweep.jit"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.add(module)
            if not node.module:  # from . import x
                found.update(f"{module}.{a.name}" for a in node.names)
    return found


def test_the_jit_report_is_a_leaf():
    """report.py imports the standard library and the status vocabulary only (the engine reads it while cases
    run); the package-wide cycle guard is tests/unit/test_import_cycles.py."""
    allowed = set(sys.stdlib_module_names) | {"pydantic"}
    found = {m for m in _imports(JIT_PACKAGE / "report.py") if m.split(".")[0] not in allowed}
    assert found <= {"flashinfer_trace.status"}, found


def test_importing_the_report_loads_no_ground_truth_nor_the_build_pool():
    code = ("import sys; import flashinfer_trace.sweep.jit.report; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('flashinfer_trace'))))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    loaded = set(res.stdout.split())
    assert "flashinfer_trace.sweep.jit.report" in loaded
    assert not {m for m in loaded if m.startswith(("flashinfer_trace.groundtruth", "flashinfer_trace.inputs"))}
    assert not loaded & {"flashinfer_trace.sweep.jit.scheduler", "flashinfer_trace.sweep.jit.worker",
                         "flashinfer_trace.sweep.jit.cache", "flashinfer_trace.sweep.results"}

"""Matrix sessions: result files, the in-environment session runner, install failures, the manifest,
and the sessions nox lists."""

import importlib.util
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from flashinfer_trace.status import Kind, Status
from flashinfer_trace.sweep import manifest
from flashinfer_trace.sweep.combos import load_combination
from flashinfer_trace.sweep.install import InstallOptions, install
from flashinfer_trace.sweep.results import SessionInfo, TestRecord, junit_xml, read_records, write_session
from flashinfer_trace.sweep.session import EXIT_SKIPPED, run_session

ROOT = Path(__file__).resolve().parents[2]


def _nox() -> str:
    return str(Path(sys.executable).parent / "nox") if (Path(sys.executable).parent / "nox").exists() else "nox"


needs_nox = pytest.mark.skipif(shutil.which("nox") is None and not (Path(sys.executable).parent / "nox").exists(),
                               reason="nox is not installed")


def test_results_round_trip_and_junit(tmp_path):
    records = [TestRecord("tests/a.py::test_ok", "passed", 0.5, properties={"seed": 1}),
               TestRecord("tests/a.py::test_skip", "skipped", message="not-installed: flashinfer"),
               TestRecord("tests/a.py::test_bad", "failed", message="Mismatch: 3 of 8 differ"),
               TestRecord("tests/a.py::test_crash", "error", message="process died with SIGSEGV"),
               TestRecord("tests/a.py::test_hang", "timeout", message="no result after 5 s")]
    info = SessionInfo("references-x", "cpu-torch2.13", status="tests-failed")
    write_session(tmp_path, info, records=records, manifest={"python": {}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.json", "junit.xml", "session.json", "tests.json"]
    assert not list(tmp_path.glob(".*.tmp")), "atomic writes leave no temporary files"
    assert read_records(tmp_path / "tests.json") == records
    session = json.loads((tmp_path / "session.json").read_text())
    assert session["counts"] == {"passed": 1, "failed": 1, "error": 1, "timeout": 1, "skipped": 1}
    suite = ET.fromstring(junit_xml(records, "s")).find("testsuite")
    counted = (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped"))
    assert counted == ("5", "1", "2", "1")
    props = {p.get("name"): p.get("value") for p in suite.find("testcase").iter("property")}
    assert props == {"seed": "1"}
    with pytest.raises(ValueError, match="unknown test status"):
        TestRecord("x", "exploded")
    with pytest.raises(ValueError, match="unknown session status"):
        SessionInfo("s", "c", status="meh")


PLANTED = '''
import os, signal, pytest

def test_passes(record_property):
    record_property("seed", 7)
    assert 1 + 1 == 2

def test_skips():
    pytest.skip("not-installed: flashinfer")

def test_crashes():
    os.kill(os.getpid(), signal.SIGSEGV)

def test_after_the_crash():
    assert True
'''


def _planted_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "repo"
    (tree / "tests" / "references").mkdir(parents=True)
    (tree / "tests" / "references" / "conftest.py").write_text(
        "from flashinfer_trace.pytest_plugin import *  # noqa: F401,F403\n")
    (tree / "tests" / "references" / "test_planted.py").write_text(PLANTED)
    return tree


def test_a_session_survives_a_crash_and_writes_every_file(tmp_path):
    tree = _planted_tree(tmp_path)
    combo = load_combination(ROOT / "constraints" / "cpu-torch2.13.toml")
    out = tmp_path / "results" / "references-cpu"
    rc = run_session("references", combo, "references-cpu", out, install={"mode": "fresh"}, jobs=1,
                     test_timeout=60, cwd=tree)
    assert rc == 1
    session = json.loads((out / "session.json").read_text())
    assert session["status"] == "tests-failed" and session["install_mode"] == "fresh"
    assert session["constraints_sha256"] == combo.sha256 and session["arch"] == "cpu"
    by_name = {r.nodeid.rsplit("::", 1)[1]: r for r in read_records(out / "tests.json")}  # CaseRecords
    assert by_name["test_passes"].status is Status.PASS and by_name["test_passes"].seed == 7
    skipped = by_name["test_skips"]
    assert skipped.status is Status.SKIP and skipped.kind is Kind.NOT_INSTALLED and "flashinfer" in skipped.detail
    assert by_name["test_crashes"].status is Status.ERROR and "SIGSEGV" in by_name["test_crashes"].detail
    assert by_name["test_after_the_crash"].status is Status.PASS
    env = json.loads((out / "env.json").read_text())
    assert env["combination"]["id"] == "cpu-torch2.13" and env["torch"]["version"].startswith("2.")
    assert "clocks_start" in env and "clocks_end" in env
    assert ET.parse(out / "junit.xml").getroot().find("testsuite").get("errors") == "1"


def test_records_stream_as_tests_finish_and_resume_runs_only_the_rest(tmp_path):
    from flashinfer_trace.sweep.session import streamed_records

    tree = _planted_tree(tmp_path)
    combo = load_combination(ROOT / "constraints" / "cpu-torch2.13.toml")
    out = tmp_path / "results" / "references-cpu"
    run_session("references", combo, "references-cpu", out, install={"mode": "fresh"}, jobs=1, test_timeout=60,
                cwd=tree)
    streamed = streamed_records(out)
    assert sorted(r.nodeid for r in streamed) == sorted(r.nodeid for r in read_records(out / "tests.json"))
    # Keep two of the four as if the session had been killed after them (a torn line too), then resume.
    lines = (out / "tests.jsonl").read_text().splitlines()
    kept = [json.loads(line)["nodeid"] for line in lines[:2]]
    (out / "tests.jsonl").write_text("\n".join(lines[:2]) + '\n{"nodeid": "torn')
    (out / "tests.json").unlink()
    rc = run_session("references", combo, "references-cpu", out, install={"mode": "fresh"}, jobs=1,
                     test_timeout=60, cwd=tree, resume=True)
    assert rc == 1
    records = read_records(out / "tests.json")
    assert sorted(r.nodeid for r in records) == sorted(r.nodeid for r in streamed)  # each test once
    logs = "".join(p.read_text() for p in (out / "logs").glob("*.deselect"))
    assert all(n in logs for n in kept)  # the resumed child deselected what was recorded


def test_matrix_reads_a_session_killed_mid_run(tmp_path):
    from flashinfer_trace.matrix.build import read_session

    out = tmp_path / "references-cpu"
    out.mkdir()
    (out / "session.json").write_text(json.dumps(SessionInfo("references-cpu", "cpu-torch2.13",
                                                             status="running").as_dict()))
    (out / "tests.jsonl").write_text(json.dumps(TestRecord("tests/references/test_rmsnorm.py::test_x", "passed",
                                                           0.1).as_dict()) + '\n{"nodeid": "cut')
    problems: list = []
    data = read_session(out, problems)
    assert data.session["status"] == "interrupted" and "1 streamed test record" in data.session["reason"]
    assert [t.nodeid for t in data.tests] == ["tests/references/test_rmsnorm.py::test_x"] and not problems


def test_a_gpu_session_without_a_gpu_is_recorded_and_skipped(tmp_path):
    combo = load_combination(ROOT / "constraints" / "cu130-torch2.11-fi0.6.6.toml")
    out = tmp_path / "results" / "references-cuda13"
    rc = run_session("references", combo, "references-cuda13", out, cwd=_planted_tree(tmp_path))
    session = json.loads((out / "session.json").read_text())
    assert rc == EXIT_SKIPPED and session["status"] == "no-gpu" and "needs a CUDA GPU" in session["reason"]
    assert not (out / "tests.json").exists() and (out / "env.json").exists()


def test_a_failed_install_is_a_result_with_the_log_tail(tmp_path):
    text = (ROOT / "constraints" / "cpu-torch2.13.toml").read_text().replace('torch = "2.13.0"', 'torch = "9.9.9"')
    path = tmp_path / "cpu-torch9.9.toml"
    path.write_text(text)
    empty = tmp_path / "wheelhouse"
    empty.mkdir()
    result = install(load_combination(path), sys.executable, InstallOptions(wheelhouse=empty), project=ROOT,
                     log=tmp_path / "install.log")
    assert not result.ok and result.mode == "offline" and "CalledProcessError" in result.error
    assert "torch==9.9.9" in result.tail() and result.steps[-1].endswith("torch==9.9.9")


def test_manifest_on_this_machine():
    m = manifest.finish(manifest.collect(combination={"id": "x"}, install={"mode": "fresh"}, repo=ROOT))
    assert m["python"]["version"].count(".") == 2 and m["packages"]["torch"]
    assert m["torch"]["cuda_available"] in (True, False) and m["combination"] == {"id": "x"}
    assert {"clocks_start", "clocks_end", "git_sha", "environment", "gpu"} <= set(m)


@needs_nox
def test_nox_lists_the_sessions_a_ci_job_needs():
    nox = str(Path(sys.executable).parent / "nox") if (Path(sys.executable).parent / "nox").exists() else "nox"
    listed = subprocess.run([nox, "-l", "--json", "-t", "nightly"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout
    sessions = {s["name"]: s["tags"] for s in json.loads(listed)}
    assert "references-cpu-torch2.13" in sessions
    tags = sessions["references-cu130-torch2.11-fi0.6.6-sm90"]
    assert {"references", "cuda13", "sm90", "nightly", "combo:cu130-torch2.11-fi0.6.6"} <= set(tags)
    assert "uninstallable" in sessions["references-cu128-torch2.8-fi0.4.1"]
    assert any(n.startswith("bench-") for n in sessions)
    plain = subprocess.run([nox, "-l"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in ("references-cpu", "references-cuda12", "references-cuda13", "bench-cuda12", "bench-cuda13", "tests",
                 "lint", "matrix", "references-cu130-torch2.11-fi0.6.6"):
        assert f" {name} " in plain, name


def test_large_reference_files_are_sharded_in_proportion_to_their_definitions():
    from flashinfer_trace.sweep.session import shard

    files = [f"tests/references/test_{op}.py" for op in ("gemm", "rmsnorm", "mla_paged")]
    plan = shard(files, 8, Path("definitions"))
    gemm = [t for t in plan if not isinstance(t, str) and t[0].endswith("test_gemm.py")]
    assert len(gemm) >= 4 and {t[1] for t in gemm} == {("--shard", f"{i}/{len(gemm)}") for i in range(len(gemm))}
    assert plan[0] == gemm[0]  # the biggest file's shards start first
    assert "tests/references/test_mla_paged.py" in plan  # two definitions: one process
    assert shard(files, 1, Path("definitions")) == files


def test_small_reference_files_share_a_process_and_no_file_is_lost():
    """A CPU session packs the files of few definitions into groups (each test process starts torch and a fork
    server): every file and shard still runs once, a group runs exactly its files' definitions, the heaviest first."""
    from flashinfer_trace.sweep.isolation import collect_files
    from flashinfer_trace.sweep.session import group_small, shard, target_definitions, target_files

    definitions = ROOT / "definitions"
    plan = shard(collect_files([str(ROOT / "tests" / "references")]), 2, definitions)
    grouped = group_small(plan, 2, definitions)
    assert len(grouped) < len(plan) // 2
    assert sorted(f for t in grouped for f in target_files(t)) == sorted(f for t in plan for f in target_files(t))
    assert {t for t in plan if not isinstance(t, str)} <= set(grouped)  # shards and own arguments stay alone
    share = sum(len(target_definitions(f, definitions) or []) for f in plan) // 8
    for t in (t for t in grouped if not isinstance(t, str) and t[1][0].endswith(".py")):
        names = target_definitions(t, definitions)
        assert names == [d for f in target_files(t) for d in target_definitions(f, definitions)]
        assert len(names) <= share
    assert grouped[0] == plan[0]


def test_shards_split_a_file_without_overlap_or_loss():
    def collect(*extra):
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              "tests/references/test_rope.py", *extra], capture_output=True, text=True, timeout=300)
        return {line for line in out.stdout.splitlines() if "::" in line}

    everything = collect()
    shards = [collect("--shard", f"{i}/3") for i in range(3)]
    assert all(shards) and sum(map(len, shards)) == len(everything) and set().union(*shards) == everything


def test_parallel_test_processes_share_the_cores(monkeypatch):
    from flashinfer_trace.sweep import session

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(session.os, "cpu_count", lambda: 16)
    assert session.child_environment(8)["OMP_NUM_THREADS"] == "2"
    assert session.child_environment(1)["OMP_NUM_THREADS"] == "16"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice stands
    assert session.child_environment(8)["OMP_NUM_THREADS"] == "3"


def test_the_session_sums_where_the_tests_spent_their_time():
    from flashinfer_trace.sweep.session import phase_totals

    records = [TestRecord("a", "passed", 1.0, properties={"phases": {"inputs": 0.3, "reference": 0.5}}),
               TestRecord("b", "passed", 1.0, properties={"phases": {"reference": 1.25, "worker_starts": 1}}),
               TestRecord("c", "skipped", 0.0)]
    assert phase_totals(records) == {"inputs": 0.3, "reference": 1.8, "worker_starts": 1}


def test_the_summary_names_each_bad_test_with_its_reason_escaped():
    from flashinfer_trace.results.record import CaseRecord
    from flashinfer_trace.sweep.session import bad_lines

    bad = [CaseRecord(definition="d", check="match", status=Status.ERROR, kind=Kind.REFERENCE,
                      detail="RuntimeError: boom\x1b[2J\nsecond line", nodeid="tests/references/test_x.py::t[d]"),
           TestRecord("tests/bench/test_y.py::b", "failed", message="assert 1 == 2")]
    lines = bad_lines(bad)
    assert lines[0] == "  tests/references/test_x.py::t[d]: error [reference]: RuntimeError: boom\\x1b[2J"
    assert lines[1] == "  tests/bench/test_y.py::b: failed: assert 1 == 2"
    many = bad_lines(bad * 15, limit=20)
    assert len(many) == 21 and many[-1].startswith("  ... and 10 more")


def test_a_jit_session_of_a_cpu_combination_has_nothing_to_build(tmp_path):
    combo = load_combination(ROOT / "constraints" / "cpu-torch2.13.toml")
    assert run_session("jit", combo, "jit-cpu", tmp_path, cwd=ROOT) == 0
    info = json.loads((tmp_path / "session.json").read_text())
    assert info["status"] == "ok" and info["jit"]["counts"] == {} and "no GPU" in info["jit"]["note"]


def test_a_reused_environment_with_the_same_install_is_not_installed_again(tmp_path, monkeypatch):
    from flashinfer_trace.sweep import install as inst

    site, wheels = tmp_path / "site", tmp_path / "wheels"
    site.mkdir()
    wheels.mkdir()
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"x")
    calls = []

    def fake(combo, python, options, *, project, log, env=None):
        calls.append(options.mode)
        return inst.InstallResult(ok=len(calls) != 4, mode=options.mode, log=str(log), steps=["pip install ..."])

    monkeypatch.setattr(inst, "_install", fake)
    monkeypatch.setattr(inst, "site_packages", lambda python: site)
    combo = load_combination(ROOT / "constraints" / "cpu-torch2.13.toml")
    opts = InstallOptions(wheelhouse=wheels)
    first = install(combo, sys.executable, opts, project=ROOT, log=tmp_path / "1.log")
    again = install(combo, sys.executable, opts, project=ROOT, log=tmp_path / "2.log")
    assert first.ok and again.ok and len(calls) == 1
    assert again.steps[0].startswith("unchanged since") and "nothing installed" in (tmp_path / "2.log").read_text()
    (site / "flashinfer_trace_combo.pth").write_text(str(tmp_path / "gone") + "\n")  # a layer's folder removed
    install(combo, sys.executable, opts, project=ROOT, log=tmp_path / "2b.log")
    assert len(calls) == 2
    (site / "flashinfer_trace_combo.pth").unlink()
    (wheels / "b-1.0-py3-none-any.whl").write_bytes(b"y")  # another wheelhouse: installed again
    install(combo, sys.executable, opts, project=ROOT, log=tmp_path / "3.log")
    assert len(calls) == 3
    failed = install(combo, sys.executable, InstallOptions(), project=ROOT, log=tmp_path / "4.log")
    assert not failed.ok and len(calls) == 4
    install(combo, sys.executable, InstallOptions(), project=ROOT, log=tmp_path / "5.log")  # a failure is no stamp
    assert len(calls) == 5


def test_an_interrupt_during_the_prebuild_keeps_every_record(tmp_path, monkeypatch):
    from flashinfer_trace.sweep import jit
    from flashinfer_trace.sweep import session as sess

    combo = load_combination(ROOT / "constraints" / "cu130-torch2.11-fi0.6.6.toml")
    out = tmp_path / "results" / "references-cuda13"
    out.mkdir(parents=True)
    earlier = [TestRecord(f"tests/references/test_planted.py::test_{i}", "passed", 0.1) for i in range(2)]
    (out / "tests.jsonl").write_text("".join(json.dumps(r.as_dict()) + "\n" for r in earlier))

    def prebuild(results, *args, **kwargs):  # one module built, then Ctrl-C while the next builds
        (results / sess.JIT_STREAM).write_text(json.dumps(jit.BuildRecord("d", "flashinfer", "built").as_dict()) + "\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(sess, "check_gpu", lambda combo, arch: ("ok", None, "sm90"))
    monkeypatch.setattr(sess, "plan_prebuild", prebuild)
    rc = run_session("references", combo, "references-cuda13", out, cwd=_planted_tree(tmp_path), resume=True)
    s = json.loads((out / "session.json").read_text())
    assert rc == 130 and s["status"] == "interrupted" and "during the JIT prebuild after 2 test(s)" in s["reason"]
    assert s["counts"] == {"pass": 2} and s["jit"]["counts"] == {"built": 1} and s["jit"]["interrupted"]


def test_offline_extra_wheels_go_in_after_the_pins_without_dependencies(tmp_path, monkeypatch):
    # sglang 0.5.16 on the node: its pins go in --no-deps, so the modules it imports (xgrammar, torchvision, ...)
    # come from a folder of their own, each --no-deps, after the pins (a pin's wheel is never replaced)
    from flashinfer_trace.sweep import install as inst

    site, wheels, extra = tmp_path / "site", tmp_path / "wheels", tmp_path / "extra"
    for d in (site, wheels, extra):
        d.mkdir()
    (extra / "xgrammar-0.2.1-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"x")
    (extra / "dill-0.4.1-py3-none-any.whl").write_bytes(b"y")
    commands: list[list[str]] = []

    def run(self, cmd):
        commands.append([str(c) for c in cmd])
        if "--target" in commands[-1]:  # pip makes the folder
            Path(commands[-1][commands[-1].index("--target") + 1]).mkdir(parents=True, exist_ok=True)
        return ""

    monkeypatch.setattr(inst._Runner, "__call__", run)
    monkeypatch.setattr(inst, "site_packages", lambda python: site)
    monkeypatch.setenv("FLASHINFER_TRACE_SITE", str(tmp_path / "combos"))
    combo = load_combination(ROOT / "constraints" / "cu130-torch2.11-fi0.6.14-sglang0.5.16.toml")
    result = inst._install(combo, sys.executable, InstallOptions(wheelhouse=wheels, extra_wheels=extra,
                                                                 preinstalled_torch=sys.executable),
                           project=ROOT, log=tmp_path / "install.log")
    assert result.ok, result.error
    pins = next(i for i, c in enumerate(commands) if "sglang==0.5.16" in c)
    extras = next(i for i, c in enumerate(commands) if any(a.endswith("manylinux_2_28_x86_64.whl") for a in c))
    assert pins < extras and "--no-deps" in commands[pins] and "--no-deps" in commands[extras]
    assert "--upgrade" not in commands[extras] and sum(a.endswith(".whl") for a in commands[extras]) == 2
    opts, _ = inst.parse_session_args(["--wheelhouse", str(wheels), "--extra-wheels", str(extra)], environ={})
    assert opts.extra_wheels == extra
    with pytest.raises(ValueError, match="--extra-wheels needs --wheelhouse"):
        inst.parse_session_args(["--extra-wheels", str(extra)], environ={})
    with pytest.raises(ValueError, match="not a folder"):
        inst.parse_session_args(["--wheelhouse", str(wheels), "--extra-wheels", str(tmp_path / "no")], environ={})


def test_offline_pins_whose_wheels_add_a_pth_file_are_importable(tmp_path, monkeypatch):
    # nvidia-cutlass-dsl puts `cutlass` under nvidia_cutlass_dsl/dsl_packages and a .pth file that adds that folder;
    # Python runs a .pth file of a site directory only, not of a folder another .pth file names
    from flashinfer_trace.sweep import install as inst

    site, wheels = tmp_path / "site", tmp_path / "wheels"
    for d in (site, wheels):
        d.mkdir()

    def run(self, cmd):
        cmd = [str(c) for c in cmd]
        if "--target" in cmd:  # what pip leaves in the folder: the package out of sight, and the .pth that adds it
            target = Path(cmd[cmd.index("--target") + 1])
            (target / "dsl" / "dsl_packages" / "planted_dsl").mkdir(parents=True)
            (target / "dsl" / "dsl_packages" / "planted_dsl" / "__init__.py").write_text("")
            (target / "dsl" / "__init__.py").write_text("")
            hook = "import sys, os, dsl; sys.path.insert(0, os.path.join(dsl.__path__[0], 'dsl_packages'))\n"
            (target / "dsl_packages.pth").write_text(hook)
        return ""

    monkeypatch.setattr(inst._Runner, "__call__", run)
    monkeypatch.setattr(inst, "site_packages", lambda python: site)
    monkeypatch.setenv("FLASHINFER_TRACE_SITE", str(tmp_path / "combos"))
    combo = load_combination(ROOT / "constraints" / "cu130-torch2.11-fi0.6.6.toml")
    result = inst._install(combo, sys.executable, InstallOptions(wheelhouse=wheels, preinstalled_torch=sys.executable),
                           project=ROOT, log=tmp_path / "install.log")
    assert result.ok, result.error
    assert any("dsl_packages.pth" in s for s in result.steps)
    # a fresh interpreter reads the environment's site-packages as it would at start-up
    probe = f"import site; site.addsitedir({str(site)!r}); import planted_dsl; print(planted_dsl.__file__)"
    out = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(tmp_path / "combos" / combo.id))
    assert inst._layers_intact(site)
    (site / "flashinfer_trace_combo_site.pth").unlink()  # an environment layered before the .pth files were run
    assert not inst._layers_intact(site)


def test_each_reference_test_gives_its_cached_cuda_blocks_back(monkeypatch):
    """Sixteen processes share one GPU in a session: blocks one caches after a large case must go back
    to the device (a false OutOfMemoryError on the H100 otherwise), and a process without CUDA is left alone."""
    import types

    from flashinfer_trace import pytest_plugin

    calls = []
    cuda = types.SimpleNamespace(is_initialized=lambda: True, empty_cache=lambda: calls.append("empty"),
                                 synchronize=lambda: None)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(pytest_plugin, "_broken", None)
    pytest_plugin.release_cuda_cache()
    assert calls == ["empty"] and pytest_plugin._broken is None
    cuda.is_initialized = lambda: False
    pytest_plugin.release_cuda_cache()
    assert calls == ["empty"]


def test_a_test_that_broke_the_cuda_context_marks_its_process_to_end(monkeypatch):
    """A sticky CUDA error shows at the next synchronisation: the process is marked, and ends after the test's
    report (test_isolation.py shows the rest running in a new process)."""
    import types

    from flashinfer_trace import pytest_plugin

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    cuda = types.SimpleNamespace(is_initialized=lambda: True, empty_cache=lambda: None, synchronize=broken)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(pytest_plugin, "_broken", None)
    pytest_plugin.release_cuda_cache()
    assert "illegal memory access" in pytest_plugin._broken


def _nox_sessions(tmp_path: Path, constraints: dict[str, str]):
    """The project's noxfile over these constraint files only: a function from a tag to the session names."""
    (tmp_path / "constraints").mkdir()
    shutil.copy(ROOT / "noxfile.py", tmp_path / "noxfile.py")
    (tmp_path / "src").symlink_to(ROOT / "src")
    for name, text in constraints.items():
        (tmp_path / "constraints" / name).write_text(text)

    def names(tag: str) -> set[str]:
        out = subprocess.run([_nox(), "-f", str(tmp_path / "noxfile.py"), "-l", "--json", "-t", tag], cwd=tmp_path,
                             capture_output=True, text=True, check=True)
        return {s["name"] for s in json.loads(out.stdout)}

    return names


@needs_nox
def test_nox_torch_axis_selects_exactly_the_cpu_combinations_and_the_nightly_runs_them():
    from flashinfer_trace.sweep.combos import load_combinations

    def listed(tag):
        out = subprocess.run([_nox(), "-l", "--json", "-t", tag], cwd=ROOT, capture_output=True, text=True, check=True)
        return {s["name"]: s["tags"] for s in json.loads(out.stdout)}

    cpu = [c.id for c in load_combinations(ROOT / "constraints") if not c.gpu]
    axis = listed("torch-axis")
    assert sorted(axis) == sorted(f"references-{c}" for c in cpu) and len(axis) == 8
    assert "references-cpu-torch2.8" in axis and "references-cpu-torch2.15" in axis
    nightly = listed("nightly")
    assert set(axis) <= set(nightly) and "references-cpu" not in nightly  # the alias would run 2.13 twice
    spec = importlib.util.spec_from_file_location("ci_plan", ROOT / "scripts" / "ci_plan.py")
    plan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plan)
    jobs = plan.plan([{"name": n, "tags": t} for n, t in nightly.items()])
    assert {e["session"] for e in jobs["cpu"]} >= set(axis) and not set(axis) & {e["session"] for e in jobs["gpu"]}


@needs_nox
def test_a_cpu_combination_with_nightly_false_stays_on_the_axis_but_out_of_the_nightly(tmp_path):
    body = '[combination]\ncuda = "none"\ntorch_variant = "cpu"\narchs = []\npython = ">=3.10"\n{extra}\n' \
           '[pins]\ntorch = "{torch}"\n'
    names = _nox_sessions(tmp_path, {
        "cpu-torch2.13.toml": "# a\n" + body.format(extra='default_for = ["cpu"]', torch="2.13.0"),
        "cpu-torch2.9.toml": "# b\n" + body.format(extra="nightly = false", torch="2.9.1")})
    assert names("torch-axis") == {"references-cpu-torch2.13", "references-cpu-torch2.9"}
    assert "references-cpu-torch2.9" not in names("nightly") and "references-cpu-torch2.13" in names("nightly")


def test_a_session_says_when_the_torch_it_imports_is_not_the_pinned_build(tmp_path):
    """A torch-axis session whose environment has another torch (PyPI's CUDA build for a CPU combination, or
    another version) says so in session.json's reason: the matrix column is then not only the pin's word."""
    import torch

    tree = tmp_path / "repo"
    (tree / "tests" / "references").mkdir(parents=True)
    (tree / "tests" / "references" / "conftest.py").write_text(
        "from flashinfer_trace.pytest_plugin import *  # noqa: F401,F403\n")
    (tree / "tests" / "references" / "test_one.py").write_text("def test_one():\n    pass\n")
    combo = load_combination(ROOT / "constraints" / "cpu-torch2.8.toml")  # this interpreter's torch is not 2.8.0
    out = tmp_path / "results" / "references-cpu-torch2.8"
    assert run_session("references", combo, "references-cpu-torch2.8", out, install={"mode": "fresh"}, jobs=1,
                       test_timeout=60, cwd=tree) == 0
    session = json.loads((out / "session.json").read_text())
    here = torch.__version__.split("+")[0]
    assert session["status"] == "ok" and f"torch {here} instead of 2.8.0" in session["reason"]
    from flashinfer_trace.sweep.session import torch_differences_found

    assert torch_differences_found(combo, None, {"version": "2.8.0+cu128", "cuda": "12.8"}) == [
        "torch variant cu128 instead of cpu"]
    assert torch_differences_found(combo, None, {"version": "2.8.0+cpu", "cuda": None}) == []
    assert torch_differences_found(combo, {"differences": ["from the install"]}, {"version": "2.8.0"}) == [
        "from the install"]
    assert torch_differences_found(combo, None, {"error": "ImportError: no torch"}) == []


@needs_nox
def test_nox_release_axis_selects_the_tagged_per_arch_references_and_bench_and_not_the_nightly(tmp_path):
    gpu = ('# g\n[combination]\ncuda = "13"\ntorch_variant = "cu130"\narchs = ["sm90"]\npython = ">=3.10"\n{extra}\n'
           '[pins]\ntorch = "2.11.0"\nflashinfer-python = "{fi}"\n')
    names = _nox_sessions(tmp_path, {
        "cpu-torch2.13.toml": '# c\n[combination]\ncuda = "none"\ntorch_variant = "cpu"\narchs = []\n'
                              'python = ">=3.10"\ndefault_for = ["cpu"]\n[pins]\ntorch = "2.13.0"\n',
        "cu130-fi0.6.6.toml": gpu.format(extra="", fi="0.6.6"),
        "cu130-fi0.6.9.toml": gpu.format(extra='nightly = false\ntags = ["release-axis"]', fi="0.6.9"),
        "cu130-fi0.9.0.toml": gpu.format(
            extra='nightly = false\ntags = ["release-axis"]\nstatus = "uninstallable"\nreason = "torch>=2.12"',
            fi="0.9.0")})
    assert names("release-axis") == {"references-cu130-fi0.6.9-sm90", "bench-cu130-fi0.6.9-sm90",
                                     "references-cu130-fi0.9.0"}  # the uninstallable one records why
    nightly = names("nightly")
    assert "references-cu130-fi0.6.6-sm90" in nightly and not {n for n in nightly if "0.6.9" in n or "0.9.0" in n}


def test_an_interrupt_before_the_tests_of_a_cpu_session_is_recorded_as_such(tmp_path, monkeypatch):
    """Ctrl-C during a step before the tests (here the fi_trace import): the session is `interrupted`, its reason
    says where, and there is no JIT prebuild to report on a CPU."""
    from flashinfer_trace.sweep import session as sess

    def import_interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sess, "fi_trace_step", import_interrupted)
    out = tmp_path / "results" / "references-cpu"
    rc = run_session("references", load_combination(ROOT / "constraints" / "cpu-torch2.13.toml"), "references-cpu",
                     out, install={"mode": "fresh"}, cwd=_planted_tree(tmp_path))
    s = json.loads((out / "session.json").read_text())
    assert rc == 130 and s["status"] == "interrupted" and "interrupted before the tests after 0 test(s)" in s["reason"]
    assert s["jit"] is None


def test_the_summary_counts_info_apart_and_lists_it_in_a_line_of_its_own(tmp_path, capsys):
    """Info records (a kernel differing where its API promises nothing) fail nothing: a session of passes and
    info ends ok with exit 0, its counts say `info N`, and one line of its own names them, apart from the
    failures' lines."""
    import time
    from types import SimpleNamespace

    from flashinfer_trace.results.record import CaseRecord
    from flashinfer_trace.sweep.session import SessionConfig, SessionState, finish

    def r(name, status, kind=None, detail=None):
        return CaseRecord(definition="dec", check="edge", source="flashinfer", status=status, kind=kind,
                          detail=detail, nodeid=f"tests/references/test_gqa_paged.py::t[{name}]")

    combo = load_combination(ROOT / "constraints" / "cpu-torch2.13.toml")
    info = [r("a", Status.INFO, Kind.OUTSIDE_CONTRACT, "outside the contract (x: y): ..."),
            r("b", Status.INFO, Kind.OUTSIDE_CONTRACT, "outside the contract (x: y): ...")]
    for records, code, status in ((info + [r("c", Status.PASS)], 0, "ok"),
                                  (info + [r("d", Status.FAIL, Kind.MISMATCH, "lse off")], 1, "tests-failed")):
        state = SessionState(SessionInfo("references-x", combo.id), {}, time.monotonic(), records=records,
                             timeline=SimpleNamespace(as_dict=lambda background: {}))
        assert finish(state, SessionConfig("references", combo, "references-x", tmp_path)) == code
        lines = capsys.readouterr().err.splitlines()
        assert lines[0].startswith(f"references-x: {status}: ") and "info 2" in lines[0]
        assert json.loads((tmp_path / "session.json").read_text())["counts"]["info"] == 2
        (line,) = [x for x in lines if x.startswith("  info ")]
        assert line == ("  info 2, outside the API's contract (not failures; the records say why): "
                        "tests/references/test_gqa_paged.py::t[a], tests/references/test_gqa_paged.py::t[b]")
        assert [x for x in lines if "::t[" in x and x is not line] == (
            ["  tests/references/test_gqa_paged.py::t[d]: fail [mismatch]: lse off"] if code else [])


def test_a_process_holding_memory_beyond_its_cases_ends_after_the_test(monkeypatch):
    """Memory a test process keeps that no case of its holds is outside the device's budget: past the limit the
    process ends after its test (the rest run in a new one); below it, or off a GPU, nothing happens."""
    import types

    from flashinfer_trace import pytest_plugin
    from flashinfer_trace.check import Memo

    monkeypatch.setattr(pytest_plugin, "_broken", None)
    pytest_plugin.strays(types.SimpleNamespace(stray_bytes=lambda: 1 << 30))
    assert pytest_plugin._broken is None
    pytest_plugin.strays(types.SimpleNamespace(stray_bytes=lambda: 5 << 30))
    assert "holds 5.0 GiB of device memory beyond its cases'" in pytest_plugin._broken
    monkeypatch.setattr(pytest_plugin, "_broken", None)
    # memory a reference cycle held, back once the collector ran: judged after collecting, the process goes on
    import gc

    collected = []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(1) or 0)
    pytest_plugin.strays(types.SimpleNamespace(stray_bytes=lambda: (5 << 30) if not collected else 0))
    assert collected and pytest_plugin._broken is None
    pytest_plugin.strays(Memo("cpu"))  # no GPU: nothing to judge
    assert Memo("cpu").stray_bytes() is None and pytest_plugin._broken is None


PLANTED_OOM = '''
import os
from flashinfer_trace.results.record import CaseRecord

MARK = os.path.join(os.path.dirname(__file__), "ran-once")

def _record(record_property, status, kind=None, detail=None):
    record_property("record", CaseRecord(definition="big_h1", op_type="planted", check="match", status=status,
                                         kind=kind, detail=detail, memory={"planned": 1 << 30}).as_dict())

def test_big(record_property):
    first = not os.path.exists(MARK)
    open(MARK, "a").write(f"{os.getpid()} ")
    if first:
        _record(record_property, "not-run", "out-of-memory", "out-of-memory: 1.00 GiB not granted (planted)")
    else:
        _record(record_property, "pass")

def test_small(record_property):
    _record(record_property, "pass")
'''


def test_a_case_out_of_memory_beside_the_others_runs_again_alone_after_them(tmp_path):
    """Out of memory is never a verdict: the session's last step runs such cases again in one process, once every
    other test process has ended; the later record replaces the earlier, in tests.jsonl too, and is marked."""
    from flashinfer_trace.sweep.session import streamed_records

    tree = _planted_tree(tmp_path)
    (tree / "tests" / "references" / "test_planted.py").write_text(PLANTED_OOM)
    combo = load_combination(ROOT / "constraints" / "cpu-torch2.13.toml")
    out = tmp_path / "results" / "references-cpu"
    rc = run_session("references", combo, "references-cpu", out, install={"mode": "fresh"}, jobs=2,
                     test_timeout=60, cwd=tree)
    runs = (tree / "tests" / "references" / "ran-once").read_text().split()
    assert len(runs) == 2 and runs[0] != runs[1]  # the second run in a process of its own
    by_name = {r.nodeid.rsplit("::", 1)[1]: r for r in read_records(out / "tests.json")}
    assert by_name["test_big"].status is Status.PASS and by_name["test_big"].memory["rerun_alone"] is True
    assert by_name["test_small"].status is Status.PASS and "rerun_alone" not in (by_name["test_small"].memory or {})
    assert {r.nodeid.rsplit("::", 1)[1]: r.status for r in streamed_records(out)} == {
        "test_big": Status.PASS, "test_small": Status.PASS}
    session = json.loads((out / "session.json").read_text())
    assert rc == 0 and session["status"] == "ok" and session["memory"]["out_of_memory"] == 0
    assert session["memory"]["rerun_alone"] == 1

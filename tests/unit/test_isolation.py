"""Planted faults for `run_isolated`: a crash, a hang and a broken import each fail only their own
test (or target), and every other result still arrives."""

import os
import textwrap
import time

import pytest

from flashinfer_trace.sweep.isolation import collect_files, run_isolated


@pytest.fixture
def plant(tmp_path):
    """Write a test file into tmp_path and return its path as a string."""

    def write(name: str, source: str) -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return str(path)

    return write


def run(tmp_path, targets, **kwargs):
    kwargs.setdefault("test_timeout", 30)
    return run_isolated(targets, [], cwd=str(tmp_path), log_dir=tmp_path / "logs", **kwargs)


def short(records):
    return [(r.nodeid.rpartition("::")[2] or r.nodeid, r.status) for r in records]


def test_crash_fails_only_its_test_and_the_run_resumes(tmp_path, plant):
    target = plant("test_crash.py", """
        import os, signal

        def test_before():
            pass

        def test_crash():
            os.kill(os.getpid(), signal.SIGSEGV)

        def test_crash_after():  # shares test_crash's prefix: resuming must still run it
            pass
    """)
    records = run(tmp_path, [target])
    assert short(records) == [("test_before", "passed"), ("test_crash", "error"), ("test_crash_after", "passed")]
    assert "SIGSEGV (signal 11) during this test" in records[1].message
    assert "Fatal Python error" in records[1].message  # faulthandler's dump, pytest's own frames left out
    assert 'test_crash.py", line 8 in test_crash' in records[1].message


def test_exit_inside_a_test_and_a_missing_target(tmp_path, plant):
    target = plant("test_exit.py", "import os\n\ndef test_exit():\n    os._exit(3)\n\ndef test_next():\n    pass\n")
    records = run(tmp_path, [target, str(tmp_path / "test_missing.py")])
    assert short(records) == [("test_exit", "error"), ("test_next", "passed"),
                              (str(tmp_path / "test_missing.py"), "error")]
    assert records[0].message.startswith("process exited with code 3 during this test")
    assert "exited with code 4 without running any test" in records[2].message
    assert "file or directory not found" in records[2].message


def test_hang_times_out_and_the_process_group_dies(tmp_path, plant):
    pidfile = tmp_path / "grandchild.pid"
    target = plant("test_hang.py", f"""
        import subprocess, sys, time

        def test_before():
            pass

        def test_hang():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
            with open({str(pidfile)!r}, "w") as f:
                f.write(str(child.pid))
            time.sleep(3600)

        def test_after():
            pass
    """)
    start = time.monotonic()
    records = run(tmp_path, [target], test_timeout=3)
    assert time.monotonic() - start < 60
    assert short(records) == [("test_before", "passed"), ("test_hang", "timeout"), ("test_after", "passed")]
    assert records[1].message == "no result after 3 s: killed the process group"
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:  # killed; gone once init (or a subreaper) reaps it
        time.sleep(0.1)
    assert not alive(pid)


def alive(pid: int) -> bool:
    """os.kill(pid, 0) succeeds on a zombie too: in a container whose init does not reap, a killed
    orphan stays one, so its state counts."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("body", ["raise RuntimeError('no GPU library here')", "def broken(:"])
def test_import_failure_is_one_error_for_the_target(tmp_path, plant, body):
    target = plant("test_broken.py", f"""
        def test_never():
            pass

        {body}
    """)
    records = run(tmp_path, [target])
    assert [r.status for r in records] == ["error"]
    assert ("no GPU library here" if "Runtime" in body else "SyntaxError") in records[0].message
    assert records[0].nodeid.endswith("test_broken.py")


def test_outcomes_messages_and_properties(tmp_path, plant):
    target = plant("test_outcomes.py", """
        import pytest

        def test_pass(record_property):
            record_property("seed", 3)
            record_property("tolerance", {"atol": 1e-3, "rtol": 1e-2})

        def test_skip():
            pytest.skip("no-gpu: torch sees no CUDA device")

        @pytest.mark.skip(reason="not on this arch")
        def test_skip_marker():
            pass

        @pytest.mark.xfail(reason="known bad rounding")
        def test_xfail():
            assert False

        @pytest.mark.xfail(reason="fixed upstream")
        def test_xpass():
            pass

        def test_fail(record_property):
            record_property("seed", 7)
            assert 1 == 2, "max abs diff 0.5"

        @pytest.fixture
        def broken_teardown():
            yield
            raise RuntimeError("teardown blew up")

        def test_teardown_error(broken_teardown):
            pass

        @pytest.fixture
        def broken_setup():
            raise RuntimeError("setup blew up")

        def test_setup_error(broken_setup):
            pass
    """)
    by_name = {r.nodeid.rpartition("::")[2]: r for r in run(tmp_path, [target])}
    assert {n: r.status for n, r in by_name.items()} == {
        "test_pass": "passed", "test_skip": "skipped", "test_skip_marker": "skipped", "test_xfail": "xfailed",
        "test_xpass": "xpassed", "test_fail": "failed", "test_teardown_error": "error", "test_setup_error": "error"}
    assert by_name["test_pass"].properties == {"seed": 3, "tolerance": {"atol": 1e-3, "rtol": 1e-2}}
    assert by_name["test_skip"].message == "no-gpu: torch sees no CUDA device"
    assert by_name["test_skip_marker"].message == "not on this arch"
    assert by_name["test_xfail"].message == "known bad rounding"
    assert by_name["test_fail"].properties == {"seed": 7}
    assert "AssertionError: max abs diff 0.5" in by_name["test_fail"].message
    assert "teardown blew up" in by_name["test_teardown_error"].message
    assert "setup blew up" in by_name["test_setup_error"].message
    assert all(r.duration >= 0 for r in by_name.values())


def test_parallel_targets_keep_their_order(tmp_path, plant):
    a = plant("test_a.py", "def test_one():\n    pass\n\ndef test_two():\n    assert False\n")
    b = plant("test_b.py", "import os, signal\n\ndef test_three():\n    os.kill(os.getpid(), signal.SIGSEGV)\n")
    records = run(tmp_path, [a, b], jobs=2)
    assert short(records) == [("test_one", "passed"), ("test_two", "failed"), ("test_three", "error")]
    assert records[0].nodeid.startswith("test_a.py") and records[2].nodeid.startswith("test_b.py")


def test_nodeid_target_and_pytest_args(tmp_path, plant):
    path = plant("test_select.py", "def test_x():\n    pass\n\ndef test_y():\n    pass\n\ndef test_z():\n    pass\n")
    records = run_isolated([f"{path}::test_x"], [], cwd=str(tmp_path))
    assert short(records) == [("test_x", "passed")]
    assert short(run_isolated([path], ["-k", "not test_y"], cwd=str(tmp_path))) == [("test_x", "passed"),
                                                                                      ("test_z", "passed")]


def test_collect_files(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("test_b.py", "test_a.py", "sub/test_c.py", "helper.py", "conftest.py"):
        (tmp_path / name).write_text("")
    found = collect_files([str(tmp_path), "tests/x.py::test_y"])
    assert found == [str(tmp_path / "sub" / "test_c.py"), str(tmp_path / "test_a.py"), str(tmp_path / "test_b.py"),
                     "tests/x.py::test_y"]


def test_a_broken_cuda_context_ends_its_process_after_the_report_and_the_rest_run_anew(tmp_path, plant):
    """The reference plugin's rule: a test that leaves the CUDA context broken keeps its own record, and the
    tests after it run in a new process instead of inheriting the error (stood in for by the plugin's flag)."""
    target = plant("test_context.py", """
        import os
        import flashinfer_trace.pytest_plugin as plugin

        def test_breaks_it():
            plugin._broken = "CUDA error: an illegal memory access was encountered"

        def test_after_one():
            assert plugin._broken is None, "inherited the broken context"
            print("pid", os.getpid())

        def test_after_two():
            assert plugin._broken is None
    """)
    records = run_isolated([target], ["-p", "flashinfer_trace.pytest_plugin", "-s"], cwd=str(tmp_path),
                           log_dir=tmp_path / "logs", test_timeout=60)
    assert short(records) == [("test_breaks_it", "passed"), ("test_after_one", "passed"),
                              ("test_after_two", "passed")]
    logs = sorted((tmp_path / "logs").glob("*.log"))
    assert len(logs) == 2 and "the CUDA context cannot be trusted" in logs[0].read_text()


def test_a_collection_the_device_refused_is_tried_again_not_recorded(tmp_path, plant, monkeypatch):
    """The seventh run: an MPS server recovering from another process's fatal fault refused every new client, and
    each test file's collection error ("MPS server is not ready") was recorded as the file's result. A collection
    the device refused is tried again after a wait; a collection error of the file's own is recorded at once."""
    from flashinfer_trace.sweep import isolation

    monkeypatch.setattr(isolation, "REFUSED_WAITS", (0.1, 0.1, 0.1))
    tries = tmp_path / "tries"
    target = plant("test_refused.py", f"""
        import pathlib

        tries = pathlib.Path({str(tries)!r})
        tries.write_text(tries.read_text() + "x" if tries.exists() else "x")
        if len(tries.read_text()) < 3:
            raise RuntimeError("Unexpected error from cudaGetDeviceCount(). Error 807: MPS server is not ready to "
                               "accept new MPS client requests")

        def test_after_the_server_recovered():
            pass
    """)
    records = run(tmp_path, [target])
    assert short(records) == [("test_after_the_server_recovered", "passed")] and tries.read_text() == "xxx"
    broken = plant("test_broken_import.py", "import no_such_module_here\n\ndef test_x():\n    pass\n")
    started = time.monotonic()
    records = run(tmp_path, [broken])
    assert [r.status for r in records] == ["error"] and "collection error" in records[0].message
    assert time.monotonic() - started < 20  # not waited on
    tries.write_text("")  # refused every time: after the waits, recorded as before
    monkeypatch.setattr(isolation, "REFUSED_WAITS", (0.1,))
    always = plant("test_always_refused.py", """
        raise RuntimeError("CUDA error: MPS client terminated")

        def test_never():
            pass
    """)
    records = run(tmp_path, [always])
    assert [r.status for r in records] == ["error"] and "MPS client terminated" in records[0].message

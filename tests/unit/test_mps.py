"""The session's own CUDA MPS daemon (sweep/mps.py), against a stand-in control binary that records
how it was called: started with private directories, exported while the session runs, quit after;
every way it cannot start is a recorded reason, never an error."""

from __future__ import annotations

import os
import stat

import pytest

from flashinfer_trace.sweep import mps


def _fake_control(tmp_path, rc: int = 0):
    calls = tmp_path / "calls"
    script = tmp_path / "bin" / mps.CONTROL
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\necho \"$* pipe=${mps.PIPE_ENV} stdin=$(cat)\" >> {calls}\n"
                      f"echo 'cannot start' >&2\nexit {rc}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return calls, str(script.parent)


@pytest.fixture
def no_user_daemon(monkeypatch):
    monkeypatch.delenv(mps.PIPE_ENV, raising=False)
    monkeypatch.delenv(mps.LOG_ENV, raising=False)


def test_the_session_starts_its_own_daemon_and_quits_it(tmp_path, monkeypatch, no_user_daemon):
    calls, bin_dir = _fake_control(tmp_path)
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    with mps.session() as state:
        pipe = os.environ[mps.PIPE_ENV]
        assert state["used"] and state["own"] and state["reason"] is None
        assert os.path.isdir(pipe) and pipe.startswith(state["dir"])
        assert mps.recorded() == state  # what the session process records in session.json
    assert mps.PIPE_ENV not in os.environ and not os.path.exists(state["dir"]) and mps.recorded() is None
    started, quit_ = calls.read_text().splitlines()
    assert started.startswith(f"-d pipe={pipe}") and quit_ == f" pipe={pipe} stdin=quit"


def test_a_daemon_that_cannot_start_is_a_reason(tmp_path, monkeypatch, no_user_daemon):
    _, bin_dir = _fake_control(tmp_path, rc=1)
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    with mps.session() as state:
        assert mps.PIPE_ENV not in os.environ
    assert not state["used"] and "failed (1): cannot start" in state["reason"]


def test_without_the_control_binary_or_when_turned_off(monkeypatch, no_user_daemon):
    monkeypatch.setenv("PATH", "/nonexistent")
    with mps.session() as state:
        assert state == {"used": False, "own": False, "reason": f"{mps.CONTROL} not found"}
    with mps.session(enabled=False) as state:
        assert not state["used"] and "--mps turns it on" in state["reason"] and mps.recorded() == state


def test_the_users_own_daemon_is_used_as_it_is(tmp_path, monkeypatch):
    calls, bin_dir = _fake_control(tmp_path)
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv(mps.PIPE_ENV, "/run/their-mps")
    with mps.session() as state:
        assert state["used"] and not state["own"] and os.environ[mps.PIPE_ENV] == "/run/their-mps"
    assert not calls.exists()  # neither started nor quit


def test_mps_is_an_opt_in_session_flag():
    """Off by default (one client's fatal fault reaches every client of the daemon); --mps turns it on, and
    --no-mps wins wherever it stands."""
    from flashinfer_trace.sweep.install import parse_session_args

    opts, rest = parse_session_args(["--no-mps", "-k", "rmsnorm"], environ={})
    assert not opts.mps and rest == ["-k", "rmsnorm"]
    assert not parse_session_args([], environ={})[0].mps
    opts, rest = parse_session_args(["--mps", "-k", "rmsnorm"], environ={})
    assert opts.mps and rest == ["-k", "rmsnorm"]
    assert not parse_session_args(["--mps", "--no-mps"], environ={})[0].mps
    assert not parse_session_args(["--no-mps", "--mps"], environ={})[0].mps


def test_clients_name_the_daemons_gpus_from_zero(tmp_path, monkeypatch, no_user_daemon):
    """A session on the host's second GPU (CUDA_VISIBLE_DEVICES=1): the daemon is started seeing that GPU alone, so
    its clients must call it 0. Left at 1, every test process of the session saw no GPU (H200 pair, 2026-11-28)."""
    calls = tmp_path / "calls"
    script = tmp_path / "bin" / mps.CONTROL
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\necho \"$* visible=$CUDA_VISIBLE_DEVICES\" >> {calls}\ncat >/dev/null\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(script.parent) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with mps.session() as state:
        assert state["used"] and os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"  # the host's numbering again for what comes after
    assert calls.read_text().splitlines()[0] == "-d visible=1"  # the daemon sees the host's GPU 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with mps.session():
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"

"""The host runner (sweep/host.py) with stand-in sessions: each is a short Python process that records when it ran
and on which GPU (CUDA_VISIBLE_DEVICES) and writes its session.json; the GPU list is given, not read from
nvidia-smi. Two GPUs run two sessions at once, never one GPU twice at once, never two sessions of one combination
at once; a failing session does not stop the others; the summary says what ran where."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flashinfer_trace.sweep import host
from flashinfer_trace.sweep.host import HostConfig, HostError, HostSession

FAKE = """
import json, os, sys, time
name, results, seconds, rc = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
start = time.time()
time.sleep(seconds)
out = os.path.join(results, name)
os.makedirs(out, exist_ok=True)
if rc == 0:
    json.dump({"status": "ok"}, open(os.path.join(out, "session.json"), "w"))
with open(os.path.join(results, "ran.jsonl"), "a") as f:
    f.write(json.dumps({"name": name, "gpu": os.environ["CUDA_VISIBLE_DEVICES"], "max_jobs": os.environ["MAX_JOBS"],
                        "cores": sys.argv[5], "shared": sys.argv[6], "start": start, "end": time.time(),
                        "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
                        "owner": os.environ.get("FLASHINFER_TRACE_MPS_OWNER")}) + "\\n")
print("session", name, "done")
sys.exit(rc)
"""


def _config(tmp_path, gpus, fail=(), seconds=0.6, cores=8, per_gpu=1, mps=False):
    def command(s: HostSession, share: int, shared: bool) -> list[str]:
        return [sys.executable, "-c", FAKE, s.name, str(tmp_path), str(seconds), "1" if s.name in fail else "0",
                str(share), str(shared)]

    return HostConfig(gpus=gpus, command=command, results=tmp_path, log_dir=tmp_path / "host", cores=cores,
                      per_gpu=per_gpu, mps=mps)


def _ran(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "ran.jsonl").read_text().splitlines()]


def _overlap(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def test_two_gpus_run_two_sessions_at_once_never_one_gpu_twice(tmp_path):
    todo = [HostSession(f"s{i}", f"combo{i}") for i in range(4)]
    summary = host.run(todo, _config(tmp_path, ["0", "1"]))
    ran = _ran(tmp_path)
    assert sorted(r["name"] for r in ran) == ["s0", "s1", "s2", "s3"]
    assert {r["gpu"] for r in ran} == {"0", "1"}
    assert any(_overlap(a, b) for a in ran for b in ran if a is not b)  # side by side
    for a in ran:
        for b in ran:
            if a is not b and a["gpu"] == b["gpu"]:
                assert not _overlap(a, b), (a, b)
    assert {(r["max_jobs"], r["cores"]) for r in ran} == {("4", "4")}  # 8 cores over 2 sessions at once
    assert summary["gpus"] == ["0", "1"] and summary["cores_per_session"] == 4
    assert summary["counts"] == {"ok": 4} and summary["failed"] == []
    # two GPUs: about half the summed time (four 0.6 s sessions, two at a time)
    assert summary["wall_seconds"] < 0.8 * summary["session_seconds"]
    by = {s["session"]: s for s in summary["sessions"]}
    assert all(by[r["name"]]["gpu"] == r["gpu"] for r in ran)
    assert json.loads((tmp_path / "host" / "summary.json").read_text()) == summary
    assert "session s2 done" in (tmp_path / "host" / "s2.log").read_text()


def test_a_failing_session_does_not_stop_the_others(tmp_path):
    todo = [HostSession(f"s{i}", f"combo{i}") for i in range(3)]
    summary = host.run(todo, _config(tmp_path, ["0", "1"], fail={"s0"}, seconds=0.1))
    assert sorted(r["name"] for r in _ran(tmp_path)) == ["s0", "s1", "s2"]
    assert summary["failed"] == ["s0"] and summary["counts"] == {"ok": 2, "exit 1": 1}
    assert next(s for s in summary["sessions"] if s["session"] == "s0")["rc"] == 1


def test_sessions_of_one_combination_never_run_at_once(tmp_path):
    todo = [HostSession("references-a", "a"), HostSession("bench-a", "a"), HostSession("references-b", "b")]
    host.run(todo, _config(tmp_path, ["0", "1"], seconds=0.4))
    ran = {r["name"]: r for r in _ran(tmp_path)}
    assert not _overlap(ran["references-a"], ran["bench-a"])
    assert _overlap(ran["references-a"], ran["references-b"])  # the other GPU took the other combination


def test_one_gpu_runs_them_one_after_another_with_every_core(tmp_path):
    summary = host.run([HostSession("s0", "a"), HostSession("s1", "b")], _config(tmp_path, ["3"], seconds=0.2))
    ran = _ran(tmp_path)
    assert {r["gpu"] for r in ran} == {"3"} and not _overlap(ran[0], ran[1])
    assert summary["cores_per_session"] == 8


def test_sessions_from_nox_listing_keep_this_hosts_arch_and_group_by_combination():
    entries = [
        {"session": "references-c1-sm90", "tags": ["references", "sm90", "combo:c1", "nightly"]},
        {"session": "references-c1-sm80", "tags": ["references", "sm80", "combo:c1", "nightly"]},
        {"session": "bench-c1-sm90", "tags": ["bench", "sm90", "combo:c1", "nightly"]},
        {"session": "references-cpu", "tags": ["references", "cpu", "combo:cpu", "nightly"]},
        {"session": "references-old", "tags": ["references", "uninstallable", "combo:old", "nightly"]},
        {"session": "tests-heavy", "tags": ["nightly", "cpu"]},
    ]
    keep, left = host.sessions(entries, "sm90", cpu=True)
    assert [(s.name, s.group) for s in keep] == [("references-c1-sm90", "c1"), ("bench-c1-sm90", "c1"),
                                                 ("references-cpu", "cpu"), ("tests-heavy", "tests-heavy")]
    assert left == ["references-c1-sm80", "references-old"]
    # by default the CPU sessions hold no GPU slot
    keep, left = host.sessions(entries, "sm90")
    assert [s.name for s in keep] == ["references-c1-sm90", "bench-c1-sm90"]
    assert left == ["references-c1-sm80", "references-cpu", "references-old", "tests-heavy"]
    assert host.nox_command(["nox"], ["--wheelhouse", "wh"])(keep[0], 8, False) == [
        "nox", "-s", "references-c1-sm90", "--", "--cores", "8", "--wheelhouse", "wh"]


def test_bad_gpu_lists_are_refused_by_name(tmp_path):
    assert host.parse_gpus("0, 1") == ["0", "1"]
    with pytest.raises(HostError, match="'a,b'"):
        host.parse_gpus("a,b")
    with pytest.raises(HostError, match="none"):
        _config(tmp_path, [])
    with pytest.raises(HostError, match="named twice"):
        _config(tmp_path, ["0", "0"])


def test_concurrent_sessions_get_their_own_mps_daemon_directories(tmp_path, monkeypatch):
    """Two sessions' daemons (one per GPU) never share pipe or log directories."""
    import os
    import stat

    from flashinfer_trace.sweep import mps

    script = tmp_path / "bin" / mps.CONTROL
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\necho \"$CUDA_VISIBLE_DEVICES ${mps.PIPE_ENV}\" >> {tmp_path / 'calls'}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(mps.PIPE_ENV, raising=False)
    states = []
    for gpu in ("0", "1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpu)
        states.append(mps.start())
    (a, env_a), (b, env_b) = states
    assert a["used"] and b["used"] and a["dir"] != b["dir"]
    dirs = (mps.PIPE_ENV, mps.LOG_ENV)
    assert not {env_a[k] for k in dirs} & {env_b[k] for k in dirs}
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["0", "1"]  # each daemon started pinned to its session's GPU
    # and each session's processes name their daemon's one GPU 0 (mps.start: its numbering, not the host's)
    assert env_a["CUDA_VISIBLE_DEVICES"] == env_b["CUDA_VISIBLE_DEVICES"] == "0"
    for state, env in states:
        mps.stop(state, env)


# a stand-in nox: its listing filters as nox 2026's does (the last -s only; -s ignored beside -t; no -s, -t or -k:
# only the default sessions; -k True: every one), and a session writes its session.json and appends to ran.jsonl
NOX = """#!{python}
import json, os, sys
args = sys.argv[1:]
ENTRIES = [
    {{"session": "references-cpu", "name": "references-cpu", "tags": ["references", "cpu", "combo:cpu"],
      "default": True}},
    {{"session": "good", "name": "good", "tags": ["nightly", "sm90", "combo:good"], "default": False}},
    {{"session": "bad", "name": "bad", "tags": ["nightly", "sm90", "combo:bad"], "default": False}},
    {{"session": "other-arch", "name": "other-arch", "tags": ["nightly", "sm80", "combo:x"], "default": False}},
    {{"session": "references-c1", "name": "references-c1", "tags": ["references", "combo:c1"], "default": False}},
    {{"session": "jit-c1", "name": "jit-c1", "tags": ["jit", "combo:c1"], "default": False}},
    {{"session": "bench-c1", "name": "bench-c1", "tags": ["bench", "combo:c1"], "default": False}},
]
def last(flag):
    return args[len(args) - 1 - args[::-1].index(flag) + 1] if flag in args else None
if "-l" in args:
    s, t, k = last("-s"), last("-t"), last("-k")
    if k == "True":
        keep = ENTRIES
    elif t is not None:
        keep = [e for e in ENTRIES if t in e["tags"]]
    elif s is not None:
        keep = [e for e in ENTRIES if e["session"] == s]
    else:
        keep = [e for e in ENTRIES if e["default"]]
    print(json.dumps([{{k: v for k, v in e.items() if k != "default"}} for e in keep]))
    sys.exit(0)
name = args[args.index("-s") + 1]
results = os.environ["FLASHINFER_TRACE_RESULTS"]
out = os.path.join(results, name)
os.makedirs(out, exist_ok=True)
status = "tests-failed" if name == "bad" else "ok"
json.dump({{"status": status, "posargs": args[args.index("--") + 1:], "gpu": os.environ["CUDA_VISIBLE_DEVICES"]}},
          open(os.path.join(out, "session.json"), "w"))
with open(os.path.join(results, "ran.jsonl"), "a") as f:
    f.write(json.dumps({{"name": name, "gpu": os.environ["CUDA_VISIBLE_DEVICES"]}}) + "\\n")
sys.exit(1 if name == "bad" else 0)
"""


@pytest.fixture
def fake_nox(tmp_path, monkeypatch):
    """The stand-in nox's path; results under tmp_path/results; a host of three sm90 GPUs."""
    nox = tmp_path / "nox"
    nox.write_text(NOX.format(python=sys.executable))
    nox.chmod(0o755)
    monkeypatch.setattr(host, "host_gpus", lambda: (["0", "1", "2"], "sm90"))
    monkeypatch.setenv("FLASHINFER_TRACE_RESULTS", str(tmp_path / "results"))
    return str(nox)


def test_the_command_lists_runs_and_sums_up(tmp_path, fake_nox, capsys):
    from flashinfer_trace.cli import main

    rc = main(["sweep", "run", "-t", "nightly", "--gpus", "0,1", "--cores", "6", "--nox", fake_nox, "--",
               "--wheelhouse", "wh"])
    assert rc == 1  # one session failed
    text = capsys.readouterr().out
    assert ("left out (for another arch than this host's sm90, uninstallable, or CPU sessions without --with-cpu): 1"
            in text)
    summary = json.loads((tmp_path / "results" / "host" / "summary.json").read_text())
    assert summary["counts"] == {"ok": 1, "tests-failed": 1} and summary["failed"] == ["bad"]
    assert summary["cores_per_session"] == 3
    for name in ("good", "bad"):
        written = json.loads((tmp_path / "results" / name / "session.json").read_text())
        assert written["posargs"] == ["--cores", "3", "--wheelhouse", "wh"] and written["gpu"] in ("0", "1")
    assert main(["sweep", "run", "--gpus", "0"]) == 2 and "-t TAG or -s NAME" in capsys.readouterr().err


def test_every_named_session_and_tag_runs_once_over_every_gpu(tmp_path, fake_nox, capsys):
    """-s A -s B -t T: the union, each session once, on both GPUs (nox itself would run only the last -s, and
    none of them beside -t)."""
    from flashinfer_trace.cli import main

    rc = main(["sweep", "run", "-s", "references-c1", "-s", "good", "-t", "nightly", "-s", "good", "--gpus", "0,1",
               "--cores", "4", "--nox", fake_nox])
    assert rc == 1  # bad (tag nightly) failed
    ran = _ran(tmp_path / "results")
    assert sorted(r["name"] for r in ran) == ["bad", "good", "references-c1"]  # other-arch: sm80, left out
    assert {r["gpu"] for r in ran} == {"0", "1"}
    summary = json.loads((tmp_path / "results" / "host" / "summary.json").read_text())
    assert summary["gpus"] == ["0", "1"] and summary["cores_per_session"] == 2


def test_unknown_sessions_and_tags_are_named_with_close_matches_before_anything_runs(tmp_path, fake_nox, capsys):
    from flashinfer_trace.cli import main

    rc = main(["sweep", "run", "-s", "good", "-s", "referenses-c1", "-t", "nigthly", "-t", "bench", "--gpus", "0",
               "--nox", fake_nox])
    err = capsys.readouterr().err
    assert rc == 2
    assert "no session 'referenses-c1' (close: references-c1" in err and "no tag 'nigthly' (close: nightly)" in err
    assert "'good'" not in err and "'bench'" not in err  # those exist
    assert not (tmp_path / "results").exists()  # nothing ran


def test_dry_run_shows_which_session_on_which_gpu_with_its_cores(tmp_path, fake_nox, capsys):
    from flashinfer_trace.cli import main

    args = ["sweep", "run", "-t", "nightly", "-s", "references-c1", "-s", "bench-c1", "-s", "jit-c1", "--gpus",
            "0,1", "--cores", "8", "--nox", fake_nox, "--dry-run"]
    assert main([*args, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["gpus"] == ["0", "1"] and shown["cores_per_session"] == 4 and shown["left_out"] == ["other-arch"]
    assert [(p["gpu"], p["session"]) for p in shown["plan"]] == [
        ("0", "references-c1"), ("1", "jit-c1"),  # the named ones first, in the order named; jit-c1 is not
        # references-c1's group, so it runs beside it, and bench-c1 is, so it waits
        ("0", "bench-c1"), ("1", "good"),  # then the tag's, in nox's order; each GPU takes the next
        ("0", "bad")]
    assert shown["plan"][0]["command"] == [fake_nox, "-s", "references-c1", "--", "--cores", "4"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "5 session(s) over GPU(s) 0, 1, one session per GPU at a time, 4 cores each" in text
    gpu0 = text[text.index("GPU 0:"):text.index("GPU 1:")]
    assert f"{fake_nox} -s references-c1 -- --cores 4" in gpu0 and f"{fake_nox} -s bench-c1 -- --cores 4" in gpu0
    assert "jit-c1" in text[text.index("GPU 1:"):] and "good" in text[text.index("GPU 1:"):]
    assert main([*args, "--json", "--per-gpu", "2"]) == 0  # two at once per GPU: four slots, 2 cores each
    shown = json.loads(capsys.readouterr().out)
    assert shown["gpus"] == ["0", "1", "0", "1"] and shown["per_gpu"] == 2 and shown["cores_per_session"] == 2
    assert shown["mps"] == "off"  # the default: every shared session takes turns
    assert shown["plan"][0]["command"] == [fake_nox, "-s", "references-c1", "--", "--cores", "2"]
    assert main([*args, "--json", "--per-gpu", "2", "--", "--mps"]) == 0
    shown = json.loads(capsys.readouterr().out)
    # asked for: a shared GPU's reference sessions use the runner's MPS daemon; a benchmark takes turns (--no-mps)
    assert shown["plan"][0]["command"] == [fake_nox, "-s", "references-c1", "--", "--cores", "2", "--mps"]
    assert shown["mps"] == "runner"
    bench = next(p["command"] for p in shown["plan"] if p["session"] == "bench-c1")
    assert bench[-2:] == ["--no-mps", "--mps"]
    assert not (tmp_path / "results").exists()  # nothing ran


def test_the_listing_is_every_session_selected_in_python(fake_nox):
    entries = host.list_sessions([fake_nox])
    assert [e["session"] for e in entries] == ["references-cpu", "good", "bad", "other-arch", "references-c1",
                                               "jit-c1", "bench-c1"]  # not only the default session
    picked = host.select(entries, ["bench-c1", "good"], ["nightly", "jit"])
    # the named ones in the order named (the queue), then the tags' in nox's order; each once
    assert [e["session"] for e in picked] == ["bench-c1", "good", "bad", "other-arch", "jit-c1"]
    with pytest.raises(HostError, match=r"no session 'god' \(close: good\)"):
        host.select(entries, ["god"], [])
    with pytest.raises(HostError, match=r"no tag 'zzz' \(`nox -l`"):
        host.select(entries, [], ["zzz"])


def test_group_of_a_combinations_sessions_and_its_own_for_the_prebuild():
    assert host.group_of("references-c1-sm90") == host.group_of("bench-c1") == host.group_of("references-c1") == "c1"
    assert host.group_of("jit-c1") == "jit:c1"
    assert host.group_of("references-cpu-torch2.10") == "cpu-torch2.10"
    # an alias session's combination is its combo: tag
    assert host.group_of("references-cuda13", ["references", "combo:cu130-x"]) == "cu130-x"
    assert host.group_of("jit-cuda13", ["jit", "combo:cu130-x"]) == host.group_of("jit-cu130-x") == "jit:cu130-x"
    assert host.group_of("tests-heavy", ["nightly", "cpu"]) == "tests-heavy"  # no combination: its own


def test_a_prebuild_runs_beside_its_combinations_references_but_not_beside_another_prebuild(tmp_path):
    entries = [{"session": n, "tags": ["combo:c1"]} for n in ("references-c1", "jit-c1", "jit-cuda13", "bench-c1")]
    todo, _ = host.sessions(entries, None)
    assert [s.group for s in todo] == ["c1", "jit:c1", "jit:c1", "c1"]
    host.run(todo, _config(tmp_path, ["0", "1"], seconds=0.4))
    ran = {r["name"]: r for r in _ran(tmp_path)}
    assert _overlap(ran["references-c1"], ran["jit-c1"])
    assert not _overlap(ran["jit-c1"], ran["jit-cuda13"])
    assert not _overlap(ran["references-c1"], ran["bench-c1"])


def test_sessions_share_a_gpu_per_gpu_at_a_time_without_mps_daemons_of_their_own(tmp_path):
    """--per-gpu 2 on two GPUs: four sessions at once, two on each GPU and never three, the cores split four ways,
    and each told its GPU is shared (the nox command then says --no-mps)."""
    todo = [HostSession(f"s{i}", f"combo{i}") for i in range(6)]
    assert host.slots_for(todo, ["0", "1"], 2) == ["0", "1", "0", "1"]
    assert host.slots_for(todo[:3], ["0", "1"], 2) == ["0", "1", "0"]  # fewer sessions: spread over both GPUs
    summary = host.run(todo, _config(tmp_path, ["0", "1"], cores=8, per_gpu=2, seconds=0.8))
    ran = _ran(tmp_path)
    assert sorted(r["name"] for r in ran) == [f"s{i}" for i in range(6)]
    assert {(r["max_jobs"], r["cores"], r["shared"]) for r in ran} == {("2", "2", "True")}
    for a in ran:  # no three sessions on one GPU at a time: at each start, at most two of that GPU are running
        running = [b for b in ran if b["gpu"] == a["gpu"] and b["start"] <= a["start"] < b["end"]]
        assert len(running) <= 2, (a, running)
    assert any(_overlap(a, b) for a in ran for b in ran if a is not b and a["gpu"] == b["gpu"])
    assert summary["per_gpu"] == 2 and summary["cores_per_session"] == 2
    one = host.run(todo[:2], _config(tmp_path / "one", ["0", "1"]))  # one per GPU: not shared
    assert {r["shared"] for r in _ran(tmp_path / "one")} == {"False"} and one["per_gpu"] == 1
    nox = host.nox_command(["nox"], ["--jobs", "4"])  # no MPS asked for: nothing to turn off
    assert nox(todo[0], 3, True) == nox(todo[0], 3, False) == ["nox", "-s", "s0", "--", "--cores", "3", "--jobs", "4"]
    # asked for: a session on a shared GPU that does not join the runner's daemon is told --no-mps (which wins)
    nox = host.nox_command(["nox"], ["--mps", "--jobs", "4"])
    assert nox(todo[0], 3, True) == ["nox", "-s", "s0", "--", "--cores", "3", "--no-mps", "--mps", "--jobs", "4"]
    assert nox(todo[0], 3, False) == ["nox", "-s", "s0", "--", "--cores", "3", "--mps", "--jobs", "4"]
    with pytest.raises(HostError, match="--per-gpu 0: at least 1"):
        _config(tmp_path, ["0"], per_gpu=0)


def test_a_shared_gpus_reference_sessions_use_one_mps_daemon_the_runner_owns(tmp_path, monkeypatch):
    """--per-gpu 2 on two GPUs with MPS: one daemon per GPU, started pinned to it before its sessions and quit after
    the last; its reference sessions find it (no --no-mps), a benchmark session does not (it times kernels alone)."""
    import os
    import stat

    from flashinfer_trace.sweep import mps

    script = tmp_path / "bin" / mps.CONTROL
    script.parent.mkdir()
    calls = tmp_path / "calls"
    script.write_text(f"#!/bin/sh\nline=$(cat); echo \"$CUDA_VISIBLE_DEVICES ${mps.PIPE_ENV} $* $line\" >> {calls}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(mps.PIPE_ENV, raising=False)
    todo = [HostSession(f"references-c{i}", f"c{i}") for i in range(3)] + [HostSession("bench-c9", "c9")]
    summary = host.run(todo, _config(tmp_path, ["0", "1"], cores=8, per_gpu=2, seconds=0.4, mps=True))
    log = [c.split() for c in calls.read_text().splitlines()]
    starts = {c[0]: c[1] for c in log if c[2:] == ["-d"]}
    quits = {c[1] for c in log if c[2:] == ["quit"]}
    assert sorted(starts) == ["0", "1"] and quits == set(starts.values())  # one per GPU, each quit once
    ran = {r["name"]: r for r in _ran(tmp_path)}
    for name in ("references-c0", "references-c1", "references-c2"):
        r = ran[name]
        assert r["shared"] == "False" and r["pipe"] in starts.values() and "host runner" in r["owner"]
        assert r["gpu"] == "0"  # the daemon's numbering: its one GPU
    assert ran["bench-c9"]["pipe"] is None and ran["bench-c9"]["shared"] == "True"
    assert {g: s["own"] for g, s in summary["mps"].items()} == {"0": True, "1": True}
    # where no daemon can start, the sessions take turns and say so (--no-mps)
    monkeypatch.setenv("PATH", "/nonexistent")
    summary = host.run(todo[:2], _config(tmp_path / "none", ["0"], per_gpu=2, seconds=0.2, mps=True))
    assert {r["shared"] for r in _ran(tmp_path / "none")} == {"True"}
    assert summary["mps"]["0"]["used"] is False and "not found" in summary["mps"]["0"]["reason"]


def test_no_more_gpu_slots_than_groups():
    """Three sessions of one combination on two GPUs: one slot, with every core (a second would only wait)."""
    todo = [HostSession(n, "c1") for n in ("references-c1", "bench-c1", "references-c1-sm90")]
    assert host.slots_for(todo, ["0", "1"]) == ["0"]
    assert [g for g, _ in host.plan(todo, ["0", "1"])] == ["0", "0", "0"]
    two = [*todo, HostSession("references-c2", "c2")]
    assert host.slots_for(two, ["0", "1", "2"]) == ["0", "1"]
    assert [(g, s.name) for g, s in host.plan(two, ["0", "1", "2"])] == [
        ("0", "references-c1"), ("1", "references-c2"), ("0", "bench-c1"), ("0", "references-c1-sm90")]


NOXFILE = """import nox

@nox.session(venv_backend="none", tags=["t1"])
def a(session):
    pass

@nox.session(venv_backend="none", tags=["t2", "combo:c"], default=False)
def b(session):
    pass

@nox.session(name="jit-c", venv_backend="none", tags=["combo:c"], default=False)
def jit_c(session):
    pass
"""


def test_a_real_nox_lists_every_session_not_only_the_default_ones(tmp_path):
    """What the stand-in assumes of nox: `nox -l --json` alone lists only the default sessions, the listing
    here every one of them."""
    pytest.importorskip("nox")
    (tmp_path / "noxfile.py").write_text(NOXFILE)
    nox = [sys.executable, "-m", "nox"]
    plain = subprocess.run([*nox, "-l", "--json"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert [e["session"] for e in json.loads(plain)] == ["a"]
    entries = host.list_sessions(nox, cwd=str(tmp_path))
    assert [(e["session"], e["tags"]) for e in entries] == [("a", ["t1"]), ("b", ["t2", "combo:c"]),
                                                            ("jit-c", ["combo:c"])]
    assert [e["session"] for e in host.select(entries, ["a"], ["t2"])] == ["a", "b"]
    assert [s.group for s in host.sessions(entries, None)[0]] == ["a", "c", "jit:c"]

"""bisect: the search over releases with a fake probe (first bad in the middle, at either end, untestable releases
stepped past, bad inputs refused), a probe's verdict from its records, release listing, a matrix cell and
`matrix diff` naming the bisect, and the user-kernel ground truth (`check --kernel`) bisect relies on."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from packaging.version import Version

from flashinfer_trace.bisect import (
    BisectConfig,
    BisectError,
    Probe,
    Verdict,
    between,
    changelog,
    classify,
    parse_pip_index,
    pinned,
    search,
    wheelhouse_versions,
)
from flashinfer_trace.bisect.cell import from_cell
from flashinfer_trace.matrix.__main__ import main as matrix_main
from flashinfer_trace.matrix.diff import bisect_commands, bisectable_change, diff_environments, diff_matrices
from flashinfer_trace.results.record import CaseRecord, Check, GroundTruthPath
from flashinfer_trace.status import CellState, Kind, Status
from flashinfer_trace.sweep.combos import load_combination

ROOT = Path(__file__).resolve().parents[2]
V = Version


def combination(tmp_path: Path, pins: dict[str, str], name: str = "cpu-demo") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text('[combination]\ncuda = "none"\ntorch_variant = "cpu"\narchs = []\npython = ">=3.10"\n\n[pins]\n'
                    + "".join(f'{k} = "{v}"\n' for k, v in pins.items()))
    return path


def config(tmp_path, good="1.0", bad="1.9", **kw) -> BisectConfig:
    combo = load_combination(combination(tmp_path, {"torch": "2.13.0", "flashinfer-python": bad}))
    return BisectConfig(definition="rmsnorm_h128", package="flashinfer-python", good=V(good), bad=V(bad),
                        combination=combo, out=tmp_path / "out", **kw)


def fake(verdicts: dict[str, Verdict], default: Verdict = Verdict.GOOD):
    """A probe answering from a table, recording what it was asked."""
    asked: list[str] = []

    def probe(version: Version) -> Probe:
        asked.append(str(version))
        v = verdicts.get(str(version), default)
        state = {Verdict.GOOD: CellState.PASS, Verdict.BAD: CellState.FAIL}.get(v, CellState.INSTALL_FAILED)
        failing = [{"case": "match-flashinfer-small-seed0", "state": "fail", "detail": f"wrong on {version}",
                    "tolerance_used": 3.5}] if v is Verdict.BAD else []
        cases = {"match-flashinfer-small-seed0": "fail" if v is Verdict.BAD else "pass"}
        return Probe(str(version), v, state, f"{v.value} on {version}", cases=cases if v is not Verdict.UNTESTABLE
                     else {}, failing=failing, folder=f"out/{version}")

    return probe, asked


RELEASES = [V(f"1.{i}") for i in range(1, 9)]  # strictly between 1.0 and 1.9


def bad_from(first: str, untestable: tuple[str, ...] = ()) -> dict[str, Verdict]:
    table = {str(v): (Verdict.BAD if v >= V(first) else Verdict.GOOD) for v in [V("1.0"), *RELEASES, V("1.9")]}
    return table | dict.fromkeys(untestable, Verdict.UNTESTABLE)


@pytest.mark.parametrize("first", ["1.5", "1.1", "1.8", "1.9"])
def test_search_finds_the_first_bad_release(tmp_path, first):
    probe, asked = fake(bad_from(first))
    r = search(RELEASES, probe, config(tmp_path))
    assert (r.first_bad, r.suspects) == (first, [first])
    assert V(r.last_good) < V(first) and bad_from(first)[r.last_good] is Verdict.GOOD
    assert asked[:2] == ["1.9", "1.0"]  # the ends first: each must be what it is said to be
    assert len(asked) <= 2 + 4  # log2 of 8 candidates, rounded up, plus one
    assert r.evidence["first_bad_failing"][0]["detail"] == f"wrong on {first}"
    assert r.evidence["last_good_same_cases"] == {"match-flashinfer-small-seed0": "pass"}
    assert r.changelog["url"] == f"https://github.com/flashinfer-ai/flashinfer/compare/v{r.last_good}...v{first}"


def test_untestable_releases_are_stepped_past_and_reported(tmp_path):
    probe, asked = fake(bad_from("1.5", untestable=("1.4", "1.5")))
    r = search(RELEASES, probe, config(tmp_path))
    # 1.4 and 1.5 could not be tested: the first bad is one of them or 1.6, after the last good 1.3
    assert (r.last_good, r.first_bad, r.suspects) == ("1.3", "1.6", ["1.4", "1.5", "1.6"])
    assert [p.version for p in r.untestable] == ["1.4", "1.5"]
    assert "one of 1.4, 1.5, 1.6" in r.text() and "skipped 1.4" in r.text()


def test_an_untestable_release_away_from_the_boundary_changes_nothing(tmp_path):
    probe, _ = fake(bad_from("1.6", untestable=("1.2",)))
    r = search(RELEASES, probe, config(tmp_path))
    assert (r.last_good, r.first_bad, r.suspects) == ("1.5", "1.6", ["1.6"])


def test_no_release_between_good_and_bad(tmp_path):
    probe, asked = fake(bad_from("1.9"))
    r = search([], probe, config(tmp_path))
    assert (r.last_good, r.first_bad, asked) == ("1.0", "1.9", ["1.9", "1.0"])


def test_good_not_older_than_bad_is_refused(tmp_path):
    with pytest.raises(BisectError, match=r"--good 1.9 is not older than --bad 1.9"):
        between(RELEASES, config(tmp_path, good="1.9", bad="1.9"))
    with pytest.raises(BisectError, match=r"--good 2.0 is not older than --bad 1.9"):
        between(RELEASES, config(tmp_path, good="2.0"))


@pytest.mark.parametrize(("end", "verdict"), [("1.9", Verdict.GOOD), ("1.0", Verdict.BAD), ("1.0", Verdict.UNTESTABLE)])
def test_ends_that_are_not_what_they_are_said_to_be_are_refused(tmp_path, end, verdict):
    probe, _ = fake(bad_from("1.5") | {end: verdict})
    want = "bad" if end == "1.9" else "good"
    with pytest.raises(BisectError, match=f"the {want} release {end} is {verdict.value}"):
        search(RELEASES, probe, config(tmp_path))


def test_between_keeps_releases_strictly_inside_and_pre_releases_only_when_asked(tmp_path):
    found = [V("0.9"), V("1.0"), V("1.2rc1"), V("1.2"), V("1.9"), V("2.0")]
    assert between(found, config(tmp_path)) == [V("1.2")]
    assert between(found, config(tmp_path, pre=True)) == [V("1.2rc1"), V("1.2")]


def test_config_refuses_what_it_cannot_bisect(tmp_path):
    combo = load_combination(combination(tmp_path, {"torch": "2.13.0", "flashinfer-python": "1.9"}))
    with pytest.raises(BisectError, match="does not pin sglang"):
        BisectConfig("d", "sglang", V("1"), V("2"), combo)
    with pytest.raises(BisectError, match="no ground truth exercises it"):
        BisectConfig("d", "torch", V("1"), V("2"), combo)
    with pytest.raises(BisectError, match="go together"):
        BisectConfig("d", "flashinfer-python", V("1"), V("2"), combo, source="kernel")


def test_pinned_is_a_combination_of_its_own(tmp_path):
    combo = load_combination(combination(tmp_path, {"torch": "2.13.0", "flashinfer-python": "1.9"}))
    p = pinned(combo, "FlashInfer_Python", V("1.4"))
    assert p.pin("flashinfer-python") == V("1.4") and p.torch == combo.torch
    assert p.id == "cpu-demo+flashinfer-python1.4" and p.sha256 != combo.sha256
    assert pinned(combo, "flashinfer-python", V("1.5")).sha256 != p.sha256


# -- a probe's verdict from its records -----------------------------------------------------------------
def record(status, kind=None, source="flashinfer", version="1.4", seed=0, **kw):
    return CaseRecord(definition="rmsnorm_h128", check=Check.MATCH, size="small", seed=seed, source=source,
                      status=status, kind=kind, ground_truth=GroundTruthPath(source=source, version=version), **kw)


def test_classify():
    ok, skip = record(Status.PASS), record(Status.SKIP, Kind.API_MISSING, seed=1)
    wrong = record(Status.FAIL, Kind.MISMATCH, seed=2, detail="out: 10% beyond tolerance",
                   compared=[{"tolerance_used": 7.0}], tolerance={"atol": 0.01})
    flaky = record(Status.FAIL, Kind.FLAKY_WRONG, seed=3, detail="wrong in 1/5 runs")
    reference_only = CaseRecord(definition="rmsnorm_h128", check=Check.SHAPE, status=Status.FAIL, kind=Kind.SHAPE)
    assert classify("1.4", [ok, skip, reference_only], "flashinfer").verdict is Verdict.GOOD
    bad = classify("1.4", [ok, wrong, flaky], "flashinfer")
    assert (bad.verdict, bad.state, bad.counts) == (Verdict.BAD, CellState.FAIL, {"pass": 1, "fail": 2})
    assert bad.failing[0]["tolerance_used"] == 7.0 and bad.failing[0]["tolerance"] == {"atol": 0.01}
    assert classify("1.4", [ok, flaky], "flashinfer").state is CellState.FLAKY_WRONG
    for records, state in (([skip], CellState.SKIP_API_MISSING), ([], CellState.NOT_RUN),
                           ([ok, record(Status.ERROR, Kind.EXCEPTION, seed=4)], CellState.ERROR),
                           ([record(Status.SKIP, Kind.BUILD_FAILED)], CellState.BUILD_FAILED)):
        p = classify("1.4", records, "flashinfer")
        assert (p.verdict, p.state) == (Verdict.UNTESTABLE, state)
    other = classify("1.4", [record(Status.PASS, version="1.3")], "flashinfer")
    assert other.verdict is Verdict.UNTESTABLE and "ran 1.3, not 1.4" in other.detail


def test_probe_round_trips_through_json():
    p = classify("1.4", [record(Status.FAIL, Kind.MISMATCH, detail="x")], "flashinfer", "out/1.4")
    assert Probe.from_dict(json.loads(json.dumps(p.as_dict()))) == p


# -- releases ------------------------------------------------------------------------------------------------
def test_parse_pip_index():
    text = "flashinfer-python (0.7.2)\nAvailable versions: 0.7.2, 0.6.6, 0.5.3, 0.7.0rc1\n  INSTALLED: 0.6.6\n"
    assert parse_pip_index(text) == [V("0.5.3"), V("0.6.6"), V("0.7.0rc1"), V("0.7.2")]
    assert parse_pip_index("ERROR: No matching distribution found for nothing") == []


def test_wheelhouse_versions(tmp_path):
    for name in ("flashinfer_python-0.6.6-py3-none-any.whl", "flashinfer_python-0.7.2.post1-py3-none-any.whl",
                 "sglang-0.5.16-py3-none-any.whl", "not-a-wheel.whl"):
        (tmp_path / name).write_bytes(b"")
    assert wheelhouse_versions(tmp_path, "FlashInfer-Python") == [V("0.6.6"), V("0.7.2.post1")]
    with pytest.raises(BisectError, match="not a folder"):
        wheelhouse_versions(tmp_path / "nope", "sglang")


def test_changelog_of_sglang_and_of_an_unknown_package():
    assert changelog("sglang", "0.5.16", "0.5.17")["url"] == \
        "https://github.com/sgl-project/sglang/compare/v0.5.16...v0.5.17"
    assert changelog("my-kernels", "1.0", "1.1") is None


# -- a matrix cell, and matrix diff naming the bisect ------------------------------------------------------
def env(env_id, combo, pins):
    return {"id": env_id, "combination": combo, "arch": "sm90", "torch": pins.get("torch"),
            "flashinfer": pins.get("flashinfer-python"), "sglang": pins.get("sglang"),
            "manifest": {"combination": {"pins": pins}}}


def matrix(cells: dict[tuple[str, str], str], envs: list[dict]) -> dict:
    return {"schema_version": 1, "environments": envs,
            "cells": [{"definition": d, "environment": e, "state": s, "reason": None} for (d, e), s in cells.items()]}


OLD = env("fi066@sm90", "cu130-torch2.11-fi0.6.6", {"torch": "2.11.0", "flashinfer-python": "0.6.6"})
NEW = env("fi072@sm90", "cu130-torch2.11-fi0.7.2", {"torch": "2.11.0", "flashinfer-python": "0.7.2"})
TORCH = env("t214@sm90", "cu130-torch2.14-fi0.7.2", {"torch": "2.14.1", "flashinfer-python": "0.7.2"})


def test_matrix_diff_names_the_bisect_of_a_wrong_result_between_two_releases(tmp_path, capsys):
    m = matrix({("a", OLD["id"]): "pass", ("a", NEW["id"]): "fail", ("b", OLD["id"]): "pass",
                ("b", NEW["id"]): "error", ("c", OLD["id"]): "skip:api-missing", ("c", NEW["id"]): "flaky-wrong",
                ("a", TORCH["id"]): "fail"}, [OLD, NEW, TORCH])
    d = diff_environments(m, m, "fi066", "fi072")
    found = bisect_commands(m, m, d, ("fi066", "fi072"))
    assert [(b["definition"], b["package"], b["good"], b["bad"]) for b in found] == [
        ("a", "flashinfer-python", "0.6.6", "0.7.2"), ("c", "flashinfer-python", "0.6.6", "0.7.2")]
    assert found[0]["command"] == ("flashinfer-trace bisect a --package flashinfer-python --good 0.6.6 --bad 0.7.2 "
                                   "--combination cu130-torch2.11-fi0.7.2")
    assert bisect_commands(m, m, diff_environments(m, m, "fi066", "t214"), ("fi066", "t214")) == []  # torch moved too
    path = tmp_path / "m.json"
    path.write_text(json.dumps(m))
    assert matrix_main(["diff", str(path), str(path), "--envs", "fi066", "fi072", "--bisect-out",
                        str(tmp_path / "b.json")]) == 1
    assert "flashinfer-trace bisect a --package" in capsys.readouterr().out
    assert json.loads((tmp_path / "b.json").read_text()) == found


def test_matrix_diff_of_two_nightlies_names_a_bisect_where_the_combination_was_repinned(tmp_path):
    old = matrix({("a", "cuda13@sm90"): "pass"}, [{**OLD, "id": "cuda13@sm90"}])
    new = matrix({("a", "cuda13@sm90"): "fail"}, [{**NEW, "id": "cuda13@sm90"}])
    same = matrix({("a", "cuda13@sm90"): "fail"}, [{**OLD, "id": "cuda13@sm90"}])
    assert [b["bad"] for b in bisect_commands(old, new, diff_matrices(old, new))] == ["0.7.2"]
    assert bisect_commands(old, same, diff_matrices(old, same)) == []  # the same release: nothing to bisect


def test_bisectable_change_says_why_not():
    with pytest.raises(ValueError, match="torch differs"):
        bisectable_change({"torch": "2.11"}, {"torch": "2.14"})
    with pytest.raises(ValueError, match="neither"):
        bisectable_change({"torch": "2.11"}, {"torch": "2.11"})
    with pytest.raises(ValueError, match="does not move forward"):
        bisectable_change({"torch": "2", "sglang": "0.5.17"}, {"torch": "2", "sglang": "0.5.16"})


def test_from_cell():
    m = matrix({}, [OLD, NEW, TORCH])
    assert from_cell(m, "fi066", "fi072") == {"package": "flashinfer-python", "good": "0.6.6", "bad": "0.7.2",
                                              "combination": "cu130-torch2.11-fi0.7.2"}
    with pytest.raises(BisectError, match="--cell fi066 t214: torch differs"):
        from_cell(m, "fi066", "t214")
    with pytest.raises(BisectError, match="not found"):
        from_cell(m, "fi066", "nope")
    # an environment without a manifest: the versions its record names
    bare = matrix({}, [{k: v for k, v in e.items() if k != "manifest"} for e in (OLD, NEW)])
    assert from_cell(bare, "fi066", "fi072")["good"] == "0.6.6"


def test_bisect_cli_refuses_bad_inputs_by_name(tmp_path, capsys):
    from flashinfer_trace.cli import main

    combo = combination(tmp_path, {"torch": "2.13.0", "flashinfer-python": "0.7.2"})
    assert main(["bisect", "rmsnorm_h128", "--good", "0.6.6"]) == 2
    assert "--bad, --combination missing" in capsys.readouterr().err
    assert main(["bisect", "rmsnorm_h128", "--good", "0.8", "--bad", "0.7.2", "--combination", str(combo),
                 "--versions", "0.7.0", "--out", str(tmp_path / "o")]) == 2
    assert "--good 0.8 is not older than --bad 0.7.2" in capsys.readouterr().err
    assert main(["bisect", "rmsnorm_h128", "--good", "x!", "--bad", "0.7.2", "--combination", str(combo)]) == 2
    assert "not a version" in capsys.readouterr().err


# -- the user's kernel as a ground truth ----------------------------------------------------------------
KERNEL_MODULE = textwrap.dedent("""
    import torch

    def rmsnorm(hidden_states, weight, eps):
        x = hidden_states.float()
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        return y.to(hidden_states.dtype)

    def wrong(hidden_states, weight, eps):
        return {"output": (rmsnorm(hidden_states, weight, eps).float() * {factor}).to(hidden_states.dtype)}
""")


def test_check_with_the_users_kernel(tmp_path, monkeypatch):
    from flashinfer_trace.check import CheckConfig, check

    (tmp_path / "userkern_a.py").write_text(KERNEL_MODULE.replace("{factor}", "1.05"))
    monkeypatch.syspath_prepend(str(tmp_path))
    d = str(ROOT / "definitions/rmsnorm/rmsnorm_h4096_fp16.json")  # eps an input, as the user's kernel takes it

    def run(kernel):
        cfg = CheckConfig(sources=("kernel",), kernel=kernel, sizes=("small",), seeds=(0,), cases=(), device="cpu")
        return [r for r in check([d], cfg)[0] if r.source == "kernel"]

    right, wrong, missing = run("userkern_a:rmsnorm"), run("userkern_a:wrong"), run("userkern_a:nothing")
    assert [r.status for r in right] == [Status.PASS] and right[0].ground_truth.api == "userkern_a:rmsnorm"
    assert [(r.status, r.kind) for r in wrong] == [(Status.FAIL, Kind.MISMATCH)]
    assert [(r.status, r.kind) for r in missing] == [(Status.SKIP, Kind.API_MISSING)]


def test_check_kernel_options_are_checked(capsys):
    from flashinfer_trace.cli import main

    assert main(["check", "rmsnorm_h128", "--ground-truth", "kernel", "--results", ""]) == 2
    assert "--ground-truth kernel needs --kernel" in capsys.readouterr().err
    assert main(["check", "rmsnorm_h128", "--kernel", "no colon", "--results", ""]) == 2
    assert "expected MODULE:FUNCTION" in capsys.readouterr().err
    assert main(["check", "rmsnorm_h128", "--kernel", "m:f", "--ground-truth", "torch", "--results", ""]) == 2
    assert "not torch" in capsys.readouterr().err


# -- listing from an index, and the probe's mechanics -----------------------------------------------------------
def test_index_versions_asks_pip_with_its_configured_index_or_the_one_named(tmp_path):
    from flashinfer_trace.bisect import index_versions

    args_file = tmp_path / "args"
    fake_python = tmp_path / "python"
    fake_python.write_text(f'#!/bin/sh\necho "$@" > {args_file}\necho "demo (1.3)"\n'
                           'echo "Available versions: 1.3, 1.2, 1.1rc1, 1.0"\n')
    fake_python.chmod(0o755)
    assert index_versions("demo", python=str(fake_python)) == [V("1.0"), V("1.1rc1"), V("1.2"), V("1.3")]
    assert args_file.read_text().split()[:4] == ["-m", "pip", "index", "versions"]
    assert "--index-url" not in args_file.read_text()  # pip's configured index
    index_versions("demo", pre=True, index_url="https://example.invalid/simple", python=str(fake_python))
    assert "--pre --index-url https://example.invalid/simple" in args_file.read_text()
    fake_python.write_text("#!/bin/sh\necho 'ERROR: No matching distribution found for demo' >&2\nexit 1\n")
    with pytest.raises(BisectError, match="no releases of demo from the index.*No matching distribution"):
        index_versions("demo", python=str(fake_python))


def test_check_command_runs_one_definition_one_source_the_same_inputs(tmp_path):
    from flashinfer_trace.bisect.probe import check_command

    cfg = config(tmp_path, check_args=("--repeats", "5"))
    cmd = check_command("py", cfg, tmp_path / "1.4")
    assert cmd[:5] == ["py", "-m", "flashinfer_trace.cli", "check", "rmsnorm_h128"]
    assert " ".join(cmd[5:]) == (f"--ground-truth flashinfer --results {tmp_path / '1.4' / 'check.jsonl'} --resume "
                                 "--no-progress --fresh-seed off --repeats 5")


def test_a_probe_with_a_verdict_is_not_run_again(tmp_path):
    from flashinfer_trace.bisect.probe import PROBE, probe_release

    cfg = config(tmp_path, python=str(tmp_path / "no-such-python"))  # anything it ran would fail
    done = Probe("1.4", Verdict.BAD, CellState.FAIL, "wrong", {"fail": 1}, {"m": "fail"}, [{"case": "m"}], "f")
    cfg.folder("1.4").mkdir(parents=True)
    (cfg.folder("1.4") / PROBE).write_text(json.dumps(done.as_dict()))
    assert probe_release(V("1.4"), cfg) == done


def test_a_release_that_does_not_install_is_untestable(tmp_path, monkeypatch):
    import sys

    from flashinfer_trace.bisect.probe import PROBE, probe_release
    from flashinfer_trace.sweep.install import SITE_ENV

    monkeypatch.setenv(SITE_ENV, str(tmp_path / "site"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()  # no wheel of flashinfer-python 1.4 in it
    cfg = config(tmp_path, wheelhouse=wheels, preinstalled_torch=sys.executable, project=ROOT)
    p = probe_release(V("1.4"), cfg)
    assert (p.verdict, p.state) == (Verdict.UNTESTABLE, CellState.INSTALL_FAILED)
    assert "flashinfer-python==1.4" in p.detail and (cfg.folder("1.4") / PROBE).is_file()


def test_a_wheelhouse_built_for_one_combination_is_refused_up_front(tmp_path):
    from flashinfer_trace.bisect.probe import check_wheelhouse

    (tmp_path / "wheelhouse.json").write_text("{}")
    with pytest.raises(BisectError, match="built for one combination"):
        check_wheelhouse(config(tmp_path, wheelhouse=tmp_path))
    check_wheelhouse(config(tmp_path, wheelhouse=tmp_path / "elsewhere"))  # a plain folder is fine

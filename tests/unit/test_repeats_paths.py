"""Repeats (a kernel wrong in some runs is flaky-wrong, never pass), paths (every call mode of a source is its
own case) and the fresh seed, on the CPU with planted kernels: an adapter that is wrong on some calls, or
whose planned launch keeps the first run's data."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from samples import VALID

from flashinfer_trace import check
from flashinfer_trace.check import CheckConfig, Discovered, plan, run
from flashinfer_trace.definition import Definition
from flashinfer_trace.groundtruth import GroundTruth, modes
from flashinfer_trace.groundtruth import torch_ref as tgt
from flashinfer_trace.groundtruth.base import Adapter, Call
from flashinfer_trace.status import CellState, Kind, Status, cell_state


def _definition() -> Definition:
    return Definition.model_validate(VALID)


def _planted(monkeypatch, fn, *, plan=None, finish=None, mode=None, races=False):
    """check's ground truth replaced by a planted kernel (`fn` gets the Call), on the CPU."""
    adapter = Adapter("torch", "rmsnorm", "planted", fn, plan=plan, finish=finish, races=races,
                      modes=modes.GENERIC if plan else ())

    def get(source, d, *, device=None, prebuild=None, path=None):
        return GroundTruth(adapter, d, "cpu", None, None, (), mode)

    monkeypatch.setattr(check, "get_ground_truth", get)
    return adapter


def _match(config: CheckConfig) -> list:
    cases = [c for c in plan(Discovered([_definition()], []), config) if c.check == "match"]
    return list(run(cases, config))


CONFIG = dict(sources=("torch",), sizes=("small",), seeds=(0,), cases=(), device="cpu", paths=False)


def test_a_kernel_wrong_in_some_runs_is_flaky_wrong_never_pass(monkeypatch):
    calls = {"n": 0}

    def flaky(call: Call) -> tuple:
        calls["n"] += 1
        (out,) = tgt.rmsnorm(call)
        return (out * 1.5,) if calls["n"] % 3 == 0 else (out,)  # wrong on every third call

    _planted(monkeypatch, flaky)
    (r,) = _match(CheckConfig(**CONFIG, repeats=5))
    assert r.status is Status.FAIL and r.kind is Kind.FLAKY_WRONG
    assert r.repeats["runs"] == 5 and r.repeats["wrong"] == 1 and r.detail.startswith("wrong in 1/5 runs")
    assert cell_state(r.status, r.kind) is CellState.FLAKY_WRONG


def test_always_wrong_is_a_mismatch_and_one_run_misses_a_rare_race(monkeypatch):
    _planted(monkeypatch, lambda call: (tgt.rmsnorm(call)[0] * 1.5,))
    (r,) = _match(CheckConfig(**CONFIG, repeats=3))
    assert r.status is Status.FAIL and r.kind is Kind.MISMATCH and r.repeats["wrong"] == 3
    calls = {"n": 0}

    def rare(call):
        calls["n"] += 1
        return (tgt.rmsnorm(call)[0] * (1.5 if calls["n"] == 2 else 1.0),)

    _planted(monkeypatch, rare)
    (once,) = _match(CheckConfig(**CONFIG, repeats=1))
    assert once.status is Status.PASS and once.repeats is None  # what a single call per case used to see


def test_a_nondeterministic_kernel_within_tolerance_passes_with_its_spread(monkeypatch):
    calls = {"n": 0}

    def noisy(call):
        calls["n"] += 1
        (out,) = tgt.rmsnorm(call)
        return (out + calls["n"] * 1e-6,)  # a different last bit each run, far inside tolerance

    _planted(monkeypatch, noisy)
    (r,) = _match(CheckConfig(**CONFIG, repeats=4))
    assert r.status is Status.PASS
    assert r.repeats["identical"] is False and 0 < r.repeats["max_abs_spread"] < 1e-4


def test_runs_with_the_first_runs_bytes_are_judged_once_and_a_different_run_anew(monkeypatch):
    judged = []
    real = check.judge

    def counting(*a, **kw):
        judged.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(check, "judge", counting)
    _planted(monkeypatch, tgt.rmsnorm)
    (r,) = _match(CheckConfig(**CONFIG, repeats=5))
    assert r.status is Status.PASS and r.repeats["identical"] is True and len(judged) == 1
    calls = {"n": 0}

    def last_wrong(call):  # the same bytes four times, then a wrong fifth run: judged twice, and wrong
        calls["n"] += 1
        (out,) = tgt.rmsnorm(call)
        return (out * 1.5 if calls["n"] == 5 else out,)

    judged.clear()
    _planted(monkeypatch, last_wrong)
    (r,) = _match(CheckConfig(**CONFIG, repeats=5))
    assert len(judged) == 2 and r.status is Status.FAIL and r.kind is Kind.FLAKY_WRONG
    assert r.repeats["wrong"] == 1 and r.repeats["identical"] is False


def test_same_bytes_counts_a_nan_as_itself_and_a_sign_of_zero_as_a_difference():
    spread = check.Spread()
    a = torch.tensor([float("nan"), 1.0, 0.0])
    first, same = spread.add(None, (a,))
    assert same is False  # the first run is judged
    assert spread.add(first, (a.clone(),))[1] is True
    assert spread.add(first, (torch.tensor([float("nan"), 1.0, -0.0]),))[1] is False
    assert spread.add(first, (a.to(torch.float64),))[1] is False  # another dtype is another output
    assert spread.add((None, 3), (None, 3))[1] is True and spread.add((None, 3), (None, 4))[1] is False


def test_races_get_more_runs_and_the_cpu_runs_once(monkeypatch):
    adapter = _planted(monkeypatch, tgt.rmsnorm, races=True)
    gt = GroundTruth(adapter, _definition(), "cpu", None, None)
    assert CheckConfig(device="cpu").repeats_for(gt) == 1
    assert CheckConfig(device="cpu", repeats=5).repeats_for(gt) == 5 * check.RACE_FACTOR
    cuda = dataclasses.replace(gt, device="cuda")
    assert CheckConfig().repeats_for(cuda) == check.DEFAULT_REPEATS * check.RACE_FACTOR


def _plan_keeping_first(call: Call):
    """A planned launch that computes on the data present at its first run and returns that ever after."""
    kept = {}

    def launch():
        if "out" not in kept:
            kept["out"] = tgt.rmsnorm(call)[0].clone()
        return (kept["out"],)

    return launch


def _plan_live(call: Call):
    return lambda: tgt.rmsnorm(call)


def test_plan_reuse_catches_a_launch_that_does_not_follow_new_data(monkeypatch):
    _planted(monkeypatch, tgt.rmsnorm, plan=_plan_keeping_first, mode="plan-reuse")
    (stale,) = _match(CheckConfig(**CONFIG))
    assert stale.status is Status.FAIL and stale.kind is Kind.MISMATCH
    _planted(monkeypatch, tgt.rmsnorm, plan=_plan_live, mode="plan-reuse")
    (live,) = _match(CheckConfig(**CONFIG))
    assert live.status is Status.PASS


def test_the_other_data_differs_and_keeps_rows_valid():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    other = modes._other(probs)
    assert not torch.equal(other, probs) and torch.allclose(other.sum(-1), probs.sum(-1))
    assert not modes._is_data(torch.tensor([3, 4])) and not modes._is_data(torch.tensor([1.0]))


def test_graph_mode_needs_a_gpu(monkeypatch):
    _planted(monkeypatch, tgt.rmsnorm, plan=_plan_live, mode="graph")
    (r,) = _match(CheckConfig(**CONFIG))
    assert r.status is Status.SKIP and r.kind is Kind.NO_GPU


def test_every_path_of_a_source_is_its_own_case():
    config = CheckConfig(sources=("flashinfer", "torch"), sizes=("small",), seeds=(0,), cases=(), device="cpu")
    from flashinfer_trace.dataset import load_definition

    decode = load_definition("gqa_paged_decode_h32_kv4_d128_ps1")
    ids = [c.id for c in plan(Discovered([decode], []), config) if c.check == "match"]
    assert ids == [f"gqa_paged_decode_h32_kv4_d128_ps1-match-{s}-small-0" for s in (
        "flashinfer", "flashinfer:plan-reuse", "flashinfer:graph", "flashinfer:tensor-cores",
        "flashinfer:tensor-cores+plan-reuse", "flashinfer:tensor-cores+graph", "torch")]
    plain = CheckConfig(**{**config.__dict__, "paths": False})
    assert len([c for c in plan(Discovered([decode], []), plain) if c.check == "match"]) == 2


def test_a_path_the_release_lacks_is_a_reasoned_skip():
    from flashinfer_trace.dataset import load_definition

    config = CheckConfig(sources=("flashinfer",), sizes=("small",), seeds=(0,), cases=(), device="cpu")
    decode = load_definition("gqa_paged_decode_h32_kv4_d128_ps1")
    records = list(run([c for c in plan(Discovered([decode], []), config) if c.check == "match"], config))
    assert {r.path for r in records} == {None, "plan-reuse", "graph", "tensor-cores", "tensor-cores+plan-reuse",
                                         "tensor-cores+graph"}
    assert all(r.status is Status.SKIP and r.kind in (Kind.NOT_INSTALLED, Kind.NO_GPU) for r in records)


def test_the_fresh_seed_is_recorded_replayable_and_not_in_the_id():
    config = CheckConfig(sources=("torch",), sizes=("small",), seeds=(0, 1), cases=(), device="cpu",
                         fresh_seed=123456)
    cases = [c for c in plan(Discovered([_definition()], []), config) if c.check == "match"]
    assert [(c.seed, c.fresh) for c in cases] == [(0, False), (1, False), (123456, True)]
    assert cases[2].id.endswith("-small-fresh")
    (r,) = list(run(cases[2:], config))
    assert r.seed == 123456 and r.fresh and r.status is Status.PASS
    assert r.axes == {"batch_size": next(iter(r.axes.values()))} and r.axes["batch_size"] >= 9  # drawn afresh
    # a fresh record's replay (`--seed N --fresh-seed N`) runs it once, as the fresh seed: its counts drawn again
    assert CheckConfig(seeds=(7,), fresh_seed=7).all_seeds == ((7, True),)
    assert CheckConfig(seeds=(0, 7), fresh_seed=7).all_seeds == ((0, False), (7, True))


@pytest.mark.parametrize("option, want", [("off", None), ("42", 42)])
def test_fresh_seed_option(option, want):
    from flashinfer_trace.options import _fresh, fresh_seed

    assert fresh_seed(_fresh(option)) == want
    drawn = {fresh_seed(None) for _ in range(4)}
    assert len(drawn) > 1 and all(0 <= s < 2**31 for s in drawn)


def _fake_norm_module(with_keywords: bool, seen: dict):
    from types import SimpleNamespace

    def plain(x, w, eps=1e-6):
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)

    def rmsnorm(x, w, eps=1e-6, out=None, enable_pdl=None):
        seen.update(pdl=enable_pdl, out=out is not None)
        y = plain(x, w, eps)
        if out is not None:
            out.copy_(y)
            return out
        return y

    return SimpleNamespace(norm=SimpleNamespace(rmsnorm=rmsnorm if with_keywords else plain))


@pytest.mark.parametrize("mode", ["out", "pdl"])
def test_norm_modes_pass_their_keyword_or_say_api_missing(mode):
    from flashinfer_trace.groundtruth import flashinfer as fgt
    from flashinfer_trace.groundtruth import paths
    from flashinfer_trace.inputs import generate_inputs
    from flashinfer_trace.status import GroundTruthUnavailable

    d = _definition()
    assert paths("flashinfer", d) == [None, "out", "pdl"]
    inputs = generate_inputs(d, "small", 0)
    seen: dict = {}
    (out,) = fgt.rmsnorm(Call(d, inputs, _fake_norm_module(True, seen), None, 1, mode))
    assert seen == {"pdl": True if mode == "pdl" else None, "out": mode == "out"} and not out.isnan().any()
    with pytest.raises(GroundTruthUnavailable, match="api-missing"):
        fgt.rmsnorm(Call(d, inputs, _fake_norm_module(False, {}), None, 1, mode))


def test_a_large_case_is_too_large_for_the_memory_it_may_use():
    from flashinfer_trace.inputs.common import Builder, CaseTooLarge

    b = Builder(_definition(), "small", 0, None, memory=10 << 30)
    b.require_bytes(512 << 20, "a 512 MiB cache")  # x12 = 6 GiB: fits its 10 GiB share
    with pytest.raises(CaseTooLarge, match="a 4 GiB cache needs 4.0 GiB"):
        b.require_bytes(4 << 30, "a 4 GiB cache")
    assert CheckConfig(device="cpu").memory() is None  # a CPU judges its memory per case
    rec = check.outcome_of(CaseTooLarge("x needs more"))
    assert rec[0] is Status.SKIP and rec[1] is Kind.TOO_LARGE

"""The `moe_routing` family (flashinfer.fused_moe.fused_topk_deepseek): definitions, generator and boundary cases,
the float64 truth, the grouped-selection verdict, the FlashInfer adapter on a fake module, and the planted bugs."""

from __future__ import annotations

import dataclasses
import inspect
import types
from pathlib import Path

import pytest
import torch
from fakes import install_flashinfer
from planted import agrees, assert_boundary_bug, assert_boundary_classes, assert_killed, mutant_named, passes, truth

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.groundtruth import GroundTruthUnavailable, base, get_ground_truth, paths
from flashinfer_trace.groundtruth.flashinfer_moe_routing import applies as fi_applies
from flashinfer_trace.groundtruth.torch_ref import deepseek_routing
from flashinfer_trace.inputs import Inputs, edge_cases, generate_inputs
from flashinfer_trace.mutants import MUTANTS, mutate
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import compare_with_model

DEFS = Path(__file__).resolve().parents[2] / "definitions" / "moe_routing"
DS, BF16 = "fused_topk_deepseek_e256_k8", "fused_topk_deepseek_e256_k8_bf16"
ALL8, K1 = "fused_topk_deepseek_e128_k8_ng8_kg8_bf16", "fused_topk_deepseek_e384_k1_fp16"
ALL = (DS, BF16, ALL8, K1)


def shipped(name: str):
    return load_definition(DEFS / f"{name}.json")


def gen(name: str, case: str | None = None, size: str = "small") -> Inputs:
    return generate_inputs(shipped(name), size, 0, case=case)


def reports(d, x, got):
    return compare_with_model(d, x, got, truth(d, x), tolerance_for(d))


# -- definitions and generator ------------------------------------------------------------------------------
def test_definitions_take_the_api_s_names_dtypes_and_limits():
    assert sorted(p.stem for p in DEFS.glob("*.json")) == sorted(ALL)
    for name in ALL:
        d = shipped(name)
        assert d.op_type == "moe_routing" and "coverage:moe_routing" in d.tags
        assert "fi_api:flashinfer.fused_moe.fused_topk_deepseek" in d.tags
        assert list(d.inputs) == ["scores", "bias"] and list(d.outputs) == ["topk_values", "topk_indices"]
        assert d.outputs["topk_values"].dtype == d.inputs["scores"].dtype
        assert d.outputs["topk_indices"].dtype.value == "int32"
        assert fi_applies(d) is None, name  # every shipped file is inside the API's documented limits
    ds = shipped(DS)
    assert {"param:n_group=8", "param:topk_group=4", "param:routed_scaling_factor=2.5", "model:deepseek-v3"} <= \
        set(ds.tags)


def test_kimi_k2_top8_is_outside_the_api_s_check():
    """n_group 1 / topk_group 1 at top-8 breaks `topk_group * n_group >= topk`: the adapter says so."""
    d = shipped(K1)
    tags = [t for t in d.tags if not t.startswith("param:")] + ["param:n_group=1", "param:topk_group=1",
                                                                 "param:routed_scaling_factor=2.827"]
    axes = {**d.axes, "topk": d.axes["topk"].model_copy(update={"value": 8})}
    kimi = d.model_copy(update={"tags": tags, "axes": axes})
    assert "topk_group * n_group >= topk" in fi_applies(kimi)


def test_edge_cases():
    assert edge_cases(shipped(DS)) == ["single_token", "expert_ties", "group_ties", "bias_flips", "bias_cancels",
                                       "saturated_high", "saturated_low", "many_tokens"]
    assert "group_ties" not in edge_cases(shipped(K1))
    with pytest.raises(Exception, match="unknown edge case .group_ties."):
        gen(K1, "group_ties")


def test_boundary_inputs_are_what_their_docstring_says():
    assert gen(DS, "single_token").values["scores"].shape == (1, 256)
    assert gen(DS, "many_tokens").values["scores"].shape == (4096, 256)
    x = gen(DS, "group_ties").values
    groups = x["scores"].view(-1, 8, 32).sort(dim=-1).values
    assert torch.equal(groups, groups[:, :1].expand_as(groups))  # every group the same multiset
    assert bool((x["bias"] == x["bias"][0]).all())
    x = gen(DS, "bias_cancels").values
    assert bool((x["bias"] == -0.5).all()) and bool((x["scores"][0::2] == 0).all())
    assert bool((x["scores"][1::2] < 0).all())
    assert bool((gen(DS, "saturated_high").values["scores"] >= 16).all())
    low = gen(DS, "saturated_low").values["scores"]
    assert bool((low <= -20).all()) and bool((torch.sigmoid(low) > 0).all())  # float32 keeps them positive
    ties = gen(BF16, "expert_ties").values
    assert bool((ties["bias"] == 0).all()) and bool((ties["scores"] * 2 == (ties["scores"] * 2).round()).all())
    flips = gen(ALL8, "bias_flips").values["bias"].float()
    assert torch.equal(flips.abs(), torch.full_like(flips, 0.5))


# -- the float64 truth ------------------------------------------------------------------------------------------
def test_truth_by_hand_on_a_small_row():
    """8 experts in 4 groups of 2, keep 2 groups, top-3, scale 2: computed here step by step."""
    d = shipped(DS)
    tags = [t for t in d.tags if not t.startswith("param:")] + ["param:n_group=4", "param:topk_group=2",
                                                                 "param:routed_scaling_factor=2.0"]
    axes = {**d.axes, "num_experts": d.axes["num_experts"].model_copy(update={"value": 8}),
            "topk": d.axes["topk"].model_copy(update={"value": 3})}
    small = d.model_copy(update={"tags": tags, "axes": axes})
    logits = torch.tensor([[3.0, -1.0, 0.5, 0.4, -2.0, -3.0, 1.0, 0.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, -0.3, 0.0])
    s = torch.sigmoid(logits.double())[0]
    b = s + bias.double()
    # group scores: g0 = b0 + b1, g1 = b2 + b3, g2 = b4 + b5 (the bias lifts it to the top), g3 = b6 + b7
    g = torch.stack([b[0] + b[1], b[2] + b[3], b[4] + b[5], b[6] + b[7]])
    assert g.argsort(descending=True)[:2].tolist() == [2, 0]
    want_ids = [4, 5, 0]  # b4 = 1.119, b5 = 1.047, b0 = 0.953 > b1
    w = s[want_ids] / s[want_ids].sum() * 2.0
    x = Inputs(small.name, "small", 0, None, {"scores": logits, "bias": bias})
    values, ids = truth(small, x)
    assert ids.dtype == torch.int32 and ids[0].tolist() == want_ids
    assert torch.allclose(values[0].double(), w, rtol=1e-7)


def test_truth_weights_sum_to_the_scaling_factor():
    for name, scale in ((DS, 2.5), (ALL8, 1.0), (K1, 2.827)):
        values, ids = truth(shipped(name), gen(name))
        assert torch.allclose(values.double().sum(-1), torch.full((values.shape[0],), scale, dtype=torch.float64),
                              rtol=1e-2)
        assert all(row.unique().numel() == row.numel() for row in ids)


def test_bias_cancels_even_rows_weigh_scale_over_k():
    values, _ = truth(shipped(DS), gen(DS, "bias_cancels"))
    assert torch.equal(values[0::2], torch.full_like(values[0::2], 2.5 / 8))


# -- the verdict ------------------------------------------------------------------------------------------------
def test_any_tie_break_passes_and_its_weights_are_the_ones_judged():
    d = shipped(DS)
    x = gen(DS, "bias_cancels")  # even rows: every biased score exactly 0, every group tied
    values, ids = truth(d, x)
    other = ids.clone()
    other[0] = torch.arange(248, 256, dtype=torch.int32)  # the last group's experts: as valid as the first's
    assert agrees(d, x, (values, other))
    flipped = ids.flip(-1), values.flip(-1)  # any order
    assert agrees(d, x, (flipped[1], flipped[0]))


def test_a_valid_selection_with_another_row_s_weights_fails():
    d = shipped(DS)
    x = gen(DS, "expert_ties")
    values, ids = truth(d, x)
    wrong = values.clone()
    wrong[1] = wrong[1].flip(-1) * 1.5
    r = reports(d, x, (wrong, ids))
    assert not r[0].passed and r[1].passed and "weights" in r[0].problem


@pytest.mark.parametrize("why", ["twice", "outside"])
def test_structural_index_errors_are_bugs(why):
    d = shipped(DS)
    x = gen(DS)
    values, ids = truth(d, x)
    bad = torch.cat([ids[:, :1], ids[:, :1], ids[:, 2:]], 1) if why == "twice" else ids + 300
    r = reports(d, x, (values, bad))
    assert r[1].verdict == "bug" and why in r[1].problem


def test_an_expert_from_a_dropped_group_or_a_worse_expert_is_caught():
    d = shipped(DS)
    x = gen(DS, None, "medium")
    values, ids = truth(d, x)
    s = torch.sigmoid(x.values["scores"].double())
    biased = s + x.values["bias"].double()
    row = 0
    kept = set((ids[row].long() // 32).tolist())
    dropped = next(g for g in range(8) if g not in kept)
    bad = ids.clone()
    bad[row, -1] = dropped * 32 + int(biased[row, dropped * 32:(dropped + 1) * 32].argmax())
    r = reports(d, x, (values, bad))
    assert r[1].verdict == "bug" and "group" in r[1].problem
    worse = ids.clone()
    pool = torch.cat([torch.arange(g * 32, (g + 1) * 32) for g in sorted(kept)])
    left = [int(e) for e in pool[biased[row, pool].argsort()] if e not in ids[row].tolist()]
    worse[row, 0] = left[0]  # the worst expert of the kept groups in place of a chosen one
    r = reports(d, x, (values, worse))
    assert r[1].verdict == "bug" and "chosen with biased score" in r[1].problem


def test_wrong_index_dtype_is_a_bug():
    d = shipped(DS)
    x = gen(DS)
    values, ids = truth(d, x)
    r = reports(d, x, (values, ids.long()))
    assert r[1].verdict == "bug" and "dtype int64" in r[1].problem


# -- the FlashInfer adapter on a fake module --------------------------------------------------------------------
def _fake(monkeypatch, version: str, calls: list, *, new_keywords: bool = True, missing: bool = False):
    module = types.ModuleType("flashinfer")
    module.__version__ = version

    def _route(scores, bias, n_group, topk_group, topk, scale, values, ids):
        got_ids, w = deepseek_routing(scores, bias, topk, n_group, topk_group, scale)
        values.copy_(w.to(values.dtype))
        ids.copy_(got_ids.to(ids.dtype))

    if new_keywords:
        def fused_topk_deepseek(scores, bias, n_group, topk_group, topk, routed_scaling_factor, topk_values,
                                topk_indices, launch_with_pdl=True, routing_replay_out=None, *, backend="default"):
            calls.append(("call", launch_with_pdl, routing_replay_out is not None, backend))
            _route(scores, bias, n_group, topk_group, topk, routed_scaling_factor, topk_values, topk_indices)
            if routing_replay_out is not None:
                routing_replay_out[: scores.shape[0]].copy_(topk_indices.to(torch.int16))
    else:
        def fused_topk_deepseek(scores, bias, n_group, topk_group, topk, routed_scaling_factor, topk_values,
                                topk_indices, launch_with_pdl=True):
            calls.append(("call", launch_with_pdl, False, "default"))
            _route(scores, bias, n_group, topk_group, topk, routed_scaling_factor, topk_values, topk_indices)

    module.fused_moe = types.SimpleNamespace() if missing else types.SimpleNamespace(
        fused_topk_deepseek=fused_topk_deepseek)
    install_flashinfer(monkeypatch, module, version, cc=(10, 0))
    return module


def _call(name: str, case: str | None, path: str | None):
    d = shipped(name)
    x = generate_inputs(d, "small", 0, case=case)
    gt = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path=path), device="cpu")
    return d, x, gt(x)


def test_flashinfer_paths():
    assert paths("flashinfer", shipped(DS)) == [None, "no-pdl", "replay", "plan-reuse", "graph", "cake",
                                                "cake+plan-reuse", "cake+graph"]


@pytest.mark.parametrize("path,want", [(None, ("call", True, False, "default")),
                                       ("no-pdl", ("call", False, False, "default")),
                                       ("replay", ("call", True, True, "default")),
                                       ("cake", ("call", True, False, "cake"))])
def test_flashinfer_modes(monkeypatch, path, want):
    calls: list = []
    _fake(monkeypatch, "0.7.2.post1", calls)
    d, x, got = _call(DS, "group_ties", path)
    assert calls == [want] and agrees(d, x, got)


def test_flashinfer_replay_that_disagrees_is_judged_by_its_own_ids(monkeypatch):
    calls: list = []
    module = _fake(monkeypatch, "0.7.2.post1", calls)
    inner = module.fused_moe.fused_topk_deepseek

    def stale_replay(*args, routing_replay_out=None, **kw):
        inner(*args, routing_replay_out=routing_replay_out, **kw)
        routing_replay_out[-1].fill_(3)  # a row past num_tokens written
    stale_replay.__signature__ = inspect.signature(inner)
    module.fused_moe.fused_topk_deepseek = stale_replay
    d, x, got = _call(DS, None, "replay")
    assert bool((got[1] == -1).all()) and not agrees(d, x, got)


def test_flashinfer_releases(monkeypatch):
    calls: list = []
    _fake(monkeypatch, "0.5.3", calls, missing=True)
    with pytest.raises(GroundTruthUnavailable, match="api-missing"):
        get_ground_truth("flashinfer", shipped(DS), device="cuda")
    _fake(monkeypatch, "0.6.6", calls, new_keywords=False)
    _call(DS, None, None)
    _call(DS, None, "no-pdl")
    assert calls == [("call", True, False, "default"), ("call", False, False, "default")]
    for path, what in (("replay", "routing_replay_out"), ("cake", "backend")):
        gt = dataclasses.replace(get_ground_truth("flashinfer", shipped(DS), device="cuda", path=path), device="cpu")
        with pytest.raises(GroundTruthUnavailable, match=f"api-missing: flashinfer 0.6.6 .* has no {what}"):
            gt(gen(DS))


def test_cake_is_sm100_only(monkeypatch):
    _fake(monkeypatch, "0.7.2.post1", [])
    monkeypatch.setattr(base, "cuda_capability", lambda device: (9, 0))
    get_ground_truth("flashinfer", shipped(DS), device="cuda")
    with pytest.raises(GroundTruthUnavailable, match="arch-unsupported"):
        get_ground_truth("flashinfer", shipped(DS), device="cuda", path="cake")


# -- planted bugs ------------------------------------------------------------------------------------------------
BOUNDARY_MUTANTS = {  # mutant -> the case that catches it (typical rows pass)
    f"{DS}:tanh-sigmoid": "saturated_low",
    f"{DS}:zero-padded-groups": "bias_cancels",
    f"{DS}:tie-duplicates": "expert_ties",
    f"{DS}:group-tie-duplicates": "group_ties",
    f"{BF16}:token-axis-squeezed": "single_token",
    f"{DS}:grid-capped-at-1024": "many_tokens",
}
ALSO = {f"{DS}:bias-ignored": "bias_flips", f"{DS}:weights-from-biased": "bias_cancels"}
FAMILY = [m for m in MUTANTS if m.definition in ALL]


def test_every_boundary_class_has_a_mutant():
    assert_boundary_classes(FAMILY, BOUNDARY_MUTANTS, {"boundary-ties", "boundary-magnitude", "boundary-structure"})


@pytest.mark.parametrize("name", sorted(BOUNDARY_MUTANTS))
def test_a_boundary_bug_passes_typical_rows_and_is_caught_by_its_case(name):
    assert_boundary_bug(mutant_named(FAMILY, name), [BOUNDARY_MUTANTS[name]], sizes=("small", "medium"),
                        crash_fails=False)


@pytest.mark.parametrize("name", sorted(ALSO))
def test_plain_bugs_are_caught_by_the_case_built_against_them(name):
    [mutant] = [m for m in FAMILY if m.name == name]
    assert not passes(mutate(shipped(mutant.definition), mutant), ALSO[name], crash_fails=False)


@pytest.mark.parametrize("mutant", [m.name for m in FAMILY])
def test_planted_moe_routing_bugs_are_caught(mutant):
    assert_killed(mutant_named(FAMILY, mutant))

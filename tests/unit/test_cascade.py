"""The `cascade_merge` family (attention partial-state merges): the generator's boundary cases make the states
docs/boundary/cascade.md promises, the float64 truth matches values worked by hand, the FlashInfer and SGLang
adapters call each API as documented (fake modules: no GPU here) and skip precisely, and each planted bug
passes on typical states and is caught by its case."""

from __future__ import annotations

import dataclasses
import math
import sys
import types
from pathlib import Path

import pytest
import torch
from packaging.version import Version
from planted import agrees, assert_boundary_bug, assert_boundary_classes, assert_killed, mutant_named

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.groundtruth import GroundTruthUnavailable, base, get_ground_truth, paths
from flashinfer_trace.inputs import Inputs, edge_cases, generate_inputs
from flashinfer_trace.inputs import cascade as cascade_inputs
from flashinfer_trace.inputs.common import Builder, GeneratorMismatch, InputGenerationError
from flashinfer_trace.mutants import MUTANTS
from flashinfer_trace.testing import run_reference

DEFS = Path(__file__).resolve().parents[2] / "definitions" / "cascade_merge"
PAIR, IN_PLACE, MULTI = "merge_state_h32_d128", "merge_state_in_place_h32_d128", "merge_states_h32_d128"
LN2 = math.log(2.0)


def shipped(name: str):
    return load_definition(DEFS / f"{name}.json")


def values(name: str, case: str | None = None, size: str = "small") -> dict:
    return generate_inputs(shipped(name), size, 0, case=case).values


# -- the generator's boundary cases ------------------------------------------------------------------
def test_edge_cases_per_form():
    assert edge_cases(shipped(PAIR)) == ["single_token", "empty_state", "both_empty", "far_apart", "equal_lse",
                                        "large_lse"]
    assert edge_cases(shipped(IN_PLACE))[-1] == "masked_rows"
    assert edge_cases(shipped(MULTI))[-1] == "mostly_empty"
    x = values(MULTI, "single_token")
    assert x["v"].shape == (1, cascade_inputs.STATES["small"], 32, 128)


def test_typical_states_are_finite_and_every_row_merged():
    x = values(IN_PLACE)
    assert bool(x["mask"].all()) and all(bool(x[n].isfinite().all()) for n in ("v", "s", "v_other", "s_other"))
    gap = (values(PAIR)["s_a"] - values(PAIR)["s_b"]).abs()
    assert 0 < float(gap.max()) < 64  # a few binades apart: both states weigh in, exp2(s) itself is finite


def test_empty_state_is_lse_minus_inf_with_v_zero_on_one_side_only():
    x = values(PAIR, "empty_state")
    a, b = torch.isneginf(x["s_a"]), torch.isneginf(x["s_b"])
    assert bool(a.any()) and bool(b.any()) and not bool((a & b).any())
    assert bool((x["v_a"][a] == 0).all()) and bool((x["v_b"][b] == 0).all())
    assert not bool(torch.isnan(x["s_a"]).any()) and not bool(torch.isposinf(x["s_a"]).any())
    m = values(MULTI, "empty_state")["s"]
    empty = torch.isneginf(m)
    assert bool(empty[:, 0].any()) and bool(empty[:, -1].any()) and not bool(empty.all(dim=1).any())


def test_both_empty_rows_are_all_empty_beside_one_sided_and_full_ones():
    x = values(PAIR, "both_empty")
    a, b = torch.isneginf(x["s_a"]), torch.isneginf(x["s_b"])
    assert bool((a & b).any()) and bool((a & ~b).any()) and bool((~a & ~b).any())
    m = torch.isneginf(values(MULTI, "both_empty")["s"])
    assert bool(m.all(dim=1).any()) and bool((m[:, 0] & ~m.all(dim=1)).any()) and bool((~m).all(dim=1).any())
    for name in (PAIR, IN_PLACE, MULTI):  # the definitions define it: output 0, lse -inf, no NaN
        d = shipped(name)
        x = generate_inputs(d, "small", 0, case="both_empty")
        v, s = run_reference(d, x)
        assert not bool(v.isnan().any()) and not bool(s.isnan().any()) and bool(torch.isneginf(s).any())


def test_far_apart_gaps_span_8_to_512_binades_both_ways():
    x = values(PAIR, "far_apart", "medium")
    d = x["s_b"] - x["s_a"]
    assert float(d.abs().min()) >= 8 - 1e-3 and float(d.abs().max()) <= 512 + 1e-2
    assert bool((d > 128).any()) and bool((d < -128).any())  # exp2 of the gap overflows float32 both ways


def test_equal_lse_ties_exactly():
    x = values(PAIR, "equal_lse")
    assert torch.equal(x["s_a"], x["s_b"])
    s = values(MULTI, "equal_lse")["s"]
    assert torch.equal(s, s[:, :1].expand_as(s))


def test_large_lse_overflows_and_underflows_a_naive_exp2():
    s = values(PAIR, "large_lse")["s_a"]
    assert float(s.abs().min()) > 9000
    assert bool(torch.isinf(torch.exp2(s[0])).all()) and bool((torch.exp2(s[1]) == 0).all())


def test_mostly_empty_keeps_one_or_two_states_and_often_empties_the_first():
    s = values(MULTI, "mostly_empty", "medium")["s"]
    kept = (~torch.isneginf(s)).sum(dim=1)
    assert int(kept.min()) >= 1 and int(kept.max()) <= 2
    assert float(torch.isneginf(s[:, 0]).float().mean()) > 0.5


def test_masked_rows_skip_the_even_rows():
    mask = values(IN_PLACE, "masked_rows")["mask"]
    assert mask.tolist() == [False, True, False, True]


def test_an_absent_mask_is_left_to_the_declaration():
    d = shipped(IN_PLACE)
    spec = d.inputs["mask"].model_copy(update={"dtype": None, "optional": True})
    absent = d.model_copy(update={"inputs": {**d.inputs, "mask": spec}})
    assert absent.inputs["mask"].is_absent
    b = Builder(absent, "small", 0, None)
    with pytest.raises(GeneratorMismatch, match="absent optional"):
        cascade_inputs.generate(b)


def test_neg_inf_is_allowed_only_where_the_generator_says_and_nan_never():
    d = shipped(PAIR)
    b = Builder(d, "small", 0, None)
    b.set_axis("seq_len", 1)
    b.put("s_a", torch.full((1, 32), -math.inf))
    with pytest.raises(InputGenerationError, match="'s_a': generated non-finite"):
        b._check_value("s_a", d.inputs["s_a"], b.values["s_a"])
    b.neg_inf.add("s_a")
    b._check_value("s_a", d.inputs["s_a"], b.values["s_a"])
    for bad in (math.nan, math.inf):
        with pytest.raises(InputGenerationError, match="non-finite"):
            b._check_value("s_a", d.inputs["s_a"], torch.full((1, 32), bad))


# -- the float64 truth, against values worked by hand ------------------------------------------------
def _inputs(name: str, **vals) -> Inputs:
    d = shipped(name)
    return Inputs(d.name, "small", 0, None, {n: vals[n] for n in d.inputs})


def _state(value: float, rows: int = 1, heads: int = 32, dtype=torch.bfloat16):
    return torch.full((rows, heads, 128), value, dtype=dtype)


def test_truth_weighs_states_by_two_to_the_lse():
    lse = torch.zeros(1, 32)
    for shift in (0.0, 1e4, -1e4):  # 1 : 2 masses, at any magnitude
        x = _inputs(PAIR, v_a=_state(1.0), s_a=lse + shift, v_b=_state(4.0), s_b=lse + shift + 1)
        v, s = get_ground_truth("torch", shipped(PAIR), device="cpu")(x)
        assert torch.equal(v, _state(3.0)) and torch.allclose(s.double(), lse.double() + shift + math.log2(3))


def test_truth_returns_the_other_state_exactly_when_one_is_empty_and_zero_when_both_are():
    s_a = torch.tensor([[2.5] * 31 + [-math.inf]])
    s_b = torch.tensor([[-math.inf] * 31 + [-math.inf]])
    x = _inputs(PAIR, v_a=_state(0.7), s_a=s_a, v_b=_state(0.0), s_b=s_b)
    v, s = get_ground_truth("torch", shipped(PAIR), device="cpu")(x)
    assert torch.equal(v[0, :31], _state(0.7)[0, :31]) and torch.equal(s[0, :31], s_a[0, :31])
    assert bool((v[0, 31] == 0).all()) and bool(torch.isneginf(s[0, 31]))  # the empty softmax's convention


def test_truth_in_place_leaves_unmasked_rows_bit_for_bit():
    v, s = torch.randn(2, 32, 128).to(torch.bfloat16), torch.randn(2, 32)
    x = _inputs(IN_PLACE, v=v, s=s, v_other=_state(5.0, 2), s_other=s + 1, mask=torch.tensor([False, True]))
    out_v, out_s = get_ground_truth("torch", shipped(IN_PLACE), device="cpu")(x)
    assert torch.equal(out_v[0], v[0]) and torch.equal(out_s[0], s[0])
    assert torch.allclose(out_v[1].float(), (v[1].float() + 2 * 5.0) / 3, atol=2e-2)


def test_truth_merges_n_states_with_empty_ones_first():
    v = torch.stack([_state(100.0), _state(1.0), _state(4.0)], dim=1)  # the first state is empty
    s = torch.tensor([-math.inf, 0.0, 1.0]).reshape(1, 3, 1).expand(1, 3, 32).contiguous()
    out_v, out_s = get_ground_truth("torch", shipped(MULTI), device="cpu")(_inputs(MULTI, v=v, s=s))
    assert torch.equal(out_v, _state(3.0)) and torch.allclose(out_s, torch.full((1, 32), math.log2(3)))


# -- FlashInfer and SGLang adapters (fakes) ----------------------------------------------------------
def _merge(vs, ss):
    """Fake kernels' math: float32 weights relative to the max, like the CUDA kernels."""
    s = torch.stack(ss)
    m = s.amax(dim=0)
    w = torch.exp2(s - m)
    v = sum(wi[..., None] * vi.float() for wi, vi in zip(w, vs, strict=True)) / w.sum(dim=0)[..., None]
    return v.to(vs[0].dtype), m + torch.log2(w.sum(dim=0))


def _fake(monkeypatch, name: str, version: str, **attrs):
    module = types.ModuleType(name)
    module.__version__ = version
    for k, v in attrs.items():
        setattr(module, k, v)
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(base, "installed_version", lambda package: Version(version))
    monkeypatch.setattr(base, "_imported", {})
    monkeypatch.setattr(base, "cuda_capability", lambda device: (9, 0) if str(device).startswith("cuda") else None)
    return module


def _cascade(calls: list, *, with_mask: bool = True) -> types.SimpleNamespace:
    def merge_state(v_a, s_a, v_b, s_b):
        calls.append("merge_state")
        return _merge([v_a, v_b], [s_a, s_b])

    def merge_states(v, s):
        calls.append(("merge_states", v.shape[1]))
        return _merge(list(v.unbind(1)), list(s.unbind(1)))

    def in_place(v, s, v_other, s_other, mask=None):
        calls.append(("in_place", mask is not None))
        mv, ms = _merge([v, v_other], [s, s_other])
        keep = torch.ones(v.shape[0], dtype=torch.bool) if mask is None else mask
        v.copy_(torch.where(keep[:, None, None], mv, v))
        s.copy_(torch.where(keep[:, None], ms, s))

    def old_in_place(v, s, v_other, s_other):
        return in_place(v, s, v_other, s_other)

    return types.SimpleNamespace(merge_state=merge_state, merge_states=merge_states,
                                 merge_state_in_place=in_place if with_mask else old_in_place)


def test_flashinfer_paths_per_form():
    assert paths("flashinfer", shipped(PAIR)) == [None, "in-place", "merge-states", "graph"]
    assert paths("flashinfer", shipped(IN_PLACE)) == [None, "no-mask", "graph"]
    assert paths("flashinfer", shipped(MULTI)) == [None, "graph"]
    assert paths("sglang", shipped(PAIR)) == [None, "out", "v2", "v2+out"]


def test_flashinfer_not_installed_here(monkeypatch):
    monkeypatch.setattr(base, "installed_version", lambda package: None)
    with pytest.raises(GroundTruthUnavailable, match="not-installed: flashinfer"):
        get_ground_truth("flashinfer", shipped(PAIR), device="cuda")
    with pytest.raises(GroundTruthUnavailable, match="not-installed: sgl_kernel"):
        get_ground_truth("sglang", shipped(PAIR), device="cuda")


@pytest.mark.parametrize("name, path, expected", [
    (PAIR, None, ["merge_state"]), (PAIR, "in-place", [("in_place", False)]),
    (PAIR, "merge-states", [("merge_states", 2)]), (IN_PLACE, None, [("in_place", True)]),
    (IN_PLACE, "no-mask", [("in_place", False)]), (MULTI, None, [("merge_states", 3)])])
def test_flashinfer_calls_each_api_and_leaves_the_case_untouched(monkeypatch, name, path, expected):
    calls: list = []
    _fake(monkeypatch, "flashinfer", "0.6.6", cascade=_cascade(calls))
    d = shipped(name)
    case = "masked_rows" if name == IN_PLACE else "empty_state"
    x = generate_inputs(d, "small", 0, case=case)
    before = {k: v.clone() for k, v in x.values.items()}
    gt = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path=path), device="cpu")
    got = gt(x)
    assert calls == expected
    assert agrees(d, x, got)
    assert all(torch.equal(before[k], v) for k, v in x.values.items())  # in-place kernels got clones


def test_flashinfer_mask_keyword_is_gated_by_signature(monkeypatch):
    _fake(monkeypatch, "flashinfer", "0.5.3", cascade=_cascade([], with_mask=False))
    d = shipped(IN_PLACE)
    gt = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda"), device="cpu")
    with pytest.raises(GroundTruthUnavailable, match="api-missing: flashinfer 0.5.3 merge_state_in_place has no mask"):
        gt(generate_inputs(d, "small", 0))
    no_mask = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path="no-mask"), device="cpu")
    x = generate_inputs(d, "small", 0, case="masked_rows")
    assert agrees(d, x, no_mask(x))  # the unmasked kernel on the masked rows still runs


def test_flashinfer_without_cascade_is_api_missing(monkeypatch):
    _fake(monkeypatch, "flashinfer", "0.6.6")
    with pytest.raises(GroundTruthUnavailable, match="api-missing: flashinfer 0.6.6 has no cascade.merge_state"):
        get_ground_truth("flashinfer", shipped(PAIR), device="cuda")


def test_flashinfer_graph_mode_needs_a_gpu(monkeypatch):
    _fake(monkeypatch, "flashinfer", "0.6.6", cascade=_cascade([]))
    gt = dataclasses.replace(get_ground_truth("flashinfer", shipped(MULTI), device="cuda", path="graph"),
                             device="cpu")
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        gt(generate_inputs(shipped(MULTI), "small", 0))


def test_sglang_merge_state_v2_gets_natural_logs_and_gives_base_2_back(monkeypatch):
    seen = {}

    def v1(v_a, s_a, v_b, s_b, v_merged=None, s_merged=None):
        seen["v1_out"] = v_merged is not None
        return _merge([v_a, v_b], [s_a, s_b])

    def v2(v_a, s_a, v_b, s_b, v_merged=None, s_merged=None):  # natural-log lse, as FlashAttention returns it
        seen["v2_out"] = v_merged is not None
        v, s = _merge([v_a, v_b], [s_a / LN2, s_b / LN2])
        return v, s * LN2

    _fake(monkeypatch, "sgl_kernel", "0.3.9", merge_state=v1, merge_state_v2=v2)
    d = shipped(PAIR)
    for case in (None, "empty_state", "large_lse"):
        x = generate_inputs(d, "small", 0, case=case)
        for path in (None, "out", "v2", "v2+out"):
            gt = dataclasses.replace(get_ground_truth("sglang", d, device="cuda", path=path), device="cpu")
            assert agrees(d, x, gt(x)), (case, path)
    assert seen == {"v1_out": True, "v2_out": True}
    with pytest.raises(GroundTruthUnavailable, match="unsupported: sgl_kernel.merge_state: merges two states"):
        get_ground_truth("sglang", shipped(MULTI), device="cuda")


def test_sglang_release_without_v2_is_api_missing(monkeypatch):
    _fake(monkeypatch, "sgl_kernel", "0.0.9", merge_state=lambda *a: None)
    with pytest.raises(GroundTruthUnavailable, match="api-missing: sgl_kernel 0.0.9 has no merge_state_v2"):
        get_ground_truth("sglang", shipped(PAIR), device="cuda", path="v2")


# -- planted bugs ------------------------------------------------------------------------------------
BOUNDARY_MUTANTS = {  # mutant -> the case that catches it (typical states pass)
    f"{PAIR}:no-max": "large_lse",
    f"{PAIR}:relative-to-a": "far_apart",
    f"{PAIR}:lse-from-a": "empty_state",
    f"{PAIR}:nan-on-both-empty": "both_empty",
    f"{PAIR}:equal-lse-dedup": "equal_lse",
    f"{IN_PLACE}:mask-ignored": "masked_rows",
    f"{IN_PLACE}:skipped-rows-zeroed": "masked_rows",
    f"{MULTI}:online-from-neg-inf": "mostly_empty",
    f"{MULTI}:global-max": "large_lse",
}
FAMILY = [m for m in MUTANTS if m.definition in (PAIR, IN_PLACE, MULTI)]


def test_every_boundary_class_has_a_mutant():
    assert_boundary_classes(FAMILY, BOUNDARY_MUTANTS, {"boundary-magnitude", "boundary-structure", "boundary-ties"})


@pytest.mark.parametrize("name", sorted(BOUNDARY_MUTANTS))
def test_a_boundary_bug_passes_typical_states_and_is_caught_by_its_case(name):
    assert_boundary_bug(mutant_named(FAMILY, name), [BOUNDARY_MUTANTS[name]], crash_fails=False)


@pytest.mark.parametrize("mutant", [m.name for m in FAMILY])
def test_planted_cascade_bugs_are_caught(mutant):
    assert_killed(mutant_named(FAMILY, mutant))

"""The `topk` family (flashinfer.top_k, top_k_varlen): definitions, generator and boundary cases, the float64
truth, the set-by-value verdict, the FlashInfer adapter on a fake module, and the planted bugs."""

from __future__ import annotations

import dataclasses
import math
import types
from pathlib import Path

import pytest
import torch
from fakes import install_flashinfer
from planted import agrees, assert_boundary_bug, assert_boundary_classes, assert_killed, mutant_named

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.groundtruth import GroundTruthUnavailable, get_ground_truth, paths
from flashinfer_trace.inputs import Inputs, edge_cases, generate_inputs
from flashinfer_trace.mutants import MUTANTS
from flashinfer_trace.testing import run_reference

DEFS = Path(__file__).resolve().parents[2] / "definitions" / "topk"
F32, BF16, K1, KN = "top_k_v128256_k50", "top_k_v151936_k20_bf16", "top_k_v32000_k1_fp16", "top_k_v2048_k2048"
VAR, VAR_BF16 = "top_k_varlen_n65536_k2048", "top_k_varlen_n8192_k1024_bf16"
ALL = (F32, BF16, K1, KN, VAR, VAR_BF16)


def shipped(name: str):
    return load_definition(DEFS / f"{name}.json")


def gen(name: str, case: str | None = None, size: str = "small") -> Inputs:
    return generate_inputs(shipped(name), size, 0, case=case)


# -- definitions and generator ------------------------------------------------------------------------------
def test_definitions_take_the_api_s_names_and_dtypes():
    assert sorted(p.stem for p in DEFS.glob("*.json")) == sorted(ALL)
    for name in ALL:
        d = shipped(name)
        assert d.op_type == "topk" and "coverage:topk" in d.tags and any(t.startswith("model:") for t in d.tags)
        if name.startswith("top_k_varlen"):
            assert list(d.inputs) == ["logits", "seq_lens", "top_k"] and list(d.outputs) == ["indices"]
            assert d.outputs["indices"].dtype.value == "int32"
        else:
            assert list(d.inputs) == ["input", "k"] and list(d.outputs) == ["values", "indices"]
            assert d.outputs["indices"].dtype.value == "int64"


def test_edge_cases():
    assert edge_cases(shipped(F32)) == ["single_row", "ties_at_kth", "all_equal", "negative_rows", "neg_inf",
                                        "last_bit", "large_values"]
    assert edge_cases(shipped(VAR))[-1] == "short_rows"


def test_k_is_the_const_axis_and_typical_varlen_rows_are_longer_than_k():
    x = gen(VAR)
    assert x.values["top_k"] == 2048
    assert bool((x.values["seq_lens"] > 2048).all()) and bool((x.values["seq_lens"] <= 65536).all())
    assert gen(F32).values["k"] == 50


def test_ties_straddle_the_cut():
    for name in (F32, K1, KN):
        x = gen(name, "ties_at_kth").values["input"].to(torch.float64)
        k = shipped(name).const_axes["top_k"]
        kth = x.sort(dim=-1, descending=True).values[:, k - 1:k]
        above = (x > kth).sum(dim=-1)
        equal = (x == kth).sum(dim=-1)
        assert bool((above < k).all()) and bool((above + equal > k).all() if k < x.shape[1] else True), name
        assert bool((equal >= 2).all()), name


def test_all_equal_negative_last_bit_and_large_rows():
    x = gen(F32, "all_equal").values["input"]
    assert bool((x == x[:, :1]).all()) and bool((x[0] == 0).all())
    assert bool((gen(F32, "negative_rows").values["input"] < 0).all())
    lb = gen(F32, "last_bit").values["input"].to(torch.float64)
    lo = lb.min(dim=-1, keepdim=True).values
    assert bool(((lb - lo) / lo <= 16 * 2.0**-23).all()) and bool(lb.unique(dim=-1).shape[1] > 1)
    big = gen(BF16, "large_values").values["input"]
    assert float(big.float().abs().max()) > 65504 and bool(torch.isfinite(big).all())


def test_neg_inf_rows():
    d = shipped(F32)
    x = gen(F32, "neg_inf").values["input"]
    finite = torch.isfinite(x).sum(dim=-1).tolist()
    k = d.const_axes["top_k"]
    assert finite[1] == k // 2 and finite[2] == 0 and finite[3] == x.shape[1] - 1
    assert not bool(torch.isnan(x).any())


def test_short_rows():
    x = gen(VAR_BF16, "short_rows")
    assert x.values["seq_lens"].tolist() == [1, 1023, 1024, 1025, 8192]
    (out,) = run_reference(shipped(VAR_BF16), x)
    assert sorted(out[0][out[0] != -1].tolist()) == [0] and int((out[1] == -1).sum()) == 1
    assert sorted(out[2].tolist()) == list(range(1024))


# -- the float64 truth and the verdict ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_the_reference_agrees_with_the_truth_on_every_case(name):
    d = shipped(name)
    for case in [None, *edge_cases(d)]:
        x = generate_inputs(d, "small", 0, case=case)
        assert agrees(d, x, run_reference(d, x)), case


def test_any_tie_break_passes_and_a_duplicate_does_not():
    d = shipped(F32)
    x = gen(F32, "all_equal")
    rows = x.values["input"].shape[0]
    idx = torch.stack([torch.randperm(128256)[:50] for _ in range(rows)])  # any 50 of an all-equal row
    vals = torch.gather(x.values["input"], 1, idx)
    assert agrees(d, x, (vals, idx))
    dup = idx.clone()
    dup[:, 1] = dup[:, 0]
    assert not agrees(d, x, (vals, dup))


def test_values_must_be_the_input_at_the_indices():
    d = shipped(F32)
    x = gen(F32)
    values, indices = run_reference(d, x)
    assert agrees(d, x, (values.flip(-1), indices.flip(-1)))  # any order
    assert not agrees(d, x, (values.flip(-1), indices))  # a value at the wrong index
    assert not agrees(d, x, (values, indices.to(torch.int32)))  # the API's indices are int64


def test_truth_selects_minus_inf_when_fewer_than_k_are_finite():
    d = shipped(F32)
    x = gen(F32, "neg_inf")
    values, indices = get_ground_truth("torch", d, device="cpu")(x)
    assert int(torch.isinf(values[1]).sum()) == 50 - 25 and bool(torch.isinf(values[2]).all())


# -- the FlashInfer adapter (a fake module) --------------------------------------------------------------------
def _fake(monkeypatch, version: str, calls: list, *, keywords: bool = True, varlen: bool = True):
    module = types.ModuleType("flashinfer")
    module.__version__ = version

    def _select(x, k):
        order = torch.argsort(x.float(), dim=-1, descending=True, stable=True)[:, :k]
        return torch.gather(x, 1, order), order

    if keywords:
        def top_k(input, k, sorted=False, deterministic=False, tie_break=0):
            calls.append(("top_k", k, sorted, deterministic, tie_break))
            return _select(input, k)
    else:
        def top_k(input, k, sorted=False):
            calls.append(("top_k", k, sorted))
            return _select(input, k)

    def _varlen(logits, lens, k):
        out = torch.full((logits.shape[0], k), -1, dtype=torch.int32)
        for r, n in enumerate(lens.tolist()):
            ids = _select(logits[r:r + 1, :n], min(k, n))[1][0]
            out[r, : ids.numel()] = ids.to(torch.int32)
        return out

    def top_k_ragged_transform(input, offsets, lengths, k, deterministic=False, tie_break=0):
        calls.append(("ragged", int(offsets.abs().sum())))
        return _varlen(input, lengths, k)

    def top_k_page_table_transform(input, src_page_table, lengths, k, row_to_batch=None):
        calls.append(("page-table", tuple(src_page_table.shape)))
        ids = _varlen(input, lengths, k)
        return torch.where(ids >= 0, src_page_table.gather(1, ids.clamp(min=0).long()), ids)

    module.topk = types.SimpleNamespace(top_k=top_k, top_k_ragged_transform=top_k_ragged_transform,
                                        top_k_page_table_transform=top_k_page_table_transform)
    if varlen:
        def top_k_varlen(logits, seq_lens, top_k, pre_idx=None, out_indices=None):
            calls.append(("varlen", out_indices is not None))
            ids = _varlen(logits, seq_lens, top_k)
            if out_indices is not None:
                out_indices.copy_(ids)
                ids = out_indices
            return ids, None
        module.top_k_varlen = top_k_varlen
    install_flashinfer(monkeypatch, module, version)
    return module


def _call(name: str, case: str | None, path: str | None):
    d = shipped(name)
    x = generate_inputs(d, "small", 0, case=case)
    gt = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path=path), device="cpu")
    return d, x, gt(x)


def test_flashinfer_paths():
    assert paths("flashinfer", shipped(F32)) == [None, "sorted", "deterministic", "tie-small", "tie-large",
                                                 "plan-reuse", "graph"]
    assert paths("flashinfer", shipped(VAR)) == [None, "out", "plan-reuse", "graph", "ragged", "ragged+plan-reuse",
                                                 "ragged+graph", "page-table", "page-table+plan-reuse",
                                                 "page-table+graph"]


@pytest.mark.parametrize("path,want", [(None, ("top_k", 50, False, False, 0)),
                                       ("sorted", ("top_k", 50, True, False, 0)),
                                       ("deterministic", ("top_k", 50, False, True, 0)),
                                       ("tie-small", ("top_k", 50, False, False, 1))])
def test_flashinfer_top_k_modes(monkeypatch, path, want):
    calls: list = []
    _fake(monkeypatch, "0.6.6", calls)
    d, x, got = _call(F32, "ties_at_kth", path)
    assert calls == [want] and agrees(d, x, got)


@pytest.mark.parametrize("path,want", [(None, ("varlen", False)), ("out", ("varlen", True)), ("ragged", ("ragged", 0)),
                                       ("page-table", ("page-table", (5, 8192)))])
def test_flashinfer_varlen_paths(monkeypatch, path, want):
    calls: list = []
    _fake(monkeypatch, "0.7.0", calls)
    d, x, got = _call(VAR_BF16, "short_rows", path)
    assert calls == [want] and agrees(d, x, got)


def test_flashinfer_missing_apis_and_keywords(monkeypatch):
    calls: list = []
    _fake(monkeypatch, "0.5.3", calls)
    with pytest.raises(GroundTruthUnavailable, match="api-missing"):
        get_ground_truth("flashinfer", shipped(F32), device="cuda")
    _fake(monkeypatch, "0.6.0", calls, keywords=False, varlen=False)
    with pytest.raises(GroundTruthUnavailable, match="api-missing: flashinfer 0.6.0 has no top_k_varlen"):
        get_ground_truth("flashinfer", shipped(VAR), device="cuda")
    d = shipped(F32)
    gt = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path="tie-small"), device="cpu")
    with pytest.raises(GroundTruthUnavailable, match="api-missing: flashinfer 0.6.0 top_k has no tie_break"):
        gt(generate_inputs(d, "small", 0))


def test_flashinfer_no_gpu(monkeypatch):
    _fake(monkeypatch, "0.6.6", [])
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        get_ground_truth("flashinfer", shipped(F32), device="cpu")


# -- planted bugs ------------------------------------------------------------------------------------------------
BOUNDARY_MUTANTS = {  # mutant -> the case that catches it (typical rows pass)
    f"{F32}:tie-slot-repeated": "ties_at_kth",
    f"{F32}:negatives-by-magnitude": "negative_rows",
    f"{VAR}:neg-inf-skipped": "neg_inf",
    f"{F32}:low-bits-dropped": "last_bit",
    f"{BF16}:float16-keys": "large_values",
    f"{VAR_BF16}:pad-with-zero": "short_rows",
    f"{VAR}:short-row-skipped": "short_rows",
}
ALSO = {f"{F32}:tie-slot-repeated": "all_equal"}
FAMILY = [m for m in MUTANTS if m.definition in ALL]


def test_every_boundary_class_has_a_mutant():
    assert_boundary_classes(FAMILY, BOUNDARY_MUTANTS,
                            {"boundary-ties", "boundary-magnitude", "boundary-structure", "boundary-parameter"})


@pytest.mark.parametrize("name", sorted(BOUNDARY_MUTANTS))
def test_a_boundary_bug_passes_typical_rows_and_is_caught_by_its_case(name):
    cases = [BOUNDARY_MUTANTS[name], ALSO[name]] if name in ALSO else [BOUNDARY_MUTANTS[name]]
    assert_boundary_bug(mutant_named(FAMILY, name), cases, sizes=("small", "medium"), crash_fails=False)


@pytest.mark.parametrize("mutant", [m.name for m in FAMILY])
def test_planted_topk_bugs_are_caught(mutant):
    assert_killed(mutant_named(FAMILY, mutant))


def test_nan_is_never_generated():
    for name in ALL:
        for case in [None, *edge_cases(shipped(name))]:
            v = next(iter(gen(name, case).values.values()))
            assert not (v.is_floating_point() and bool(torch.isnan(v).any())), (name, case)
    assert math.isinf(float(gen(K1, "neg_inf").values["input"][2, 0]))

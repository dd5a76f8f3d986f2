"""The `segment_gemm` family: the generator's boundary cases make the segments docs/boundary/segment_gemm.md
promises, the float64 truth matches values worked by hand, the FlashInfer adapter calls SegmentGEMMWrapper as
documented (a fake module: no GPU here) with the right layout flag, offsets or lengths, and weight indices, and skips
precisely (release gates, arch gates, no FlashInfer), and each planted bug passes on typical operands and is caught
by its case."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import pytest
import torch
from fakes import install_flashinfer
from planted import agrees, assert_boundary_bug, assert_boundary_classes, assert_killed, mutant_named

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.groundtruth import (
    GroundTruthUnavailable,
    base,
    flashinfer_segment_gemm,
    get_ground_truth,
    paths,
)
from flashinfer_trace.inputs import Inputs, edge_cases, generate_inputs
from flashinfer_trace.inputs import segment_gemm as sg_inputs
from flashinfer_trace.inputs.common import Builder, GeneratorMismatch
from flashinfer_trace.mutants import MUTANTS
from flashinfer_trace.testing import run_reference
from flashinfer_trace.timing import roofline
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import error_models

DEFS = Path(__file__).resolve().parents[2] / "definitions" / "segment_gemm"
SHRINK, EXPAND = "segment_gemm_lora_shrink_h4096_r16", "segment_gemm_lora_expand_h4096_r16"
SHRINK70, EXPAND70 = "segment_gemm_lora_shrink_h8192_r64_fp16", "segment_gemm_lora_expand_h8192_r64_fp16"
MOE, ODD = "segment_gemm_moe_e8_k768_n2048", "segment_gemm_k200_n72_fp16"


def shipped(name: str):
    return load_definition(DEFS / f"{name}.json")


def values(name: str, case: str | None = None, size: str = "small") -> dict:
    return generate_inputs(shipped(name), size, 0, case=case).values


def lens(v: dict) -> list[int]:
    p = v["seg_indptr"]
    return (p[1:] - p[:-1]).tolist()


# -- the definitions -----------------------------------------------------------------------------------
def test_definitions_state_layout_offsets_and_indices():
    names = sorted(p.stem for p in DEFS.glob("*.json"))
    assert names == sorted([SHRINK, EXPAND, SHRINK70, EXPAND70, MOE, ODD])
    for n in names:
        d = shipped(n)
        assert d.op_type == "segment_gemm" and list(d.inputs)[:3] == ["x", "weights", "seg_indptr"]
        assert d.inputs["seg_indptr"].dtype.value == "int64" and d.outputs["output"].dtype == d.inputs["x"].dtype
        assert "fi_api:flashinfer.gemm.SegmentGEMMWrapper" in d.tags and "coverage:segment_gemm" in d.tags
    assert [sg_inputs.column_major(shipped(n)) for n in (SHRINK, EXPAND, SHRINK70, EXPAND70, MOE, ODD)] == [
        True, True, False, False, False, False]
    assert "weight_indices" not in shipped(MOE).inputs and shipped(MOE).const_axes["num_experts"] == 8
    assert shipped(SHRINK).const_axes == {"K": 4096, "N": 16} and shipped(EXPAND70).const_axes == {"K": 64, "N": 8192}
    assert shipped(ODD).const_axes["K"] % 32 and shipped(ODD).const_axes["K"] % 8 == 0


def test_tolerance_and_error_model():
    tol = tolerance_for(shipped(SHRINK))
    assert (tol.atol, tol.rtol, tol.matched_ratio) == (1e-2, 1e-2, 1.0)
    assert error_models(shipped(SHRINK)) == ["operand scale: |x| @ |W[segment]|"]


def test_roofline_counts_a_multiply_add_per_row_k_and_n():
    d = shipped(ODD)
    x = generate_inputs(d, "small", 0)
    assert roofline.work(d, x).flops == 2 * x.values["x"].shape[0] * 200 * 72


# -- the generator's boundary cases --------------------------------------------------------------------
def test_edge_cases():
    assert edge_cases(shipped(SHRINK)) == list(sg_inputs.CASES)
    assert edge_cases(shipped(MOE)) == ["empty_segments", "one_row_segments", "tile_edge", "long_segment",
                                        "half_overflow"]
    with pytest.raises(Exception, match="repeated_weights"):
        values(MOE, "repeated_weights")


def test_typical_segments_and_distinct_weight_indices():
    v = values(ODD, size="medium")
    assert len(lens(v)) == 8 and all(2 <= n <= 32 for n in lens(v))
    wi = v["weight_indices"]
    assert v["weights"].shape[0] == 9 and len(set(wi.tolist())) == 8
    assert bool((wi != torch.arange(8)).all())  # never W[i]: ignoring the indices shows
    m = values(MOE)
    assert len(lens(m)) == 8 and m["x"].shape == (sum(lens(m)), 768)


def test_structural_cases():
    assert lens(values(SHRINK, "empty_segments"))[0] == 0
    e = lens(values(MOE, "empty_segments"))
    assert e[0] == e[4] == e[7] == 0 and sum(e) > 0
    s = values(SHRINK, "single_segment")
    assert len(lens(s)) == 1 and s["weight_indices"].tolist() == [s["weights"].shape[0] - 1] != [0]
    assert set(lens(values(SHRINK, "one_row_segments"))) == {1}
    assert lens(values(MOE, "tile_edge")) == list(sg_inputs.TILE_EDGE)
    long = lens(values(SHRINK, "long_segment"))
    assert long[1] == 2049 and torch.tensor(2049.0).to(torch.bfloat16).item() == 2048
    assert torch.tensor(2049.0).to(torch.float16).item() == 2048
    r = values(SHRINK, "repeated_weights")["weight_indices"].tolist()
    assert r == [4, 0, 4, 0]


def test_half_overflow_partial_sums_pass_fp16_max_but_the_output_does_not():
    d = shipped(ODD)
    x = generate_inputs(d, "small", 0, case="half_overflow")
    a = sg_inputs.half_magnitude(200)
    assert a == 64 and bool((x.values["weights"] == a).all())
    assert a * a * 101 > 65504  # the positive half of K alone
    (out,) = run_reference(d, x)
    assert bool((out.float() == 2 * a * a).all())


def test_a_definition_without_seg_indptr_or_with_an_odd_weight_shape_is_refused():
    d = shipped(ODD)
    bad = d.model_copy(update={"inputs": {k: v for k, v in d.inputs.items() if k != "seg_indptr"}})
    with pytest.raises(GeneratorMismatch, match="missing seg_indptr"):
        sg_inputs.generate(Builder(bad, "small", 0, None))
    w = d.inputs["weights"].model_copy(update={"shape": ["num_weights", "N", "N"]})
    with pytest.raises(GeneratorMismatch, match="K axis"):
        sg_inputs.generate(Builder(d.model_copy(update={"inputs": {**d.inputs, "weights": w}}), "small", 0, None))


# -- the float64 truth ---------------------------------------------------------------------------------
def _inputs(name: str, x, w, indptr, wi=None) -> Inputs:
    d = shipped(name)
    vals = {"x": x, "weights": w, "seg_indptr": torch.tensor(indptr)}
    if wi is not None:
        vals["weight_indices"] = torch.tensor(wi)
    axes = {"total_rows": x.shape[0], "len_indptr": len(indptr)}
    return Inputs(d.name, "small", 0, None, vals, axes, ())


def test_truth_picks_each_segment_s_weight_and_transposes_column_major_ones():
    x = torch.zeros(3, 4096, dtype=torch.bfloat16)
    x[0, 0], x[1, 1], x[2, 0] = 1.0, 2.0, 3.0
    w = torch.zeros(5, 16, 4096, dtype=torch.bfloat16)  # column-major: [N, K]
    w[4, 7, 0], w[2, 3, 1], w[2, 5, 0] = 0.5, 4.0, -1.0
    # segments: [0, 1) -> W4, [1, 1) empty -> W0, [1, 3) -> W2
    (out,) = get_ground_truth("torch", shipped(SHRINK), device="cpu")(_inputs(SHRINK, x, w, [0, 1, 1, 3], [4, 0, 2]))
    assert out.dtype == torch.bfloat16 and out.shape == (3, 16)
    assert float(out[0, 7]) == 0.5 and float(out[0].abs().sum()) == 0.5
    assert float(out[1, 3]) == 8.0 and float(out[2, 5]) == -3.0 and float(out[1, 5]) == 0


def test_truth_without_weight_indices_uses_w_i():
    x = torch.ones(2, 768, dtype=torch.bfloat16)
    w = torch.zeros(8, 768, 2048, dtype=torch.bfloat16)  # row-major [K, N]
    w[7, :, 1] = 1.0
    w[0, :, 0] = 1.0
    indptr = [0, 1] + [1] * 6 + [2]  # expert 0 one row, experts 1..6 none, expert 7 one row
    (out,) = get_ground_truth("torch", shipped(MOE), device="cpu")(_inputs(MOE, x, w, indptr))
    assert float(out[0, 0]) == 768 and float(out[0, 1]) == 0 and float(out[1, 1]) == 768 and float(out[1, 0]) == 0


# -- the FlashInfer adapter (a fake module) ------------------------------------------------------------
class _FakeWrapper:
    def __init__(self, calls, ws, backend="auto"):
        self.calls, self.backend = calls, backend

    def run(self, x, weights, batch_size, weight_column_major, out=None, seg_lens=None, seg_indptr=None,
            weight_indices=None):
        self.calls.append(dict(backend=self.backend, col=weight_column_major, batch=batch_size, out=out is not None,
                               lens=seg_lens is not None, indptr=seg_indptr is not None,
                               indices=None if weight_indices is None else weight_indices.tolist()))
        if seg_indptr is None:  # what run does: the lengths through x's dtype
            seg_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), seg_lens.to(x).to(torch.int64).cumsum(0)])
        y = torch.zeros(x.shape[0], weights.shape[1 if weight_column_major else 2], dtype=x.dtype) if out is None \
            else out
        for i in range(batch_size):
            s, e = int(seg_indptr[i]), int(seg_indptr[i + 1])
            w = weights[i if weight_indices is None else int(weight_indices[i])].float()
            y[s:e] += (x[s:e].float() @ (w.t() if weight_column_major else w)).to(y.dtype)
        return y


def _fake(monkeypatch, version: str, calls: list | None = None, *, with_class: bool = True, cc=(9, 0)):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    calls = [] if calls is None else calls
    if with_class:
        module.SegmentGEMMWrapper = lambda ws, backend="auto": _FakeWrapper(calls, ws, backend)
    install_flashinfer(monkeypatch, module, version, cc=cc)
    monkeypatch.setattr(flashinfer_segment_gemm, "WORKSPACE_BYTES", 16)
    return module


def _on_cpu(d, path=None):
    return dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path=path), device="cpu")


def test_flashinfer_paths():
    common = [None, "out", "graph", "seg-lens", "other-layout"]
    assert paths("flashinfer", shipped(SHRINK)) == [*common, "sm80", "sm90"]
    assert paths("flashinfer", shipped(MOE)) == [*common, "identity-indices", "sm80", "sm90"]


@pytest.mark.parametrize("name", [SHRINK, EXPAND70, MOE])
@pytest.mark.parametrize("path, want", [
    (None, dict(backend="auto", out=False, lens=False, indptr=True)),
    ("out", dict(backend="auto", out=True, lens=False, indptr=True)),
    ("seg-lens", dict(backend="auto", out=False, lens=True, indptr=False)),
    ("sm80", dict(backend="sm80", out=False, lens=False, indptr=True)),
    ("sm90", dict(backend="sm90", out=False, lens=False, indptr=True)),
    ("other-layout", dict(backend="auto", out=False, lens=False, indptr=True)),
])
def test_flashinfer_calls_run_as_documented(monkeypatch, name, path, want):
    calls: list = []
    _fake(monkeypatch, "0.6.6", calls)
    d = shipped(name)
    x = generate_inputs(d, "small", 0, case="empty_segments")
    before = {k: v.clone() for k, v in x.values.items()}
    got = _on_cpu(d, path)(x)
    [c] = calls
    col = sg_inputs.column_major(d)
    assert {k: c[k] for k in want} == want and c["batch"] == x.values["seg_indptr"].shape[0] - 1
    assert c["col"] == (not col if path == "other-layout" else col)
    assert c["indices"] == (x.values["weight_indices"].tolist() if "weight_indices" in x.values else None)
    assert agrees(d, x, got)
    assert all(torch.equal(before[k], v) for k, v in x.values.items())


def test_identity_indices_path_passes_arange(monkeypatch):
    calls: list = []
    _fake(monkeypatch, "0.7.2.post1", calls)
    d = shipped(MOE)
    x = generate_inputs(d, "small", 0)
    assert agrees(d, x, _on_cpu(d, "identity-indices")(x))
    assert calls[0]["indices"] == list(range(8))
    with pytest.raises(GroundTruthUnavailable, match="has weight_indices"):
        get_ground_truth("flashinfer", shipped(SHRINK), device="cuda", path="identity-indices")


def test_the_seg_lens_path_fails_long_segments_as_flashinfer_s_run_computes_them(monkeypatch):
    _fake(monkeypatch, "0.6.6")
    d = shipped(SHRINK)
    x = generate_inputs(d, "small", 0, case="long_segment")
    assert agrees(d, x, _on_cpu(d)(x))
    assert not agrees(d, x, _on_cpu(d, "seg-lens")(x))  # 2049 -> 2048 through bfloat16


def test_flashinfer_release_gates(monkeypatch):
    _fake(monkeypatch, "0.1.5")
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*needs >=0.1.6"):
        get_ground_truth("flashinfer", shipped(SHRINK), device="cuda")
    _fake(monkeypatch, "0.1.6")
    get_ground_truth("flashinfer", shipped(SHRINK), device="cuda")  # run() without backend: fine
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*needs >=0.2.0"):
        get_ground_truth("flashinfer", shipped(SHRINK), device="cuda", path="sm80")
    _fake(monkeypatch, "0.2.5")
    d = shipped(SHRINK)
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*has no out= \(needs >=0.2.6\)"):
        _on_cpu(d, "out")(generate_inputs(d, "small", 0))
    _fake(monkeypatch, "0.6.6", with_class=False)
    with pytest.raises(GroundTruthUnavailable, match="api-missing"):
        get_ground_truth("flashinfer", shipped(SHRINK), device="cuda")


def test_flashinfer_arch_gates(monkeypatch):
    _fake(monkeypatch, "0.6.6", cc=(10, 0))
    with pytest.raises(GroundTruthUnavailable, match="arch-unsupported"):
        get_ground_truth("flashinfer", shipped(SHRINK), device="cuda", path="sm90")
    get_ground_truth("flashinfer", shipped(SHRINK), device="cuda", path="sm80")
    _fake(monkeypatch, "0.6.6", cc=(7, 5))
    with pytest.raises(GroundTruthUnavailable, match="arch-unsupported"):
        get_ground_truth("flashinfer", shipped(SHRINK), device="cuda")


def test_flashinfer_refuses_what_the_api_does_not_take(monkeypatch):
    _fake(monkeypatch, "0.6.6")
    d = shipped(ODD)
    f32 = d.model_copy(update={"outputs": {"output": d.outputs["output"].model_copy(
        update={"dtype": d.inputs["seg_indptr"].dtype})}})
    with pytest.raises(GroundTruthUnavailable, match="in x's dtype only"):
        get_ground_truth("flashinfer", f32, device="cuda")
    odd = d.model_copy(update={"axes": {**d.axes, "N": d.axes["N"].model_copy(update={"value": 71})}})
    with pytest.raises(GroundTruthUnavailable, match="no multiple of 8"):
        get_ground_truth("flashinfer", odd, device="cuda")


def test_flashinfer_not_installed_or_no_gpu_and_graph_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(base, "installed_version", lambda package: None)
    with pytest.raises(GroundTruthUnavailable, match="not-installed: flashinfer"):
        get_ground_truth("flashinfer", shipped(SHRINK), device="cuda")
    _fake(monkeypatch, "0.6.6")
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        get_ground_truth("flashinfer", shipped(SHRINK), device="cpu")
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        _on_cpu(shipped(ODD), "graph")(generate_inputs(shipped(ODD), "small", 0))


# -- planted bugs --------------------------------------------------------------------------------------
BOUNDARY_MUTANTS = {  # mutant -> the case that catches it (typical operands pass)
    f"{SHRINK}:empty-segments-compacted": "empty_segments",
    f"{MOE}:empty-experts-compacted": "empty_segments",
    f"{SHRINK}:single-segment-first-weight": "single_segment",
    f"{SHRINK}:one-row-gemv-reshape": "one_row_segments",
    f"{EXPAND70}:m-tile-tail-dropped": "tile_edge",
    f"{SHRINK}:seg-lens-through-dtype": "long_segment",
    f"{SHRINK}:repeated-weights-merged": "repeated_weights",
    f"{ODD}:half-accumulator": "half_overflow",
}
FAMILY = [m for m in MUTANTS if m.definition.startswith("segment_gemm_")]


def test_every_boundary_class_has_a_mutant():
    assert_boundary_classes(FAMILY, BOUNDARY_MUTANTS, {"boundary-magnitude", "boundary-structure"})
    assert set(BOUNDARY_MUTANTS.values()) == set(sg_inputs.CASES)


@pytest.mark.parametrize("name", sorted(BOUNDARY_MUTANTS))
def test_a_boundary_bug_passes_typical_operands_and_is_caught_by_its_case(name):
    assert_boundary_bug(mutant_named(FAMILY, name), [BOUNDARY_MUTANTS[name]])


@pytest.mark.parametrize("mutant", [m.name for m in FAMILY])
def test_planted_segment_gemm_bugs_are_caught(mutant):
    assert_killed(mutant_named(FAMILY, mutant))

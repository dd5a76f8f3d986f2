"""The `bmm_fp8` family: the generator's boundary cases make the operands docs/boundary/bmm.md promises, the float64
truth matches values worked by hand, the FlashInfer adapter calls the API as documented (a fake module: no GPU
here) with B column-major, and skips precisely (release gates, arch gates, the cudnn package, no FlashInfer), and
each planted bug passes on typical operands and is caught by its case."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import pytest
import torch
from fakes import install_flashinfer
from planted import agrees, assert_boundary_bug, assert_killed, mutant_named

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.groundtruth import GroundTruthUnavailable, base, flashinfer_bmm, get_ground_truth, paths
from flashinfer_trace.inputs import Inputs, edge_cases, generate_inputs
from flashinfer_trace.inputs import bmm as bmm_inputs
from flashinfer_trace.inputs.common import Builder, GeneratorMismatch
from flashinfer_trace.mutants import MUTANTS
from flashinfer_trace.testing import run_reference
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import error_models

DEFS = Path(__file__).resolve().parents[2] / "definitions" / "bmm_fp8"
BF_DEFS = DEFS.parent / "bmm_bf16"
QK, VO, ODD = "bmm_fp8_b128_k128_n512", "bmm_fp8_b128_k512_n128", "bmm_fp8_b16_k144_n80"
BF_VO, BF_ODD = "bmm_bf16_b128_k512_n128", "bmm_bf16_b16_k144_n80"
E4M3 = torch.float8_e4m3fn


def shipped(name: str):
    return load_definition((BF_DEFS if name.startswith("bmm_bf16") else DEFS) / f"{name}.json")


def values(name: str, case: str | None = None, size: str = "small") -> dict:
    return generate_inputs(shipped(name), size, 0, case=case).values


# -- the definitions -----------------------------------------------------------------------------------
def test_definitions_take_fp8_codes_and_per_tensor_scales():
    names = sorted(p.stem for p in DEFS.glob("*.json"))
    assert names == [QK, VO, ODD]
    for n in names:
        d = shipped(n)
        assert d.op_type == "bmm_fp8" and list(d.inputs) == ["A", "B", "A_scale", "B_scale"]
        assert d.inputs["A"].dtype.value == d.inputs["B"].dtype.value == "float8_e4m3fn"
        assert d.inputs["A_scale"].shape == d.inputs["B_scale"].shape == []
        assert d.outputs["C"].dtype.value == "bfloat16"
        assert "fi_api:flashinfer.gemm.bmm_fp8" in d.tags and "coverage:bmm_fp8" in d.tags
    assert "model:deepseek-v3" in shipped(QK).tags and "model:deepseek-v3" in shipped(VO).tags
    assert shipped(QK).const_axes == {"batch_size": 128, "K": 128, "N": 512}
    assert shipped(ODD).const_axes == {"K": 144, "N": 80}  # the batch is var


def test_tolerance_is_bf16_s_on_every_element_with_the_operand_scale_model():
    tol = tolerance_for(shipped(VO))
    assert (tol.atol, tol.rtol, tol.matched_ratio) == (1e-2, 1e-2, 1.0)
    assert error_models(shipped(VO)) == ["operand scale: (|A| A_scale) @ (|B| B_scale)"]


# -- the generator's boundary cases --------------------------------------------------------------------
def test_edge_cases():
    assert edge_cases(shipped(VO)) == ["single_token", "saturated", "subnormal", "zero_scale", "scale_overflow"]
    assert edge_cases(shipped(ODD)) == list(bmm_inputs.CASES)
    assert values(VO, "single_token")["A"].shape == (128, 1, 512)
    assert values(ODD, "single_batch")["A"].shape == (1, 4, 144)
    with pytest.raises(Exception, match="unknown edge case 'single_batch'"):
        values(VO, "single_batch")


def test_typical_codes_and_scales():
    x = values(ODD, size="medium")
    a = x["A"].float()
    assert x["A"].dtype == E4M3 and a.shape == (8, 32, 144) and 6 < float(a.std()) < 10
    assert float(a.abs().max()) < 240 and bool(torch.isfinite(a).all())
    for n in ("A_scale", "B_scale"):
        assert x[n].shape == () and x[n].dtype == torch.float32 and 2 ** -8 <= float(x[n]) <= 2 ** -2
    assert float(x["A_scale"]) != float(x["B_scale"])


def test_saturated_holds_448_in_even_rows_of_a_and_even_columns_of_b():
    x = values(ODD, "saturated")
    a, b = x["A"].float(), x["B"].float()
    assert bool((a[:, 0::2].abs() == 448).all()) and bool((b[:, :, 0::2].abs() == 448).all())
    assert bool((a[:, 1::2].abs() < 240).all())


def test_subnormal_a_is_subnormal_codes_scaled_to_integers():
    x = values(ODD, "subnormal")
    a = x["A"].float()
    assert bool((a.abs() < 2 ** -6).all()) and bool((a != 0).all())
    deq = a * x["A_scale"]
    assert float(x["A_scale"]) == 2 ** 9 and torch.equal(deq, deq.round()) and float(deq.abs().max()) <= 7


def test_zero_scale_gives_exact_zeros_and_scale_overflow_a_finite_output():
    d = shipped(ODD)
    x = generate_inputs(d, "small", 0, case="zero_scale")
    assert float(x.values["A_scale"]) == 0.0 and bool((x.values["B"].float().abs() == 448).all())
    (out,) = run_reference(d, x)
    assert bool((out == 0).all())
    y = generate_inputs(d, "small", 0, case="scale_overflow")
    assert (float(y.values["A_scale"]), float(y.values["B_scale"])) == (2.0 ** 120, 2.0 ** -118)
    assert float(y.values["A"].float().abs().max()) * 2.0 ** 120 > torch.finfo(torch.float32).max
    (out,) = run_reference(d, y)
    assert bool(torch.isfinite(out.float()).all()) and float(out.float().abs().max()) > 0


def test_to_e4m3_saturates_instead_of_nan():
    t = bmm_inputs.to_e4m3(torch.tensor([1000.0, -1e6, 3.0]))
    assert t.float().tolist() == [448.0, -448.0, 3.0]


def test_a_definition_without_the_scales_is_refused():
    d = shipped(ODD)
    bad = d.model_copy(update={"inputs": {k: v for k, v in d.inputs.items() if k != "B_scale"}})
    with pytest.raises(GeneratorMismatch, match="missing B_scale"):
        bmm_inputs.generate(Builder(bad, "small", 0, None))
    vector = d.model_copy(update={"inputs": {**d.inputs, "A_scale": d.inputs["A_scale"].model_copy(
        update={"shape": ["K"]})}})
    with pytest.raises(GeneratorMismatch, match="A_scale must be a per-tensor scale"):
        bmm_inputs.generate(Builder(vector, "small", 0, None))


# -- the float64 truth ---------------------------------------------------------------------------------
def _inputs(name: str, a, b, sa: float, sb: float) -> Inputs:
    d = shipped(name)
    vals = {"A": a.to(E4M3), "B": b.to(E4M3), "A_scale": torch.tensor(sa), "B_scale": torch.tensor(sb)}
    axes = {"batch_size": a.shape[0], "M": a.shape[1], "K": a.shape[2], "N": b.shape[2]}
    return Inputs(d.name, "small", 0, None, vals, axes, ())


def test_truth_is_the_scaled_batched_product():
    a = torch.zeros(2, 1, 144)
    a[0, 0, :3] = torch.tensor([1.0, 2.0, 448.0])
    a[1, 0, 0] = 0.5
    b = torch.zeros(2, 144, 80)
    b[:, 0, 0], b[:, 1, 0], b[:, 2, 1] = 4.0, -1.0, 448.0
    (out,) = get_ground_truth("torch", shipped(ODD), device="cpu")(_inputs(ODD, a, b, 0.25, 2.0))
    assert out.dtype == torch.bfloat16 and out.shape == (2, 1, 80)
    assert float(out[0, 0, 0]) == (1 * 4 - 2) * 0.5 and float(out[0, 0, 1]) == 448 * 448 * 0.5
    assert float(out[1, 0, 0]) == 0.5 * 4 * 0.5 and float(out[1, 0, 1]) == 0


def test_truth_survives_scales_whose_operand_products_overflow_float32():
    a, b = torch.full((1, 1, 144), 448.0), torch.full((1, 144, 80), 1.0)
    (out,) = get_ground_truth("torch", shipped(ODD), device="cpu")(_inputs(ODD, a, b, 2.0 ** 120, 2.0 ** -120))
    assert bool((out.float() == torch.tensor(448.0 * 144).to(torch.bfloat16).float()).all())


# -- the FlashInfer adapter (a fake module) ------------------------------------------------------------
def _fake(monkeypatch, version: str, calls: list | None = None, *, with_bmm: bool = True, cudnn: bool = True):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    if with_bmm:
        def bmm_fp8(A, B, A_scale, B_scale, dtype, out=None, backend="cublas"):
            if calls is not None:
                calls.append(dict(a=A.dtype, b_col=B.stride(-2) == 1, dtype=dtype, out=out is not None,
                                  backend=backend, scales=(A_scale.numel(), B_scale.numel())))
            assert B.stride(-2) == 1, "B must be column-major"
            # what cuBLASLt computes: the float32 sum of code products, scaled once
            c = (torch.matmul(A.float(), B.float()) * (A_scale * B_scale)).to(dtype)
            if out is None:
                return c
            out.copy_(c)
            return out
        module.bmm_fp8 = bmm_fp8

        def bmm_bf16(A, B, out=None, out_dtype=torch.bfloat16, backend="cudnn"):
            if calls is not None:
                calls.append(dict(a=A.dtype, b_col=B.stride(-2) == 1, dtype=out_dtype, out=out is not None,
                                  backend=backend))
            assert B.stride(-2) == 1, "B must be column-major"
            c = torch.matmul(A.float(), B.float()).to(out_dtype)
            if out is None:
                return c
            out.copy_(c)
            return out
        module.bmm_bf16 = bmm_bf16
    install_flashinfer(monkeypatch, module, version)
    real = flashinfer_bmm.importlib.util.find_spec
    monkeypatch.setattr(flashinfer_bmm.importlib.util, "find_spec",
                        lambda name, *a: (object() if cudnn else None) if name == "cudnn" else real(name, *a))
    return module


def _on_cpu(d, path=None):
    return dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path=path), device="cpu")


def test_flashinfer_paths():
    assert paths("flashinfer", shipped(VO)) == [None, "out", "graph", "cudnn", "auto", "cutlass"]
    assert paths("sglang", shipped(VO)) == [None]


@pytest.mark.parametrize("case", [None, "saturated", "subnormal", "zero_scale", "scale_overflow"])
@pytest.mark.parametrize("path, backend, out", [(None, "cublas", False), ("out", "cublas", True),
                                                ("cudnn", "cudnn", False), ("auto", "auto", False)])
def test_flashinfer_calls_bmm_fp8_with_b_column_major(monkeypatch, case, path, backend, out):
    calls: list = []
    _fake(monkeypatch, "0.6.6", calls)
    d = shipped(ODD)
    x = generate_inputs(d, "small", 0, case=case)
    before = {k: v.clone() for k, v in x.values.items()}
    got = _on_cpu(d, path)(x)
    assert calls == [dict(a=E4M3, b_col=True, dtype=torch.bfloat16, out=out, backend=backend, scales=(1, 1))]
    assert agrees(d, x, got)
    assert all(torch.equal(before[k].view(torch.uint8) if before[k].dtype == E4M3 else before[k],
                           v.view(torch.uint8) if v.dtype == E4M3 else v) for k, v in x.values.items())


def test_flashinfer_release_gates(monkeypatch):
    _fake(monkeypatch, "0.1.5")
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: flashinfer 0.1.5 has no flashinfer.bmm_fp8 "):
        get_ground_truth("flashinfer", shipped(VO), device="cuda")
    _fake(monkeypatch, "0.2.8")
    get_ground_truth("flashinfer", shipped(VO), device="cuda")  # cuBLASLt, no backend keyword: fine
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*backend=cudnn\) \(needs >=0.2.9\)"):
        get_ground_truth("flashinfer", shipped(VO), device="cuda", path="cudnn")
    _fake(monkeypatch, "0.2.11")
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*backend=auto\) \(needs >=0.2.12\)"):
        get_ground_truth("flashinfer", shipped(VO), device="cuda", path="auto")
    _fake(monkeypatch, "0.6.6", with_bmm=False)
    with pytest.raises(GroundTruthUnavailable, match="api-missing: flashinfer 0.6.6 has no bmm_fp8"):
        get_ground_truth("flashinfer", shipped(VO), device="cuda")


def test_flashinfer_cutlass_is_blackwell_only_and_cudnn_needs_its_package(monkeypatch):
    _fake(monkeypatch, "0.6.6", cudnn=False)
    with pytest.raises(GroundTruthUnavailable,
                       match=r"arch-unsupported: .*backend=cutlass\) needs >= sm100, have sm90"):
        get_ground_truth("flashinfer", shipped(VO), device="cuda", path="cutlass")
    with pytest.raises(GroundTruthUnavailable, match="not-installed: cudnn"):
        get_ground_truth("flashinfer", shipped(VO), device="cuda", path="cudnn")
    monkeypatch.setattr(base, "cuda_capability", lambda device: (8, 0))
    with pytest.raises(GroundTruthUnavailable, match="arch-unsupported: flashinfer.bmm_fp8 needs >= sm89, have sm80"):
        get_ground_truth("flashinfer", shipped(VO), device="cuda")


def test_flashinfer_refuses_what_the_api_does_not_take(monkeypatch):
    _fake(monkeypatch, "0.6.6")
    d = shipped(VO)
    f32 = d.inputs["A_scale"].dtype
    f32_out = d.model_copy(update={"outputs": {"C": d.outputs["C"].model_copy(update={"dtype": f32})}})
    with pytest.raises(GroundTruthUnavailable, match="unsupported: flashinfer.bmm_fp8: output C in bfloat16 or "
                                                     "float16"):
        get_ground_truth("flashinfer", f32_out, device="cuda")
    vec = d.model_copy(update={"inputs": {**d.inputs, "A_scale": d.inputs["A_scale"].model_copy(
        update={"shape": ["K"]})}})
    with pytest.raises(GroundTruthUnavailable, match="per-tensor scales only"):
        get_ground_truth("flashinfer", vec, device="cuda")


def test_flashinfer_not_installed_or_no_gpu_and_graph_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(base, "installed_version", lambda package: None)
    with pytest.raises(GroundTruthUnavailable, match="not-installed: flashinfer"):
        get_ground_truth("flashinfer", shipped(VO), device="cuda")
    _fake(monkeypatch, "0.6.6")
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        get_ground_truth("flashinfer", shipped(VO), device="cpu")
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        _on_cpu(shipped(ODD), "graph")(generate_inputs(shipped(ODD), "small", 0))


# -- planted bugs --------------------------------------------------------------------------------------
BOUNDARY_MUTANTS = {  # mutant -> the case that catches it (typical operands pass)
    f"{VO}:fnuz-limit": "saturated",
    f"{VO}:subnormals-flushed": "subnormal",
    f"{VO}:zero-scale-as-absent": "zero_scale",
    f"{VO}:dequantize-operands": "scale_overflow",
    f"{VO}:token-axis-squeezed": "single_token",
    f"{ODD}:batch-axis-squeezed": "single_batch",
    f"{BF_VO}:fp16-epilogue": "beyond_fp16",
    f"{BF_VO}:token-axis-squeezed": "single_token",
    f"{BF_ODD}:batch-axis-squeezed": "single_batch",
}
FAMILY = [m for m in MUTANTS if m.definition.startswith(("bmm_fp8_", "bmm_bf16_"))]


def test_every_boundary_class_has_a_mutant():
    for prefix in ("bmm_fp8_", "bmm_bf16_"):
        classes = {m.cls for m in FAMILY if m.name in BOUNDARY_MUTANTS and m.definition.startswith(prefix)}
        assert classes == {"boundary-magnitude", "boundary-structure"}, prefix
    assert set(BOUNDARY_MUTANTS) == {m.name for m in FAMILY if m.cls.startswith("boundary-")}


@pytest.mark.parametrize("name", sorted(BOUNDARY_MUTANTS))
def test_a_boundary_bug_passes_typical_operands_and_is_caught_by_its_case(name):
    assert_boundary_bug(mutant_named(FAMILY, name), [BOUNDARY_MUTANTS[name]])


@pytest.mark.parametrize("mutant", [m.name for m in FAMILY])
def test_planted_bmm_bugs_are_caught(mutant):
    assert_killed(mutant_named(FAMILY, mutant))


# -- bmm_bf16 ------------------------------------------------------------------------------------------
def test_bf16_definitions_cases_and_truth():
    names = sorted(p.stem for p in BF_DEFS.glob("*.json"))
    assert names == ["bmm_bf16_b128_k128_n512", BF_VO, BF_ODD]
    for n in names:
        d = shipped(n)
        assert d.op_type == "bmm_bf16" and list(d.inputs) == ["A", "B"] and d.outputs["C"].dtype.value == "bfloat16"
        assert "fi_api:flashinfer.gemm.bmm_bf16" in d.tags
    assert edge_cases(shipped(BF_VO)) == ["single_token", "beyond_fp16"]
    assert edge_cases(shipped(BF_ODD)) == ["single_token", "single_batch", "beyond_fp16"]
    d = shipped(BF_ODD)
    x = generate_inputs(d, "small", 0, case="beyond_fp16")
    (out,) = run_reference(d, x)
    assert float(out.float().abs().max()) > 65504 and bool(torch.isfinite(out.float()).all())
    a, b = torch.zeros(1, 1, 144), torch.zeros(1, 144, 80)
    a[0, 0, :2], b[0, 0, 0], b[0, 1, 0] = torch.tensor([3.0, -2.0]), 5.0, 7.0
    got = get_ground_truth("torch", d, device="cpu")(Inputs(d.name, "small", 0, None, {
        "A": a.to(torch.bfloat16), "B": b.to(torch.bfloat16)}, {"batch_size": 1, "M": 1}, ()))[0]
    assert float(got[0, 0, 0]) == 1.0 and bool((got[0, 0, 1:] == 0).all())


def test_bf16_flashinfer_paths_and_gates(monkeypatch):
    assert paths("flashinfer", shipped(BF_VO)) == [None, "out", "graph", "cutile", "cutlass"]
    _fake(monkeypatch, "0.6.11")  # cudnn on sm100 / 103 only before 0.6.12
    with pytest.raises(GroundTruthUnavailable, match=r"arch-unsupported: .*backend=cudnn\) needs sm100..sm103"):
        get_ground_truth("flashinfer", shipped(BF_VO), device="cuda")
    _fake(monkeypatch, "0.6.0")
    with pytest.raises(GroundTruthUnavailable, match="api-missing"):
        get_ground_truth("flashinfer", shipped(BF_VO), device="cuda")
    _fake(monkeypatch, "0.6.17")
    with pytest.raises(GroundTruthUnavailable, match=r"arch-unsupported: .*backend=cutlass\) needs sm100..sm107"):
        get_ground_truth("flashinfer", shipped(BF_VO), device="cuda", path="cutlass")
    _fake(monkeypatch, "0.6.17", cudnn=False)
    [current] = [a for a in flashinfer_bmm.ADAPTERS if a.op_type == "bmm_bf16" and a.path == ""
                 and "0.6.12" in str(a.versions) and ">=" in str(a.versions) and "<" not in str(a.versions)]
    with pytest.raises(GroundTruthUnavailable, match="not-installed: cudnn"):
        base.availability(current, shipped(BF_VO), "cuda")


@pytest.mark.parametrize("path, out", [(None, False), ("out", True)])
@pytest.mark.parametrize("case", [None, "single_batch", "beyond_fp16"])
def test_bf16_flashinfer_calls_bmm_bf16_with_b_column_major(monkeypatch, path, out, case):
    calls: list = []
    _fake(monkeypatch, "0.6.17", calls)
    d = shipped(BF_ODD)
    x = generate_inputs(d, "small", 0, case=case)
    got = _on_cpu(d, path)(x)
    assert calls == [dict(a=torch.bfloat16, b_col=True, dtype=torch.bfloat16, out=out, backend="cudnn")]
    assert agrees(d, x, got)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_magnitudes_for_the_operand_scale_are_exact_without_an_fp8_abs(dtype):
    """CUDA has no abs for fp8 (the first H200 run of bmm_fp8: 135 errors in the error model); the operand scale takes
    |x| by clearing the sign bit, which must agree with |x| through float32 on every code, NaN kept NaN."""
    from flashinfer_trace.verdict.errormodel import magnitude

    codes = torch.arange(256, dtype=torch.uint8).view(dtype)
    got, want = magnitude(codes), codes.float().abs()
    assert got.dtype == dtype
    finite = ~want.isnan()
    assert torch.equal(got.float()[finite], want[finite]) and got.float()[~finite].isnan().all()

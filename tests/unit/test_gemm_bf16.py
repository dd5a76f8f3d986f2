"""The `gemm_bf16` family: the definitions state FlashInfer's three bf16 GEMM forms (mm_bf16, tinygemm_bf16, the
router GEMMs), the generator's boundary cases make what docs/boundary/gemm_bf16.md promises, the float64 truth
matches values worked by hand, the FlashInfer adapter calls each API as documented (a fake module: no GPU here) with
the weight in the layout it takes, and skips precisely (release gates, arch gates), and each planted bug passes on
typical operands and is caught by its case."""

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
    flashinfer_bmm,
    flashinfer_gemm_bf16,
    get_ground_truth,
    paths,
)
from flashinfer_trace.inputs import Inputs, edge_cases, generate_inputs
from flashinfer_trace.inputs import gemm_bf16 as gb
from flashinfer_trace.inputs.common import Builder, GeneratorMismatch
from flashinfer_trace.mutants import MUTANTS
from flashinfer_trace.testing import run_reference
from flashinfer_trace.timing import roofline
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import error_models

DEFS = Path(__file__).resolve().parents[2] / "definitions" / "gemm_bf16"
MM, ODD = "gemm_bf16_n4096_k4096", "gemm_bf16_n72_k200"
TINY = "tinygemm_bf16_n128_k2880"
R7168, R6144 = "router_gemm_m16_k7168_n256", "router_gemm_m16_k6144_n256"


def shipped(name: str):
    return load_definition(DEFS / f"{name}.json")


def values(name: str, case: str | None = None, size: str = "small") -> dict:
    return generate_inputs(shipped(name), size, 0, case=case).values


# -- the definitions -----------------------------------------------------------------------------------
def test_definitions_state_the_three_forms():
    assert sorted(p.stem for p in DEFS.glob("*.json")) == sorted([MM, ODD, TINY, R7168, R6144])
    for n, form, api in [(MM, "mm", "mm_bf16"), (ODD, "mm", "mm_bf16"), (TINY, "tinygemm", "tinygemm_bf16"),
                         (R7168, "router", "mm_M1_16_K7168_N256"), (R6144, "router", "mm_M1_16_K6144_N256")]:
        d = shipped(n)
        assert d.op_type == "gemm_bf16" and gb.form_of(d) == form and f"fi_api:flashinfer.gemm.{api}" in d.tags
        assert "coverage:gemm_bf16" in d.tags
        assert all(s.dtype.value == "bfloat16" for s in d.inputs.values())
    assert shipped(MM).const_axes == {"N": 4096, "K": 4096} and list(shipped(MM).inputs["B"].shape) == ["K", "N"]
    assert list(shipped(TINY).inputs["weight"].shape) == ["N", "K"] and "bias" in shipped(TINY).inputs
    assert shipped(R7168).outputs["out"].dtype.value == "float32"
    assert shipped(R6144).const_axes == {"K": 6144, "N": 256}
    assert "model:llama-3.1-8b" in shipped(MM).tags and "model:deepseek-v3" in shipped(R7168).tags


def test_tolerance_error_model_and_roofline():
    tol = tolerance_for(shipped(MM))
    assert (tol.atol, tol.rtol, tol.matched_ratio) == (1e-2, 1e-2, 1.0)
    assert error_models(shipped(TINY)) == ["operand scale: |act| @ |W| (+ |bias|)"]
    d = shipped(ODD)
    x = generate_inputs(d, "small", 0)
    assert roofline.work(d, x).flops == 2 * x.values["A"].shape[0] * 72 * 200
    r = shipped(R7168)
    y = generate_inputs(r, "small", 0)
    assert roofline.work(r, y).flops == 2 * y.values["mat_a"].shape[0] * 256 * 7168


# -- the generator's boundary cases --------------------------------------------------------------------
def test_edge_cases_and_rows():
    assert edge_cases(shipped(MM)) == list(gb.CASES)
    assert edge_cases(shipped(R7168)) == list(gb.ROUTER_CASES)
    with pytest.raises(Exception, match="max_tokens"):
        values(ODD, "max_tokens")
    assert values(ODD, "single_token")["A"].shape == (1, 200)
    assert values(R7168, "single_token")["mat_a"].shape[0] == 1
    assert values(R7168, "max_tokens")["mat_a"].shape[0] == 16
    assert values(R6144, size="large")["mat_a"].shape[0] == 16  # never past the kernels' 16
    assert values(TINY)["weight"].shape == (128, 2880) and values(TINY)["bias"].shape == (128,)


def test_zero_rows_give_zero_rows_or_the_bias():
    v = values(ODD, "zero_rows")
    assert bool((v["A"][0::2] == 0).all()) and bool((v["A"][1::2] != 0).any())
    d = shipped(TINY)
    x = generate_inputs(d, "small", 0, case="zero_rows")
    (out,) = run_reference(d, x)
    assert torch.equal(out[0], x.values["bias"])


def test_long_k_positive_stalls_a_bf16_running_sum():
    v = values(R7168, "long_k_positive")
    a, b = v["mat_a"], v["mat_b"]
    assert bool((a > 0).all()) and bool((b > 0).all())
    true = (a[:1].double() @ b[:, :4].double()).flatten()
    acc = torch.zeros(4, dtype=torch.bfloat16)
    for k in range(a.shape[1]):
        acc = acc + a[0, k] * b[k, :4]
    assert bool((true > 0.4).all()) and bool((acc.double() < true / 4).all())


def test_near_bf16_max_is_finite_in_bf16_and_past_fp16():
    d = shipped(ODD)
    x = generate_inputs(d, "small", 0, case="near_bf16_max")
    (out,) = run_reference(d, x)
    top = float(out.float().abs().max())
    assert 2.0 ** 110 < top < torch.finfo(torch.bfloat16).max and bool(torch.isfinite(out.float()).all())
    scale = x.values["A"].double().abs() @ x.values["B"].double().abs()
    assert float(scale.max()) < torch.finfo(torch.bfloat16).max  # the error model's scale stays finite too


def test_subnormal_activations_are_bf16_subnormals_and_the_outputs_ordinary():
    v = values(ODD, "subnormal")
    a = v["A"].float()
    assert bool((a > 0).all()) and bool((a < 2.0 ** -126).all())
    assert set((a / gb.SUBNORMAL_STEP).round().unique().tolist()) <= set(range(1, 8))
    (out,) = run_reference(shipped(ODD), generate_inputs(shipped(ODD), "small", 0, case="subnormal"))
    assert float(out.float().min()) > 0.5


def test_a_definition_of_no_known_form_is_refused():
    d = shipped(ODD)
    bad = d.model_copy(update={"inputs": {"X": d.inputs["A"], "B": d.inputs["B"]}})
    with pytest.raises(GeneratorMismatch, match="gemm_bf16 needs"):
        gb.generate(Builder(bad, "small", 0, None))
    w = d.inputs["B"].model_copy(update={"shape": ["N", "K"]})
    with pytest.raises(GeneratorMismatch, match=r"B must be \[K, N\]"):
        gb.generate(Builder(d.model_copy(update={"inputs": {**d.inputs, "B": w}}), "small", 0, None))


# -- the float64 truth ---------------------------------------------------------------------------------
def test_truth_reads_each_weight_layout_and_adds_the_bias():
    a = torch.zeros(1, 200, dtype=torch.bfloat16)
    a[0, 0], a[0, 199] = 3.0, -2.0
    b = torch.zeros(200, 72, dtype=torch.bfloat16)
    b[0, 5], b[199, 5], b[199, 71] = 5.0, 7.0, 1.0
    d = shipped(ODD)
    (c,) = get_ground_truth("torch", d, device="cpu")(Inputs(d.name, "small", 0, None, {"A": a, "B": b},
                                                             {"M": 1}, ()))
    assert c.dtype == torch.bfloat16 and float(c[0, 5]) == 1.0 and float(c[0, 71]) == -2.0
    t = shipped(TINY)
    x = torch.zeros(1, 2880, dtype=torch.bfloat16)
    x[0, 1] = 2.0
    w = torch.zeros(128, 2880, dtype=torch.bfloat16)
    w[3, 1] = 4.0
    bias = torch.full((128,), 0.5, dtype=torch.bfloat16)
    (o,) = get_ground_truth("torch", t, device="cpu")(Inputs(t.name, "small", 0, None,
                                                             {"input": x, "weight": w, "bias": bias}, {"M": 1}, ()))
    assert float(o[0, 3]) == 8.5 and float(o[0, 0]) == 0.5


def test_truth_keeps_router_logits_in_float32():
    d = shipped(R6144)
    a = torch.ones(1, 6144, dtype=torch.bfloat16)
    b = torch.full((6144, 256), 2.0 ** -12, dtype=torch.bfloat16)
    b[0, 0] = 1.0 + 2.0 ** -7  # a sum bf16 cannot hold: 1.5 + 2^-7 - 2^-12
    (o,) = get_ground_truth("torch", d, device="cpu")(Inputs(d.name, "small", 0, None, {"mat_a": a, "mat_b": b},
                                                             {"M": 1}, ()))
    assert o.dtype == torch.float32 and float(o[0, 0]) == 6143 * 2.0 ** -12 + 1 + 2.0 ** -7


# -- the FlashInfer adapter (a fake module) ------------------------------------------------------------
def _col(t) -> bool:
    return t.stride(0) == 1


def _fake(monkeypatch, version: str, calls: list | None = None, *, apis=("mm_bf16", "tinygemm_bf16", "routers"),
          cc=(9, 0), cudnn: bool = True):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    gemm = types.ModuleType("flashinfer.gemm")
    calls = [] if calls is None else calls

    def mm_bf16(a, b, bias=None, pdl=False, out=None, out_dtype=torch.bfloat16, backend="cudnn"):
        calls.append(dict(api="mm_bf16", b_col=_col(b), dtype=out_dtype, out=out is not None, backend=backend,
                          bias=bias is not None))
        assert _col(b), "b must be column-major"
        c = a.float() @ b.float() + (0 if bias is None else bias.float())
        if out is None:
            return c.to(out_dtype)
        out.copy_(c)
        return out

    def tinygemm_bf16(input, weight, out, bias=None, use_pdl=False):
        calls.append(dict(api="tinygemm_bf16", contiguous=weight.is_contiguous(), bias=bias is not None))
        assert weight.is_contiguous() and weight.shape[0] == out.shape[1]
        out.copy_(input.float() @ weight.float().T + (0 if bias is None else bias.float()))

    def router(name):
        def fn(mat_a, mat_b, out, launch_with_pdl=True):
            calls.append(dict(api=name, b_col=_col(mat_b) and mat_b.stride(1) == mat_b.shape[0], pdl=launch_with_pdl,
                              out=out.dtype))
            assert 1 <= mat_a.shape[0] <= 16 and out.dtype == torch.float32
            out.copy_(mat_a.float() @ mat_b.float())
        return fn

    if "mm_bf16" in apis:
        gemm.mm_bf16 = mm_bf16
    if "tinygemm_bf16" in apis:
        gemm.tinygemm_bf16 = tinygemm_bf16
    if "routers" in apis:
        gemm.mm_M1_16_K7168_N256 = router("mm_M1_16_K7168_N256")
        gemm.mm_M1_16_K6144_N256 = router("mm_M1_16_K6144_N256")
    module.gemm = gemm
    install_flashinfer(monkeypatch, module, version, cc=cc)
    real = flashinfer_bmm.importlib.util.find_spec
    monkeypatch.setattr(flashinfer_bmm.importlib.util, "find_spec",
                        lambda name, *a: (object() if cudnn else None) if name == "cudnn" else real(name, *a))
    return module


def _on_cpu(d, path=None):
    return dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path=path), device="cpu")


def test_flashinfer_paths():
    assert paths("flashinfer", shipped(MM)) == [None, "out", "graph", "cublaslt", "tinygemm", "cutile", "auto",
                                                "cutlass"]
    assert paths("flashinfer", shipped(ODD)) == [None, "out", "graph", "cublaslt", "cutile", "auto", "cutlass"]
    assert paths("flashinfer", shipped(TINY)) == [None, "graph", "mm-bf16"]
    assert paths("flashinfer", shipped(R7168)) == [None, "pdl", "graph"]


@pytest.mark.parametrize("path, want", [
    (None, dict(backend="cudnn", out=False)), ("out", dict(backend="cudnn", out=True)),
    ("cublaslt", dict(backend="cublaslt", out=False)), ("auto", dict(backend="auto", out=False)),
])
@pytest.mark.parametrize("case", [None, "single_token", "near_bf16_max"])
def test_mm_bf16_is_called_with_b_column_major(monkeypatch, path, want, case):
    calls: list = []
    _fake(monkeypatch, "0.7.2.post1", calls)
    d = shipped(ODD)
    x = generate_inputs(d, "small", 0, case=case)
    got = _on_cpu(d, path)(x)
    assert calls == [dict(api="mm_bf16", b_col=True, dtype=torch.bfloat16, bias=False, **want)]
    assert agrees(d, x, got)


@pytest.mark.parametrize("path, want", [
    (None, dict(api="tinygemm_bf16", contiguous=True, bias=True)),
    ("mm-bf16", dict(api="mm_bf16", b_col=True, dtype=torch.bfloat16, out=False, backend="tinygemm", bias=True)),
])
def test_tinygemm_is_called_with_the_bias(monkeypatch, path, want):
    calls: list = []
    _fake(monkeypatch, "0.7.2.post1", calls)
    d = shipped(TINY)
    x = generate_inputs(d, "small", 0, case="zero_rows")
    got = _on_cpu(d, path)(x)
    assert calls == [want] and agrees(d, x, got)


@pytest.mark.parametrize("name, api", [(R7168, "mm_M1_16_K7168_N256"), (R6144, "mm_M1_16_K6144_N256")])
@pytest.mark.parametrize("path, pdl", [(None, False), ("pdl", True)])
def test_router_gemm_is_called_with_its_own_api_and_float32_out(monkeypatch, name, api, path, pdl):
    calls: list = []
    _fake(monkeypatch, "0.7.2.post1", calls)
    d = shipped(name)
    x = generate_inputs(d, "small", 0, case="max_tokens")
    got = _on_cpu(d, path)(x)
    assert calls == [dict(api=api, b_col=True, pdl=pdl, out=torch.float32)] and agrees(d, x, got)


def test_flashinfer_release_gates(monkeypatch):
    _fake(monkeypatch, "0.6.7")  # cudnn on sm90 from 0.6.8; 0.6.3 - 0.6.7 sm100 / 103 only
    with pytest.raises(GroundTruthUnavailable, match=r"arch-unsupported: .*backend=cudnn\) needs sm100..sm103"):
        get_ground_truth("flashinfer", shipped(MM), device="cuda")
    _fake(monkeypatch, "0.6.8")
    get_ground_truth("flashinfer", shipped(MM), device="cuda")
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*needs >=0.6.11"):
        get_ground_truth("flashinfer", shipped(MM), device="cuda", path="tinygemm")
    _fake(monkeypatch, "0.6.14")  # cublaslt lists 90 from 0.6.15
    with pytest.raises(GroundTruthUnavailable, match=r"arch-unsupported: .*cublaslt\) needs sm100..sm103"):
        get_ground_truth("flashinfer", shipped(MM), device="cuda", path="cublaslt")
    _fake(monkeypatch, "0.6.15")
    get_ground_truth("flashinfer", shipped(MM), device="cuda", path="cublaslt")
    _fake(monkeypatch, "0.6.4", apis=("mm_bf16",))
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*needs >=0.6.5"):
        get_ground_truth("flashinfer", shipped(TINY), device="cuda")
    _fake(monkeypatch, "0.6.18")  # the router GEMMs list 90 from 0.7.0
    with pytest.raises(GroundTruthUnavailable, match=r"arch-unsupported: .*mm_M1_16_K7168_N256 needs sm100..sm103"):
        get_ground_truth("flashinfer", shipped(R7168), device="cuda")
    _fake(monkeypatch, "0.7.0")
    get_ground_truth("flashinfer", shipped(R6144), device="cuda")
    _fake(monkeypatch, "0.6.11", apis=("mm_bf16", "tinygemm_bf16"), cc=(10, 0))  # no K6144 router before 0.6.12
    with pytest.raises(GroundTruthUnavailable, match="api-missing"):
        get_ground_truth("flashinfer", shipped(R6144), device="cuda")


def test_flashinfer_arch_gates_and_what_the_apis_refuse(monkeypatch):
    _fake(monkeypatch, "0.7.2.post1")
    with pytest.raises(GroundTruthUnavailable, match=r"arch-unsupported: .*cutlass\) needs sm100..sm107"):
        get_ground_truth("flashinfer", shipped(MM), device="cuda", path="cutlass")
    with pytest.raises(GroundTruthUnavailable, match="no multiple of 16"):
        get_ground_truth("flashinfer", shipped(ODD), device="cuda", path="tinygemm")
    _fake(monkeypatch, "0.7.2.post1", cc=(8, 0))
    get_ground_truth("flashinfer", shipped(MM), device="cuda")  # cudnn and cublaslt run on sm80
    with pytest.raises(GroundTruthUnavailable, match="arch-unsupported"):
        get_ground_truth("flashinfer", shipped(TINY), device="cuda")
    with pytest.raises(GroundTruthUnavailable, match="arch-unsupported"):
        get_ground_truth("flashinfer", shipped(R7168), device="cuda")
    _fake(monkeypatch, "0.7.2.post1", cudnn=False)
    [current] = [a for a in flashinfer_gemm_bf16.ADAPTERS if a.path == "" and str(a.versions) == ">=0.6.8"]
    with pytest.raises(GroundTruthUnavailable, match="not-installed: cudnn"):
        base.availability(current, shipped(MM), "cuda")
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        _on_cpu(shipped(R7168), "graph")(generate_inputs(shipped(R7168), "small", 0))


# -- planted bugs --------------------------------------------------------------------------------------
BOUNDARY_MUTANTS = {  # mutant -> the case that catches it (typical operands pass)
    f"{R7168}:bf16-accumulator": "long_k_positive",
    f"{ODD}:fp16-epilogue": "near_bf16_max",
    f"{ODD}:subnormals-flushed": "subnormal",
    f"{ODD}:token-axis-squeezed": "single_token",
    f"{R7168}:rows-past-8-dropped": "max_tokens",
    f"{ODD}:row-amax-scaling": "zero_rows",
}
FAMILY = [m for m in MUTANTS if m.definition.startswith(("gemm_bf16_", "tinygemm_bf16_", "router_gemm_"))]


def test_every_boundary_class_has_a_mutant():
    assert_boundary_classes(FAMILY, BOUNDARY_MUTANTS, {"boundary-magnitude", "boundary-structure"})
    assert set(BOUNDARY_MUTANTS.values()) == set(gb.ROUTER_CASES)


@pytest.mark.parametrize("name", sorted(BOUNDARY_MUTANTS))
def test_a_boundary_bug_passes_typical_operands_and_is_caught_by_its_case(name):
    assert_boundary_bug(mutant_named(FAMILY, name), [BOUNDARY_MUTANTS[name]])


@pytest.mark.parametrize("mutant", [m.name for m in FAMILY])
def test_planted_gemm_bf16_bugs_are_caught(mutant):
    assert_killed(mutant_named(FAMILY, mutant))

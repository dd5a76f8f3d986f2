"""The `gemm_fp8` family (block-scaled fp8 GEMM, FlashInfer's fp8_blockscale_gemm_sm90): the definitions state
DeepSeek-V3's shapes and block scales, the generator's boundary cases make the operands docs/boundary/gemm_fp8.md
promises, the float64 truth matches values worked by hand, the FlashInfer adapter calls the API as documented (a
fake module: no GPU here) with the kernel's M-major input-scale layout, and skips precisely (release gate, sm90 only,
contract), and each planted bug passes on typical operands and is caught by its case."""

from __future__ import annotations

import dataclasses
import os
import types
from pathlib import Path

import pytest
import torch
from fakes import install_flashinfer
from planted import agrees, assert_caught_by_its_case, assert_family_cases, passes

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.groundtruth import GroundTruthUnavailable, base, get_ground_truth, paths
from flashinfer_trace.groundtruth import flashinfer_gemm_fp8 as fgemm
from flashinfer_trace.groundtruth import torch_gemm_fp8 as tgemm
from flashinfer_trace.inputs import Inputs, edge_cases, generate_inputs
from flashinfer_trace.inputs import gemm_fp8 as gen
from flashinfer_trace.inputs.common import Builder, GeneratorMismatch
from flashinfer_trace.mutants import MUTANTS, kill, mutate
from flashinfer_trace.testing import run_reference
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import error_models

DEFS = Path(__file__).resolve().parents[2] / "definitions" / "gemm_fp8"
QA, QB, OPROJ, ODD = (f"fp8_blockscale_gemm_sm90_{s}"
                      for s in ("n2112_k7168", "n3072_k1536", "n7168_k2048", "n320_k384"))
E4M3 = torch.float8_e4m3fn


def shipped(name: str):
    return load_definition(DEFS / f"{name}.json")


def values(name: str, case: str | None = None, size: str = "small") -> dict:
    return generate_inputs(shipped(name), size, 0, case=case).values


# -- the definitions -------------------------------------------------------------------------------------------
def test_definitions_state_deepseek_shapes_and_block_scales():
    assert sorted(p.stem for p in DEFS.glob("*.json")) == sorted([QA, QB, OPROJ, ODD])
    for name, (n, k) in {QA: (2112, 7168), QB: (3072, 1536), OPROJ: (7168, 2048), ODD: (320, 384)}.items():
        d = shipped(name)
        assert d.op_type == "gemm_fp8" and list(d.inputs) == list(gen.INPUTS) and list(d.outputs) == ["out"]
        assert d.const_axes == {"N": n, "K": k, "K_div_128": k // 128, "N_div_128": -(-n // 128)}
        assert d.inputs["input"].dtype.value == d.inputs["weight"].dtype.value == "float8_e4m3fn"
        assert d.outputs["out"].dtype.value == "bfloat16" and k % 128 == 0 and n % 64 == 0
        assert "fi_api:flashinfer.gemm.fp8_blockscale_gemm_sm90" in d.tags and "coverage:gemm_fp8" in d.tags
        assert ("model:deepseek-v3" in d.tags) == (name != ODD)
    assert 2112 % 128 and 320 % 128  # a last weight-scale block of 64 rows


def test_tolerance_and_error_model():
    tol = tolerance_for(shipped(QB))
    assert (tol.atol, tol.rtol, tol.matched_ratio) == (1e-2, 1e-2, 1.0)
    assert error_models(shipped(QB)) == ["operand scale: (|input| input_scale) @ (|weight| weight_scale)^T, per block"]


# -- the generator's boundary cases --------------------------------------------------------------------------
def test_edge_cases_and_typical_operands():
    assert edge_cases(shipped(QA)) == list(gen.CASES)
    v = values(ODD, size="medium")
    assert v["input"].shape == (32, 384) and v["weight"].shape == (320, 384) and v["input"].dtype == E4M3
    assert v["input_scale"].shape == (32, 3) and v["weight_scale"].shape == (3, 3)
    s = torch.cat([v["input_scale"].flatten(), v["weight_scale"].flatten()])
    assert bool((s >= 2 ** -8).all() and (s <= 2 ** -2).all()) and len(set(s.tolist())) == s.numel()
    assert float(v["input"].float().abs().max()) < 100
    with pytest.raises(Exception, match="unknown edge case"):
        values(ODD, "k_tail")


def test_magnitude_cases():
    assert values(ODD, "single_token")["input"].shape == (1, 384)
    sat = values(ODD, "saturated")
    assert bool((sat["input"][::2].float().abs() == 448).all() and (sat["weight"][::2].float().abs() == 448).all())
    sub = values(ODD, "subnormal")
    a = sub["input"].float().abs()
    assert bool(((a > 0) & (a < 2 ** -6)).all()) and bool((sub["input_scale"] == 2 ** 9).all())
    assert set((a * 2 ** 9).unique().tolist()) <= set(range(1, 8))
    over = values(ODD, "scale_overflow")
    assert bool((over["input_scale"] == 2.0 ** 120).all() and (over["weight_scale"] == 2.0 ** -118).all())
    assert not torch.isfinite(torch.tensor(448.0) * 2.0 ** 120)  # dequantising first overflows float32
    tiny = values(ODD, "tiny_scales")
    assert bool((tiny["input_scale"] == 2.0 ** -100).all() and (tiny["weight_scale"] == 2.0 ** 90).all())
    assert float(torch.tensor(8 * 2.0 ** -100).to(torch.float16)) == 0


def test_zero_block_case():
    z = values(ODD, "zero_block")
    a, sa, w, sw = z["input"].float(), z["input_scale"], z["weight"].float(), z["weight_scale"]
    assert bool((a[::2, 128:256] == 0).all() and (sa[::2, 1] == 0).all()) and bool((sa[1::2, 1] > 0).all())
    assert bool((w[:128, 256:].abs() == 448).all()) and float(sw[0, 2]) == 0 and int((sw == 0).sum()) == 1


def test_a_definition_the_generator_cannot_fill_is_refused():
    d = shipped(ODD)
    bad = d.model_copy(update={"inputs": {k: v for k, v in d.inputs.items() if k != "weight_scale"}})
    with pytest.raises(GeneratorMismatch, match="missing weight_scale"):
        gen.generate(Builder(bad, "small", 0, None))
    odd_k = d.model_copy(update={"axes": {**d.axes, "K": d.axes["K"].model_copy(update={"value": 200})}})
    with pytest.raises(GeneratorMismatch, match="multiple of 128"):
        gen.generate(Builder(odd_k, "small", 0, None))


# -- the float64 truth ---------------------------------------------------------------------------------------
def _inputs(name: str, a, w, sa, sw) -> Inputs:
    d = shipped(name)
    return Inputs(d.name, "small", 0, None, {"input": a.to(E4M3), "weight": w.to(E4M3), "input_scale": sa,
                                             "weight_scale": sw}, {"M": a.shape[0]}, ())


def test_truth_scales_each_block_by_its_token_and_weight_block():
    a = torch.zeros(2, 384)
    w = torch.zeros(320, 384)
    a[0, 0], a[0, 130], a[1, 300] = 1.0, 2.0, 448.0
    w[5, 0], w[5, 130], w[300, 300] = 3.0, 1.0, 0.5
    sa = torch.tensor([[0.5, 4.0, 1.0], [1.0, 1.0, 2.0 ** 120]])
    sw = torch.tensor([[2.0, 0.25, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 2.0 ** -118]])  # row 300: the 64-row last block
    (out,) = get_ground_truth("torch", shipped(ODD), device="cpu")(_inputs(ODD, a, w, sa, sw))
    assert out.dtype == torch.bfloat16 and out.shape == (2, 320)
    assert float(out[0, 5]) == 1 * 0.5 * 3 * 2 + 2 * 4 * 1 * 0.25 and float(out[1, 300]) == 448 * 0.5 * 4
    assert float(out.float().abs().sum()) == float(out[0, 5]) + float(out[1, 300])


def test_truth_reads_per_token_weight_scales_too():
    a, w = torch.ones(1, 384), torch.ones(320, 384)
    sw = torch.arange(1, 321, dtype=torch.float32)[:, None].expand(320, 3).contiguous()
    x = _inputs(ODD, a, w, torch.ones(1, 3), sw)
    a64, w64 = tgemm.dequantize(x.values)
    assert bool((w64[:, 0] == torch.arange(1, 321)).all()) and bool((a64 == 1).all())


# -- the FlashInfer adapter (a fake module) ------------------------------------------------------------------
def _fake(monkeypatch, version: str, calls: list | None = None, *, with_api: bool = True, cc=(9, 0)):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    module.gemm = types.ModuleType("flashinfer.gemm")
    calls = [] if calls is None else calls

    def api(input, weight, input_scale=None, weight_scale=None, out=None, out_dtype=None):
        """What the kernel reads: input_scale as an M-major [K/128, M] view, weight_scale per block or per token."""
        m, k = input.shape
        n = weight.shape[0]
        calls.append(dict(sa_shape=tuple(input_scale.shape), sa_stride=input_scale.stride(),
                          sw_shape=tuple(weight_scale.shape), out=out is not None,
                          dg=os.environ.get(fgemm.DG_ENV)))
        per_tok = weight_scale.shape[0] == n
        vals = {"input": input, "weight": weight, "input_scale": input_scale.t(), "weight_scale": weight_scale}
        assert per_tok or weight_scale.shape == (-(-n // 128), k // 128)
        a64, w64 = tgemm.dequantize(vals)
        res = (a64 @ w64.T).to(torch.bfloat16)
        if out is None:
            return res
        out.copy_(res)
        return out

    if with_api:
        module.gemm.fp8_blockscale_gemm_sm90 = api
    install_flashinfer(monkeypatch, module, version, cc=cc)
    return calls


def _on_cpu(d, path=None):
    return dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path=path), device="cpu")


def test_flashinfer_paths():
    assert paths("flashinfer", shipped(QB)) == [None, "out", "graph", "per-token-weight-scale", "legacy-kernel"]


@pytest.mark.parametrize("path", [None, "out", "per-token-weight-scale", "legacy-kernel"])
@pytest.mark.parametrize("case", [None, "single_token", "zero_block"])
def test_flashinfer_calls_the_api_as_documented(monkeypatch, path, case):
    calls = _fake(monkeypatch, "0.7.2.post1")
    d = shipped(ODD)
    x = generate_inputs(d, "small", 0, case=case)
    before = {k: v.clone() for k, v in x.values.items()}
    got = _on_cpu(d, path)(x)
    [c] = calls
    m = x.values["input"].shape[0]
    assert c["sa_shape"] == (3, m) and c["sa_stride"] == (-(-m // 4) * 4, 1)  # M-major, M padded to 4
    assert c["sw_shape"] == ((320, 3) if path == "per-token-weight-scale" else (3, 3))
    assert c["out"] == (path == "out") and c["dg"] == ("0" if path == "legacy-kernel" else None)
    assert fgemm.DG_ENV not in os.environ
    assert agrees(d, x, got)
    assert all(torch.equal(before[k].float(), v.float()) for k, v in x.values.items())


def test_flashinfer_release_and_arch_gates(monkeypatch):
    _fake(monkeypatch, "0.5.3")
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*needs >=0.6.0"):
        get_ground_truth("flashinfer", shipped(QB), device="cuda")
    _fake(monkeypatch, "0.6.0", with_api=False)
    with pytest.raises(GroundTruthUnavailable, match="api-missing: .*gemm.fp8_blockscale_gemm_sm90"):
        get_ground_truth("flashinfer", shipped(QB), device="cuda")
    for cc in ((10, 0), (8, 9), (12, 0)):
        _fake(monkeypatch, "0.7.2.post1", cc=cc)
        with pytest.raises(GroundTruthUnavailable, match="arch-unsupported"):
            get_ground_truth("flashinfer", shipped(QB), device="cuda")
    _fake(monkeypatch, "0.6.0")
    get_ground_truth("flashinfer", shipped(QB), device="cuda", path="legacy-kernel")


def test_flashinfer_refuses_what_the_api_does_not_take(monkeypatch):
    _fake(monkeypatch, "0.7.2.post1")
    d = shipped(ODD)
    dt = type(d.outputs["out"].dtype)
    fp16 = d.model_copy(update={"outputs": {"out": d.outputs["out"].model_copy(update={"dtype": dt("float16")})}})
    assert "bfloat16" in fgemm.applies(fp16)
    odd_k = d.model_copy(update={"axes": {**d.axes, "K": d.axes["K"].model_copy(update={"value": 200})}})
    assert "multiple of 128" in fgemm.applies(odd_k)
    odd_n = d.model_copy(update={"axes": {**d.axes, "N": d.axes["N"].model_copy(update={"value": 96})}})
    assert "multiple of 64" in fgemm.applies(odd_n)
    bf16 = d.model_copy(update={"inputs": {**d.inputs, "input": d.inputs["input"].model_copy(
        update={"dtype": dt("bfloat16")})}})
    assert "float8_e4m3fn only" in fgemm.applies(bf16) and fgemm.applies(d) is None


def test_flashinfer_not_installed_or_no_gpu(monkeypatch):
    monkeypatch.setattr(base, "installed_version", lambda package: None)
    with pytest.raises(GroundTruthUnavailable, match="not-installed: flashinfer"):
        get_ground_truth("flashinfer", shipped(QB), device="cuda")
    _fake(monkeypatch, "0.7.2.post1")
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        get_ground_truth("flashinfer", shipped(QB), device="cpu")
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        _on_cpu(shipped(ODD), "graph")(generate_inputs(shipped(ODD), "small", 0))


def test_the_reference_runs_every_case_of_the_odd_shape():
    d = shipped(ODD)
    for case in [None, *gen.CASES]:
        x = generate_inputs(d, "small", 0, case=case)
        assert agrees(d, x, run_reference(d, x)), case


# -- planted bugs ----------------------------------------------------------------------------------------------
BOUNDARY = {
    "fnuz-limit": "saturated",
    "subnormals-flushed": "subnormal",
    "dequantize-operands": "scale_overflow",
    "half-dequantized-activations": "tiny_scales",
    "zero-scale-as-one": "zero_block",
    "token-axis-squeezed": "single_token",
}
WRONG_MATH = ("block-scale-read-per-token", "n-tail-scale-proportional", "input-scale-layout",
              "first-block-scale-only")
FAMILY = [m for m in MUTANTS if m.definition.startswith("fp8_blockscale_gemm_sm90_")]
VALUES_BUGS = [m for m in FAMILY if m.cls != "mutates-inputs"]


def test_every_family_mutant_has_its_case():
    assert_family_cases(VALUES_BUGS, BOUNDARY, WRONG_MATH)
    assert set(BOUNDARY.values()) == set(gen.CASES)
    assert [m.id for m in FAMILY if m.cls == "mutates-inputs"] == ["writes-scale"]


@pytest.mark.parametrize("mutant", VALUES_BUGS, ids=lambda m: m.id)
def test_a_planted_bug_is_caught_by_its_case(mutant):
    assert_caught_by_its_case(mutant, BOUNDARY)


def test_the_n_tail_bug_needs_a_partial_scale_block():
    [m] = [m for m in FAMILY if m.id == "n-tail-scale-proportional"]
    assert passes(mutate(shipped(QB), dataclasses.replace(m, definition=QB)), None)  # 3072 = 24 x 128


def test_a_reference_writing_its_scale_is_caught():
    [m] = [m for m in FAMILY if m.id == "writes-scale"]
    k = kill(m, "torch", sizes=("small",), seeds=(0,))
    assert k.killed is True, k.how

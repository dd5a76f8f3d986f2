"""The `layernorm` family: the generator's boundary cases make the rows docs/boundary/layernorm.md promises, the
float64 truth matches values worked by hand, the FlashInfer adapter calls the API as documented (a fake module:
no GPU here) and skips precisely (release gate, dtypes, no FlashInfer), and each planted bug passes on typical
rows and is caught by its case."""

from __future__ import annotations

import dataclasses
import json
import math
import types
from pathlib import Path

import pytest
import torch
from fakes import install_flashinfer
from planted import agrees, assert_boundary_bug, assert_boundary_classes, assert_killed, mutant_named, passes

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.definition import Definition
from flashinfer_trace.dtypes import DType
from flashinfer_trace.groundtruth import GroundTruthUnavailable, base, get_ground_truth, paths
from flashinfer_trace.inputs import Inputs, edge_cases, generate_inputs
from flashinfer_trace.inputs import layernorm as ln_inputs
from flashinfer_trace.inputs.common import Builder, GeneratorMismatch
from flashinfer_trace.mutants import MUTANTS, mutate
from flashinfer_trace.testing import run_reference

DEFS = Path(__file__).resolve().parents[2] / "definitions" / "layernorm"
H128, H129, H768 = "layernorm_h128", "layernorm_h129", "layernorm_h768"
F32_MAX = torch.finfo(torch.float32).max


def shipped(name: str):
    return load_definition(DEFS / f"{name}.json")


def values(name: str, case: str | None = None, size: str = "small") -> dict:
    return generate_inputs(shipped(name), size, 0, case=case).values


# -- the definitions -----------------------------------------------------------------------------------
def test_definitions_take_the_api_s_dtypes_and_a_scalar_eps():
    names = sorted(p.stem for p in DEFS.glob("*.json"))
    assert names == ["layernorm_h128", "layernorm_h129", "layernorm_h2560", "layernorm_h4544", "layernorm_h768"]
    for n in names:
        d = shipped(n)
        assert d.op_type == "layernorm" and list(d.inputs) == ["hidden_states", "weight", "bias", "eps"]
        assert d.inputs["hidden_states"].dtype.value == "bfloat16" and d.outputs["output"].dtype.value == "bfloat16"
        assert d.inputs["weight"].dtype.value == d.inputs["bias"].dtype.value == "float32"
        assert d.inputs["eps"].shape is None
        assert "fi_api:flashinfer.norm.layernorm" in d.tags and "coverage:layernorm" in d.tags


# -- the generator's boundary cases --------------------------------------------------------------------
def test_edge_cases():
    assert edge_cases(shipped(H128)) == ["single_token", "constant_rows", "large_mean", "near_max", "eps_min",
                                         "eps_max"]
    assert values(H128, "single_token")["hidden_states"].shape == (1, 128)


def test_typical_rows_weight_bias_and_eps():
    x = values(H768, size="medium")
    h = x["hidden_states"].float()
    assert h.shape == (64, 768) and 0.8 < float(h.std()) < 1.2 and float(h.mean(dim=-1).abs().max()) < 0.3
    assert 0.15 < float((x["weight"] - 1).std()) < 0.35 and 0.15 < float(x["bias"].std()) < 0.35
    assert isinstance(x["eps"], float) and 1e-6 <= x["eps"] <= 1e-5


def test_constant_rows_have_variance_zero_and_the_reference_returns_the_bias():
    d = shipped(H768)
    x = generate_inputs(d, "medium", 0, case="constant_rows")
    h = x.values["hidden_states"]
    even = h[0::2]
    assert bool((even == even[:, :1]).all()) and bool((h[0] == 0).all()) and bool((even[1:, 0] != 0).all())
    assert bool((h[1::2].float().var(dim=-1) > 0.5).all())  # odd rows are typical
    (out,) = run_reference(d, x)
    assert torch.equal(out[0::2], x.values["bias"].to(torch.bfloat16).expand_as(out[0::2]))


def test_large_mean_rows_deviate_by_one_ulp_at_1_h64_h8_h2_columns():
    rows = values(H768, "large_mean")["hidden_states"].double()
    m = rows.median(dim=-1, keepdim=True).values
    assert bool((m.abs() >= 2 ** 6).all()) and bool((m.abs() <= 2 ** 14).all())
    step = ln_inputs.ulp(m, torch.bfloat16)
    dev = (rows - m) / step
    assert bool((dev.abs() <= 1).all())  # one ulp of M, above or below, and no more
    assert [int((dev != 0).sum(dim=-1)[r]) for r in range(4)] == [1, 768 // 64, 768 // 8, 768 // 2]
    var_share = rows.var(dim=-1, unbiased=False) / (m[:, 0] ** 2)
    assert float(var_share[0]) < 2.0 ** -24  # below float32's rounding of M^2: E[x^2] - E[x]^2 is noise


def test_near_max_keeps_float32_sums_finite_but_not_squares():
    d = shipped(H128)
    x = generate_inputs(d, "medium", 0, case="near_max")
    h = x.values["hidden_states"].double()
    limit = ln_inputs.float32_square_limit(128)
    spread, const = h[1::2], h[0::2]
    assert float(spread.abs().max()) <= limit and float(spread.abs().max()) > 0.5 * limit
    assert bool((const == const[:, :1]).all())
    assert bool((const.abs() >= 2.0 ** 66).all()) and bool((const.abs() * 128 <= F32_MAX / 4).all())
    assert bool(torch.isinf(const.float() ** 2).all())  # a kernel that squares x overflows here
    (out,) = run_reference(d, x)
    assert bool(out.float().isfinite().all())
    assert torch.equal(out[0::2], x.values["bias"].to(torch.bfloat16).expand_as(out[0::2]))


def test_eps_cases_pin_eps_with_tiny_activations():
    lo, hi = values(H128, "eps_min"), values(H128, "eps_max")
    assert lo["eps"] == pytest.approx(1e-6) and hi["eps"] == pytest.approx(1e-5)
    assert 5e-7 < float(lo["hidden_states"].float().var(dim=-1).mean()) < 2e-6  # the order of eps


def test_inputs_named_as_the_api_names_them_are_taken_and_a_missing_one_refused():
    data = json.loads((DEFS / f"{H128}.json").read_text())
    renames = {"hidden_states": "input", "weight": "gemma", "bias": "beta"}
    data["inputs"] = {renames.get(k, k): v for k, v in data["inputs"].items()}
    for old, new in renames.items():
        data["reference"] = data["reference"].replace(old, new)
    api = Definition.model_validate(data)
    x = generate_inputs(api, "small", 0, case="constant_rows")
    assert set(x.values) == {"input", "gemma", "beta", "eps"} and x.values["gemma"].dtype == torch.float32
    assert get_ground_truth("torch", api, device="cpu")(x)[0].shape == (4, 128)
    d = shipped(H128)
    no_bias = d.model_copy(update={"inputs": {k: v for k, v in d.inputs.items() if k != "bias"}})
    with pytest.raises(GeneratorMismatch, match="one bias"):
        ln_inputs.generate(Builder(no_bias, "small", 0, None))


# -- the float64 truth, against values worked by hand --------------------------------------------------
def _inputs(name: str, h: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> Inputs:
    return Inputs(name, "small", 0, None, {"hidden_states": h, "weight": w, "bias": b, "eps": eps})


def test_truth_normalises_to_mean_0_variance_1_then_scales_and_shifts():
    d = shipped(H128)
    row = torch.tensor([1.0, 3.0] * 64)  # mean 2, population variance 1
    w, b = torch.full((128,), 2.0), torch.full((128,), 0.5)
    (out,) = get_ground_truth("torch", d, device="cpu")(_inputs(H128, row[None].to(torch.bfloat16), w, b, 0.0))
    assert torch.equal(out[0], (torch.tensor([-1.0, 1.0] * 64) * 2 + 0.5).to(torch.bfloat16))
    (eps_out,) = get_ground_truth("torch", d, device="cpu")(_inputs(H128, row[None].to(torch.bfloat16), w, b, 3.0))
    assert torch.allclose(eps_out[0].float(), torch.tensor([-1.0, 1.0] * 64) + 0.5, atol=1e-2)  # rsqrt(1 + 3) = 1/2


def test_truth_of_a_constant_row_is_the_bias_and_of_a_huge_one_too():
    d = shipped(H128)
    b = torch.linspace(-1, 1, 128)
    for value in (0.0, 7.0, 2.0 ** 100):
        h = torch.full((1, 128), value).to(torch.bfloat16)
        (out,) = get_ground_truth("torch", d, device="cpu")(_inputs(H128, h, torch.ones(128), b, 1e-6))
        assert torch.equal(out[0], b.to(torch.bfloat16)), value


def test_truth_reads_eps_from_the_call_not_the_reference():
    d = shipped(H128)
    bad = d.model_copy(update={"reference": d.reference.replace("torch.rsqrt(var + eps)", "torch.rsqrt(var + 0.5)")})
    x = generate_inputs(d, "small", 0, case="eps_min")
    assert torch.equal(get_ground_truth("torch", bad, device="cpu")(x)[0],
                       get_ground_truth("torch", d, device="cpu")(x)[0])


# -- the FlashInfer adapter (a fake module) ------------------------------------------------------------
def _fake(monkeypatch, version: str, calls: list | None = None, *, with_layernorm: bool = True):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    norm = types.SimpleNamespace()
    if with_layernorm:
        def layernorm(input, gemma, beta, eps=1e-6):  # FlashInfer's math: float32, two passes
            if calls is not None:
                calls.append((input.dtype, gemma.dtype, beta.dtype, eps))
            if input.dtype != torch.bfloat16 or input.dim() != 2:
                raise RuntimeError("input must be bfloat16")
            x = input.float()
            c = x - x.mean(dim=-1, keepdim=True)
            y = c * torch.rsqrt(c.pow(2).mean(dim=-1, keepdim=True) + eps) * gemma + beta
            return y.to(input.dtype)
        norm.layernorm = layernorm
    module.norm = norm
    install_flashinfer(monkeypatch, module, version)
    return module


def test_flashinfer_paths():
    assert paths("flashinfer", shipped(H128)) == [None, "graph"]
    assert paths("sglang", shipped(H128)) == [None]


@pytest.mark.parametrize("case", [None, "constant_rows", "large_mean", "near_max", "eps_min"])
def test_flashinfer_calls_layernorm_positionally_with_the_call_s_eps(monkeypatch, case):
    calls: list = []
    _fake(monkeypatch, "0.6.6", calls)
    d = shipped(H129)
    x = generate_inputs(d, "small", 0, case=case)
    before = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in x.values.items()}
    gt = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda"), device="cpu")
    got = gt(x)
    assert calls == [(torch.bfloat16, torch.float32, torch.float32, x.values["eps"])]
    assert agrees(d, x, got)
    assert all(torch.equal(before[k], v) if isinstance(v, torch.Tensor) else before[k] == v
               for k, v in x.values.items())


def test_flashinfer_before_0_5_is_api_missing(monkeypatch):
    _fake(monkeypatch, "0.4.1")
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: flashinfer 0.4.1 has no flashinfer.norm.layernorm "
                                                     r"\(needs >=0.5\)"):
        get_ground_truth("flashinfer", shipped(H128), device="cuda")
    _fake(monkeypatch, "0.5.3", with_layernorm=False)
    with pytest.raises(GroundTruthUnavailable, match="api-missing: flashinfer 0.5.3 has no norm.layernorm"):
        get_ground_truth("flashinfer", shipped(H128), device="cuda")


def test_flashinfer_takes_bf16_input_and_float32_gemma_beta_only(monkeypatch):
    _fake(monkeypatch, "0.6.6")
    d = shipped(H128)
    fp16 = d.model_copy(update={"inputs": {**d.inputs, "hidden_states": d.inputs["hidden_states"].model_copy(
        update={"dtype": DType.float16})}})
    with pytest.raises(GroundTruthUnavailable, match="unsupported: flashinfer.norm.layernorm: input in bfloat16 only"):
        get_ground_truth("flashinfer", fp16, device="cuda")
    bf16_w = d.model_copy(update={"inputs": {**d.inputs, "weight": d.inputs["hidden_states"].model_copy(
        update={"shape": ["hidden_size"]})}})
    with pytest.raises(GroundTruthUnavailable, match="gemma and beta in float32 only"):
        get_ground_truth("flashinfer", bf16_w, device="cuda")


def test_flashinfer_not_installed_or_no_gpu(monkeypatch):
    monkeypatch.setattr(base, "installed_version", lambda package: None)
    with pytest.raises(GroundTruthUnavailable, match="not-installed: flashinfer"):
        get_ground_truth("flashinfer", shipped(H128), device="cuda")
    _fake(monkeypatch, "0.6.6")
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        get_ground_truth("flashinfer", shipped(H128), device="cpu")


def test_flashinfer_graph_mode_needs_a_gpu(monkeypatch):
    _fake(monkeypatch, "0.6.6")
    d = shipped(H128)
    gt = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path="graph"), device="cpu")
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        gt(generate_inputs(d, "small", 0))


# -- planted bugs --------------------------------------------------------------------------------------
BOUNDARY_MUTANTS = {  # mutant -> the case that catches it (typical rows pass)
    f"{H768}:diff-of-squares": "large_mean",
    f"{H128}:mean-in-input-dtype": "large_mean",
    f"{H128}:no-eps": "constant_rows",
    f"{H128}:eps-outside-sqrt": "eps_min",
    f"{H129}:padded-lanes-in-variance": "large_mean",
    f"{H128}:rescale-no-zero-guard": "constant_rows",
}
ALSO = {f"{H768}:diff-of-squares": "near_max"}  # a second case that catches it on its own
FAMILY = [m for m in MUTANTS if m.definition.startswith("layernorm_")]


def test_every_boundary_class_has_a_mutant():
    assert_boundary_classes(FAMILY, BOUNDARY_MUTANTS, {"boundary-magnitude", "boundary-structure"})


@pytest.mark.parametrize("name", sorted(BOUNDARY_MUTANTS))
def test_a_boundary_bug_passes_typical_rows_and_is_caught_by_its_case(name):
    cases = [BOUNDARY_MUTANTS[name], ALSO[name]] if name in ALSO else [BOUNDARY_MUTANTS[name]]
    assert_boundary_bug(mutant_named(FAMILY, name), cases, sizes=("small", "medium"), crash_fails=False)


def test_diff_of_squares_survives_at_h128_where_float32_keeps_the_terms_exact():
    """At H <= 256 the sums of bf16 squares are exact in float32 (docs/boundary/layernorm.md): the cancellation
    bug is planted on h768, where it is not."""
    [m] = [m for m in FAMILY if m.id == "diff-of-squares"]
    narrow = mutate(shipped(H128), m)
    assert passes(narrow, "large_mean")
    assert not passes(narrow, "near_max", crash_fails=False)  # the overflow of x^2 catches it at any width


@pytest.mark.parametrize("mutant", [m.name for m in FAMILY])
def test_planted_layernorm_bugs_are_caught(mutant):
    assert_killed(mutant_named(FAMILY, mutant))


def test_every_constant_row_output_is_exactly_the_bias_at_every_width():
    for name in (H128, H129, H768):
        d = shipped(name)
        x = generate_inputs(d, "small", 0, case="constant_rows")
        (out,) = run_reference(d, x)
        assert torch.equal(out[0::2], x.values["bias"].to(torch.bfloat16).expand_as(out[0::2])), name
        assert not math.isnan(float(out.float().sum()))

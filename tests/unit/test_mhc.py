"""The `mhc_post` family: the generator's boundary cases make the tokens docs/boundary/mhc_post.md promises, the
float64 truth matches values worked by hand, the FlashInfer adapter calls the API as documented in every call mode
(a fake module: no GPU here) and skips precisely (release gate, dtypes, arch, no FlashInfer), and each planted bug
passes on typical tokens and is caught by its case."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import pytest
import torch
from fakes import install_flashinfer
from planted import agrees, assert_boundary_bug, assert_boundary_classes, assert_killed, mutant_named, passes

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.dtypes import DType
from flashinfer_trace.groundtruth import GroundTruthUnavailable, base, flashinfer_mhc, get_ground_truth, paths
from flashinfer_trace.inputs import Inputs, edge_cases, generate_inputs
from flashinfer_trace.inputs import mhc as mhc_inputs
from flashinfer_trace.inputs.common import Builder, GeneratorMismatch
from flashinfer_trace.mutants import MUTANTS, mutate
from flashinfer_trace.testing import run_reference
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import error_models

DEFS = Path(__file__).resolve().parents[2] / "definitions" / "mhc_post"
H4096, H7168, H127, H16392 = "mhc_post_hc4_h4096", "mhc_post_hc4_h7168", "mhc_post_hc4_h127", "mhc_post_hc4_h16392"


def shipped(name: str):
    return load_definition(DEFS / f"{name}.json")


def values(name: str, case: str | None = None, size: str = "small") -> dict:
    return generate_inputs(shipped(name), size, 0, case=case).values


# -- the definitions -----------------------------------------------------------------------------------
def test_definitions_take_the_api_s_names_dtypes_and_hc_4():
    names = sorted(p.stem for p in DEFS.glob("*.json"))
    assert names == sorted([H127, H16392, H4096, H7168])
    for n in names:
        d = shipped(n)
        assert d.op_type == "mhc_post" and list(d.inputs) == ["x", "residual", "post_layer_mix", "comb_res_mix"]
        assert d.inputs["x"].dtype.value == d.inputs["residual"].dtype.value == "bfloat16"
        assert d.inputs["post_layer_mix"].dtype.value == d.inputs["comb_res_mix"].dtype.value == "float32"
        assert d.outputs["out"].dtype.value == "bfloat16" and d.const_axes["hc"] == 4
        assert "fi_api:flashinfer.mhc.mhc_post" in d.tags and "coverage:mhc_post" in d.tags
    assert "model:deepseek-v4-flash" in shipped(H4096).tags and "model:deepseek-v4-pro" in shipped(H7168).tags


def test_the_error_model_and_the_tolerance():
    d = shipped(H4096)
    assert error_models(d) == ["operand scale: |x| |post| + sum_o |residual_o| |comb_o,n|"]
    tol = tolerance_for(d)
    assert (tol.atol, tol.rtol, tol.matched_ratio) == (0.0, 1e-2, 1.0)


# -- the generator's boundary cases --------------------------------------------------------------------
def test_edge_cases():
    assert edge_cases(shipped(H4096)) == ["single_token", "signed_mix", "zero_post", "permuted_mix",
                                          "large_values", "tiny_values"]
    x = values(H4096, "single_token")
    assert x["x"].shape == (1, 4096) and x["residual"].shape == (1, 4, 4096) and x["comb_res_mix"].shape == (1, 4, 4)


def test_typical_tokens_carry_the_model_s_mixes():
    x = values(H4096, size="medium")
    post, comb = x["post_layer_mix"].double(), x["comb_res_mix"].double()
    assert post.shape == (64, 4) and bool((post > 0).all()) and bool((post < 2).all())
    assert bool((comb > 0).all())
    assert torch.allclose(comb.sum(dim=1), torch.ones(64, 4, dtype=torch.float64), atol=1e-6)  # new streams
    assert torch.allclose(comb.sum(dim=2), torch.ones(64, 4, dtype=torch.float64), atol=1e-6)  # old streams
    assert float((comb - comb.transpose(1, 2)).abs().amax(dim=(1, 2)).min()) > 1e-3  # never symmetric
    assert 0.8 < float(x["residual"].float().std()) < 1.2


def test_signed_mix_has_negative_weights_and_columns_not_summing_to_1():
    x = values(H4096, "signed_mix")
    assert bool((x["post_layer_mix"] < 0).any()) and bool((x["comb_res_mix"] < 0).any())
    assert float((x["comb_res_mix"].sum(dim=1) - 1).abs().min()) > 1e-3


def test_zero_post_zeroes_every_other_weight_and_the_last_token_whole():
    d = shipped(H4096)
    x = generate_inputs(d, "medium", 0, case="zero_post")
    post = x.values["post_layer_mix"]
    t, n = torch.meshgrid(torch.arange(post.shape[0]), torch.arange(4), indexing="ij")
    assert bool((post[(t + n) % 2 == 0] == 0).all()) and bool((post[:-1][((t + n) % 2 == 1)[:-1]] > 0).all())
    assert bool((x.values["comb_res_mix"][-1] == 0).all()) and bool((post[-1] == 0).all())
    (out,) = run_reference(d, x)
    assert bool((out[-1] == 0).all())


def test_permuted_mix_moves_each_stream_bit_for_bit():
    d = shipped(H127)
    x = generate_inputs(d, "medium", 0, case="permuted_mix")
    comb, r = x.values["comb_res_mix"], x.values["residual"]
    assert bool((x.values["post_layer_mix"] == 0).all())
    assert bool((comb.sum(dim=1) == 1).all()) and bool((comb.sum(dim=2) == 1).all())
    assert bool((comb.diagonal(dim1=1, dim2=2) == 0).all())  # a 4-cycle: no stream stays
    src = comb.argmax(dim=1)  # [T, new]: the old stream each new one takes
    want = torch.gather(r, 1, src[:, :, None].expand_as(r))
    for gt in (run_reference(d, x), get_ground_truth("torch", d, device="cpu")(x)):
        assert torch.equal(gt[0], want)


def test_large_values_stay_finite_in_float32_but_not_float16():
    x = values(H4096, "large_values", "medium")
    for name in ("x", "residual"):
        mag = x[name].double().abs()
        assert float(mag.min()) >= 2.0 ** 111.9 and float(mag.max()) <= 2.0 ** 122.1
    d = shipped(H4096)
    inputs = generate_inputs(d, "medium", 0, case="large_values")
    (out,) = run_reference(d, inputs)
    assert bool(out.float().isfinite().all()) and float(out.double().abs().max()) < 2.0 ** 126
    assert bool(torch.isinf(inputs.values["x"].half()).all())


def test_tiny_values_keep_products_normal_in_float32_and_below_float16():
    x = values(H4096, "tiny_values", "medium")
    for name in ("x", "residual"):
        mag = x[name].double().abs()
        assert float(mag.min()) >= 2.0 ** -104.1 and float(mag.max()) <= 2.0 ** -95.9
    assert float(x["comb_res_mix"].min()) >= mhc_inputs.TINY_MIX_FLOOR
    assert float(x["post_layer_mix"].min()) >= mhc_inputs.TINY_MIX_FLOOR
    smallest = float(x["residual"].double().abs().min()) * mhc_inputs.TINY_MIX_FLOOR
    assert smallest > torch.finfo(torch.float32).tiny  # no product is subnormal: flush-to-zero touches none
    assert bool((x["x"].half() == 0).all())


def test_unknown_or_missing_inputs_are_refused():
    d = shipped(H4096)
    no_comb = d.model_copy(update={"inputs": {k: v for k, v in d.inputs.items() if k != "comb_res_mix"}})
    with pytest.raises(GeneratorMismatch, match="missing comb_res_mix"):
        mhc_inputs.generate(Builder(no_comb, "small", 0, None))
    extra = d.model_copy(update={"inputs": {**d.inputs, "bias": d.inputs["x"]}})
    with pytest.raises(GeneratorMismatch, match="does not know input"):
        mhc_inputs.generate(Builder(extra, "small", 0, None))


# -- the float64 truth, against values worked by hand --------------------------------------------------
def _inputs(name: str, x, r, post, comb) -> Inputs:
    return Inputs(name, "small", 0, None, {"x": x, "residual": r, "post_layer_mix": post, "comb_res_mix": comb})


def test_truth_reads_comb_old_by_new_and_weights_x_by_post():
    d = shipped(H127)
    x = torch.full((1, 127), 2.0).to(torch.bfloat16)
    r = torch.stack([torch.full((127,), float(o + 1)) for o in range(4)])[None].to(torch.bfloat16)  # stream o = o+1
    post = torch.tensor([[0.5, 0.0, -1.0, 0.25]])
    comb = torch.zeros(1, 4, 4)
    comb[0, 3, 0] = 1.0  # new 0 takes old 3 (value 4)
    comb[0, 0, 1], comb[0, 1, 1] = 2.0, -1.0  # new 1: 2 * 1 - 2 = 0
    comb[0, 2, 2] = 0.5  # new 2: 0.5 * 3 = 1.5
    (out,) = get_ground_truth("torch", d, device="cpu")(_inputs(H127, x, r, post, comb))
    want = torch.tensor([2 * 0.5 + 4, 0.0, 2 * -1.0 + 1.5, 2 * 0.25])
    assert torch.equal(out[0], want[:, None].expand(4, 127).to(torch.bfloat16))


def test_truth_takes_post_as_t_hc_1_too_and_rounds_once():
    d = shipped(H127)
    x = torch.full((1, 127), 1.0).to(torch.bfloat16)
    r = torch.full((1, 4, 127), 1.0).to(torch.bfloat16)
    post = torch.full((1, 4, 1), 2.0 ** -9)
    comb = torch.zeros(1, 4, 4)
    comb[0, 0, :], comb[0, 1, :], comb[0, 2, :] = 1.0, 2.0 ** -9, 2.0 ** -10
    (out,) = get_ground_truth("torch", d, device="cpu")(_inputs(H127, x, r, post, comb))
    # 1 + 2^-9 + 2^-9 + 2^-10 = 1 + 2^-8 + 2^-10, past half of bf16's ulp at 1 (2^-7): rounded once, 1 + 2^-7; each
    # partial sum rounded to bf16 would stay 1
    assert bool((out.float() == 1 + 2.0 ** -7).all())


# -- the FlashInfer adapter (a fake module) ------------------------------------------------------------
def _fake(monkeypatch, version: str, calls: list | None = None, *, with_mhc: bool = True, cc=(9, 0)):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    mhc = types.SimpleNamespace()
    if with_mhc:
        def mhc_post(x, residual, post_layer_mix, comb_res_mix):  # FlashInfer's wrapper and kernel, in float32
            if calls is not None:
                calls.append((tuple(x.shape), x.is_contiguous(), tuple(residual.shape), residual.is_contiguous(),
                              tuple(post_layer_mix.shape), tuple(comb_res_mix.shape)))
            if x.dtype != torch.bfloat16 or post_layer_mix.dtype != torch.float32:
                raise RuntimeError("x must be bfloat16")
            h = residual.shape[-1]
            xf = x.reshape(-1, h).float()
            rf = residual.reshape(-1, 4, h).float()
            post = post_layer_mix.reshape(-1, 4)
            comb = comb_res_mix.reshape(-1, 4, 4)
            out = xf[:, None, :] * post[:, :, None] + torch.einsum("toh,ton->tnh", rf, comb)
            return out.to(torch.bfloat16).reshape(residual.shape)
        mhc.mhc_post = mhc_post
    module.mhc = mhc
    install_flashinfer(monkeypatch, module, version, cc=cc)
    return module


def test_flashinfer_paths():
    assert paths("flashinfer", shipped(H4096)) == [None, "post-3d", "outer-dims", "strided", "graph"]
    assert paths("sglang", shipped(H4096)) == [None]


SHAPES = {  # mode -> (x, x contiguous, residual, residual contiguous, post, comb) as the API sees them (4 tokens)
    None: ((4, 127), True, (4, 4, 127), True, (4, 4), (4, 4, 4)),
    "post-3d": ((4, 127), True, (4, 4, 127), True, (4, 4, 1), (4, 4, 4)),
    "outer-dims": ((1, 4, 127), True, (1, 4, 4, 127), True, (1, 4, 4), (1, 4, 4, 4)),
    "strided": ((4, 127), False, (4, 4, 127), False, (4, 4), (4, 4, 4)),
}


@pytest.mark.parametrize("mode", list(SHAPES))
@pytest.mark.parametrize("case", [None, "signed_mix", "zero_post", "large_values", "tiny_values"])
def test_flashinfer_calls_mhc_post_in_each_mode(monkeypatch, mode, case):
    calls: list = []
    _fake(monkeypatch, "0.7.2.post1", calls)
    d = shipped(H127)
    x = generate_inputs(d, "small", 0, case=case)
    before = {k: v.clone() for k, v in x.values.items()}
    gt = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path=mode), device="cpu")
    got = gt(x)
    assert calls == [SHAPES[mode]]
    assert got[0].shape == (4, 4, 127) and agrees(d, x, got)
    assert all(torch.equal(before[k], v) for k, v in x.values.items())


def test_flashinfer_before_0_6_13_is_api_missing(monkeypatch):
    _fake(monkeypatch, "0.6.12")
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: flashinfer 0.6.12 has no flashinfer.mhc.mhc_post "
                                                     r"\(needs >=0.6.13\)"):
        get_ground_truth("flashinfer", shipped(H4096), device="cuda")
    _fake(monkeypatch, "0.6.13", with_mhc=False)
    with pytest.raises(GroundTruthUnavailable, match="api-missing: flashinfer 0.6.13 has no mhc.mhc_post"):
        get_ground_truth("flashinfer", shipped(H4096), device="cuda")


def test_flashinfer_runs_from_sm80_and_refuses_older_gpus(monkeypatch):
    _fake(monkeypatch, "0.7.2.post1", cc=(9, 0))
    assert get_ground_truth("flashinfer", shipped(H4096), device="cuda") is not None
    _fake(monkeypatch, "0.7.2.post1", cc=(7, 5))
    with pytest.raises(GroundTruthUnavailable, match="arch"):
        get_ground_truth("flashinfer", shipped(H4096), device="cuda")


def test_flashinfer_takes_bf16_streams_and_float32_mixes_only(monkeypatch):
    """The hand-written adapter refuses other dtypes (the binding's CHECK_INPUT_AND_TYPE); what is left is the
    fi_api tag's generic call (groundtruth/fi_api.py), which the real binding would refuse in turn."""
    _fake(monkeypatch, "0.7.2.post1")
    d = shipped(H4096)
    fp16 = d.model_copy(update={"inputs": {**d.inputs, "x": d.inputs["x"].model_copy(
        update={"dtype": DType.float16})}})
    assert flashinfer_mhc.applies(fp16) == "x in bfloat16 only, not float16"
    assert get_ground_truth("flashinfer", fp16, device="cuda").adapter.api != "flashinfer.mhc.mhc_post"
    bf16_mix = d.model_copy(update={"inputs": {**d.inputs, "comb_res_mix": d.inputs["comb_res_mix"].model_copy(
        update={"dtype": DType.bfloat16})}})
    assert flashinfer_mhc.applies(bf16_mix) == "comb_res_mix in float32 only, not bfloat16"
    assert flashinfer_mhc.applies(d) is None
    assert get_ground_truth("flashinfer", d, device="cuda").adapter.api == "flashinfer.mhc.mhc_post"


def test_flashinfer_not_installed_or_no_gpu(monkeypatch):
    monkeypatch.setattr(base, "installed_version", lambda package: None)
    with pytest.raises(GroundTruthUnavailable, match="not-installed: flashinfer"):
        get_ground_truth("flashinfer", shipped(H4096), device="cuda")
    _fake(monkeypatch, "0.7.2.post1")
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        get_ground_truth("flashinfer", shipped(H4096), device="cpu")


def test_flashinfer_graph_mode_needs_a_gpu(monkeypatch):
    _fake(monkeypatch, "0.7.2.post1")
    d = shipped(H4096)
    gt = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path="graph"), device="cpu")
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        gt(generate_inputs(d, "small", 0))


# -- planted bugs --------------------------------------------------------------------------------------
BOUNDARY_MUTANTS = {  # mutant -> the case that catches it (typical tokens pass)
    f"{H4096}:half-accumulator": "large_values",
    f"{H4096}:half-output": "tiny_values",
    f"{H4096}:skip-zero-post": "zero_post",
    f"{H4096}:stochastic-mix-assumed": "signed_mix",
    f"{H4096}:non-negative-mix-assumed": "signed_mix",
}
ALSO = {f"{H4096}:half-accumulator": "tiny_values", f"{H4096}:half-output": "large_values",
        f"{H4096}:skip-zero-post": "permuted_mix"}  # a second case that catches it on its own
FAMILY = [m for m in MUTANTS if m.definition.startswith("mhc_post_")]


def test_every_boundary_class_has_a_mutant():
    assert_boundary_classes(FAMILY, BOUNDARY_MUTANTS, {"boundary-magnitude", "boundary-structure"})


@pytest.mark.parametrize("name", sorted(BOUNDARY_MUTANTS))
def test_a_boundary_bug_passes_typical_tokens_and_is_caught_by_its_case(name):
    cases = [BOUNDARY_MUTANTS[name], ALSO[name]] if name in ALSO else [BOUNDARY_MUTANTS[name]]
    assert_boundary_bug(mutant_named(FAMILY, name), cases, sizes=("small", "medium"), crash_fails=False)


def test_the_remainder_bug_is_planted_where_a_remainder_exists():
    [m] = [m for m in FAMILY if m.id == "remainder-unmixed"]
    assert m.definition == H127
    assert passes(mutate(shipped(H4096), m), None)  # 4096 % 8 == 0: nothing to drop
    assert not passes(mutate(shipped(H127), m), None, crash_fails=False)


@pytest.mark.parametrize("mutant", [m.name for m in FAMILY])
def test_planted_mhc_post_bugs_are_caught(mutant):
    assert_killed(mutant_named(FAMILY, mutant))

"""The Gemma norms (gemma_rmsnorm, gemma_fused_add_rmsnorm under op_type `rmsnorm`): the definitions reach their own
generator and ground truths (never the plain norms'), the generator's cases make the rows docs/boundary/gemma_norm.md
promises, the float64 truth matches values worked by hand, the FlashInfer and SGLang adapters call the APIs as
documented (fake modules: no GPU here) and skip precisely, and each planted bug passes on typical rows and is caught
by its case."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path

import pytest
import torch
from fakes import install_flashinfer
from packaging.version import Version
from planted import agrees, assert_boundary_bug, assert_boundary_classes, assert_killed, mutant_named, passes

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.definition import Definition
from flashinfer_trace.dtypes import DType
from flashinfer_trace.groundtruth import GroundTruthUnavailable, adapters_for, base, get_ground_truth, paths
from flashinfer_trace.groundtruth import flashinfer_gemma_norm as fgn
from flashinfer_trace.inputs import Inputs, edge_cases, generate_inputs
from flashinfer_trace.inputs import gemma_norm as gn
from flashinfer_trace.inputs.common import Builder, GeneratorMismatch, InputGenerationError
from flashinfer_trace.inputs.registry import family_for
from flashinfer_trace.mutants import MUTANTS, mutate
from flashinfer_trace.testing import run_reference

DEFS = Path(__file__).resolve().parents[2] / "definitions" / "rmsnorm"
PLAIN, FUSED = "gemma_rmsnorm_h4608", "gemma_fused_add_rmsnorm_h4608"
PLAIN16, FUSED16 = "gemma_rmsnorm_h4608_fp16", "gemma_fused_add_rmsnorm_h4608_fp16"
ODD, FUSED_ODD = "gemma_rmsnorm_h129", "gemma_fused_add_rmsnorm_h129"
SIZES = (129, 2304, 3584, 4608, 5376)


def shipped(name: str):
    return load_definition(DEFS / f"{name}.json")


def values(name: str, case: str | None = None, size: str = "small") -> dict:
    return generate_inputs(shipped(name), size, 0, case=case).values


# -- the definitions -----------------------------------------------------------------------------------
def test_definitions_have_flashinfer_s_op_type_names_and_io():
    names = sorted(p.stem for p in DEFS.glob("gemma*.json"))
    assert names == sorted([f"gemma_rmsnorm_h{h}" for h in SIZES] + [f"gemma_fused_add_rmsnorm_h{h}" for h in SIZES]
                           + [PLAIN16, FUSED16])
    for n in names:
        d = shipped(n)
        fused = n.startswith("gemma_fused")
        eps_input = n.endswith(("_fp16", "_h129"))
        assert d.op_type == "rmsnorm" and "coverage:gemma-rmsnorm" in d.tags
        assert f"fi_api:flashinfer.norm.{'gemma_fused_add_rmsnorm' if fused else 'gemma_rmsnorm'}" in d.tags
        want = ["hidden_states", *(["residual"] if fused else []), "weight", *(["eps"] if eps_input else [])]
        assert list(d.inputs) == want and d.run_parameters == want
        assert list(d.outputs) == (["output", "residual"] if fused else ["output"])
        assert d.in_place_outputs == (["residual"] if fused else [])
        dtype = "float16" if n.endswith("_fp16") else "bfloat16"
        assert {s.dtype.value for s in [*d.inputs.values(), *d.outputs.values()] if s.shape} == {dtype}
        assert (d.declared_params == {"eps": 1e-6}) != eps_input
        assert any(t.startswith("model:gemma-") for t in d.tags) == (not eps_input)


def test_gemma_definitions_reach_their_own_generator_and_plain_ones_stay_norm_s():
    assert family_for(shipped(PLAIN)).name == family_for(shipped(FUSED16)).name == "gemma_norm"
    assert family_for(load_definition("rmsnorm_h4096")).name == "norm"
    assert family_for(load_definition("fused_add_rmsnorm_h4096_fp16")).name == "norm"


def test_edge_cases():
    shared = ["single_token", "large_values", "tiny_values", "zero_rows", "denormal_values", "dominant_element",
              "near_max", "eps_min", "eps_max"]
    assert edge_cases(shipped(PLAIN)) == edge_cases(shipped(FUSED)) == [*shared, "minus_one_weight"]
    assert edge_cases(shipped(FUSED16)) == [*shared, "minus_one_weight", "residual_overflow"]
    assert edge_cases(shipped(PLAIN16)) == [*shared, "minus_one_weight"]  # no residual to overflow
    with pytest.raises(InputGenerationError, match="unknown edge case 'residual_overflow'"):
        generate_inputs(shipped(FUSED), "small", 0, case="residual_overflow")


# -- the generator -------------------------------------------------------------------------------------
def test_typical_rows_and_a_zero_centred_weight():
    x = values(PLAIN, size="medium")
    h, w = x["hidden_states"].float(), x["weight"].float()
    assert h.shape == (64, 4608) and 0.9 < float(h.std()) < 1.1
    assert abs(float(w.mean())) < 0.01 and 0.08 < float(w.std()) < 0.12 and float(w.abs().max()) < 0.5
    e = values(FUSED16)["eps"]
    assert isinstance(e, float) and 1e-6 <= e <= 1e-5


def test_minus_one_weight_zeroes_even_channels_and_spikes_an_odd_one():
    for name, dtype, scale in ((PLAIN, torch.bfloat16, 2.0 ** -8), (PLAIN16, torch.float16, 2.0 ** -11),
                               (ODD, torch.bfloat16, 2.0 ** -8)):
        d = shipped(name)
        x = generate_inputs(d, "small", 0, case="minus_one_weight")
        w, h = x.values["weight"], x.values["hidden_states"]
        assert bool((w[0::2] == -1).all()) and bool((1.0 + w[1::2].double() == scale).all()), name
        spikes, spike = h.float().abs().argmax(dim=-1), float(torch.tensor(1e4, dtype=dtype))  # 9984 in bf16
        assert bool((spikes % 2 == 1).all()) and bool((h.float().abs().amax(dim=-1) == spike).all()), name
        assert int(spikes[0]) >= h.shape[1] - 2 and int(spikes[-1]) == 1  # from the last odd column to the first
        (out,) = run_reference(d, x)
        assert bool((out[:, 0::2] == 0).all()), name  # a scale of exactly 0
        peak = out.float().abs().amax(dim=-1)
        assert bool((peak > 0.8 * h.shape[1] ** 0.5 * scale).all()), name  # x^ near sqrt(H) times the scale


def test_minus_one_weight_of_the_fused_form_spikes_the_sum():
    x = values(FUSED, "minus_one_weight")
    s = x["hidden_states"].double() + x["residual"].double()
    assert bool((s.abs().amax(dim=-1) > 9900).all()) and bool((s.abs().argmax(dim=-1) % 2 == 1).all())


def test_residual_overflow_sums_past_float16_in_one_sixteenth_of_even_rows():
    d = shipped(FUSED16)
    x = generate_inputs(d, "medium", 0, case="residual_overflow")
    h, r = x.values["hidden_states"].double(), x.values["residual"].double()
    s = h + r
    over = s.abs() > 65520
    assert not bool(over[1::2].any())
    assert [int(n) for n in over[0::2].sum(dim=-1)] == [4608 // 16] * 8
    assert bool((torch.sign(h[over]) == torch.sign(r[over])).all())
    assert bool((h.abs()[over] >= 0.55 * 65504 - 32).all()) and bool((h.abs()[over] <= 0.9 * 65504).all())
    out, residual = run_reference(d, x)
    assert torch.equal(residual.isinf(), over) and bool(out.float().isfinite().all())


def test_shared_cases_are_norm_s_rows():
    z = values(FUSED, "zero_rows")
    s = z["hidden_states"].double() + z["residual"].double()
    assert bool((s[0::2] == 0).all())
    dom = values(PLAIN16, "dominant_element")["hidden_states"]
    assert float(dom[0, -1]) == 1e4 and float(dom[-1, 0]) == -1e4


def test_inputs_named_as_the_api_names_them_are_taken_and_a_missing_one_refused():
    data = json.loads((DEFS / f"{ODD}.json").read_text())
    data["inputs"] = {("input" if k == "hidden_states" else k): v for k, v in data["inputs"].items()}
    data["reference"] = data["reference"].replace("hidden_states", "input")
    api = Definition.model_validate(data)
    x = generate_inputs(api, "small", 0, case="minus_one_weight")
    assert set(x.values) == {"input", "weight", "eps"}
    assert get_ground_truth("torch", api, device="cpu")(x)[0].shape == (4, 129)
    d = shipped(ODD)
    no_weight = d.model_copy(update={"inputs": {k: v for k, v in d.inputs.items() if k != "weight"}})
    with pytest.raises(GeneratorMismatch, match="a weight"):
        gn.generate(Builder(no_weight, "small", 0, None))


# -- the float64 truth, against values worked by hand --------------------------------------------------
def _inputs(name: str, **v) -> Inputs:
    return Inputs(name, "small", 0, None, v)


def test_truth_scales_by_one_plus_weight():
    d = shipped(ODD)
    row = torch.tensor([2.0, -2.0] * 64 + [2.0])  # mean(x^2) = 4: x^ = +-1
    w = torch.tensor([0.5, -1.0, 0.0] * 43)
    (out,) = get_ground_truth("torch", d, device="cpu")(_inputs(ODD, hidden_states=row[None].to(torch.bfloat16),
                                                              weight=w.to(torch.bfloat16), eps=0.0))
    assert torch.equal(out[0], (row / 2 * (1 + w)).to(torch.bfloat16))
    assert bool((out[0, 1::3] == 0).all())  # w = -1: exactly 0


def test_truth_of_the_fused_form_normalises_the_float32_sum_and_rounds_the_residual_once():
    d = shipped(FUSED16)
    h = torch.full((1, 4608), 40000.0, dtype=torch.float16)  # h + r = 80000: past float16's 65504
    r = torch.full((1, 4608), 40000.0, dtype=torch.float16)
    w = torch.zeros(4608, dtype=torch.float16)
    out, residual = get_ground_truth("torch", d, device="cpu")(_inputs(FUSED16, hidden_states=h, residual=r,
                                                                        weight=w, eps=1e-6))
    assert bool(residual.isinf().all()) and torch.allclose(out.float(), torch.ones(1, 4608), atol=1e-3)
    small = torch.tensor([[1.0, -3.0] * 2304], dtype=torch.float16)
    out, residual = get_ground_truth("torch", d, device="cpu")(_inputs(FUSED16, hidden_states=small, residual=small,
                                                                        weight=w + 1, eps=0.0))
    assert torch.equal(residual, 2 * small)  # s = 2, -6: mean(s^2) = 20
    assert torch.allclose(out.float(), (2 * small.float() / 20 ** 0.5) * 2, atol=2e-3)


def test_truth_reads_eps_from_the_call_or_the_tag_not_the_reference():
    for name in (ODD, PLAIN):
        d = shipped(name)
        bad = d.model_copy(update={"reference": d.reference.replace("+ eps)", "+ 0.5)").replace("EPS = 1e-6",
                                                                                              "EPS = 0.5")})
        assert bad.reference != d.reference
        x = generate_inputs(d, "small", 0, case="eps_min")
        assert torch.equal(get_ground_truth("torch", bad, device="cpu")(x)[0],
                           get_ground_truth("torch", d, device="cpu")(x)[0])


def test_no_ground_truth_takes_the_other_kind_of_norm():
    gemma, plain = shipped(PLAIN), load_definition("rmsnorm_h4096")
    for source in ("flashinfer", "sglang", "torch"):
        for a in adapters_for("rmsnorm", source):
            if "gemma" in a.api or "1 + w" in a.api:  # ours
                assert "not a Gemma norm" in a.applies(plain), a.api
            else:
                assert "Gemma-style" in a.applies(gemma), a.api


# -- the FlashInfer adapter (a fake module) ------------------------------------------------------------
def _ref_norm(s: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps) * (1.0 + w.float())


def _fake_flashinfer(monkeypatch, version: str, calls: list | None = None, *, pdl: bool = True, gemma: bool = True):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    norm = types.SimpleNamespace()

    def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):  # FlashInfer's math: float32
        if calls is not None:
            calls.append(("gemma_rmsnorm", input.dtype, weight.dtype, eps, out is not None, enable_pdl))
        if input.dim() != 2 or weight.dtype != input.dtype:
            raise RuntimeError("bad call")
        y = _ref_norm(input.float(), weight, eps).to(input.dtype)
        if out is None:
            return y
        out.copy_(y)
        return out

    def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):  # in place
        if calls is not None:
            calls.append(("gemma_fused_add_rmsnorm", input.dtype, weight.dtype, eps, False, enable_pdl))
        s = input.float() + residual.float()
        residual.copy_(s.to(residual.dtype))
        input.copy_(_ref_norm(s, weight, eps).to(input.dtype))

    if gemma:
        if not pdl:  # 0.2.0 - 0.2.2: no enable_pdl keyword
            def plain_old(input, weight, eps=1e-6, out=None):
                return gemma_rmsnorm(input, weight, eps, out)

            def fused_old(input, residual, weight, eps=1e-6):
                return gemma_fused_add_rmsnorm(input, residual, weight, eps)
            norm.gemma_rmsnorm, norm.gemma_fused_add_rmsnorm = plain_old, fused_old
        else:
            norm.gemma_rmsnorm, norm.gemma_fused_add_rmsnorm = gemma_rmsnorm, gemma_fused_add_rmsnorm
    module.norm = norm
    install_flashinfer(monkeypatch, module, version)
    return module


def _on_cpu(source: str, d, path: str | None = None):
    return dataclasses.replace(get_ground_truth(source, d, device="cuda", path=path), device="cpu")


def _unchanged(before: dict, after: dict) -> bool:
    return all(torch.equal(before[k], v) if isinstance(v, torch.Tensor) else before[k] == v for k, v in after.items())


def _snapshot(x) -> dict:
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in x.values.items()}


def test_flashinfer_paths():
    assert paths("flashinfer", shipped(PLAIN)) == [None, "out", "pdl", "graph"]
    assert paths("flashinfer", shipped(FUSED)) == [None, "pdl", "graph"]
    assert paths("sglang", shipped(PLAIN)) == paths("sglang", shipped(FUSED)) == [None]


@pytest.mark.parametrize("path", [None, "out", "pdl"])
@pytest.mark.parametrize("case", [None, "zero_rows", "minus_one_weight", "eps_min"])
def test_flashinfer_gemma_rmsnorm_gets_the_declared_eps_in_every_mode(monkeypatch, path, case):
    calls: list = []
    _fake_flashinfer(monkeypatch, "0.6.6", calls)
    for name, eps in ((PLAIN16, None), (PLAIN, 1e-6)):
        calls.clear()
        d = shipped(name)
        x = generate_inputs(d, "small", 0, case=case)
        before = _snapshot(x)
        got = _on_cpu("flashinfer", d, path)(x)
        dtype = x.values["hidden_states"].dtype
        want_eps = x.values["eps"] if eps is None else eps
        assert calls == [("gemma_rmsnorm", dtype, dtype, want_eps, path == "out", True if path == "pdl" else None)]
        assert agrees(d, x, got) and _unchanged(before, x.values)


@pytest.mark.parametrize("case", [None, "zero_rows", "residual_overflow"])
def test_flashinfer_fused_runs_on_clones_and_reads_both_outputs_back(monkeypatch, case):
    calls: list = []
    _fake_flashinfer(monkeypatch, "0.6.6", calls)
    d = shipped(FUSED16)
    x = generate_inputs(d, "small", 0, case=case)
    before = _snapshot(x)
    for path in (None, "pdl"):
        got = _on_cpu("flashinfer", d, path)(x)
        assert len(got) == 2 and agrees(d, x, got) and _unchanged(before, x.values)
    assert [c[-1] for c in calls] == [None, True]


def test_flashinfer_before_0_2_is_api_missing_and_pdl_before_0_2_3(monkeypatch):
    _fake_flashinfer(monkeypatch, "0.1.6")
    for name, api in ((PLAIN, "gemma_rmsnorm"), (FUSED, "gemma_fused_add_rmsnorm")):
        with pytest.raises(GroundTruthUnavailable, match=rf"api-missing: flashinfer 0.1.6 has no flashinfer.norm.{api} "
                                                         r"\(needs >=0.2\)"):
            get_ground_truth("flashinfer", shipped(name), device="cuda")
    _fake_flashinfer(monkeypatch, "0.2.0", pdl=False)
    x = generate_inputs(shipped(PLAIN), "small", 0)
    assert agrees(shipped(PLAIN), x, _on_cpu("flashinfer", shipped(PLAIN), "out")(x))
    for name in (PLAIN, FUSED):
        with pytest.raises(GroundTruthUnavailable, match="api-missing: flashinfer 0.2.0 .* has no enable_pdl"):
            _on_cpu("flashinfer", shipped(name), "pdl")(generate_inputs(shipped(name), "small", 0))
    _fake_flashinfer(monkeypatch, "0.5.3", gemma=False)
    with pytest.raises(GroundTruthUnavailable, match="api-missing: flashinfer 0.5.3 has no norm.gemma_rmsnorm"):
        get_ground_truth("flashinfer", shipped(PLAIN), device="cuda")


def test_flashinfer_takes_2d_input_and_the_weight_in_its_dtype(monkeypatch):
    _fake_flashinfer(monkeypatch, "0.6.6")
    d = shipped(PLAIN)
    w32 = d.model_copy(update={"inputs": {**d.inputs, "weight": d.inputs["weight"].model_copy(
        update={"dtype": DType.float32})}})
    why = fgn.applies_plain(w32)
    assert "the weight is read in the input's dtype: weight float32 with hidden_states bfloat16" in why
    # no hand-written adapter applies: the reason names one, and the fi_api tag's fallback refuses the call too
    with pytest.raises(GroundTruthUnavailable, match="unsupported: .* by its fi_api tag: api-missing: signature"):
        get_ground_truth("flashinfer", w32, device="cuda")
    assert get_ground_truth("torch", w32, device="cpu") is not None  # the math takes any dtype
    data = json.loads((DEFS / f"{PLAIN}.json").read_text())
    data["axes"]["heads"] = {"type": "const", "value": 2}
    data["inputs"]["hidden_states"]["shape"] = ["batch_size", "heads", "hidden_size"]
    data["outputs"]["output"]["shape"] = ["batch_size", "heads", "hidden_size"]
    three_d = Definition.model_validate(data)
    assert "2-D input only" in fgn.applies_plain(three_d) and fgn.applies_plain(shipped(PLAIN)) is None
    with pytest.raises(GroundTruthUnavailable, match="unsupported"):
        get_ground_truth("flashinfer", three_d, device="cuda")


def test_flashinfer_not_installed_no_gpu_and_graph(monkeypatch):
    monkeypatch.setattr(base, "installed_version", lambda package: None)
    with pytest.raises(GroundTruthUnavailable, match="not-installed: flashinfer"):
        get_ground_truth("flashinfer", shipped(PLAIN), device="cuda")
    _fake_flashinfer(monkeypatch, "0.6.6")
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        get_ground_truth("flashinfer", shipped(FUSED), device="cpu")
    for name in (PLAIN, FUSED):
        with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
            _on_cpu("flashinfer", shipped(name), "graph")(generate_inputs(shipped(name), "small", 0))


def test_flashinfer_adapters_are_planned_for_the_graph_mode(monkeypatch):
    """The launch graph mode captures: the fused form's in place on the tensors it is given, so a replay on new data
    follows it (modes.py copies the case's data into those tensors before the last replay)."""
    from flashinfer_trace.groundtruth.base import Call

    module = _fake_flashinfer(monkeypatch, "0.6.6")
    d = shipped(FUSED)
    x = generate_inputs(d, "small", 0).clone()
    launch = fgn.plan_fused(Call(d, x, module, Version("0.6.6"), mode="graph"))
    other = generate_inputs(d, "small", 1)
    for n in ("hidden_states", "residual", "weight"):  # new data into the planned tensors
        x.values[n].copy_(other.values[n])
    got = fgn.finish_fused(Call(d, x, module, None), launch())
    assert agrees(d, other, got)


# -- the SGLang adapter (a fake sgl_kernel) --------------------------------------------------------------
def _fake_sgl(monkeypatch, version: str, **attrs):
    module = types.ModuleType("sgl_kernel")
    module.__version__ = version
    for k, v in attrs.items():
        setattr(module, k, v)
    monkeypatch.setitem(sys.modules, "sgl_kernel", module)
    monkeypatch.setattr(base, "installed_version", lambda package: Version(version))
    monkeypatch.setattr(base, "_imported", {})
    monkeypatch.setattr(base, "cuda_capability", lambda device: (9, 0) if str(device).startswith("cuda") else None)


def test_sglang_calls_both_gemma_kernels_with_the_declared_eps(monkeypatch):
    fi = _fake_flashinfer(monkeypatch, "0.6.6")
    _fake_sgl(monkeypatch, "0.3.21", gemma_rmsnorm=fi.norm.gemma_rmsnorm,
              gemma_fused_add_rmsnorm=fi.norm.gemma_fused_add_rmsnorm)
    for name in (PLAIN16, FUSED, FUSED16):
        d = shipped(name)
        for case in (None, "minus_one_weight"):
            x = generate_inputs(d, "small", 0, case=case)
            before = _snapshot(x)
            got = _on_cpu("sglang", d)(x)
            assert agrees(d, x, got) and _unchanged(before, x.values), (name, case)


def test_sglang_without_the_gemma_kernels_is_api_missing(monkeypatch):
    _fake_sgl(monkeypatch, "0.0.3", rmsnorm=lambda *a, **k: None)
    with pytest.raises(GroundTruthUnavailable, match="api-missing: sgl_kernel 0.0.3 has no gemma_rmsnorm"):
        get_ground_truth("sglang", shipped(PLAIN), device="cuda")
    with pytest.raises(GroundTruthUnavailable, match="api-missing: sgl_kernel 0.0.3 has no gemma_fused_add_rmsnorm"):
        get_ground_truth("sglang", shipped(FUSED), device="cuda")


# -- planted bugs --------------------------------------------------------------------------------------
BOUNDARY_MUTANTS = {  # mutant -> the case that catches it (typical rows pass)
    f"{PLAIN}:no-eps": "zero_rows",
    f"{PLAIN}:eps-outside-sqrt": "eps_min",
    f"{PLAIN}:scale-in-output-dtype": "minus_one_weight",
    f"{PLAIN}:tail-dropped": "dominant_element",
    f"{PLAIN16}:squares-in-input-dtype": "dominant_element",
    f"{FUSED16}:add-in-input-dtype": "residual_overflow",
}
ALSO = {f"{PLAIN}:eps-outside-sqrt": "eps_max", f"{PLAIN16}:squares-in-input-dtype": "near_max"}
FAMILY = [m for m in MUTANTS if m.definition.startswith("gemma_")]


def test_every_boundary_class_has_a_mutant():
    assert_boundary_classes(FAMILY, BOUNDARY_MUTANTS, {"boundary-magnitude", "boundary-structure"})
    assert {m.cls for m in FAMILY} >= {"wrong-math", "mutates-inputs", "steers-verdict"}


@pytest.mark.parametrize("name", sorted(BOUNDARY_MUTANTS))
def test_a_boundary_bug_passes_typical_rows_and_is_caught_by_its_case(name):
    cases = [BOUNDARY_MUTANTS[name], ALSO[name]] if name in ALSO else [BOUNDARY_MUTANTS[name]]
    assert_boundary_bug(mutant_named(FAMILY, name), cases, sizes=("small", "medium"), crash_fails=False)


def test_the_weight_dtype_scale_is_a_known_gap_inside_the_bf16_tolerance():
    [m] = [m for m in FAMILY if m.id == "plus-one-in-weight-dtype"]
    bad = mutate(shipped(PLAIN), m)
    assert m.survives and all(passes(bad, c) for c in [None, *edge_cases(bad)])


@pytest.mark.parametrize("mutant", [m.name for m in FAMILY if m.survives is None])
def test_planted_gemma_norm_bugs_are_caught(mutant):
    assert_killed(mutant_named(FAMILY, mutant))


def test_the_fused_in_place_write_is_what_the_stale_residual_mutant_misses():
    [m] = [m for m in FAMILY if m.id == "stale-residual"]
    d = shipped(FUSED)
    x = generate_inputs(d, "small", 0)
    out, residual = run_reference(mutate(d, m), x)  # one output returned: the in-place residual is its copy's
    assert torch.equal(residual, x.values["residual"])

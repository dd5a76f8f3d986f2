"""The dense families (norm, gemm, activation, rope): parameters come from the definition, never from the
reference (semantics.py, `param:` tags), and the boundary cases of docs/boundary/dense.md make the inputs
they promise; each planted boundary bug passes on typical inputs and is caught by its case."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from flashinfer_trace import semantics as sem
from flashinfer_trace.dataset import load_definition
from flashinfer_trace.definition import Definition, param_tag
from flashinfer_trace.groundtruth import GroundTruthUnavailable, get_ground_truth
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.inputs import gemm as gemm_inputs
from flashinfer_trace.inputs import norm as norm_inputs
from flashinfer_trace.inputs import rope as rope_inputs
from flashinfer_trace.mutants import MUTANTS, mutate
from flashinfer_trace.testing import run_reference
from flashinfer_trace.validate import check_data
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import compare_with_model

SHIPPED = Path(__file__).resolve().parents[2] / "definitions"


def shipped(name: str) -> Definition:
    (path,) = SHIPPED.glob(f"*/{name}.json")
    return load_definition(path)


def with_changes(d: Definition, **changes) -> Definition:
    return Definition.model_validate({**d.as_dict, **changes})


# -- part 1: parameters from the definition ------------------------------------------------------------
@pytest.mark.parametrize("tag, expected", [
    ("param:eps=1e-05", ("eps", 1e-05)), ("param:eps=0.000001", ("eps", 1e-06)), ("param:block=128", ("block", 128)),
    ("param:is_neox=true", ("is_neox", True)), ("param:dt_softplus=false", ("dt_softplus", False)),
    ("model:llama-3.1-8b", None), ("status:reference", None),
])
def test_param_tag_reads_numbers_and_booleans(tag, expected):
    assert param_tag(tag) == expected


@pytest.mark.parametrize("tag, message", [
    ("param:eps", "not param:<name>=<value>"), ("param:1eps=1", "not param:<name>=<value>"),
    ("param:eps=", "is not a decimal number"), ("param:eps=1e-5x", "is not a decimal number"),
    ("param:eps=True", "is not a decimal number"), ("param:eps=inf", "is not a decimal number"),
    ("param:eps=1e999", "is not finite"),
])
def test_a_malformed_param_tag_says_what_is_wrong(tag, message):
    with pytest.raises(ValueError, match=message):
        param_tag(tag)


def test_validate_names_file_and_field_of_a_bad_param_tag():
    data = shipped("rmsnorm_h4096_fp16").as_dict  # eps an input, no param: tag
    data = {**data, "tags": [*data["tags"], "param:eps=1e-5x", "param:is_neox=true", "param:is_neox=false"]}
    problems = [p for p in check_data(data, "defs/rmsnorm_h4096.json") if p.kind == "param-tag"]
    n = len(data["tags"])
    assert [(p.file, p.path) for p in problems] == [("defs/rmsnorm_h4096.json", f"$.tags[{n - 3}]"),
                                                   ("defs/rmsnorm_h4096.json", f"$.tags[{n - 1}]")]
    assert "value '1e-5x' is not a decimal number" in problems[0].message
    assert "declared twice" in problems[1].message
    clash = {**data, "tags": ["param:eps=1e-05"]}  # the definition has an eps input already
    (p,) = [p for p in check_data(clash, "f.json") if p.kind == "param-tag"]
    assert "also an input" in p.message


def test_eps_comes_from_the_call_or_a_tag_never_from_the_reference():
    assert sem.eps(shipped("rmsnorm_h4096")) == 1e-5  # param:eps=1e-5, the public contract has no eps input
    d = shipped("rmsnorm_h4096_fp16")
    assert sem.eps(d) is None  # declared as an input: each call brings it
    assert sem.eps(d, {"eps": 3e-6}) == 3e-6
    tagged = Definition.model_validate({
        **d.as_dict, "tags": [*d.tags, "param:eps=1e-05"],
        "inputs": {k: v for k, v in d.as_dict["inputs"].items() if k != "eps"},
        "reference": "import torch\n\nEPS = 9e-3\n\ndef run(hidden_states, weight):\n    return hidden_states\n"})
    assert sem.eps(tagged) == 1e-05
    bare = tagged.model_copy(update={"tags": d.tags})  # EPS = 9e-3 in its reference: still no eps
    with pytest.raises(GroundTruthUnavailable, match="declares no eps") as exc:
        sem.eps(bare)
    assert exc.value.kind == "unsupported"
    with pytest.raises(GroundTruthUnavailable, match="declares no eps"):
        get_ground_truth("torch", bare, device="cpu")


def test_the_torch_ground_truth_follows_the_eps_input():
    d = shipped("rmsnorm_h4096_fp16")
    x = generate_inputs(d, "small", 0, case="tiny_values")
    gt = get_ground_truth("torch", d, device="cpu")
    a = gt(x)[0]
    x.values["eps"] = 1e-1
    assert not torch.allclose(a, gt(x)[0], atol=1e-3)


def test_neox_softplus_and_block_come_from_name_tags_and_shapes():
    rope = shipped("rope_with_cos_sin_cache_neox_style_h32_kv8_d128_rd128")
    renamed = rope.model_copy(update={"name": "rope_h32_kv8_d128"})
    with pytest.raises(GroundTruthUnavailable, match="param:is_neox"):
        sem.rope_is_neox(renamed.model_copy(update={"reference": "IS_NEOX = True\n" + rope.reference}))
    assert sem.rope_is_neox(renamed.model_copy(update={"tags": ["param:is_neox=false"]})) is False

    mamba = shipped("mamba_ssu_decode_h128_d64_s128_ng8")
    assert "param:dt_softplus=true" in mamba.tags and sem.mamba_dt_softplus(mamba) is True
    untagged = mamba.model_copy(update={"tags": [t for t in mamba.tags if not t.startswith("param:")]})
    with pytest.raises(GroundTruthUnavailable, match="declares no dt_softplus"):
        sem.mamba_dt_softplus(untagged)  # its reference calls F.softplus: that is what is judged, not read

    moe = shipped("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048")
    assert sem.moe_block(moe) == 128
    assert sem.moe_block(moe.model_copy(update={"reference": "BLOCK = 64\n" + moe.reference})) == 128
    assert sem.moe_block(shipped("moe_bf16_renorm_topk2_e8_h4096_i1792")) is None
    hidden = torch.zeros(2, 7168)
    scales = {"hidden_states": hidden, "hidden_states_scale": torch.zeros(7168 // 64, 2)}
    with pytest.raises(GroundTruthUnavailable, match="cannot tell the scale block size"):
        sem.moe_block(moe, scales)  # 64-wide activation blocks against 128-wide weight blocks


# -- part 2: the boundary cases make what they promise --------------------------------------------------
def test_norm_cases():
    d, f16 = shipped("rmsnorm_h4096"), shipped("rmsnorm_h4096_fp16")
    assert {"zero_rows", "denormal_values", "dominant_element", "near_max"} <= set(edge_cases(d))
    assert "eps" not in generate_inputs(d, "small", 0).values  # param:eps=1e-5, no eps input
    assert {"eps_min", "eps_max"} <= set(edge_cases(f16))  # eps an input
    lo, hi = norm_inputs.EPS_RANGE
    assert generate_inputs(f16, "small", 0, case="eps_min").values["eps"] == pytest.approx(lo, rel=1e-7)
    assert generate_inputs(f16, "small", 0, case="eps_max").values["eps"] == pytest.approx(hi, rel=1e-7)
    assert lo <= generate_inputs(f16, "medium", 0).values["eps"] <= hi
    h = generate_inputs(d, "small", 0, case="zero_rows").values["hidden_states"]
    assert h[0::2].eq(0).all() and h[1::2].ne(0).any()
    h = generate_inputs(d, "small", 0, case="denormal_values").values["hidden_states"].float()
    assert (h.abs() < torch.finfo(torch.bfloat16).tiny).float().mean() > 0.9 and h.ne(0).any()
    h = generate_inputs(d, "small", 0, case="dominant_element").values["hidden_states"].float()
    assert h[0, -1].abs() > 5e3 and h[-1, 0].abs() > 5e3  # the spike at both ends of a row
    h = generate_inputs(d, "small", 0, case="near_max").values["hidden_states"].float()
    limit = norm_inputs.near_max_limit(torch.bfloat16, 4096)
    assert h.abs().max() > 0.9 * limit and h.double().pow(2).sum(-1).max() < torch.finfo(torch.float32).max / 4
    fp16 = generate_inputs(shipped("rmsnorm_h4096_fp16"), "small", 0, case="near_max").values["hidden_states"]
    assert fp16.float().abs().max() > 0.85 * 65504 and fp16.isfinite().all()
    fused = generate_inputs(shipped("fused_add_rmsnorm_h4096"), "small", 0, case="zero_rows").values
    s = fused["hidden_states"].float() + fused["residual"].float()
    assert s[0::2].eq(0).all() and fused["hidden_states"][0::2].ne(0).any()  # the sum cancels exactly


def test_gemm_cases():
    d = shipped("gemm_n4096_k4096")
    assert {"zero_rows", "one_hot_rows", "accumulator_range"} <= set(edge_cases(d))
    assert "accumulator_range" not in edge_cases(shipped("gemm_n128256_k4096"))  # N > BOUNDARY_MAX_N
    a = generate_inputs(d, "medium", 0, case="zero_rows").values["A"]
    assert a.shape[0] == gemm_inputs.BOUNDARY_ROWS["medium"] and a[0::2].eq(0).all()
    x = generate_inputs(d, "small", 0, case="one_hot_rows").values
    a, b = x["A"].float(), x["B"].float()
    assert a.ne(0).sum(-1).eq(1).all() and a[0, -1] != 0 and a[-1, 0] != 0
    c = a @ b.T
    assert torch.equal(c.half().float(), c)  # exact in fp16: any rounding of B shows
    x = generate_inputs(d, "small", 0, case="accumulator_range").values
    a, b = x["A"].double(), x["B"].double()
    half = (a[:, :2048] @ b[:, :2048].T).abs()
    assert half.min() > 65504 and (a @ b.T).abs().max() < 65504 / 4


def test_activation_cases():
    bf16, fp16 = shipped("silu_and_mul_i14336"), shipped("silu_and_mul_i14336_fp16")
    x = generate_inputs(bf16, "small", 0, case="zero_rows").values["input"]
    assert x[0::2].eq(0).all() and x[1::2].ne(0).any()
    for d, dtype in ((bf16, torch.bfloat16), (fp16, torch.float16)):
        x = generate_inputs(d, "small", 0, case="saturated_gates").values["input"].float()
        gate, up = x[:, :14336], x[:, 14336:]
        assert gate.abs().min() >= 8 and (gate > 88.8).any() and (gate < -88.8).any()
        assert (torch.nn.functional.silu(gate.double()) * up.double()).abs().max() < torch.finfo(dtype).max / 4
    x = generate_inputs(fp16, "small", 0, case="saturated_gates").values["input"].float()
    assert (x[:, :14336] * x[:, 14336:]).abs().max() > 65504  # gate * up alone overflows float16
    x = generate_inputs(fp16, "small", 0, case="large_values").values["input"].float()
    assert x.abs().max() <= 64 and (x[:, :14336] * x[:, 14336:]).abs().max() < 65504


def test_rope_cases():
    d = shipped("rope_with_cos_sin_cache_neox_style_h32_kv8_d128_rd128")
    assert "partial_rotary" not in edge_cases(d)
    x = generate_inputs(d, "small", 0, case="cache_ends").values
    rows = x["cos_sin_cache"].shape[0]
    assert x["positions"].tolist() == [rows - 1, 0, rows - 1, 0]
    x = generate_inputs(d, "small", 0, case="large_positions").values
    assert x["cos_sin_cache"].shape[0] == rope_inputs.LONG_CONTEXT
    assert x["positions"].min() >= rope_inputs.LONG_CONTEXT - rope_inputs.LATE
    partial = shipped("rope_with_cos_sin_cache_neox_style_h16_kv2_d256_rd64")
    assert "partial_rotary" in edge_cases(partial)
    q = generate_inputs(partial, "small", 0, case="partial_rotary").values["query"].float()
    assert q[..., 64:].abs().max() > 65504 and q[..., :64].abs().max() < 8


# -- the planted boundary bugs: right on typical inputs, caught by their case ---------------------------
BOUNDARY_MUTANTS = {
    "rmsnorm_h4096:rescale-no-zero-guard": "zero_rows",
    "rmsnorm_h4096:tail-dropped": "dominant_element",
    "rmsnorm_h4096_fp16:weight-first-fp16": "near_max",
    "rmsnorm_h4096_fp16:subnormal-ftz": "denormal_values",
    "rmsnorm_h4096_fp16:eps-in-fp16": "eps_min",
    "gemm_n4096_k4096:row-scaled": "zero_rows",
    "gemm_n4096_k4096:b-in-bf16": "one_hot_rows",
    "gemm_n4096_k4096:split-k-fp16": "accumulator_range",
    "silu_and_mul_i14336:sigmoid-exp-ratio": "saturated_gates",
    "silu_and_mul_i14336:row-scaled": "zero_rows",
    "silu_and_mul_i14336_fp16:gate-times-up-first": "saturated_gates",
    "rope_with_cos_sin_cache_neox_style_h32_kv8_d128_rd128:last-row-clamped": "cache_ends",
    "rope_with_cos_sin_cache_neox_style_h32_kv8_d128_rd128:positions-clamped-64k": "large_positions",
    "rope_with_cos_sin_cache_neox_style_h16_kv2_d256_rd64:tail-through-fp16": "partial_rotary",
}


def passes(d: Definition, case: str | None) -> bool:
    x = generate_inputs(d, "small", 0, case=case)
    expected = get_ground_truth("torch", d, device="cpu")(x)
    return all(r.passed for r in compare_with_model(d, x, run_reference(d, x), expected, tolerance_for(d)))


@pytest.mark.parametrize("name", sorted(BOUNDARY_MUTANTS))
def test_a_boundary_bug_passes_typical_inputs_and_is_caught_by_its_case(name):
    (mutant,) = [m for m in MUTANTS if m.name == name]
    d = shipped(mutant.definition)
    bad = mutate(d, mutant)
    case = BOUNDARY_MUTANTS[name]
    assert passes(d, case), f"the true reference fails {case}"
    assert passes(bad, None), f"{name} is caught on typical inputs already: not a boundary bug"
    assert not passes(bad, case), f"{name} survives {case}"


def test_eps_mutants_are_caught_now_that_eps_is_an_input():
    """A reference with its own EPS = 9e-3 (a ground truth reading EPS from it would agree) or a literal 1e-6:
    the ground truth takes the call's eps; mean(x^2) ~ 1e-6 (tiny_values) makes the difference show."""
    for name in ("rmsnorm_h4096:eps-constant", "fused_add_rmsnorm_h4096:eps-constant", "rmsnorm_h4096:eps",
                 "fused_add_rmsnorm_h4096:eps"):
        (mutant,) = [m for m in MUTANTS if m.name == name]
        bad = mutate(shipped(mutant.definition), mutant)
        assert "+ eps)" not in bad.reference
        assert not passes(bad, "tiny_values")


def test_near_max_limit_keeps_the_float32_sum_finite():
    for hidden in (128, 4096, 8192):
        limit = norm_inputs.near_max_limit(torch.bfloat16, hidden)
        assert hidden * limit ** 2 <= torch.finfo(torch.float32).max / 4 * (1 + 1e-6)
    assert norm_inputs.near_max_limit(torch.float16, 4096) == pytest.approx(0.9 * 65504)
    assert math.log2(gemm_inputs.one_hot_value(4096)) == 10

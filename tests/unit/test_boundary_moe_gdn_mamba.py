"""The boundary cases of moe, gdn and mamba_ssu (docs/boundary/moe-gdn-mamba.md): each reaches its boundary,
the true references pass it against the float64 torch ground truth, and each planted bug of its class
(mutants.py) passes a random case but fails the boundary case. MoE runs on scaled-down definitions from the
same templates as the shipped ones (the same reference code; the shipped fp8 DeepSeek MoE is 1.4 GB)."""

from __future__ import annotations

import pytest
import torch

from flashinfer_trace.check import CheckConfig, Discovered, plan, run
from flashinfer_trace.dataset import load_definition
from flashinfer_trace.definition import Definition
from flashinfer_trace.extract.templates import FAMILIES
from flashinfer_trace.groundtruth import torch_gdn
from flashinfer_trace.groundtruth.torch_ref import deepseek_routing, renormalize_routing
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.inputs import moe as moe_inputs
from flashinfer_trace.mutants import MUTANTS, mutate
from flashinfer_trace.semantics import routing_params
from flashinfer_trace.testing import get_ground_truth, run_reference, tolerance_for
from flashinfer_trace.verdict import judge

MOE_CASES = ("routing_ties", "extreme_magnitudes")
GDN_CASES = ("gate_extremes", "empty_sequences")
MAMBA_CASES = ("extreme_magnitudes", "all_padded")


def _moe(**params) -> Definition:
    return Definition.model_validate(FAMILIES["moe"](**params))


# scaled down from the shipped ones: DeepSeek-V3 grouped routing on an expert-parallel rank (64 experts in
# 8 groups, 8 local: one group), renormalize fp8 with every expert local, renormalize bf16
DS = _moe(routing="deepseek", weights="fp8_block_scale", top_k=8, num_experts=64, num_local_experts=8,
          hidden_size=256, intermediate_size=128, n_group=8, topk_group=4)
RENORM_FP8 = _moe(routing="renormalize", weights="fp8_block_scale", top_k=8, num_experts=32, num_local_experts=32,
                  hidden_size=256, intermediate_size=128)
RENORM_BF16 = _moe(routing="renormalize", weights="bfloat16", top_k=4, num_experts=16, num_local_experts=16,
                   hidden_size=128, intermediate_size=64)
MOE_DEFS = {"ds": DS, "renorm_fp8": RENORM_FP8, "renorm_bf16": RENORM_BF16}
SHIPPED_DS = "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048"


def _passes(d: Definition, case: str | None, size: str = "small", seed: int = 0) -> tuple[bool, str]:
    x = generate_inputs(d, size, seed, case=case)
    j = judge(d, x, run_reference(d, x), get_ground_truth("torch", d, device="cpu")(x), tolerance_for(d))
    return j.passed, j.summary or ""


def _verdicts(d: Definition, cases: tuple[str, ...]) -> dict[str | None, str]:
    """The engine's own plan (torch, small, seed 0): match -> None, each edge case -> its name. An fp8 MoE
    stand-in gets the cosine floor definitions/tolerances.toml sets for the shipped fp8 MoEs."""
    fp8 = d.op_type == "moe" and d.inputs["gemm1_weights"].dtype.value.startswith("float8")
    config = CheckConfig(sources=("torch",), sizes=("small",), seeds=(0,), cases=cases, device="cpu",
                         tolerance={"min_cosine": 0.998} if fp8 else {})
    return {r.case: r.status.value for r in run(plan(Discovered([d], []), config), config)
            if r.check in ("match", "edge")}


# -- which definitions get which case -----------------------------------------------------------------------
def test_cases_are_offered_where_they_apply():
    for d in (DS, RENORM_FP8, RENORM_BF16, load_definition(SHIPPED_DS)):
        assert set(MOE_CASES) <= set(edge_cases(d)), d.name
    assert set(GDN_CASES) <= set(edge_cases(load_definition("gdn_prefill_qk4_v8_d128_k_last")))
    assert "empty_sequences" not in edge_cases(load_definition("gdn_decode_qk4_v8_d128_k_last"))
    assert set(MAMBA_CASES) <= set(edge_cases(load_definition("mamba_ssu_decode_h64_d64_s128_ng4")))


# -- moe: the tie-break convention, and each case reaching its boundary ------------------------------------
def _local_routes(d: Definition, x, *, highest: bool) -> list[set[int]]:
    r = routing_params(d)
    bias = x.values.get("routing_bias")
    ids = moe_inputs.route(x.values["routing_logits"], bias, r, highest=highest)
    off, n = int(x.values["local_expert_offset"]), x.axes["num_local_experts"]
    return [{e for e in row.tolist() if off <= e < off + n} for row in ids]


@pytest.mark.parametrize("key", ["ds", "renorm_bf16"])
def test_routing_ties_put_the_tie_where_the_convention_decides(key):
    """Lowest- and highest-id tie-breaks route these tokens to different local experts, and the float64
    ground truth takes the lowest id: the convention the references define."""
    d = MOE_DEFS[key]
    x = generate_inputs(d, "small", 0, case="routing_ties")
    low, high = _local_routes(d, x, highest=False), _local_routes(d, x, highest=True)
    assert low != high
    if key == "ds":
        ids, _ = deepseek_routing(x.values["routing_logits"], x.values["routing_bias"], 8, 8, 4, 2.5)
    else:
        ids, _ = renormalize_routing(x.values["routing_logits"], routing_params(d).top_k)
    off, n = int(x.values["local_expert_offset"]), x.axes["num_local_experts"]
    assert [{e for e in row.tolist() if off <= e < off + n} for row in ids] == low


def test_routing_ties_types():
    """Renormalize: the last token's logits are all equal: experts 0 .. k - 1 with equal weights. Grouped: a
    group tie against a lower group (the other group is kept: nothing local), against a higher one (the local
    group is kept), a top-k tie inside the local group."""
    x = generate_inputs(RENORM_BF16, "small", 0, case="routing_ties")
    ids, w = renormalize_routing(x.values["routing_logits"], 4)
    assert ids[-1].tolist() == [0, 1, 2, 3] and torch.allclose(w[-1], torch.full_like(w[-1], 0.25))
    x = generate_inputs(DS, "medium", 0, case="routing_ties")
    routes = _local_routes(DS, x, highest=False)
    assert [len(r) for r in routes[:-1]] == [0, 1, 1] * 2 + [0]
    assert (x.values["routing_logits"][-1] == 0).all()


def test_extreme_magnitudes_route_every_token_to_the_same_experts():
    x = generate_inputs(RENORM_BF16, "small", 0, case="extreme_magnitudes")
    assert set(x.values["routing_logits"].unique().tolist()) == {-100.0, 100.0}
    assert x.values["hidden_states"].float().abs().amax() > 500  # 256 x N(0, 1)
    x = generate_inputs(DS, "medium", 0, case="extreme_magnitudes")
    routes = _local_routes(DS, x, highest=False)
    assert len(routes[0]) == 1 and all(r == routes[0] for r in routes)


def test_unreached_experts_get_zero_weights():
    x = generate_inputs(RENORM_BF16, "small", 0, case="routing_ties")
    live = {e for row in _local_routes(RENORM_BF16, x, highest=False) + _local_routes(RENORM_BF16, x, highest=True)
            for e in row}
    w1 = x.values["gemm1_weights"]
    drawn = {e for e in range(w1.shape[0]) if w1[e].abs().amax() > 0}
    assert drawn == live and len(live) < w1.shape[0]


def test_fp8_codes_reach_both_ends_of_e4m3_and_stay_order_one():
    x = generate_inputs(RENORM_FP8, "small", 0, case="extreme_magnitudes")
    for name in ("hidden_states", "gemm1_weights", "gemm2_weights"):
        assert not ((x.values[name].view(torch.uint8) & 0x7F) == 0x7F).any()  # no NaN code
    mag = x.values["gemm1_weights"].float().abs()
    assert mag.max() == 448 and ((mag > 0) & (mag < 2**-6)).any()  # the max finite code, subnormals
    scale = x.values["gemm1_weights_scale"]
    assert scale.max() / scale.min() > 1e4
    scale = x.values["hidden_states_scale"]
    block = x.values["hidden_states"].float().view(2, 2, 128) * scale.T[:, :, None]
    rms = block.pow(2).mean(-1).sqrt() / 256
    assert (rms > 0.05).all() and (rms < 20).all()  # every block O(1) once dequantised, times 256


@pytest.mark.parametrize("key", list(MOE_DEFS))
def test_true_moe_references_pass_every_boundary_case(key):
    d = MOE_DEFS[key]
    for case in MOE_CASES:
        ok, why = _passes(d, case)
        assert ok, f"{case}: {why}"


# -- gdn and mamba -------------------------------------------------------------------------------------------
def test_empty_sequences_pass_their_state_through():
    d = load_definition("gdn_prefill_qk4_v8_d128_k_last")
    x = generate_inputs(d, "small", 0, case="empty_sequences")
    cu = x.values["cu_seqlens"].tolist()
    empty = [i for i in range(len(cu) - 1) if cu[i] == cu[i + 1]]
    assert empty and empty[0] == 0 and empty[-1] == len(cu) - 2 and len(empty) < len(cu) - 1
    _, new = torch_gdn.run(d, x.values)
    _, ref_new = run_reference(d, x)
    for i in empty:
        assert torch.equal(new[i], x.values["state"][i].double()) and torch.equal(ref_new[i], x.values["state"][i])


def test_gate_extremes_reach_their_regimes():
    d = load_definition("gdn_decode_qk4_v8_d128_k_last")
    v = generate_inputs(d, "small", 0, case="gate_extremes").values
    pre = v["a"].float() + v["dt_bias"].float()
    assert pre.min() >= 19 and pre.max() > 89  # linear regime, past float32's exp overflow
    log_g, beta = torch_gdn.gates(v)
    assert log_g.exp().min() > 0.5  # tiny A: the decay still near 1
    assert (beta == 1).any() and (beta < 1e-40).any() and ((beta > 0.01) & (beta < 0.99)).any()


def test_mamba_cases_reach_their_regimes():
    d = load_definition("mamba_ssu_decode_h64_d64_s128_ng4")
    v = generate_inputs(d, "small", 0, case="extreme_magnitudes").values
    s = torch.nn.functional.softplus(v["dt"].double() + v["dt_bias"].double())[..., 0]  # per (request, head)
    assert s.max() > 900 and (s < 3e-9).any() and ((s > 1e-4) & (s < 10)).any()  # huge, tiny and usual steps
    neg_a = -v["A"][:, 0, 0].double()
    strong = neg_a >= 1e5
    assert strong.sum() == neg_a.numel() // 2 and strong[0] and (neg_a <= 16).any()
    usual = s[:, strong] > 1e-3
    assert usual.any() and (torch.exp(-s[:, strong] * neg_a[strong])[usual] < 1e-40).all()
    assert v["state"].float().abs().amax() > 2**15  # 2^14 N(0, 1)
    v = generate_inputs(d, "small", 0, case="all_padded").values
    assert (v["state_batch_indices"] == -1).all()
    out, new = run_reference(d, generate_inputs(d, "small", 0, case="all_padded"))
    assert not out.any() and torch.equal(new, v["state"])


@pytest.mark.parametrize("name,cases", [
    ("gdn_decode_qk4_v8_d128_k_last", ("gate_extremes",)),
    ("gdn_mtp_qk4_v8_d128_k_last", ("gate_extremes",)),
    ("gdn_prefill_qk4_v8_d128_k_last", GDN_CASES),
    ("mamba_ssu_decode_h64_d64_s128_ng4", MAMBA_CASES),
])
def test_true_references_pass_every_boundary_case(name, cases):
    d = load_definition(name)
    for case in cases:
        ok, why = _passes(d, case)
        assert ok, f"{case}: {why}"


# -- the planted bugs: right on a random case, wrong on their boundary case -----------------------------------
BOUNDARY_MUTANTS = {  # mutant -> (the definition it runs on here, its boundary case)
    "gdn_decode_qk4_v8_d128_k_last:softplus-overflow": (None, "gate_extremes"),
    "gdn_decode_qk4_v8_d128_k_last:sigmoid-overflow": (None, "gate_extremes"),
    "gdn_prefill_qk4_v8_d128_k_last:empty-sequence-zero-state": (None, "empty_sequences"),
    "mamba_ssu_decode_h64_d64_s128_ng4:softplus-no-linear-branch": (None, "extreme_magnitudes"),
    "mamba_ssu_decode_h64_d64_s128_ng4:fp16-output-products": (None, "extreme_magnitudes"),
    "moe_bf16_renorm_topk10_e512_h2048_i128:ties-highest-id": (RENORM_BF16, "routing_ties"),
    "moe_bf16_renorm_topk10_e512_h2048_i128:softmax-overflow": (RENORM_BF16, "extreme_magnitudes"),
    "moe_bf16_renorm_topk2_e8_h4096_i1792:silu-overflow": (RENORM_BF16, "extreme_magnitudes"),
    f"{SHIPPED_DS}:group-ties-highest-id": (DS, "routing_ties"),
    f"{SHIPPED_DS}:routing-sigmoid-overflow": (DS, "extreme_magnitudes"),
    "moe_fp8_block_scale_renorm_topk8_e128_h2048_i768:fp8-subnormal-flush": (RENORM_FP8, "extreme_magnitudes"),
}


def test_every_boundary_mutant_is_listed():
    listed = {m.name for m in MUTANTS if m.definition.split("_")[0] in ("moe", "gdn", "mamba")}
    assert set(BOUNDARY_MUTANTS) <= listed


@pytest.mark.parametrize("name", list(BOUNDARY_MUTANTS))
def test_boundary_mutant_passes_a_random_case_and_fails_its_boundary(name):
    """The same template's reference, scaled down for MoE: the mutant's edits apply to it unchanged."""
    [m] = [m for m in MUTANTS if m.name == name]
    d, case = BOUNDARY_MUTANTS[name]
    d = mutate(d if d is not None else load_definition(m.definition), m)
    verdicts = _verdicts(d, (case,))
    assert verdicts == {None: "pass", case: "fail"}, verdicts


@pytest.mark.heavy  # 1.3 GiB of fp8 weights per case
def test_grouped_routing_reaches_a_local_expert_at_every_seed():
    """A 2-token DeepSeek case whose 32 local experts are one group of eight: a steered token's boost could lose
    its group to the others (seeds 5 and 7 raised "no token is routed to a local expert", and a fresh seed made
    CI red). The logits are drawn again from their own stream until a token reaches; a seed that reached at
    once keeps its inputs."""
    from flashinfer_trace.dataset import load_definition
    from flashinfer_trace.inputs.moe import route
    from flashinfer_trace.semantics import routing_params

    d = load_definition("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048")
    for seed in (5, 7, 1309935746):
        x = generate_inputs(d, "small", seed, device="cpu")
        offset = int(x.values["local_expert_offset"])
        chosen = route(x.values["routing_logits"], x.values["routing_bias"], routing_params(d))
        assert bool(((chosen >= offset) & (chosen < offset + 32)).any()), seed

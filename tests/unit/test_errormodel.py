"""The error model: rounding where large operands cancel passes, bugs still fail; the planted-bug suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sizes import param

from flashinfer_trace.check import Case, CheckConfig, Discovered, plan, run
from flashinfer_trace.definition import Definition
from flashinfer_trace.mutants import KERNELS, MUTANTS, baseline, first_failure, kill, kill_kernel, kill_rate, mutate
from flashinfer_trace.testing import (
    assert_matches,
    generate_inputs,
    get_ground_truth,
    load_definition,
    run_reference,
)
from flashinfer_trace.verdict.compare import Mismatch, Tolerance, assert_close, diff, tolerance_for
from flashinfer_trace.verdict.errormodel import MODELS, compare_with_model, error_models, error_scales


def _split_k_fp16(a: torch.Tensor, b: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """A gemm kernel as some split-K configurations compute it: each K chunk accumulated in fp32, its
    partial result stored in fp16, the partials summed in fp32, the output rounded to fp16."""
    partials = [(a[:, k:k + chunk].float() @ b[:, k:k + chunk].float().T).half() for k in range(0, a.shape[1], chunk)]
    return torch.stack(partials).float().sum(0).half()


@pytest.fixture(scope="module")
def gemm_case():
    d = load_definition("gemm_n4096_k14336")
    inputs = generate_inputs(d, "small", seed=0, case="large_values")
    return d, inputs, get_ground_truth("torch", d)(inputs)


def test_cancellation_is_precision_not_a_bug(gemm_case):
    d, inputs, expected = gemm_case
    kernel = (_split_k_fp16(inputs.values["A"], inputs.values["B"]),)
    tol = tolerance_for(d)
    with pytest.raises(Mismatch):  # judged against |expected|: the near-zero elements fail
        assert_close(kernel, expected, tolerance=tol, names=list(d.outputs))
    reports = assert_matches(d, inputs, kernel, expected, tol)  # against the operands' scale: rounding
    assert reports[0].widened > 0 and reports[0].error_model.startswith("operand scale")
    assert reports[0].max_abs < 1.0  # (what the model let through is small in absolute terms)


def test_a_bug_still_fails_under_the_operand_scale(gemm_case):
    d, inputs, expected = gemm_case
    a, b = inputs.values["A"], inputs.values["B"]
    k = a.shape[1] * 7 // 8
    dropped = ((a[:, :k].float() @ b[:, :k].float().T).half(),)  # the last eighth of K is missing
    with pytest.raises(Mismatch) as info:
        assert_matches(d, inputs, dropped, expected, tolerance_for(d))
    assert info.value.verdict == "bug"


def test_scales_are_the_sum_of_absolute_products(gemm_case):
    d, inputs, _ = gemm_case
    (scale,) = error_scales(d, inputs)
    a, b = inputs.values["A"].double(), inputs.values["B"].double()
    assert torch.allclose(scale, a.abs() @ b.abs().T)
    assert error_models(d) == [MODELS["gemm"].description]


def test_attention_scales_only_the_output():
    d = load_definition("gqa_paged_decode_h32_kv8_d128_ps1")
    inputs = generate_inputs(d, "small", seed=0)
    out_scale, lse_scale = error_scales(d, inputs)
    expected = get_ground_truth("torch", d)(inputs)[0]
    assert lse_scale is None and out_scale.shape == expected.shape
    assert bool((out_scale >= expected.abs() - 1e-12).all())  # P.|V| >= |P.V|
    assert error_models(d) == [MODELS["gqa_paged"].description, "|expected|"]


def test_families_without_a_model_compare_against_expected():
    d = load_definition("rmsnorm_h4096")
    inputs = generate_inputs(d, "small", seed=0)
    assert error_scales(d, inputs) == [None] and error_models(d) == ["|expected|"]


def test_a_scale_of_the_wrong_shape_is_ignored():
    r = diff(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]), tolerance_for(load_definition("gemm_n128_k2048")),
             scale=torch.ones(3))
    assert r.error_model == "|expected|" and not r.passed


# -- planted bugs -----------------------------------------------------------------------------------------
def test_every_family_has_three_mutants_the_cpu_kills():
    families: dict[str, int] = {}
    for m in MUTANTS:
        if m.survives is None and m.gpu_only is None:
            family = load_definition(m.definition).op_type
            families[family] = families.get(family, 0) + 1
    assert set(families) >= {"rmsnorm", "gemm", "gqa_paged", "gqa_ragged", "mla_paged", "mla_ragged", "rope",
                             "activation", "moe", "sampling"}
    attention = families["gqa_paged"] + families["gqa_ragged"] + families["mla_paged"]
    assert all(n >= 3 for f, n in families.items() if f not in ("gqa_ragged", "mla_paged")) and attention >= 9


def test_edits_apply_to_the_current_references():
    for m in MUTANTS:
        d = load_definition(m.definition)
        assert mutate(d, m).reference != d.reference


# The unit suite kills at the small size (its random cases and every edge case); `flashinfer-trace mutants`
# runs the whole plan (small and medium). A MoE case is its weights (0.3-1.3 GiB), the same at every size.
UNIT_PLAN = {"sizes": ("small",)}


def _by_definition(value, definition: str, id: str):
    """A parameter of one definition's group: `nox -s tests` runs with `--dist loadgroup`, so a definition's mutants
    and its true reference go to one test process, where the true reference's plan (mutants.baseline, the costliest
    part of a kill) runs once instead of once in every process and again in its own test."""
    p = param(value, definition, id)
    return pytest.param(*p.values, id=p.id, marks=[*p.marks, pytest.mark.xdist_group(definition)])


@pytest.mark.parametrize("mutant", [_by_definition(m, m.definition, m.name) for m in MUTANTS])
def test_planted_bug_is_caught_against_torch(mutant):
    k = kill(mutant, "torch", device="cpu", **UNIT_PLAN)
    if mutant.gpu_only:  # planted at the GPU settings' thresholds: judged on a GPU only
        assert k.killed is None and k.how.startswith("not judged on the CPU")
    elif mutant.survives:  # a known gap, kept visible; when something starts catching it, update the entry
        assert k.killed is False, f"{mutant.name} is now caught ({k.how}): drop its `survives`"
    else:
        assert k.killed, f"{mutant.name} ({mutant.bug}) passed every check"


@pytest.mark.parametrize("name", [_by_definition(n, n, n) for n in sorted({m.definition for m in MUTANTS})])
def test_true_reference_passes_the_same_checks(name):
    # the plan every kill of this definition judges against (first_failure's, remembered per process: the
    # definition's mutants in this process ran it already)
    runs, why, _ = baseline(name, "torch", device="cpu", **UNIT_PLAN)
    assert runs, why


def test_kill_rate_counts_only_what_ran():
    from flashinfer_trace.mutants import Kill

    assert kill_rate([Kill("a", "t", True, ""), Kill("b", "t", False, ""), Kill("c", "t", None, "n/a")]) == (1, 2)


def test_reference_of_a_mutant_runs_confined():
    m = next(m for m in MUTANTS if m.name == "gemm_n4096_k4096:negated")
    d = mutate(load_definition(m.definition), m)
    x = generate_inputs(d, "small", seed=0)
    (c,) = run_reference(d, x)
    assert torch.equal(c, -run_reference(load_definition(m.definition), x)[0])


def test_a_ground_truth_that_cannot_run_kills_nothing():
    import importlib.util

    if importlib.util.find_spec("flashinfer") is not None:
        pytest.skip(reason="unsupported: flashinfer is installed here")
    k = kill(MUTANTS[0], "flashinfer")
    assert k.killed is None and k.how.startswith("not-installed")


def test_a_mutant_is_not_judged_where_the_true_reference_fails(monkeypatch):
    """A harness that cannot run references fails every mutant: that is no catch."""
    from flashinfer_trace import mutants

    monkeypatch.setattr(mutants, "_baselines", {})
    monkeypatch.setattr(mutants, "run_plan",
                        lambda d, source, **kw: mutants.PlanRun("shape small seed 0: ReferenceFailure: crash", None))
    k = mutants.kill(MUTANTS[0], "torch")
    assert k.killed is None and k.how.startswith("not judged: the true reference fails too: shape small")
    assert kill_rate([k]) == (0, 0)


def test_the_cli_streams_each_verdict(tmp_path):
    from flashinfer_trace.cli import main

    out = tmp_path / "mutants.jsonl"
    rc = main(["mutants", "--ground-truth", "torch", "--device", "cpu", "--only", "rmsnorm_h4096:eps",
               "--stream", str(out), "--json"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rc == 0 and rows and all(r["killed"] is True and r["ground_truth"] == "torch" for r in rows)
    # the true reference's closest approach is streamed beside the verdict: what a new criterion must keep passing
    assert all(0 <= r["baseline_margin"]["tolerance_used"] <= 1 and r["baseline_margin"]["comparisons"] > 0
               for r in rows)


def test_a_surviving_bug_reports_how_close_it_came():
    """The margin is the data a tighter criterion is chosen from: the bug's over every comparison it passed,
    beside the true reference's against the same ground truth."""
    m = next(m for m in MUTANTS if m.name == "fused_add_rmsnorm_h4096:norm-of-rounded")
    k = kill(m, "torch", sizes=("small",), seeds=(0,))
    assert k.killed is False and k.margin.comparisons == k.baseline_margin.comparisons > 0
    assert k.baseline_margin.tolerance_used < k.margin.tolerance_used <= 1


@pytest.mark.heavy  # the fp8 DeepSeek-routing MoE: 1.3 GiB of weights
def test_the_fp8_cosine_floor_catches_what_the_element_tolerance_cannot():
    """Routing weights from the bias-corrected scores stay inside the fp8 element tolerance; the cosine floor of
    definitions/tolerances.toml catches them, and the true reference passes the same floor."""
    m = next(m for m in MUTANTS if m.id == "biased-weights")
    k = kill(m, "torch", **UNIT_PLAN)
    assert k.killed and "below the floor 0.998" in k.how, k.how
    assert k.baseline_margin.cosine > 0.998 and k.baseline_margin.tolerance_used < 1
    # on the random cases, without the floor, the element tolerance alone lets it through (the tied_topk
    # boundary case, where the bias is most of each weight, catches it by elements as well)
    mutant = mutate(load_definition(m.definition), m)
    assert first_failure(mutant, "torch", tolerance={"min_cosine": 0.0}, cases=(),
                         **UNIT_PLAN) is None


@pytest.mark.parametrize("planted", KERNELS, ids=[k.name for k in KERNELS])
def test_planted_kernel_is_caught(planted):
    """Kernels right on typical inputs and wrong at a boundary, or wrong in one call of ten: the true reference
    judged against them (repeats as on a GPU) must fail somewhere."""
    k = kill_kernel(planted)
    if planted.survives:
        assert k.killed is False, f"{planted.name} is now caught ({k.how}): drop its `survives`"
    else:
        assert k.killed, f"{planted.name} ({planted.bug}) passed every check"


def test_kill_rates_are_kept_per_class():
    from flashinfer_trace.mutants import Kill, PlantedKernel, rates_by_class

    a, b = MUTANTS[0], PlantedKernel("x", "y", "z", lambda fn: fn, "flaky")
    pairs = [(a, Kill("a", "t", True, "")), (b, Kill("b", "t", False, "")), (b, Kill("c", "t", None, ""))]
    assert rates_by_class(pairs) == {a.cls: (1, 1), "flaky": (0, 1)}


# -- the error model's zip() bug: a ground truth with more outputs than the definition declares --------------
FP8_RAGGED = Path(__file__).parent / "fixtures" / "wild" / "gqa_ragged_prefill_causal_fp8_h4_kv2_d16.json"


def fp8_ragged() -> Definition:
    return Definition.model_validate(json.loads(FP8_RAGGED.read_text()))


def test_a_missing_output_is_reported_not_widened_by_the_error_model():
    """The error model used to run on a count mismatch (the reference's 1 output, the ground truth's 2) and
    zip the definition's 1 output with the ground truth's 2: ValueError. A count mismatch is no rounding."""
    d = fp8_ragged()
    x = generate_inputs(d, "small", 0)
    out = torch.zeros(x.axes["total_q"], 4, 16)
    reports = compare_with_model(d, x, (out,), (out, torch.zeros(x.axes["total_q"], 4)), Tolerance(0.1, 0.2))
    assert len(reports) == 1 and not reports[0].passed and "1 output(s) vs 2 expected" in reports[0].problem


def test_the_attention_ground_truth_returns_the_declared_outputs_only():
    d = fp8_ragged()
    x = generate_inputs(d, "small", 0)
    assert x.source == "generator" and x.values["q"].dtype == torch.float8_e4m3fn
    (out,) = get_ground_truth("torch", d, device="cpu")(x)  # no lse: the file declares none
    assert out.shape == (x.axes["total_q"], 4, 16)
    config = CheckConfig(sources=("torch",), sizes=("small",), seeds=(0,), cases=(), device="cpu")
    records = list(run([c for c in plan(Discovered([d], []), config) if isinstance(c, Case)], config))
    assert records and all(r.status == "pass" for r in records), [r.detail for r in records]


# -- MoE: the sums that make each output element, with the activation as it is ------------------------------
def _moe(**params) -> Definition:
    from flashinfer_trace.extract.templates import FAMILIES

    return Definition.model_validate(FAMILIES["moe"](**params))


MOE_BF16 = dict(routing="renormalize", top_k=4, num_experts=16, num_local_experts=16, hidden_size=128,
                intermediate_size=64)


def _blocked(a: torch.Tensor, b: torch.Tensor, block: int) -> torch.Tensor:
    """a @ b.T in float32 in a fixed order, the same on every machine: a running sum k by k within each block of
    K, the blocks' partial sums added in order (a split-K GEMM), every step one rounded multiply and add."""
    total = torch.zeros(a.shape[0], b.shape[0])
    for k0 in range(0, a.shape[1], block):
        part = torch.zeros_like(total)
        for k in range(k0, min(k0 + block, a.shape[1])):
            part = part + a[:, k:k + 1] * b[:, k][None, :]
        total = total + part
    return total


def _moe_float32(values: dict, top_k: int, block: int) -> torch.Tensor:
    """The renormalize bf16 MoE reference's arithmetic (float32 throughout, rounded once to bf16), with GEMM1 in
    split-K blocks of `block` and GEMM2 in one running sum."""
    x = values["hidden_states"].float()
    ranked = values["routing_logits"].float().sort(dim=-1, descending=True, stable=True)
    ids, w = ranked.indices[:, :top_k], torch.softmax(ranked.values[:, :top_k], dim=-1)
    out = torch.zeros(x.shape)
    inter = values["gemm2_weights"].shape[2]
    for e in ids.unique().tolist():
        weight = (w * (ids == e)).sum(dim=1)
        tokens = (weight > 0).nonzero().flatten()  # a weight of exp(-200) = 0 adds nothing
        if tokens.numel():
            h = _blocked(x[tokens], values["gemm1_weights"][e].float(), block)
            act = torch.nn.functional.silu(h[:, inter:]) * h[:, :inter]
            out[tokens] += weight[tokens, None] * _blocked(act, values["gemm2_weights"][e].float(), inter)
    return out.bfloat16()


@pytest.mark.heavy  # 768 MiB of (mostly zero) expert weights
def test_a_moe_element_that_cancels_is_judged_by_the_rounding_of_its_terms():
    """The H200 record of 2026-11-28 (FlashInfer 0.5.3 session, torch ground truth): at extreme_magnitudes, medium,
    seed 0, the reference gave -0.398 at (4, 538) against the float64 -0.384265, beside elements of 1e5: one of
    16384 out of tolerance. The element is 128 terms of up to ~1e4 (sum of their magnitudes 2.1e5) cancelling to
    0.38, and its float32 value depends on the order the GEMMs sum in: the reference's own arithmetic, summed as
    a split-K GEMM does, misses it by 0.022. Judged against |expected| that is a failure; the MoE error model
    (the element's operand scale) passes it, and passes nothing else that failed."""
    d = load_definition("moe_bf16_renorm_topk10_e512_h2048_i128")
    x = generate_inputs(d, "medium", 0, case="extreme_magnitudes")
    expected = get_ground_truth("torch", d)(x)
    assert abs(expected[0][4, 538].item() + 0.384265) < 1e-6  # the record's expected value
    actual = (_moe_float32(x.values, 10, block=256),)
    tol = tolerance_for(d)
    with pytest.raises(Mismatch) as info:  # against |expected| alone
        assert_close(actual, expected, tolerance=tol, names=list(d.outputs))
    (report,) = info.value.reports
    err = abs(report.worst_actual - report.worst_expected)
    assert report.mismatched == 1 and report.worst_index == [4, 538] and err > 0.02
    (scale,) = error_scales(d, x)  # its terms' magnitudes sum to 2.1e5: the error is ~2**-23 of that, float32's
    assert 2e5 < scale[4, 538].item() < 2.2e5 and err < 2.0**-22 * scale[4, 538].item()
    (report,) = assert_matches(d, x, actual, expected, tol)
    assert report.error_model == MODELS["moe"].description and report.widened == 1


@pytest.fixture(scope="module")
def moe_case():
    d = _moe(weights="bfloat16", **MOE_BF16)
    x = generate_inputs(d, "small", 0, case="extreme_magnitudes")
    return d, x, get_ground_truth("torch", d)(x)


def test_moe_scales_are_the_absolute_terms_of_gemm2_and_the_expert_sum(moe_case):
    """Computed here from the routing and the float64 experts, independently of torch_ref.py."""
    d, x, expected = moe_case
    v = {k: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for k, t in x.values.items()}
    ranked = v["routing_logits"].sort(dim=-1, descending=True, stable=True)
    ids, w = ranked.indices[:, :4], torch.softmax(ranked.values[:, :4], dim=-1)
    want = torch.zeros_like(expected[0])
    inter = v["gemm2_weights"].shape[2]
    for t in range(ids.shape[0]):
        for slot in range(4):
            e = int(ids[t, slot])
            h = v["hidden_states"][t] @ v["gemm1_weights"][e].T
            act = torch.nn.functional.silu(h[inter:]) * h[:inter]
            want[t] += w[t, slot] * (act.abs() @ v["gemm2_weights"][e].abs().T)
    (scale,) = error_scales(d, x)
    assert torch.allclose(scale, want, rtol=1e-9, atol=0)
    assert bool((scale >= expected[0].abs() * (1 - 1e-12)).all()) and error_models(d) == [MODELS["moe"].description]


def test_a_moe_bug_still_fails_under_its_operand_scale(moe_case):
    """silu on the first half of GEMM1's rows (flashinfer.activation.silu_and_mul's order, not the definition's)."""
    d, x, expected = moe_case
    mine = _moe(weights="bfloat16", **MOE_BF16)
    swapped = mine.model_copy(update={"reference": mine.reference.replace(
        "up = h[:, :intermediate_size]", "up = h[:, intermediate_size:]").replace(
        "gate = h[:, intermediate_size:]", "gate = h[:, :intermediate_size]")})
    assert swapped.reference != mine.reference
    with pytest.raises(Mismatch) as info:
        assert_matches(d, x, run_reference(swapped, x), expected, tolerance_for(d))
    assert info.value.reports[0].error_model == MODELS["moe"].description


def test_fp8_moe_keeps_its_fp8_tolerance():
    d = _moe(weights="fp8_block_scale", routing="renormalize", top_k=8, num_experts=32, num_local_experts=32,
             hidden_size=256, intermediate_size=128)
    assert error_scales(d, generate_inputs(d, "small", 0)) == [None] and error_models(d) == ["|expected|"]

"""The deterministic sampling filters (top_k_renorm_probs, top_p_renorm_probs, top_k_mask_logits:
inputs/topk.py, groundtruth/torch_topk.py, flashinfer_topk.py, sglang_topk.py, mutants_topk.py,
docs/boundary/topk.md): routing, each boundary case builds what it names, typical cases hold no tie at the
cut, the float64 truth against hand-computed values, the adapters' gating with fake modules, and each
planted bug passing a typical case and failing its boundary. On a 1024-token vocabulary (the shipped
definitions with vocab_size replaced), so it runs in seconds; the reference suite runs the shipped ones."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path

import pytest
import torch
from packaging.version import Version

from flashinfer_trace.check import CheckConfig, Discovered, plan, run
from flashinfer_trace.dataset import load_definition
from flashinfer_trace.definition import Definition
from flashinfer_trace.groundtruth import GroundTruthUnavailable, base, get_ground_truth, paths
from flashinfer_trace.groundtruth.base import Call
from flashinfer_trace.groundtruth.torch_topk import top_k_mask, top_k_renorm, top_p_renorm
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.inputs.registry import family_for
from flashinfer_trace.inputs.topk import P_MARGIN, cut_masses, kind
from flashinfer_trace.mutants import mutate
from flashinfer_trace.mutants_topk import MUTANTS
from flashinfer_trace.testing import run_reference, tolerance_for
from flashinfer_trace.verdict import judge
from flashinfer_trace.verdict.contract import reconsider

ROOT = Path(__file__).resolve().parents[2] / "definitions" / "sampling"
VOCAB = 1024
TOPK_K, TOPK_K_BF16 = "top_k_renorm_probs_v128256", "top_k_renorm_probs_v151936_bf16"
TOPP, TOPP_SCALAR = "top_p_renorm_probs_v151936", "top_p_renorm_probs_v32000"
MASK, MASK_BF16 = "top_k_mask_logits_v128256", "top_k_mask_logits_v32000_bf16"
SHIPPED = (TOPK_K, TOPK_K_BF16, TOPP, TOPP_SCALAR, MASK, MASK_BF16)


def small(name: str, vocab: int = VOCAB) -> Definition:
    data = json.loads((ROOT / f"{name}.json").read_text())
    data["axes"]["vocab_size"]["value"] = vocab
    return Definition.model_validate(data)


def inputs(name: str, case: str | None = None, size: str = "small", seed: int = 0):
    return generate_inputs(small(name), size, seed, case=case)


def _dist(x) -> torch.Tensor:
    return (x.values["probs"] if "probs" in x.values else x.values["logits"]).to(torch.float64)


def _per_row(x, name: str) -> list:
    v = x.values[name]
    rows = _dist(x).shape[0]
    return v.tolist() if isinstance(v, torch.Tensor) else [v] * rows


# -- routing and the cases offered -----------------------------------------------------------------------------
def test_the_filters_get_this_generator_and_the_samplers_keep_theirs():
    for name in SHIPPED:
        assert family_for(load_definition(name)).name == "topk", name
    assert family_for(load_definition("top_k_sampling_from_probs_v32000")).name == "sampling"
    data = json.loads((ROOT / f"{MASK}.json").read_text())  # FlashInfer's fi_trace softmax: logits + temperature
    data["inputs"]["temperature"] = data["inputs"].pop("top_k")
    d = Definition.model_validate(data)
    assert kind(d) is None and family_for(d).name == "sampling"


def test_each_filter_lists_the_cases_its_inputs_have():
    assert edge_cases(small(TOPK_K)) == ["ties_at_cut", "uniform", "top_k_1", "one_hot", "last_token",
                                         "filters_off", "tiny_probs"]
    assert edge_cases(small(TOPP)) == ["ties_at_cut", "uniform", "top_p_exact", "one_hot", "last_token",
                                       "filters_off", "tiny_probs"]
    assert edge_cases(small(MASK)) == ["ties_at_cut", "uniform", "top_k_1", "filters_off", "lowest_logits",
                                       "extreme_logits"]


# -- typical cases: no tie at the cut, top_p away from every cumulative mass ------------------------------------
@pytest.mark.parametrize("name", [TOPK_K, TOPK_K_BF16, MASK, MASK_BF16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_typical_top_k_has_distinct_values_either_side_of_the_cut(name, seed):
    x = inputs(name, seed=seed)
    s = torch.sort(_dist(x), dim=-1, descending=True).values
    for r, k in enumerate(_per_row(x, "top_k")):
        assert 1 <= k < VOCAB and s[r, k - 1] > s[r, k], (r, k)


@pytest.mark.parametrize("name", [TOPP, TOPP_SCALAR])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_typical_top_p_is_away_from_every_cut_mass(name, seed):
    x = inputs(name, seed=seed)
    for r, p in enumerate(_per_row(x, "top_p")):
        assert 0 < p < 1 and float((cut_masses(x.values["probs"][r]) - p).abs().min()) >= P_MARGIN


# -- each boundary case builds what it names -------------------------------------------------------------------
def test_ties_at_cut_straddle_the_cut():
    x = inputs(TOPK_K, "ties_at_cut")
    s = torch.sort(_dist(x), dim=-1, descending=True).values
    for r, k in enumerate(_per_row(x, "top_k")):
        assert s[r, k - 1] == s[r, k] and s[r, 0] > s[r, 1]  # the k-th is tied with the next; the tie starts at 2nd
    x = inputs(TOPP, "ties_at_cut")
    for r, p in enumerate(_per_row(x, "top_p")):
        row = _dist(x)[r]
        tie = torch.sort(row, descending=True).values[1]
        before = float(row[row > tie].sum())
        assert before < p < before + float(row[row == tie].sum()) and int((row == tie).sum()) >= 12


def test_uniform_rows_are_one_tie_and_exact_top_p_is_a_cut_mass():
    x = inputs(MASK, "uniform")
    assert all(bool((row == row[0]).all()) for row in _dist(x))
    x = inputs(TOPP, "top_p_exact")
    for r, p in enumerate(_per_row(x, "top_p")):
        assert float((cut_masses(x.values["probs"][r]) - p).abs().min()) == 0.0


def test_one_hot_last_token_filters_off_and_tiny_probs():
    x = inputs(TOPK_K, "one_hot")
    assert ((_dist(x) > 0).sum(dim=-1) == 1).all()
    x = inputs(TOPP, "last_token")
    assert (_dist(x)[:, VOCAB - 1] >= 0.75).all()
    x = inputs(TOPK_K, "filters_off")
    assert all(k >= VOCAB for k in _per_row(x, "top_k")) and 2**31 - 1 in _per_row(x, "top_k")
    assert all(p == 1.0 for p in _per_row(inputs(TOPP, "filters_off"), "top_p"))
    p = inputs(TOPK_K, "tiny_probs").values["probs"]
    assert bool(((p > 0) & (p < torch.finfo(torch.float32).tiny)).any())


def test_logit_cases_reach_the_dtype_limits():
    for name in (MASK, MASK_BF16):
        x = inputs(name, "lowest_logits")
        logits = x.values["logits"]
        lowest = logits == torch.finfo(logits.dtype).min
        assert bool(lowest.any()) and torch.isfinite(logits).all()
        ks = _per_row(x, "top_k")
        s = torch.sort(logits.to(torch.float64), dim=-1, descending=True).values
        assert all(s[r, k - 1] > s[r, k] for r, k in enumerate(ks))  # no tie at the cut, lowest block included
        x = inputs(name, "extreme_logits")
        assert float(x.values["logits"].abs().max()) > 2.0**100
    assert _per_row(inputs(MASK, "top_k_1"), "top_k") == [1, 1]


# -- the float64 truth against hand-computed values ------------------------------------------------------------
def _truth(fn, name: str, **values):
    d = small(name, 4)
    return fn(Call(d, types.SimpleNamespace(values=values), None, None))[0]


def test_top_k_renorm_keeps_ties_whole_and_renormalises():
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.3, 0.1, 0.3, 0.3]])
    out = _truth(top_k_renorm, TOPK_K, probs=probs, top_k=torch.tensor([2, 2], dtype=torch.int32))
    assert torch.allclose(out, torch.tensor([[4 / 7, 3 / 7, 0, 0], [1 / 3, 0, 1 / 3, 1 / 3]], dtype=torch.float64))
    for off in (0, 4, 5, 2**31 - 1):  # filter off: the row itself, renormalised
        assert torch.allclose(_truth(top_k_renorm, TOPK_K, probs=probs, top_k=off), probs.double())


def test_top_p_renorm_is_strict_and_decides_ties_by_value():
    probs = torch.tensor([[0.5, 0.25, 0.125, 0.125]])
    assert torch.equal(_truth(top_p_renorm, TOPP, probs=probs, top_p=0.75),  # 0.125 has exactly 0.75 before it
                       torch.tensor([[2 / 3, 1 / 3, 0, 0]], dtype=torch.float64))
    assert torch.equal(_truth(top_p_renorm, TOPP, probs=probs, top_p=0.76), probs.double())  # the tie kept whole
    assert torch.equal(_truth(top_p_renorm, TOPP, probs=probs, top_p=torch.tensor([0.01])),
                       torch.tensor([[1.0, 0, 0, 0]], dtype=torch.float64))  # the most probable token always kept
    assert torch.equal(_truth(top_p_renorm, TOPP, probs=probs, top_p=1.0), probs.double())


def test_top_k_mask_sets_the_rest_to_minus_infinity():
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0], [0.0, -1.0, 5.0, -2.0]])
    inf = float("-inf")
    out = _truth(top_k_mask, MASK, logits=logits, top_k=torch.tensor([2, 1], dtype=torch.int32))
    assert torch.equal(out, torch.tensor([[3.0, inf, 2.0, 2.0], [inf, inf, 5.0, inf]], dtype=torch.float64))
    assert torch.equal(_truth(top_k_mask, MASK, logits=logits, top_k=4), logits.double())


# -- the adapters' gating (fake modules: no GPU, no FlashInfer here) -------------------------------------------
def _fake(monkeypatch, name: str, version: str, **attrs):
    module = types.ModuleType(name)
    module.__version__ = version
    for k, v in attrs.items():
        setattr(module, k, v)
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(base, "installed_version", lambda package: Version(version))
    monkeypatch.setattr(base, "_imported", {})
    monkeypatch.setattr(base, "cuda_capability", lambda device: (9, 0) if str(device).startswith("cuda") else None)
    return module


def _renorm_k(seen):
    def top_k_renorm_probs(probs, top_k):
        seen.append(top_k)
        x = types.SimpleNamespace(values={"probs": probs, "top_k": top_k})
        return top_k_renorm(Call(small(TOPK_K), x, None, None))[0].to(torch.float32)  # float32, as before 0.6
    return top_k_renorm_probs


def test_flashinfer_gating_without_the_package_or_the_api(monkeypatch):
    d = small(TOPK_K)
    if base.installed_version(base.Package("flashinfer", ("flashinfer-python", "flashinfer"), "flashinfer")) is None:
        with pytest.raises(GroundTruthUnavailable, match="not-installed: flashinfer"):
            get_ground_truth("flashinfer", d, device="cuda")
    _fake(monkeypatch, "flashinfer", "0.1.6", sampling=types.SimpleNamespace(top_k_renorm_prob=None))
    with pytest.raises(GroundTruthUnavailable, match="api-missing: .*0.1.6 has no flashinfer.sampling.top_k_renorm"):
        get_ground_truth("flashinfer", d, device="cuda")
    _fake(monkeypatch, "flashinfer", "0.6.6", sampling=types.SimpleNamespace())
    with pytest.raises(GroundTruthUnavailable, match="api-missing: .*has no sampling.top_k_renorm_probs"):
        get_ground_truth("flashinfer", d, device="cuda")
    _fake(monkeypatch, "flashinfer", "0.6.6", sampling=types.SimpleNamespace(top_k_renorm_probs=_renorm_k([])))
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        get_ground_truth("flashinfer", d, device="cpu")
    assert get_ground_truth("flashinfer", d, device="cuda").api == "flashinfer.sampling.top_k_renorm_probs"


def test_flashinfer_call_modes_and_output_dtype(monkeypatch):
    seen: list = []
    _fake(monkeypatch, "flashinfer", "0.5.3", sampling=types.SimpleNamespace(top_k_renorm_probs=_renorm_k(seen)))
    d = small(TOPK_K_BF16)  # a scalar top_k, bfloat16 probs
    assert paths("flashinfer", d) == [None, "per-row", "plan-reuse", "graph"]
    x = inputs(TOPK_K_BF16)
    plain = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda"), device="cpu")(x)[0]
    row = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path="per-row"), device="cpu")(x)[0]
    assert isinstance(seen[0], int) and seen[1].dtype == torch.int32 and seen[1].shape == (x.values["probs"].shape[0],)
    assert plain.dtype == torch.bfloat16 and torch.equal(plain, row)  # float32 result rounded to the definition's
    reuse = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path="plan-reuse"), device="cpu")(x)
    assert torch.equal(reuse[0], plain)  # the second call follows the case's data


def test_flashinfer_deterministic_mode_needs_0_6_7(monkeypatch):
    d = small(TOPP)
    assert paths("flashinfer", d) == [None, "deterministic", "plan-reuse", "graph"]

    def old(probs, top_p):
        return probs

    calls = []

    def new(probs, top_p, is_deterministic=False):
        calls.append(is_deterministic)
        return probs

    x = inputs(TOPP)
    _fake(monkeypatch, "flashinfer", "0.6.6", sampling=types.SimpleNamespace(top_p_renorm_probs=old))
    gt = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path="deterministic"), device="cpu")
    with pytest.raises(GroundTruthUnavailable, match="api-missing: .*has no is_deterministic"):
        gt(x)
    _fake(monkeypatch, "flashinfer", "0.6.7", sampling=types.SimpleNamespace(top_p_renorm_probs=new))
    dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path="deterministic"), device="cpu")(x)
    assert calls == [True]


def test_sglang_gating_and_the_samplers_adapters_leave_the_filters_alone(monkeypatch):
    _fake(monkeypatch, "sgl_kernel", "0.3.9", top_k_renorm_prob=lambda probs, k: probs.float())
    gt = get_ground_truth("sglang", small(TOPK_K), device="cuda")
    assert gt.api == "sgl_kernel.top_k_renorm_prob"
    with pytest.raises(GroundTruthUnavailable, match="api-missing: .*has no top_k_mask_logits"):
        get_ground_truth("sglang", small(MASK), device="cuda")
    assert paths("sglang", small(MASK_BF16)) == [None, "per-row"]
    sampler = load_definition("top_k_sampling_from_probs_v32000")
    assert get_ground_truth("torch", sampler, device="cpu").adapter.kind == "sampler"
    assert get_ground_truth("torch", small(TOPK_K), device="cpu").adapter.kind == "exact"


# -- the planted bugs: right on a typical case, wrong on their boundary ----------------------------------------
BOUNDARY = {  # mutant -> the case that catches it (None: plain wrong math, caught on the typical case)
    f"{TOPK_K}:ties-by-rank": "ties_at_cut",
    f"{TOPK_K}:whole-row-mass": None,
    f"{TOPK_K_BF16}:last-token-dropped": "last_token",
    f"{TOPP}:le-top-p": "top_p_exact",
    f"{TOPP_SCALAR}:ties-by-rank": "ties_at_cut",
    f"{TOPP_SCALAR}:crossing-token-dropped": None,
    f"{MASK}:lowest-not-inf": None,
    f"{MASK_BF16}:float16-compute": "extreme_logits",
    f"{MASK_BF16}:ties-by-rank": "ties_at_cut",
}


def _verdicts(d: Definition, cases: tuple[str, ...]) -> dict[str | None, str]:
    config = CheckConfig(sources=("torch",), sizes=("small",), seeds=(0,), cases=cases, device="cpu")
    return {r.case: r.status.value for r in run(plan(Discovered([d], []), config), config)
            if r.check in ("match", "edge")}


def test_every_mutant_is_listed():
    assert {m.name for m in MUTANTS} == set(BOUNDARY)


@pytest.mark.parametrize("name", list(BOUNDARY))
def test_mutant_passes_a_typical_case_and_fails_its_boundary(name):
    [m] = [m for m in MUTANTS if m.name == name]
    case = BOUNDARY[name]
    d = mutate(small(m.definition), m)
    verdicts = _verdicts(d, (case,) if case else ())
    assert verdicts == ({None: "pass", case: "fail"} if case else {None: "fail"}), verdicts


@pytest.mark.parametrize("name", SHIPPED)
def test_true_references_pass_every_case_at_the_small_vocabulary(name):
    d = small(name)
    verdicts = _verdicts(d, tuple(edge_cases(d)))
    assert set(verdicts.values()) == {"pass"} and len(verdicts) == 1 + len(edge_cases(d)), verdicts


# -- ties are outside the documented contract (verdict/contract.toml, ties-at-cut) ------------------------------
API = {TOPK_K: "top_k_renorm_probs", TOPP_SCALAR: "top_p_renorm_probs", MASK_BF16: "top_k_mask_logits"}


@pytest.mark.parametrize(("name", "case"), [(TOPK_K, "ties_at_cut"), (TOPK_K, "uniform"), (TOPP_SCALAR, "ties_at_cut"),
                                            (MASK_BF16, "ties_at_cut"), (MASK_BF16, "uniform")])
def test_a_kernel_keeping_ties_by_id_is_info_and_any_other_difference_stays_red(name, case):
    d = small(name)
    x = generate_inputs(d, "small", 0, case=case)
    [rank] = [m for m in MUTANTS if m.definition == name and m.id == "ties-by-rank"]
    stable = ("torch.sort(p, dim=-1, descending=True)", "torch.sort(p, dim=-1, descending=True, stable=True)")
    if stable[0] in d.reference:  # top-p's rank rule, with equal values in id order (the model's order)
        rank = dataclasses.replace(rank, edits=(*rank.edits, stable))
    kernel = run_reference(mutate(d, rank), x)  # what a kernel keeping exactly k by a stable rank returns
    tol = tolerance_for(d)
    gt = {"source": "flashinfer", "api": f"flashinfer.sampling.{API[name]}", "version": "0.6.6"}

    def rerun(seen):
        return run_reference(d, seen)

    differs = not judge(d, x, run_reference(d, x), kernel, tol).passed
    decision = reconsider(d, case, gt, x, kernel, tol, rerun)
    assert differs and decision is not None and decision.explained, decision and decision.detail("x")
    wrong = tuple(torch.where(t.isfinite(), t * 1.25, t) if t.is_floating_point() else t for t in kernel)
    assert not reconsider(d, case, gt, x, wrong, tol, rerun).explained  # a kernel wrong otherwise stays red
    assert reconsider(d, case, {**gt, "source": "torch"}, x, kernel, tol, rerun) is None  # ours promises it
    assert reconsider(d, "top_k_1" if "top_k" in d.inputs else "top_p_exact", gt, x, kernel, tol, rerun) is None

"""The samplers of inputs/samplers.py (min_p_sampling_from_probs, sampling_from_probs, sampling_from_logits,
top_k_top_p_sampling_from_logits: groundtruth/torch_samplers.py, flashinfer_samplers.py, sglang_samplers.py,
mutants_samplers.py, docs/boundary/samplers.md): routing, each boundary case builds what it names, the float64
distribution and its bands against hand-computed values, the true references pass every case, the adapters' gating
and call modes with fake modules, generator replay judged as a bug, and each planted bug passing a typical case and
failing its boundary. On a 1024-token vocabulary (the shipped definitions with vocab_size replaced) so it runs in
seconds; the reference suite runs the shipped ones."""

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
from flashinfer_trace.groundtruth.torch_samplers import MIN_P_SLACK, bands, distributions, exact_threshold
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.inputs.registry import family_for
from flashinfer_trace.inputs.samplers import EXACT_ROWS, HUGE_SHIFTS, kind
from flashinfer_trace.mutants import mutate
from flashinfer_trace.mutants_samplers import MUTANTS
from flashinfer_trace.verdict.samples import SamplingSettings, check_sampler, target

ROOT = Path(__file__).resolve().parents[2] / "definitions" / "sampling"
VOCAB = 1024
MIN_P, MIN_P_SCALAR = "min_p_sampling_from_probs_v128256", "min_p_sampling_from_probs_v151936"
PLAIN, PLAIN_32K = "sampling_from_probs_v128256", "sampling_from_probs_v32000"
LOGITS, LOGITS_BF16 = "sampling_from_logits_v128256", "sampling_from_logits_v151936_bf16"
TKTP, TKTP_SCALAR = "top_k_top_p_sampling_from_logits_v128256", "top_k_top_p_sampling_from_logits_v151936"
SHIPPED = (MIN_P, MIN_P_SCALAR, PLAIN, PLAIN_32K, LOGITS, LOGITS_BF16, TKTP, TKTP_SCALAR)
EDGE = SamplingSettings.cpu(edge=True)


def small(name: str, vocab: int = VOCAB) -> Definition:
    data = json.loads((ROOT / f"{name}.json").read_text())
    data["axes"]["vocab_size"]["value"] = vocab
    return Definition.model_validate(data)


def inputs(name: str, case: str | None = None, size: str = "small", seed: int = 0, vocab: int = VOCAB):
    return generate_inputs(small(name, vocab), size, seed, case=case)


def q_of(x) -> torch.Tensor:
    return distributions(x.values, [(0.0, 1.0)])[0]


# -- routing, the shipped files and the cases offered --------------------------------------------------------------
def test_the_new_samplers_get_this_generator_and_the_others_keep_theirs():
    for name in SHIPPED:
        d = load_definition(name)
        assert family_for(d).name == "samplers" and kind(d) is not None, name
        assert f"fi_api:flashinfer.sampling.{name.rsplit('_v', 1)[0]}" in d.tags and "coverage:samplers" in d.tags
        assert d.outputs["samples"].dtype.value == "int32"  # as FlashInfer returns them
    assert family_for(load_definition("top_k_top_p_sampling_from_probs_v32000")).name == "sampling"
    assert family_for(load_definition("top_k_mask_logits_v32000_bf16")).name == "topk"
    data = json.loads((ROOT / f"{MIN_P}.json").read_text())  # FlashInfer's fi_trace file: an optional indices input
    data["inputs"]["indices"] = {"shape": ["num_indices"], "dtype": "unknown", "optional": True}
    data["axes"]["num_indices"] = {"type": "var"}
    d = Definition.model_validate(data)
    assert kind(d) is None and family_for(d).name == "sampling"
    x = inputs(MIN_P)  # its own target would ignore min_p: none, the two samplers' draws compared instead
    assert target(d, dataclasses.replace(x, values={**x.values, "indices": None}), 1e-4) is None
    assert get_ground_truth("torch", small(MIN_P), device="cpu").api.startswith("softmax / min-p")


def test_each_kind_lists_the_cases_its_inputs_have():
    assert edge_cases(small(PLAIN)) == ["uniform", "one_hot", "last_token", "tiny_probs"]
    assert edge_cases(small(MIN_P)) == ["min_p_zero", "min_p_one", "min_p_exact", "uniform", "one_hot", "last_token",
                                        "tiny_probs"]
    assert edge_cases(small(LOGITS)) == ["neg_inf_logits", "huge_logits", "uniform", "one_hot", "last_token",
                                         "tiny_probs"]
    assert len(edge_cases(small(TKTP))) == 11 and "filter_order" in edge_cases(small(TKTP_SCALAR))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_case_generates_at_every_size(name):
    d = small(name)
    for case in [None, *edge_cases(d)]:
        for size in ("small", "medium", "large"):
            x = generate_inputs(d, size, 0, case=case)  # shapes, dtypes, constraints, finiteness (-inf allowed)
            dist = x.values["logits"] if "logits" in x.values else x.values["probs"]
            assert not dist.isnan().any() and not dist.isposinf().any()
            assert (dist.float().max(dim=1).values > float("-inf")).all()


def test_typical_parameters_disable_some_rows_but_never_the_scalar():
    x = inputs(MIN_P, size="large")
    assert (x.values["min_p"] == 0).any() and (x.values["min_p"] > 0).any()
    for seed in range(8):
        assert generate_inputs(small(MIN_P_SCALAR), "small", seed).values["min_p"] > 0
        y = generate_inputs(small(TKTP_SCALAR), "small", seed).values
        assert 0 < y["top_k"] < VOCAB and y["top_p"] < 1


# -- what the contract keeps (the float64 truth) --------------------------------------------------------------------
@pytest.mark.parametrize("name", [MIN_P, MIN_P_SCALAR])
def test_min_p_zero_keeps_every_token_of_positive_probability(name):
    x = inputs(name, "min_p_zero")
    q, probs = q_of(x), x.values["probs"]
    assert torch.equal(q > 0, probs > 0) and (probs == 0).any()
    assert torch.allclose(q, probs.double() / probs.double().sum(dim=1, keepdim=True))
    assert (probs < 0.1 * probs.max(dim=1, keepdim=True).values).sum() > VOCAB  # a default would cut much
    assert not target(small(name), x, 1e-4).filtering.any()


def test_min_p_one_keeps_only_the_most_probable_tokens():
    x = inputs(MIN_P, "min_p_one")
    q, probs = q_of(x), x.values["probs"]
    assert int((q[0] > 0).sum()) == 1 and int(q[0].argmax()) == int(probs[0].argmax())
    top = probs[1] == probs[1].max()
    assert 3 <= int(top.sum()) <= 5 and torch.equal(q[1] > 0, top)  # the tie at the maximum kept whole, alike
    assert torch.allclose(q[1][top], torch.full((int(top.sum()),), 1 / int(top.sum()), dtype=torch.float64))


def test_min_p_exact_keeps_the_tokens_on_the_threshold_with_no_band():
    x = inputs(MIN_P, "min_p_exact")
    assert exact_threshold(x.values).all()
    q, wide, narrow, exact = bands(x.values, 1e-4)
    assert exact.all() and torch.equal(wide > 0, narrow > 0) and torch.equal(q > 0, wide > 0)
    for r, (top, n_tie, tie, _, low) in enumerate(EXACT_ROWS):
        row = x.values["probs"][r].double()
        assert float(row.max()) == top and float(x.values["min_p"][r]) * top == tie
        assert int((q[r] > 0).sum()) == 1 + n_tie and not (q[r][row == low] > 0).any()
        assert float(q[r][row == tie].sum()) == pytest.approx(n_tie * tie / (top + n_tie * tie))


def test_a_min_p_threshold_that_float32_rounds_gets_a_relative_band():
    probs = torch.tensor([[0.45, 0.27, 0.2, 0.08]], dtype=torch.float32)
    # float32 0.45 * 0.6 is not a float32: the kernel's threshold rounds, and the token float32(0.27), 2.6e-8 of it
    # above the exact product, sits inside the band: allowed, not counted
    values = {"probs": probs, "min_p": torch.tensor([0.6], dtype=torch.float32)}
    assert not exact_threshold(values).all()
    q, wide, narrow, exact = bands(values, 1e-4)
    assert not exact[0] and (q[0] > 0).tolist() == [True, True, False, False]
    assert (wide[0] > 0).tolist() == [True, True, False, False] and (narrow[0] > 0).tolist() == [True] + [False] * 3
    values["min_p"] = torch.tensor([0.5], dtype=torch.float32)  # 0.45 / 2: exact, and no token on it
    q, wide, narrow, exact = bands(values, 1e-4)
    assert exact[0] and torch.equal(wide > 0, narrow > 0) and (q[0] > 0).tolist() == [True, True, False, False]
    assert MIN_P_SLACK < 1e-5


def test_tiny_probs_under_min_p():
    x = inputs(MIN_P, "tiny_probs")
    q, probs = q_of(x), x.values["probs"]
    assert torch.equal(q[0] > 0, probs[0] > 0)  # min_p 0: every nonzero token
    assert int((q[1] > 0).sum()) == 4 + 16  # threshold 1e-35: the tiny normals, no subnormal
    assert int((q[2] > 0).sum()) == 3  # 0.4, 0.3, and 0.2 exactly on 0.5 * 0.4
    assert bands(x.values, 1e-4)[3][2]  # that threshold is exact in float32: no band


def test_logits_are_their_float64_softmax_and_minus_inf_is_never_drawn():
    x = inputs(LOGITS, "neg_inf_logits")
    logits = x.values["logits"]
    assert logits.isneginf().float().mean(dim=1).tolist() == pytest.approx([0.5, 0.99], abs=0.01)
    q = q_of(x)
    assert torch.allclose(q, torch.softmax(logits.double(), dim=-1), rtol=1e-12, atol=0)
    assert torch.equal(q > 0, logits > float("-inf"))
    t = target(small(LOGITS), x, 1e-4)
    assert not t.filtering.any() and torch.equal(t.allowed, logits > float("-inf"))


def test_huge_logits_have_the_distribution_of_their_differences():
    x = inputs(LOGITS, "huge_logits")
    logits = x.values["logits"].double()
    assert [float(r.max()) > s - 30 for r, s in zip(logits, HUGE_SHIFTS, strict=True)] == [True] * 3
    assert torch.isinf(torch.exp(logits.float())).any() and (torch.exp(logits.float()) == 0).any()
    q = q_of(x)
    assert torch.allclose(q, torch.softmax(logits - logits.max(dim=1, keepdim=True).values, dim=-1), rtol=1e-12)
    assert not q.isnan().any()


def test_top_k_over_logits_keeps_a_tie_whole_and_top_p_reads_the_renormalised_mass():
    x = inputs(TKTP, "ties_at_cut")
    logits, q = x.values["logits"], q_of(x)
    r = 0  # the row cut by top_k inside a tie
    k = int(x.values["top_k"][r])
    kth = torch.sort(logits[r], descending=True).values[k - 1]
    assert int((logits[r] == kth).sum()) >= 12 and torch.equal(q[r] > 0, logits[r] >= kth)
    y = inputs(TKTP, "filter_order")
    qy = q_of(y)
    for r in range(2):
        k, p = int(y.values["top_k"][r]), float(y.values["top_p"][r])
        kept = int((qy[r] > 0).sum())
        assert kept < k  # the nucleus of the renormalised top-k: the raw top-k mass is far below top_p
        assert float(torch.softmax(y.values["logits"][r].double(), -1).topk(k).values.sum()) < p


def test_the_verdict_band_for_logits_is_the_top_p_slack():
    x = inputs(TKTP)
    q, wide, narrow, exact = bands(x.values, 1e-4)
    assert not exact.any() and (wide >= narrow).all()
    assert ((wide > 0).sum(dim=1) >= (q > 0).sum(dim=1)).all() and ((narrow > 0).sum(dim=1) <= (q > 0).sum(dim=1)).all()


# -- the true references pass every case ------------------------------------------------------------------------
@pytest.mark.parametrize("name", SHIPPED)
def test_true_references_pass_every_case_at_the_small_vocabulary(name):
    d = small(name)
    gt = get_ground_truth("torch", d, device="cpu")
    for case in [None, *edge_cases(d)]:
        report = check_sampler(d, generate_inputs(d, "small", 0, case=case), gt,
                               SamplingSettings.cpu(edge=case is not None), 0)
        assert report.passed, (case, report.summary())


# -- the planted bugs: right on a typical case, wrong on their boundary -------------------------------------------
BOUNDARY = {  # mutant -> (the case that catches it, its status there; None: the typical case)
    f"{MIN_P}:relative-to-one": ("min_p_one", "error"),  # min_p past every probability: nothing kept, it raises
    f"{MIN_P}:strict-threshold": ("min_p_exact", "fail"),
    f"{MIN_P_SCALAR}:not-renormalised": (None, "fail"),
    f"{MIN_P_SCALAR}:zero-min-p-default": ("min_p_zero", "fail"),
    f"{PLAIN_32K}:last-token-dropped": ("last_token", "error"),  # the one-hot last row has no mass left
    f"{PLAIN_32K}:probs-as-logits": (None, "fail"),
    f"{LOGITS}:no-max-subtraction": ("huge_logits", "error"),  # inf / inf: NaN probabilities
    f"{LOGITS}:neg-inf-zeroed": ("neg_inf_logits", "fail"),
    f"{LOGITS_BF16}:float16-compute": ("huge_logits", "error"),
    f"{TKTP}:ties-by-rank": ("uniform", "fail"),
    f"{TKTP}:top-p-on-raw-softmax": ("filter_order", "fail"),
    f"{TKTP_SCALAR}:no-max-subtraction": ("huge_logits", "error"),
}


def _verdicts(d: Definition, cases: tuple[str, ...]) -> dict[str | None, str]:
    config = CheckConfig(sources=("torch",), sizes=("small",), seeds=(0,), cases=cases, device="cpu")
    return {r.case: r.status.value for r in run(plan(Discovered([d], []), config), config)
            if r.check in ("match", "edge")}


def test_every_mutant_is_listed():
    assert {m.name for m in MUTANTS} == set(BOUNDARY)
    assert {m.cls for m in MUTANTS} == {"wrong-math", "boundary-parameter", "boundary-index", "boundary-magnitude",
                                        "boundary-structure", "boundary-ties"}


@pytest.mark.parametrize("name", list(BOUNDARY))
def test_mutant_passes_a_typical_case_and_fails_its_boundary(name):
    [m] = [m for m in MUTANTS if m.name == name]
    case, status = BOUNDARY[name]
    d = mutate(small(m.definition), m)
    verdicts = _verdicts(d, (case,) if case else ())
    assert verdicts == ({None: "pass", case: status} if case else {None: status}), verdicts


# -- the adapters (fake modules: no GPU, no FlashInfer here) ------------------------------------------------------
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


def _draw(dist_name: str, dist, params: dict, indices, generator, seed, offset):
    """What a correct kernel draws: the float64 distribution, one token a row (a generator of its own for seed
    and offset)."""
    q = distributions({dist_name: dist, **params}, [(0.0, 1.0)])[0]
    if indices is not None:
        q = q[indices.long()]
    if seed is not None:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + offset)
    return torch.multinomial(q, 1, generator=generator).squeeze(1).to(torch.int32)


def fake_apis(calls: list, *, seed_offset: bool = True, generator_ignored: bool = False):
    """sampling_from_probs, min_p_sampling_from_probs, sampling_from_logits and top_k_top_p_sampling_from_logits
    with the >= 0.2.3 signatures (seed / offset from 0.6.0 when `seed_offset`), recording every call."""
    def record(api, dist_name, dist, params, indices, deterministic, generator, seed=None, offset=None, **kw):
        calls.append({"api": api, "rows": dist.shape[0], "params": params, "indices": indices,
                      "deterministic": deterministic, "generator": generator, "seed": seed, "offset": offset, **kw})
        return _draw(dist_name, dist, params, indices, None if generator_ignored else generator, seed, offset)

    def sampling_from_probs(probs, indices=None, deterministic=True, generator=None, check_nan=False, seed=None,
                            offset=None):
        return record("probs", "probs", probs, {}, indices, deterministic, generator, seed, offset)

    def min_p_sampling_from_probs(probs, min_p, indices=None, deterministic=True, generator=None, check_nan=False,
                                  seed=None, offset=None):
        return record("min_p", "probs", probs, {"min_p": min_p}, indices, deterministic, generator, seed, offset)

    def sampling_from_logits(logits, indices=None, deterministic=True, generator=None, check_nan=False, seed=None,
                             offset=None):
        return record("logits", "logits", logits, {}, indices, deterministic, generator, seed, offset)

    def top_k_top_p_sampling_from_logits(logits, top_k, top_p, indices=None, filter_apply_order="top_k_first",
                                         deterministic=True, generator=None, check_nan=False, seed=None, offset=None):
        return record("tktp", "logits", logits, {"top_k": top_k, "top_p": top_p}, indices, deterministic, generator,
                      seed, offset, order=filter_apply_order)

    fns = [sampling_from_probs, min_p_sampling_from_probs, sampling_from_logits, top_k_top_p_sampling_from_logits]
    if not seed_offset:  # the 0.2.3-0.5.x signatures: no seed, no offset
        fns = [_without_seed(f) for f in fns]
    return types.SimpleNamespace(**{f.__name__: f for f in fns})


def _without_seed(fn):
    def wrapped(x, *params, indices=None, deterministic=True, generator=None, check_nan=False, **kw):
        return fn(x, *params, indices=indices, deterministic=deterministic, generator=generator, **kw)
    wrapped.__name__ = fn.__name__
    return wrapped


def _gt(d: Definition, path: str | None = None, source: str = "flashinfer"):
    return dataclasses.replace(get_ground_truth(source, d, device="cuda", path=path), device="cpu")


def test_flashinfer_gating_by_release_and_device(monkeypatch):
    _fake(monkeypatch, "flashinfer", "0.2.2", sampling=fake_apis([]))
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: flashinfer 0.2.2 has no .*min_p.*>=0.2.3"):
        get_ground_truth("flashinfer", small(MIN_P), device="cuda")
    _fake(monkeypatch, "flashinfer", "0.2.5", sampling=fake_apis([]))
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*sampling_from_logits \(needs >=0.2.6\)"):
        get_ground_truth("flashinfer", small(LOGITS), device="cuda")
    assert get_ground_truth("flashinfer", small(TKTP), device="cuda").api.endswith("top_k_top_p_sampling_from_logits")
    _fake(monkeypatch, "flashinfer", "0.6.6", sampling=types.SimpleNamespace())
    with pytest.raises(GroundTruthUnavailable, match="api-missing: .*has no sampling.sampling_from_probs"):
        get_ground_truth("flashinfer", small(PLAIN), device="cuda")
    _fake(monkeypatch, "flashinfer", "0.6.6", sampling=fake_apis([]))
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        get_ground_truth("flashinfer", small(PLAIN), device="cpu")
    other = small(PLAIN).model_copy(update={"tags": ["fi_api:flashinfer.norm.sampling_from_probs"]})
    with pytest.raises(GroundTruthUnavailable):  # a tag naming another API: not this adapter's definition
        get_ground_truth("flashinfer", other, device="cuda")


def test_every_call_mode_is_a_path():
    tail = ["nondeterministic", "indices", "seed-offset", "replay"]
    assert paths("flashinfer", small(MIN_P)) == [None, "scalar", *tail]
    assert paths("flashinfer", small(MIN_P_SCALAR)) == [None, "per-row", *tail]
    assert paths("flashinfer", small(PLAIN)) == [None, *tail]
    assert paths("flashinfer", small(LOGITS)) == [None, "indices", "seed-offset", "replay"]  # no deterministic flag
    assert paths("flashinfer", small(TKTP_SCALAR)) == [None, "per-row", *tail]
    assert paths("sglang", small(MIN_P)) == [None, "scalar", "replay"]


@pytest.mark.parametrize("path", [None, "scalar", "nondeterministic", "indices", "seed-offset", "replay"])
def test_flashinfer_min_p_modes_draw_the_target(monkeypatch, path):
    calls: list = []
    _fake(monkeypatch, "flashinfer", "0.6.6", sampling=fake_apis(calls))
    d = small(MIN_P)
    x = generate_inputs(d, "small", 0)
    report = check_sampler(d, x, _gt(d, path), SamplingSettings.cpu(), 0)
    assert report.passed, report.summary()
    drawn = [c for c in calls if c["api"] == "min_p"]
    first = drawn[-1]
    per_row = path not in ("scalar", "indices")
    assert isinstance(first["params"]["min_p"], torch.Tensor) == per_row
    assert first["deterministic"] is (path != "nondeterministic")
    if path == "indices":
        assert first["rows"] == 1 and first["indices"].dtype == torch.int32 and not first["indices"].any()
    if path == "seed-offset":
        offsets = [c["offset"] for c in drawn]
        assert first["generator"] is None and offsets == sorted(set(offsets))
        assert all(isinstance(o, int) for o in offsets)
    elif path != "replay":
        assert len({id(c["generator"]) for c in drawn}) == 1  # one seeded generator, advancing across the calls


def test_flashinfer_logits_samplers_pass_their_order_and_forms(monkeypatch):
    calls: list = []
    _fake(monkeypatch, "flashinfer", "0.6.6", sampling=fake_apis(calls))
    for name, path in ((TKTP_SCALAR, None), (TKTP_SCALAR, "per-row"), (TKTP, None), (LOGITS, None)):
        d = small(name)
        x = generate_inputs(d, "small", 0)
        assert check_sampler(d, x, _gt(d, path), SamplingSettings.cpu(), 0).passed
        c = calls[-1]
        if name != LOGITS:
            assert c["order"] == "top_k_first"
            assert isinstance(c["params"]["top_k"], int) == (name == TKTP_SCALAR and path is None)


def test_seed_offset_needs_0_6(monkeypatch):
    _fake(monkeypatch, "flashinfer", "0.5.3", sampling=fake_apis([], seed_offset=False))
    d = small(PLAIN)
    with pytest.raises(GroundTruthUnavailable, match="api-missing: .*sampling_from_probs has no seed"):
        _gt(d, "seed-offset")(generate_inputs(d, "small", 0), draws=8)
    assert _gt(d, "indices")(generate_inputs(d, "small", 0), draws=8)[0].shape == (2, 8)


def test_generator_replay_is_judged_a_bug_of_the_kernel(monkeypatch):
    d = small(LOGITS)
    x = generate_inputs(d, "small", 0)
    _fake(monkeypatch, "flashinfer", "0.6.6", sampling=fake_apis([]))
    assert check_sampler(d, x, _gt(d, "replay"), SamplingSettings.cpu(), 0).passed
    _fake(monkeypatch, "flashinfer", "0.6.6", sampling=fake_apis([], generator_ignored=True))
    assert check_sampler(d, x, _gt(d), SamplingSettings.cpu(), 0).passed  # its draws are right
    report = check_sampler(d, x, _gt(d, "replay"), SamplingSettings.cpu(), 0)
    assert report.verdict == "bug" and "same generator state drew differently" in report.summary()
    assert report.sides[0].verdict == "pass"  # the reference is judged as ever

    def frozen(logits, indices=None, deterministic=True, generator=None, check_nan=False):  # a fixed seed inside
        return _draw("logits", logits, {}, indices, torch.Generator().manual_seed(7), None, None)

    _fake(monkeypatch, "flashinfer", "0.6.6", sampling=types.SimpleNamespace(sampling_from_logits=frozen))
    report = check_sampler(d, x, _gt(d, "replay"), SamplingSettings.cpu(), 0)
    assert report.verdict == "bug" and "did not advance" in report.summary()


def test_the_fast_path_is_not_judged_on_a_tie_at_the_k_th_logit(monkeypatch):
    sampling = fake_apis([])
    d = small(TKTP_SCALAR, vocab=65536)  # a Python int top_k <= 256 on a vocabulary >= 65536
    ties, typical = (generate_inputs(d, "small", 0, case=c) for c in ("ties_at_cut", None))
    _fake(monkeypatch, "flashinfer", "0.6.13", sampling=sampling)  # no fast path yet: judged
    assert check_sampler(d, ties, _gt(d), EDGE, 0).passed
    sampling._top_k_first_fast_path_applicable = lambda *a: True
    _fake(monkeypatch, "flashinfer", "0.6.14", sampling=sampling)
    with pytest.raises(GroundTruthUnavailable, match="unsupported: .*fast path.*ties at the k-th logit"):
        _gt(d)(ties, draws=8)
    assert check_sampler(d, typical, _gt(d), SamplingSettings.cpu(), 0).passed
    assert _gt(d, "per-row")(ties, draws=8)[0].shape == (2, 8)  # a tensor top_k takes the general path


def test_sglang_min_p_by_its_signature(monkeypatch):
    d = small(MIN_P)

    def uniform_api(probs, uniform_samples, min_p, deterministic=True, check_nan=False):
        raise AssertionError("not called")

    _fake(monkeypatch, "sgl_kernel", "0.1.0", min_p_sampling_from_probs=uniform_api,
          top_k_top_p_sampling_from_probs=uniform_api)
    with pytest.raises(GroundTruthUnavailable, match="api-missing: .*takes uniform_samples"):
        get_ground_truth("sglang", d, device="cuda")
    _fake(monkeypatch, "sgl_kernel", "0.3.21", min_p_sampling_from_probs=fake_apis([]).min_p_sampling_from_probs)
    gt = _gt(d, source="sglang")
    assert gt.api == "sgl_kernel.min_p_sampling_from_probs"
    assert check_sampler(d, generate_inputs(d, "small", 0), gt, SamplingSettings.cpu(), 0).passed


def base_adapters():
    from flashinfer_trace.groundtruth import ADAPTERS

    return [a for source in ("flashinfer", "sglang", "torch") for a in ADAPTERS[source]
            if a.op_type == "sampling" and a.kind == "sampler"]


def test_only_the_min_p_adapters_apply_to_min_p():
    """The older samplers' adapters (top-k / top-p) would read past a min_p input."""
    d = small(MIN_P)
    applying = {a.api for a in base_adapters() if a.applies(d) is None}
    assert applying == {"flashinfer.sampling.min_p_sampling_from_probs", "sgl_kernel.min_p_sampling_from_probs",
                        "softmax / min-p / top-k / top-p distribution (float64) + torch.multinomial"}

"""Chain speculative sampling (inputs/speculative.py, groundtruth/torch_speculative.py, flashinfer_speculative.py,
verdict/speculative.py, mutants_speculative.py, docs/boundary/speculative.md): routing, each boundary case builds
what it names, the float64 law against hand-computed values and the theorem of speculative sampling, the encoding of
the deterministic parts, the true reference passes every case, each planted bug caught on its boundary, and the
FlashInfer adapter on fakes (gating per release, the count keywords, call modes, replay judged a bug, the kernel's
re-tested stop). On a small vocabulary (the shipped definitions with vocab_size replaced) so it runs in seconds."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path

import pytest
import torch
from fakes import install_flashinfer

from flashinfer_trace.check import CheckConfig, Discovered, plan, run
from flashinfer_trace.dataset import load_definition
from flashinfer_trace.definition import Definition
from flashinfer_trace.groundtruth import ADAPTERS, GroundTruthUnavailable, get_ground_truth, paths
from flashinfer_trace.groundtruth.torch_speculative import acceptance, count_law, encode, laws, split, stop_law
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.inputs.registry import family_for
from flashinfer_trace.mutants import mutate
from flashinfer_trace.mutants_speculative import MUTANTS
from flashinfer_trace.verdict.samples import SamplingSettings, check_sampler

ROOT = Path(__file__).resolve().parents[2] / "definitions" / "sampling"
CHAIN, CHAIN_128K = "chain_speculative_sampling_v32000", "chain_speculative_sampling_v128256"
SHIPPED = (CHAIN, CHAIN_128K)
VOCAB = 1024
CASES = ["draft_equals_target", "disjoint", "one_hot_target", "zero_prob_draft", "single_residual"]


def small(name: str = CHAIN, vocab: int = VOCAB) -> Definition:
    data = json.loads((ROOT / f"{name}.json").read_text())
    data["axes"]["vocab_size"]["value"] = vocab
    return Definition.model_validate(data)


def inputs(case: str | None = None, name: str = CHAIN, size: str = "small", vocab: int = VOCAB):
    return generate_inputs(small(name, vocab), size, 0, case=case)


def stops(x) -> torch.Tensor:
    a, _ = acceptance(x.values)
    return stop_law(a)


# -- routing and the shipped files ----------------------------------------------------------------------------------
def test_the_chain_gets_its_generator_and_adapters():
    for name in SHIPPED:
        d = load_definition(name)
        assert family_for(d).name == "speculative" and d.is_sampler
        assert "fi_api:flashinfer.sampling.chain_speculative_sampling" in d.tags and "coverage:samplers" in d.tags
        assert [s.dtype.value for s in d.outputs.values()] == ["int32"] * 3
        assert d.axes["num_speculative_plus_1"].value == d.axes["num_speculative"].value + 1
    applying = {(s, a.api) for s in ADAPTERS for a in ADAPTERS[s]
                if a.op_type == "sampling" and a.applies(small()) is None}
    assert {s for s, _ in applying} == {"flashinfer", "torch"} and len(applying) == 2
    assert family_for(load_definition("sampling_from_probs_v32000")).name == "samplers"


def test_each_case_generates_at_every_size():
    d = small()
    assert edge_cases(d) == CASES
    for case in [None, *CASES]:
        for size in ("small", "medium", "large"):
            x = generate_inputs(d, size, 0, case=case)
            q, ids, p = x.values["draft_probs"], x.values["draft_token_ids"], x.values["target_probs"]
            assert q.shape[1] == 4 and p.shape[1] == 5 and ids.dtype == torch.int32
            assert (q >= 0).all() and (p >= 0).all() and ids.max() < VOCAB


# -- each boundary case is what it says -----------------------------------------------------------------------------
def test_draft_equal_to_target_accepts_everything_and_draws_the_bonus_row():
    x = inputs("draft_equals_target")
    assert torch.equal(x.values["draft_probs"], x.values["target_probs"][:, :4])
    assert torch.equal(stops(x)[:, 4], torch.ones(4, dtype=torch.float64))
    q_out, allowed, _, _ = laws(x.values)
    bonus = q_out.reshape(4, 5, VOCAB)[:, 4]
    assert torch.allclose(bonus, x.values["target_probs"][:, 4].double() / x.values["target_probs"][:, 4].double()
                          .sum(dim=1, keepdim=True))
    # a float32 test on equal probabilities may fail (u = 1): allowed, never tested for frequency
    assert allowed.reshape(4, 5, VOCAB)[:, :4].any()


def test_disjoint_rejects_at_position_0_and_draws_the_whole_target_row():
    x = inputs("disjoint")
    assert torch.equal(stops(x)[:, 0], torch.ones(4, dtype=torch.float64))
    q_out, allowed, q_count, _ = laws(x.values)
    first = q_out.reshape(4, 5, VOCAB)[:, 0]
    target = x.values["target_probs"][:, 0].double()
    assert torch.allclose(first, target / target.sum(dim=1, keepdim=True))
    assert not allowed.reshape(4, 5, VOCAB)[:, 1:].any()  # nothing past position 0 is possible
    assert torch.equal(q_count.reshape(4, 5, 5)[:, 0, 0], torch.ones(4, dtype=torch.float64))  # no count


def test_one_hot_target_determines_the_output():
    x = inputs("one_hot_target")
    q_out, _, _, _ = laws(x.values)
    assert ((q_out == 1).sum(dim=1) == 1).all()
    tokens = x.values["target_probs"].argmax(dim=2)
    code = q_out.argmax(dim=1)
    assert (code // VOCAB).tolist() == [4, 2, 4, 2]
    assert torch.equal(code % VOCAB, tokens[torch.arange(4), code // VOCAB])


def test_zero_probability_draft_tokens():
    x = inputs("zero_prob_draft")
    a, may_fail = acceptance(x.values)
    assert a[0, 0] == 0 and a[1, 1] == 0 and a[2, 2] == 1 and not may_fail[2, 2]  # 0 under the draft: passes
    s = stops(x)
    assert s[0, 0] == 1 and s[1, 2:].sum() == 0 and (s[2, :2] > 0).all() and s[2, 2] == 0


def test_single_residual_emits_one_token_at_a_rejection():
    x = inputs("single_residual")
    q_out, allowed, _, _ = laws(x.values)
    per = q_out.reshape(4, 5, VOCAB)[:, :4]
    assert ((per > 0).sum(dim=2) == 1).all() and ((allowed.reshape(4, 5, VOCAB)[:, :4]).sum(dim=2) == 1).all()
    assert torch.allclose(stops(x), torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625], dtype=torch.float64))


# -- the float64 law ------------------------------------------------------------------------------------------------
def _tiny(q: list, ids: list, p: list) -> dict:
    return {"draft_probs": torch.tensor([q], dtype=torch.float32), "draft_token_ids": torch.tensor([ids]),
            "target_probs": torch.tensor([p], dtype=torch.float32)}


def test_the_law_by_hand():
    x = _tiny([[0.5, 0.25, 0.25], [0.25, 0.25, 0.5]], [0, 2],
              [[0.25, 0.5, 0.25], [0.5, 0.25, 0.25], [0.0, 0.0, 1.0]])
    a, _ = acceptance(x)
    assert a.tolist() == [[0.5, 0.5]]
    assert stop_law(a).tolist() == [[0.5, 0.25, 0.25]]
    q_out, _, q_count, _ = laws(x)
    # stop 0: residual (0, .25, 0) -> token 1; stop 1: (.25, 0, 0) -> token 0; stop 2: the bonus, token 2
    expected = torch.zeros(9, dtype=torch.float64)
    expected[0 * 3 + 1], expected[1 * 3 + 0], expected[2 * 3 + 2] = 0.5, 0.25, 0.25
    assert torch.equal(q_out[0], expected)
    # the count after a stop at 0: 0, plus token 1's own test (1/2)
    assert count_law(a)[0, 0].tolist() == [0.5, 0.5, 0.0] and q_count[0].sum() == 1


def test_speculative_sampling_draws_from_the_target():
    """The theorem: with draft tokens drawn from the draft rows, the first emitted token is distributed as
    target row 0, and given the first token accepted, the second as target row 1."""
    g = torch.Generator().manual_seed(3)
    vocab = 6
    q = torch.rand(2, vocab, generator=g, dtype=torch.float64)
    q[0, 2] = 0.0  # a token the draft never proposes
    q = q / q.sum(dim=1, keepdim=True)
    p = torch.rand(3, vocab, generator=g, dtype=torch.float64)
    p[1, 4] = 0.0
    p = p / p.sum(dim=1, keepdim=True)
    first = torch.zeros(vocab, dtype=torch.float64)
    second = torch.zeros(vocab, dtype=torch.float64)
    for d0 in range(vocab):
        for d1 in range(vocab):
            w = q[0, d0] * q[1, d1]
            if w == 0:
                continue
            x = {"draft_probs": q[None], "draft_token_ids": torch.tensor([[d0, d1]]), "target_probs": p[None]}
            law = laws(x)[0].reshape(3, vocab)
            first[d0] += w * law[1:].sum()  # accepted: d0 emitted first
            first += w * law[0]  # rejected at 0: the residual's token
            if d0 == 0:  # given d0 = 0 is accepted, the next token
                accepted = law[1:].sum()
                second[d1] += w / q[0, 0] * law[2].sum() / accepted
                second += w / q[0, 0] * law[1] / accepted
    assert torch.allclose(first, p[0], atol=1e-12)
    assert torch.allclose(second, p[1], atol=1e-12)


def test_encode_checks_the_deterministic_parts():
    ids = torch.tensor([[3, 4, 5, 6]] * 7)
    tokens = torch.tensor([[3, 9, -1, -1, -1],  # stop 1, token 9: fine
                           [3, 4, 5, 6, 8],  # every draft accepted, bonus 8: fine
                           [3, 9, 0, -1, -1],  # not padded with -1
                           [7, 9, -1, -1, -1],  # a draft token that is not the draft's before the stop
                           [3, 9, -1, -1, -1],  # emitted count 2 for a stop at 1
                           [3, 9, -1, -1, -1],  # accepted count below the emitted one
                           [3, 99, -1, -1, -1]])  # a token outside the vocabulary
    emitted = torch.tensor([1, 4, 1, 1, 2, 1, 1])
    accepted = torch.tensor([2, 4, 1, 1, 2, 0, 1])
    codes = encode(tokens, accepted, emitted, ids, 10)
    assert codes.tolist()[:2] == [(1 * 10 + 9) * 5 + 2, (4 * 10 + 8) * 5 + 4] and (codes[2:] == -1).all()
    outcome, count = split(codes, 4, 10)
    assert outcome.tolist()[:2] == [19, 48] and count.tolist()[:2] == [1 * 5 + 2, 4 * 5 + 4] and count[2] == -1
    assert (encode(tokens[:, :4], accepted, emitted, ids, 10) == -1).all()  # the wrong shape


# -- the true reference passes, the planted bugs are caught ---------------------------------------------------------
@pytest.mark.parametrize("name", SHIPPED)
def test_true_reference_passes_every_case(name):
    d = small(name)
    gt = get_ground_truth("torch", d, device="cpu")
    for case in [None, *CASES]:
        report = check_sampler(d, generate_inputs(d, "small", 0, case=case), gt,
                               SamplingSettings.cpu(edge=case is not None), 0)
        assert report.passed, (case, report.summary())
        assert [s.side for s in report.sides] == ["reference", "reference accepted count", "ground truth",
                                                  "ground truth accepted count"]


BOUNDARY = {  # mutant -> (the boundary case that catches it, the typical case's status)
    f"{CHAIN}:residual-is-target": ("single_residual", "fail"),
    f"{CHAIN}:ratio-inverted": ("disjoint", "fail"),
    f"{CHAIN_128K}:bonus-from-last-draft-row": ("draft_equals_target", "pass"),
    f"{CHAIN}:zero-tie-accepted": ("zero_prob_draft", "pass"),
    f"{CHAIN}:no-stop": ("one_hot_target", "fail"),
    f"{CHAIN_128K}:padding-zero": (None, "fail"),
    f"{CHAIN}:accepted-retests-stop": ("single_residual", "fail"),
}


def test_every_mutant_is_listed():
    assert {m.name for m in MUTANTS} == set(BOUNDARY)
    assert {m.cls for m in MUTANTS} == {"wrong-math", "boundary-index", "boundary-ties", "boundary-structure"}


@pytest.mark.parametrize("name", list(BOUNDARY))
def test_mutant_is_caught_on_its_boundary(name):
    [m] = [m for m in MUTANTS if m.name == name]
    case, typical = BOUNDARY[name]
    config = CheckConfig(sources=("torch",), sizes=("small",), seeds=(0,), cases=(case,) if case else (),
                         device="cpu")
    d = mutate(small(m.definition), m)
    verdicts = {r.case: r.status.value for r in run(plan(Discovered([d], []), config), config)
                if r.check in ("match", "edge")}
    assert verdicts == ({None: typical, case: "fail"} if case else {None: typical}), verdicts


# -- the FlashInfer adapter (fake modules: no GPU, no FlashInfer here) ---------------------------------------------
def _fake(monkeypatch, version: str, fn):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    module.sampling = types.SimpleNamespace(chain_speculative_sampling=fn)
    install_flashinfer(monkeypatch, module, version)
    return module


def kernel(draft_probs, draft_token_ids, target_probs, accepted, emitted, generator, *, seed=None, offset=None,
           retest_stop=False):
    """What the kernel computes (sampling.cuh's ChainSpeculativeSampling), in float32, with its own uniforms:
    `retest_stop` is its accepted-count loop starting at the stop (the documented count starts after it)."""
    if seed is not None:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + offset)
    b, n, vocab = draft_probs.shape
    out = torch.full((b, n + 1), -1, dtype=torch.int32)
    for r in range(b):
        u = 1.0 - torch.rand(2 * n + 1, generator=generator)
        pos, used = n, 0
        for i in range(n):
            d = int(draft_token_ids[r, i])
            used += 1
            if float(u[i]) * float(draft_probs[r, i, d]) < float(target_probs[r, i, d]):
                out[r, i] = d
            else:
                pos = i
                break
        count = pos
        for i in range(pos if retest_stop else pos + 1, n):
            d = int(draft_token_ids[r, i])
            count += int(float(u[used]) * float(draft_probs[r, i, d]) < float(target_probs[r, i, d]))
            used += 1
        res = target_probs[r, pos] - (draft_probs[r, pos] if pos < n else 0)
        out[r, pos] = int(torch.multinomial(res.clamp(min=0).double(), 1, generator=generator))
        accepted[r] += count
        emitted[r] += pos
    return out, accepted, emitted


def fake_api(calls: list, *, old_names=False, seed_offset=True, retest_stop=False, generator_ignored=False):
    """chain_speculative_sampling with the >= 0.2.5 signature (0.2.3-0.2.4's keyword with `old_names`; seed and
    offset from 0.6.0 with `seed_offset`), recording every call."""
    def impl(draft_probs, draft_token_ids, target_probs, acc, emi, deterministic, generator, seed=None, offset=None):
        calls.append({"rows": draft_probs.shape[0], "acc": acc, "emi": emi, "deterministic": deterministic,
                      "generator": generator, "seed": seed, "offset": offset})
        b = draft_probs.shape[0]
        acc = torch.zeros(b, dtype=torch.int32) if acc is None else acc
        emi = torch.zeros(b, dtype=torch.int32) if emi is None else emi
        return kernel(draft_probs, draft_token_ids, target_probs, acc, emi,
                      torch.Generator().manual_seed(7) if generator_ignored else generator, seed=seed,
                      offset=offset, retest_stop=retest_stop)

    if old_names:
        def chain_speculative_sampling(draft_probs, draft_token_ids, target_probs,
                                       maybe_output_accepted_token_num=None, maybe_output_emitted_token_num=None,
                                       deterministic=True, generator=None):
            return impl(draft_probs, draft_token_ids, target_probs, maybe_output_accepted_token_num,
                        maybe_output_emitted_token_num, deterministic, generator)
    elif not seed_offset:
        def chain_speculative_sampling(draft_probs, draft_token_ids, target_probs,
                                       maybe_output_accepted_token_num=None,
                                       maybe_output_emitted_draft_token_num=None, deterministic=True, generator=None):
            return impl(draft_probs, draft_token_ids, target_probs, maybe_output_accepted_token_num,
                        maybe_output_emitted_draft_token_num, deterministic, generator)
    else:
        def chain_speculative_sampling(draft_probs, draft_token_ids, target_probs,
                                       maybe_output_accepted_token_num=None,
                                       maybe_output_emitted_draft_token_num=None, deterministic=True, generator=None,
                                       seed=None, offset=None):
            return impl(draft_probs, draft_token_ids, target_probs, maybe_output_accepted_token_num,
                        maybe_output_emitted_draft_token_num, deterministic, generator, seed, offset)
    return chain_speculative_sampling


def _gt(d: Definition, path: str | None = None):
    return dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path=path), device="cpu")


def test_every_call_mode_is_a_path():
    assert paths("flashinfer", small()) == [None, "counts-in-place", "nondeterministic", "seed-offset", "replay"]
    assert paths("torch", small()) == [None]


def test_gating_by_release(monkeypatch):
    def uniform_api(draft_probs, draft_token_ids, uniform_samples, target_probs, deterministic=True):
        raise AssertionError("not called")

    _fake(monkeypatch, "0.2.2", uniform_api)
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*>=0.2.3"):
        get_ground_truth("flashinfer", small(), device="cuda")
    _fake(monkeypatch, "0.2.3", uniform_api)  # a build whose signature still takes the uniforms
    with pytest.raises(GroundTruthUnavailable, match="api-missing: .*takes uniform_samples"):
        _gt(small())(inputs(), draws=4)
    _fake(monkeypatch, "0.5.3", fake_api([], seed_offset=False))
    with pytest.raises(GroundTruthUnavailable, match="api-missing: .*no seed / offset"):
        _gt(small(), "seed-offset")(inputs(), draws=4)
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        get_ground_truth("flashinfer", small(), device="cpu")


@pytest.mark.parametrize("path", [None, "counts-in-place", "nondeterministic", "seed-offset", "replay"])
def test_modes_draw_the_law(monkeypatch, path):
    calls: list = []
    _fake(monkeypatch, "0.6.6", fake_api(calls))
    d = small(vocab=64)
    report = check_sampler(d, generate_inputs(d, "small", 0), _gt(d, path), SamplingSettings.cpu(), 0)
    assert report.passed, report.summary()
    last = calls[-1]
    assert last["deterministic"] is (path != "nondeterministic")
    assert (last["acc"] is not None) == (path == "counts-in-place")
    if path == "seed-offset":
        offsets = [c["offset"] for c in calls]
        assert last["generator"] is None and offsets == sorted(set(offsets))
    elif path != "replay":
        assert len({id(c["generator"]) for c in calls}) == 1  # one seeded generator for the case


def test_the_older_count_keyword(monkeypatch):
    calls: list = []
    _fake(monkeypatch, "0.2.4", fake_api(calls, old_names=True))
    d = small(vocab=64)
    assert check_sampler(d, generate_inputs(d, "small", 0), _gt(d, "counts-in-place"), SamplingSettings.cpu(),
                         0).passed
    assert calls[-1]["emi"] is not None


def test_counts_not_added_in_place_are_a_bug(monkeypatch):
    api = fake_api([])

    def copies(draft_probs, draft_token_ids, target_probs, maybe_output_accepted_token_num=None,
               maybe_output_emitted_draft_token_num=None, deterministic=True, generator=None):
        out, acc, emi = api(draft_probs, draft_token_ids, target_probs, None, None, deterministic, generator)
        return out, acc, emi  # fresh tensors: the caller's are left alone

    _fake(monkeypatch, "0.6.6", copies)
    d = small(vocab=64)
    report = check_sampler(d, generate_inputs(d, "small", 0), _gt(d, "counts-in-place"), SamplingSettings.cpu(), 0)
    assert report.verdict == "bug" and "not the one returned" in report.summary()


def test_replay_is_judged_a_bug(monkeypatch):
    d = small(vocab=64)
    x = generate_inputs(d, "small", 0)
    _fake(monkeypatch, "0.6.6", fake_api([], generator_ignored=True))
    report = check_sampler(d, x, _gt(d, "replay"), SamplingSettings.cpu(), 0)
    assert report.verdict == "bug" and "did not advance" in report.summary()
    assert report.sides[0].verdict == "pass"  # the reference is judged as ever


def test_the_kernels_re_tested_stop_is_caught_on_the_accepted_count(monkeypatch):
    """FlashInfer's accepted-count loop starts at the stop (a second test for the token that failed); the
    documented count starts after it. On single_residual (every test 1/2) a count of n after an early stop shows."""
    d = small(vocab=64)
    x = generate_inputs(d, "small", 0, case="single_residual")
    _fake(monkeypatch, "0.6.6", fake_api([]))
    assert check_sampler(d, x, _gt(d), SamplingSettings.cpu(edge=True), 0).passed
    _fake(monkeypatch, "0.6.6", fake_api([], retest_stop=True))
    report = check_sampler(d, x, _gt(d), SamplingSettings.cpu(edge=True), 0)
    verdicts = {s.side: s.verdict for s in report.sides}
    assert verdicts["ground truth"] == "pass" and verdicts["ground truth accepted count"] == "bug"

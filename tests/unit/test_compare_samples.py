"""verdict/samples.py: the chi-square machinery of the logits fallback, the support and frequency verdicts
against a target, row repetition, and a whole sampler check on a tiny vocabulary against the torch ground
truth. The power and false-alarm rate are measured in test_sampler_power.py."""

from __future__ import annotations

import pytest
import torch

from flashinfer_trace.definition import Definition
from flashinfer_trace.groundtruth import get_ground_truth
from flashinfer_trace.inputs import Inputs, generate_inputs
from flashinfer_trace.inputs.sampling import repeat_rows
from flashinfer_trace.verdict.samples import (
    SamplingMismatch,
    SamplingSettings,
    Target,
    assert_samples_match,
    chi2_sf,
    compare_to_target,
    two_sample_chi2,
)

VOCAB = 50


# -- chi2_sf ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("x, df, p", [
    (3.841, 1, 0.05),
    (6.635, 1, 0.01),
    (5.991, 2, 0.05),
    (18.307, 10, 0.05),
    (23.209, 10, 0.01),
    (124.342, 100, 0.05),
    (10.0, 10, 0.4405),
])
def test_chi2_sf_matches_table_values(x, df, p):
    assert chi2_sf(x, df) == pytest.approx(p, abs=0.01)


def test_chi2_sf_edges():
    assert chi2_sf(0, 3) == 1.0
    assert chi2_sf(-1.0, 3) == 1.0
    assert chi2_sf(5.0, 0) == 1.0
    assert chi2_sf(5.0, -2) == 1.0
    assert chi2_sf(1000.0, 10) < 1e-12


def test_chi2_sf_decreases_in_x_and_increases_in_df():
    xs = [0.5, 1, 2, 5, 10, 20, 50]
    ps = [chi2_sf(x, 4) for x in xs]
    assert ps == sorted(ps, reverse=True) and len(set(ps)) == len(ps)
    assert chi2_sf(10.0, 3) < chi2_sf(10.0, 6) < chi2_sf(10.0, 12)


# -- two_sample_chi2 --------------------------------------------------------------------------------
def draws(probs: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    return torch.multinomial(probs, n, replacement=True, generator=torch.Generator().manual_seed(seed))


def test_same_distribution_is_not_rejected():
    p = torch.softmax(torch.linspace(0, 3, 20), dim=0)
    chi2, df, pval, bins = two_sample_chi2(draws(p, 4000, 1), draws(p, 4000, 2), 20)
    assert pval > 1e-3
    assert df == bins - 1 and 2 <= bins <= 20 and chi2 >= 0


def test_different_distributions_are_rejected():
    p = torch.softmax(torch.linspace(0, 3, 20), dim=0)
    q = torch.full((20,), 1 / 20)
    _, _, pval, _ = two_sample_chi2(draws(p, 4000, 1), draws(q, 4000, 2), 20)
    assert pval < 1e-6


def test_rare_tokens_share_one_bin():
    a = torch.tensor([0] * 50 + [1] * 50 + [5, 6, 7])
    b = torch.tensor([0] * 50 + [1] * 50 + [8, 9])
    _, df, _, bins = two_sample_chi2(a, b, 10)
    assert bins == 3 and df == 2  # tokens 0 and 1, plus one bin for 5..9 (fewer than 10 pooled draws each)


def test_a_single_bin_is_no_evidence():
    a = torch.zeros(30, dtype=torch.int64)
    assert two_sample_chi2(a, a.clone(), 5) == (0.0, 0, 1.0, 1)


# -- compare_to_target ------------------------------------------------------------------------------
P = torch.tensor([0.5, 0.3, 0.2, 0.0, 0.0], dtype=torch.float64)


def target_first(batch: int, q: torch.Tensor = P) -> Target:
    """Rows of q; the allowed set (and the core) is where q > 0."""
    q = q.expand(batch, -1).clone()
    ok = q > 0
    return Target(q, ok, ok.clone(), torch.zeros(batch, dtype=torch.bool), torch.ones(batch, dtype=torch.bool))


PLAN = SamplingSettings(row_draws=500).plan(2, 5)


def test_compare_to_target_passes_on_the_same_distribution():
    ref = torch.stack([draws(P, 500, 1), draws(P, 500, 3)])
    gt = torch.stack([draws(P, 500, 2), draws(P, 500, 4)])
    report = compare_to_target(ref, gt, target_first(2), PLAN)
    assert report.verdict == "pass" and report.passed
    assert [s.side for s in report.sides] == ["reference", "ground truth"]
    assert all(s.outside == 0 and s.p_value > 1e-3 and s.tvd_max < 0.2 for s in report.sides)
    assert report.settings["row_draws"] == 500 and report.settings["draws"] == 1000
    assert [r["allowed"] for r in report.rows] == [3, 3]


@pytest.mark.parametrize("side", ["reference", "ground_truth"])
def test_a_draw_outside_the_allowed_set_is_a_bug(side):
    ref = torch.stack([draws(P, 500, 1), draws(P, 500, 3)])
    gt = torch.stack([draws(P, 500, 2), draws(P, 500, 4)])
    bad = ref if side == "reference" else gt
    bad[1, 17] = 4  # one draw of a token the filters remove
    report = compare_to_target(ref, gt, target_first(2), PLAN)
    assert report.verdict == "bug" and not report.passed
    got = {s.side: (s.outside, s.outside_rows) for s in report.sides}
    want_ref = (1, [1]) if side == "reference" else (0, [])
    assert got["reference"] == want_ref and got["ground truth"] == ((0, []) if side == "reference" else (1, [1]))
    assert "outside the allowed set (rows 1)" in report.summary()


def test_a_token_id_outside_the_vocabulary_is_a_bug():
    ref = torch.stack([draws(P, 500, 1)])
    ref[0, 3], ref[0, 4] = -1, 5
    report = compare_to_target(ref, None, target_first(1), PLAN)
    assert report.verdict == "bug" and report.sides[0].outside == 2


def test_distribution_difference_is_flagged_as_distribution():
    q = torch.tensor([0.2, 0.3, 0.5, 0.0, 0.0], dtype=torch.float64)
    report = compare_to_target(torch.stack([draws(q, 1000, 1)]), None, target_first(1),
                               SamplingSettings(row_draws=1000).plan(1, 5))
    assert report.verdict == "distribution"
    assert report.sides[0].p_value < 1e-6 and report.sides[0].tvd_max > 0.2


def test_support_bug_outranks_a_distribution_difference():
    q = torch.tensor([0.2, 0.3, 0.5, 0.0, 0.0], dtype=torch.float64)
    ref = torch.stack([draws(q, 1000, 1), draws(P, 1000, 3)])
    ref[1, 0] = 3
    report = compare_to_target(ref, None, target_first(2), SamplingSettings(row_draws=1000).plan(2, 5))
    assert report.verdict == "bug"


def test_draws_in_the_boundary_band_are_allowed_but_not_counted():
    """A token inside the slack of the top-p cut (allowed, not core): drawing it is no bug, and the
    frequencies are tested on the other draws, against the core renormalised."""
    t = target_first(1)
    t = Target(t.q, t.allowed | (torch.arange(5) == 3), t.core, t.exact, t.filtering)
    ref = torch.stack([draws(P, 1000, 1)])
    ref[0, :100] = 3  # 10% of the draws on the band token
    report = compare_to_target(ref, None, t, SamplingSettings(row_draws=1000).plan(1, 5))
    assert report.passed and report.rows[0]["band"] == 1


def test_an_id_range_never_drawn_shows_in_the_id_order_test():
    """A flat row of many tokens in no id order: a sampler that never returns the upper half of the ids fails,
    though every draw is allowed and the probability-order KS sees little."""
    v = 4000
    q = 0.5 + torch.rand(v, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    q = q / q.sum()
    half = q.clone()
    half[v // 2:] = 0
    half = half / half.sum()
    report = compare_to_target(torch.stack([draws(half, 400, 1)]), None, target_first(1, q),
                               SamplingSettings(row_draws=400).plan(1, v))
    assert report.verdict == "distribution" and "id order" in report.sides[0].test


def test_a_rare_token_drawn_too_often_shows_in_the_bins():
    """1e-3 of probability drawn at 5e-2: a total variation of 0.05, below what the KS tests see in 1000 draws,
    but 50 draws where 1 is expected."""
    v = 200
    q = torch.full((v,), 1.0, dtype=torch.float64)
    q[0] = 200.0
    q = q / q.sum()
    rare = int(q.argmin())
    bad = q * 0.95 / (1 - q[rare])
    bad[rare] = 0.05
    report = compare_to_target(torch.stack([draws(bad, 1000, 2)]), None, target_first(1, q),
                               SamplingSettings(row_draws=1000).plan(1, v))
    assert report.verdict == "distribution" and report.sides[0].test.startswith("row 0 tokens")


# -- repeat_rows ------------------------------------------------------------------------------------
def repeat_definition() -> Definition:
    return Definition.model_validate({
        "name": "repeat_v4", "op_type": "sampling",
        "axes": {"batch_size": {"type": "var"}, "vocab_size": {"type": "const", "value": 4}},
        "inputs": {"probs": {"shape": ["batch_size", "vocab_size"], "dtype": "float32"},
                   "top_k": {"shape": ["batch_size"], "dtype": "int32"},
                   "bias": {"shape": ["vocab_size"], "dtype": "float32"},
                   "temperature": {"shape": None, "dtype": "float32"}},
        "outputs": {"samples": {"shape": ["batch_size"], "dtype": "int64"}},
        "reference": "def run(probs, top_k, bias, temperature):\n    return None\n",
    })


def test_repeat_rows_repeats_only_batch_axis_tensors():
    d = repeat_definition()
    probs = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    top_k = torch.tensor([1, 2, 3], dtype=torch.int32)
    bias = torch.arange(3, dtype=torch.float32)  # deliberately 3 long, like the batch: only the axis name counts
    x = Inputs("repeat_v4", "small", 0, None, {"probs": probs, "top_k": top_k, "bias": bias, "temperature": 0.7})
    p, k, b, t = repeat_rows(d, x, 2)
    assert torch.equal(p, probs[[0, 0, 1, 1, 2, 2]])
    assert k.tolist() == [1, 1, 2, 2, 3, 3]
    assert b is bias and t == 0.7
    p, k, b, t = repeat_rows(d, x, 3, slice(1, 2))
    assert torch.equal(p, probs[[1, 1, 1]]) and k.tolist() == [2, 2, 2]
    assert b is bias and t == 0.7


# -- a whole sampler check --------------------------------------------------------------------------
TOP_K_REFERENCE = """import torch


@torch.no_grad()
def run(probs, top_k):
    vocab_size = probs.shape[1]
    sorted_probs, sorted_ids = torch.sort(probs.to(torch.float32), dim=-1, descending=True)
    rank = torch.arange(vocab_size, device=probs.device)[None, :]
    k = top_k.to(torch.int64)
    k = torch.where((k <= 0) | (k >= vocab_size), vocab_size, k)
    kept = sorted_probs * (rank < k[:, None])
    kept = kept / kept.sum(dim=-1, keepdim=True)
    choice = torch.multinomial(kept, 1)
    return sorted_ids.gather(1, choice).squeeze(1).to(torch.int64)
"""

IGNORES_TOP_K = """import torch


@torch.no_grad()
def run(probs, top_k):
    return torch.multinomial(probs.to(torch.float32), 1).squeeze(1).to(torch.int64)
"""

UNIFORM_OVER_TOP_K = """import torch


@torch.no_grad()
def run(probs, top_k):
    vocab_size = probs.shape[1]
    sorted_probs, sorted_ids = torch.sort(probs.to(torch.float32), dim=-1, descending=True)
    rank = torch.arange(vocab_size, device=probs.device)[None, :]
    k = top_k.to(torch.int64)
    k = torch.where((k <= 0) | (k >= vocab_size), vocab_size, k)
    kept = (rank < k[:, None]).to(torch.float32)  # right support, wrong weights
    choice = torch.multinomial(kept, 1)
    return sorted_ids.gather(1, choice).squeeze(1).to(torch.int64)
"""


def sampler(reference: str) -> Definition:
    return Definition.model_validate({
        "name": f"top_k_sampling_from_probs_v{VOCAB}", "op_type": "sampling",
        "axes": {"batch_size": {"type": "var"}, "vocab_size": {"type": "const", "value": VOCAB}},
        "constraints": ["abs(probs.sum(1) - 1).max().item() < 1e-3"],
        "inputs": {"probs": {"shape": ["batch_size", "vocab_size"], "dtype": "float32"},
                   "top_k": {"shape": ["batch_size"], "dtype": "int32"}},
        "outputs": {"samples": {"shape": ["batch_size"], "dtype": "int64"}},
        "reference": reference,
    })


SETTINGS = SamplingSettings(row_draws=300)


def test_correct_sampler_matches_torch_ground_truth():
    d = sampler(TOP_K_REFERENCE)
    gt = get_ground_truth("torch", d, device="cpu")
    assert gt.kind == "sampler"
    for seed in (0, 1):
        x = generate_inputs(d, "small", seed=seed)
        assert x.values["probs"].shape == (2, VOCAB)
        report = assert_samples_match(d, x, gt, settings=SETTINGS, seed=seed)
        assert report.passed and len(report.rows) == 2
        assert report.settings["row_draws"] == 300


def test_correct_sampler_with_a_tight_top_k():
    d = sampler(TOP_K_REFERENCE)
    x = generate_inputs(d, "small", seed=0)
    x.values["top_k"] = torch.tensor([3, 1], dtype=torch.int32)
    report = assert_samples_match(d, x, get_ground_truth("torch", d, device="cpu"), settings=SETTINGS)
    assert report.passed


def test_sampler_that_ignores_top_k_draws_outside_the_allowed_set():
    d = sampler(IGNORES_TOP_K)
    x = generate_inputs(d, "small", seed=0)
    x.values["top_k"] = torch.tensor([3, 3], dtype=torch.int32)
    with pytest.raises(SamplingMismatch) as exc:
        assert_samples_match(d, x, get_ground_truth("torch", d, device="cpu"), settings=SETTINGS)
    report = exc.value.report
    assert report.verdict == "bug"
    ref, gt = report.sides
    assert ref.outside > 0 and ref.outside_rows == [0, 1] and gt.outside == 0
    assert "[bug]" in str(exc.value)


def test_sampler_with_wrong_weights_is_a_distribution_failure():
    d = sampler(UNIFORM_OVER_TOP_K)
    x = generate_inputs(d, "small", seed=0)
    x.values["top_k"] = torch.tensor([VOCAB, 20], dtype=torch.int32)
    with pytest.raises(SamplingMismatch) as exc:
        assert_samples_match(d, x, get_ground_truth("torch", d, device="cpu"), settings=SETTINGS)
    report = exc.value.report
    assert report.verdict == "distribution"
    assert all(s.outside == 0 for s in report.sides) and report.sides[0].p_value < SETTINGS.alpha


def test_sampler_check_replays_with_the_same_seed():
    d = sampler(TOP_K_REFERENCE)
    x = generate_inputs(d, "small", seed=4)
    gt = get_ground_truth("torch", d, device="cpu")
    first = assert_samples_match(d, x, gt, settings=SETTINGS, seed=7)
    second = assert_samples_match(d, x, gt, settings=SETTINGS, seed=7)
    assert first.as_dict() == second.as_dict()


def test_reference_draws_in_several_calls_are_independent(monkeypatch):
    """The worker reseeds its RNG per call: a row split over calls must not repeat its draws."""
    from flashinfer_trace.dataset import load_definition
    from flashinfer_trace.verdict import samples as compare_samples

    d = load_definition("top_k_sampling_from_probs_v32000")
    inputs = generate_inputs(d, "small", seed=0)
    monkeypatch.setitem(compare_samples.CHUNK_ELEMENTS, "cpu", 32000 * 16)  # 16 rows per call
    draws = compare_samples.draw_reference(d, inputs, 64, seed=3)
    assert draws.shape == (inputs.values["probs"].shape[0], 64)
    chunks = draws[0].reshape(4, 16)
    assert len({tuple(c.tolist()) for c in chunks}) == 4, "every call drew the same tokens"
    assert torch.equal(draws, compare_samples.draw_reference(d, inputs, 64, seed=3))  # still replays


def test_a_sampler_of_logits_repeats_its_logits_rows_and_has_no_probability_support():
    from flashinfer_trace.inputs.sampling import distribution_input, repeat_rows
    from flashinfer_trace.verdict.samples import allowed_tokens

    d = Definition.model_validate({
        "name": "sampling_from_logits_v4", "op_type": "sampling",
        "axes": {"batch": {"type": "var"}, "vocab": {"type": "const", "value": 4}},
        "inputs": {"logits": {"shape": ["batch", "vocab"], "dtype": "float32"}, "temperature": {"shape": None,
                                                                                               "dtype": "float32"}},
        "outputs": {"samples": {"shape": ["batch"], "dtype": "int32"}},
        "reference": "import torch\n\ndef run(logits, temperature):\n    return logits.argmax(-1)\n"})
    logits = torch.arange(8.0).reshape(2, 4)
    x = Inputs(d.name, "small", 0, None, {"logits": logits, "temperature": 1.0}, {"batch": 2, "vocab": 4})
    assert distribution_input(d) == "logits"
    rows, temperature = repeat_rows(d, x, 3, slice(1, 2))
    assert rows.tolist() == [[4.0, 5.0, 6.0, 7.0]] * 3 and temperature == 1.0
    assert allowed_tokens(d, x, 0.0) is None  # the torch filters read probabilities: distributions only
    with pytest.raises(KeyError, match="needs a probs or logits input"):
        distribution_input(Definition.model_validate({**d.as_dict, "inputs": {
            "x": {"shape": ["batch", "vocab"], "dtype": "float32"}}, "reference": "def run(x):\n    return x\n"}))


def test_a_stored_reference_draw_set_is_reused_only_for_the_same_reference_inputs_seed_and_machine(
        tmp_path, monkeypatch):
    """--draws-store: the second check of the same reference, inputs and seed reads the first's draws instead of
    calling the reference (and says so); another seed, other inputs, another reference or another torch make their
    own; a stored file that is not the draws is made again."""
    from flashinfer_trace.verdict import drawstore
    from flashinfer_trace.verdict import samples as compare_samples
    from flashinfer_trace.verdict.drawstore import DrawStore

    calls = []
    real = compare_samples.draw_reference
    monkeypatch.setattr(compare_samples, "draw_reference", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    d, store = sampler(TOP_K_REFERENCE), DrawStore(tmp_path)
    x = generate_inputs(d, "small", seed=0)
    gt = get_ground_truth("torch", d, device="cpu")

    def check(definition=d, inputs=x, seed=5):
        return compare_samples.check_sampler(definition, inputs, gt, SETTINGS, seed, store=store)

    first, second = check(), check()
    assert calls == [5] and first.settings["reference_draws"] == "made"
    assert second.settings["reference_draws"] == "reused" and first.sides[0] == second.sides[0]
    check(seed=6)
    other = generate_inputs(d, "small", seed=1)
    check(inputs=other)
    check(definition=sampler(TOP_K_REFERENCE + "\n# another reference\n"))
    assert calls == [5, 6, 5, 5]
    monkeypatch.setattr(drawstore.torch, "__version__", "0.0.0-another-build")
    check()
    assert calls == [5, 6, 5, 5, 5]
    monkeypatch.undo()
    monkeypatch.setattr(compare_samples, "draw_reference", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    files = sorted(tmp_path.rglob("*.pt"))
    assert len(files) == 5
    for f in files:
        f.write_bytes(b"not a tensor")
    assert check().settings["reference_draws"] == "made" and calls[-1] == 5
    assert "reference_draws" not in compare_samples.check_sampler(d, x, gt, SETTINGS, 5).settings  # no store

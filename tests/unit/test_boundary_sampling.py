"""The sampling boundary cases (inputs/sampling.py, docs/boundary/sampling.md): each builds the boundary it
names, the float64 ground truth keeps there what the contract says, the definitions' true references pass,
and the planted bug of each boundary class fails there. On a 1024-token vocabulary, so it runs in seconds;
the reference suite runs the same cases on the shipped vocabularies."""

from __future__ import annotations

import pytest
import torch

from flashinfer_trace.definition import Definition
from flashinfer_trace.extract.templates.sampling import sampling
from flashinfer_trace.groundtruth import get_ground_truth
from flashinfer_trace.groundtruth.base import Call
from flashinfer_trace.groundtruth.torch_ref import filtered_distribution
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.inputs.sampling import EXACT_TOP_P, INT32_MAX, TIE_VALUE
from flashinfer_trace.mutants import MUTANTS, mutate
from flashinfer_trace.sandbox import ReferenceFailure
from flashinfer_trace.verdict.samples import SamplingMismatch, SamplingSettings, assert_samples_match, exact_rows

VOCAB = 1024
KINDS = ("top_k", "top_p", "top_k_top_p")


def definition(kind: str) -> Definition:
    return Definition.model_validate(sampling(kind, VOCAB))


def kept(d: Definition, case: str, size: str = "small"):
    x = generate_inputs(d, size, 0, case=case)
    return x, filtered_distribution(Call(d, x, None, None))


def test_every_kind_lists_the_cases_its_filters_have():
    assert edge_cases(definition("top_k")) == ["top_k_1", "ties_at_cut", "uniform", "one_hot", "last_token",
                                               "filters_off", "tiny_probs"]
    assert edge_cases(definition("top_p")) == ["top_p_small", "ties_at_cut", "uniform", "top_p_exact", "one_hot",
                                               "last_token", "filters_off", "tiny_probs"]
    assert len(edge_cases(definition("top_k_top_p"))) == 9


@pytest.mark.parametrize("kind", KINDS)
def test_boundary_cases_generate_at_every_size(kind):
    d = definition(kind)
    for case in edge_cases(d):
        for size in ("small", "medium", "large"):
            x = generate_inputs(d, size, 0, case=case)  # shapes, dtypes and the sum-to-1 constraint checked
            assert x.values["probs"].dtype == torch.float32 and (x.values["probs"] >= 0).all()


# -- what the contract keeps at each boundary (the float64 ground truth) -------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_tie_straddling_the_cut_is_kept_whole(kind):
    x, q = kept(definition(kind), "ties_at_cut")
    probs = x.values["probs"]
    for r in range(probs.shape[0]):
        tie = probs[r] == torch.tensor(TIE_VALUE, dtype=torch.float32)
        above = probs[r] > torch.tensor(TIE_VALUE, dtype=torch.float32)
        assert tie.sum() >= 4
        assert torch.equal(q[r] > 0, tie | above)  # the head and the whole tie, nothing below
        k = int(x.values["top_k"][r]) if "top_k" in x.values else VOCAB
        p = float(x.values["top_p"][r]) if "top_p" in x.values else 1.0
        if k < VOCAB:  # the cut by rank falls inside the tie
            assert int(above.sum()) < k < int((tie | above).sum())
        else:
            head = float(probs[r][above].double().sum())
            assert head < p < head + float(tie.sum()) * TIE_VALUE


@pytest.mark.parametrize("kind", KINDS)
def test_a_uniform_row_keeps_the_whole_vocabulary(kind):
    x, q = kept(definition(kind), "uniform")
    assert torch.allclose(q, torch.full_like(q, 1 / VOCAB))
    if "top_k" in x.values:
        assert (x.values["top_k"] < VOCAB).any()
    if "top_p" in x.values:
        assert (x.values["top_p"] < 1).all()


@pytest.mark.parametrize("kind", ["top_p", "top_k_top_p"])
def test_top_p_at_an_exact_cumulative_mass_drops_the_token_there(kind):
    x, q = kept(definition(kind), "top_p_exact")
    assert exact_rows(x).all()
    for r, top_p in enumerate(EXACT_TOP_P):
        assert float(x.values["top_p"][r]) == top_p
        expected = {0.5: 1, 0.75: 2, 0.875: 3, 0.96875: 5}[top_p]  # 1/2, 1/4, 1/8, ...: strict <; 31/32: the tail tie
        assert int((q[r] > 0).sum()) == expected


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case, hot", [("one_hot", None), ("last_token", VOCAB - 1)])
def test_all_the_mass_on_one_token_is_all_that_is_kept(kind, case, hot):
    x, q = kept(definition(kind), case)
    row = x.values["probs"][0]
    assert int((row > 0).sum()) == 1 and (hot is None or row[hot] == 1)
    assert torch.equal(q[0], row.double())
    if case == "one_hot":
        assert x.values["probs"][1, 0] == 1 and q[1, 0] == 1
    else:
        assert q[1, VOCAB - 1] == 0.75 and q[1, VOCAB - 2] == 0.25


@pytest.mark.parametrize("kind", KINDS)
def test_filters_at_their_disabling_values_keep_everything(kind):
    x, q = kept(definition(kind), "filters_off")
    probs = x.values["probs"].double()
    assert torch.allclose(q, probs / probs.sum(dim=1, keepdim=True), rtol=1e-12, atol=0)
    assert (probs.max(dim=1).values < 0.01).all()  # spread over the whole vocabulary
    if "top_k" in x.values:
        assert x.values["top_k"].tolist() == [VOCAB, INT32_MAX, VOCAB + 1]
    if "top_p" in x.values:
        assert (x.values["top_p"] == 1).all()


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_and_subnormal_tokens_are_kept_and_zeros_never(kind):
    x, q = kept(definition(kind), "tiny_probs")
    probs = x.values["probs"]
    subnormal = (probs > 0) & (probs < torch.finfo(torch.float32).tiny)
    assert subnormal[0].sum() == 512 and (probs == 0).any()
    assert torch.equal(q[0] > 0, probs[0] > 0) and torch.equal(q[2] > 0, probs[2] > 0)  # all that is nonzero
    assert not (q[:, :][probs == 0] > 0).any()
    if "top_p" in x.values:  # 0.99999 drops everything below the four tokens that hold the mass
        assert int((q[1] > 0).sum()) == 4
    else:  # top_k 120 reaches into the 1e-40 tokens: all 256 of them tie, all are kept
        assert int((q[1] > 0).sum()) == 4 + 16 + 256


# -- the true references pass, the planted bug of each class fails -------------------------------------------
SETTINGS = SamplingSettings.cpu(edge=True)  # what the engine plans for a boundary case on a CPU


@pytest.mark.parametrize("kind", KINDS)
def test_the_true_reference_passes_every_boundary_case(kind):
    d = definition(kind)
    gt = get_ground_truth("torch", d, device="cpu")
    for case in edge_cases(d):
        assert_samples_match(d, generate_inputs(d, "small", 0, case=case), gt, settings=SETTINGS, seed=0)


def mutant(kind: str, bug: str) -> Definition:
    m = next(m for m in MUTANTS if m.definition.startswith(f"{kind}_sampling") and m.id == bug)
    return mutate(definition(kind), m)


@pytest.mark.parametrize("kind, bug, case, verdict", [
    ("top_k", "ties-by-rank", "ties_at_cut", "distribution"),
    ("top_k", "ties-by-rank", "uniform", "distribution"),
    ("top_p", "ties-by-rank", "ties_at_cut", "distribution"),
    ("top_p", "le-top-p", "top_p_exact", "bug"),
    ("top_k_top_p", "last-id-clamped", "last_token", "bug"),
    ("top_k_top_p", "probs-as-logits", "one_hot", "bug"),
    ("top_k_top_p", "leak-cpu", "tiny_probs", "bug"),
])
def test_each_boundary_class_catches_its_planted_bug(kind, bug, case, verdict):
    d = mutant(kind, bug)
    with pytest.raises(SamplingMismatch) as e:
        assert_samples_match(d, generate_inputs(d, "small", 0, case=case), get_ground_truth("torch", d, device="cpu"),
                             settings=SETTINGS, seed=0)
    assert e.value.report.verdict == verdict


def test_a_top_k_past_the_vocabulary_not_clamped_fails_on_filters_off():
    d = mutant("top_k", "k-past-vocab")
    with pytest.raises(ReferenceFailure):
        assert_samples_match(d, generate_inputs(d, "small", 0, case="filters_off"),
                             get_ground_truth("torch", d, device="cpu"), settings=SETTINGS, seed=0)

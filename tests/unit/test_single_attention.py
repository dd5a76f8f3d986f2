"""single_decode / single_prefill (FlashInfer's single-request attention): the generator makes one request with
the lengths each case names (docs/boundary/attention.md, "Single-request attention"), the float64 truth is the
ragged truth with one request, the FlashInfer adapters gate per release and pass every call mode's keywords
through (a fake module: no GPU here), the FLOP model counts the one request, and each planted bug is caught by
its case."""

from __future__ import annotations

import dataclasses
import math
import sys
import types
from pathlib import Path

import pytest
import torch
from fakes import install_flashinfer
from packaging.version import Version

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.definition import Definition
from flashinfer_trace.groundtruth import GroundTruthUnavailable, get_ground_truth, modes, paths
from flashinfer_trace.groundtruth import flashinfer_single as fs
from flashinfer_trace.groundtruth.base import Call
from flashinfer_trace.inputs import attention as att
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.inputs import single_attention as gen
from flashinfer_trace.mutants import MUTANTS, mutate
from flashinfer_trace.testing import run_reference
from flashinfer_trace.timing.roofline import work
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import compare_with_model

ROOT = Path(__file__).resolve().parents[2] / "definitions"
DECODES = sorted((ROOT / "single_decode").glob("*.json"))
PREFILLS = sorted((ROOT / "single_prefill").glob("*.json"))
DECODE = ROOT / "single_decode" / "single_decode_h32_kv8_d128.json"
PREFILL = ROOT / "single_prefill" / "single_prefill_causal_h32_kv8_d128.json"
RAGGED = ROOT / "gqa_ragged" / "gqa_ragged_prefill_causal_h32_kv8_d128.json"


def _d(path):
    return load_definition(path)


def _variant(d, **changes):
    """A copy of a definition with some top-level fields replaced (validated afresh)."""
    return Definition.model_validate({**d.as_dict, **changes})


# -- definitions and the generator ------------------------------------------------------------------------------
def test_the_definitions_are_the_two_op_types_with_their_tags():
    assert len(DECODES) == len(PREFILLS) == 4
    for path in DECODES + PREFILLS:
        d = _d(path)
        fn = "decode.single_decode_with_kv_cache" if d.op_type == "single_decode" else \
            "prefill.single_prefill_with_kv_cache"
        assert f"fi_api:flashinfer.{fn}" in d.tags and "coverage:single-request" in d.tags
        assert any(t.startswith("model:") for t in d.tags) and set(d.outputs) == {"output", "lse"}
    assert all(_d(p).constraints == ["qo_len <= kv_len"] for p in PREFILLS)


def test_edge_cases_are_the_ones_one_request_has():
    assert edge_cases(_d(DECODE)) == ["single_token", "empty_kv", *att.SCORE_CASES, "long_kv"]
    assert edge_cases(_d(PREFILL)) == ["single_token", "qo_equals_kv", *att.SCORE_CASES, "long_kv"]
    for cases in (edge_cases(_d(DECODE)), edge_cases(_d(PREFILL))):  # batch structure, or outside the contract
        assert not {"batch1", "uneven", "empty", "empty_qo", "fully_masked_rows", "large_offsets"} & set(cases)


def _lens(x) -> tuple[int, int]:
    q = x.values["q"]
    return x.values["k"].shape[0], (q.shape[0] if q.dim() == 3 else 1)


@pytest.mark.parametrize("path", [DECODE, PREFILL], ids=lambda p: p.stem)
@pytest.mark.parametrize("size", ["small", "medium"])
def test_every_case_is_one_request_with_qo_len_at_most_kv_len(path, size):
    d = _d(path)
    tier = att.TIERS[size]
    for case in [None, *edge_cases(d)]:
        x = generate_inputs(d, size, 0, case=case)
        kv, qo = _lens(x)
        assert x.values["v"].shape == x.values["k"].shape
        assert math.isclose(x.values["sm_scale"], 1 / math.sqrt(128), rel_tol=1e-6)
        if case != "empty_kv":
            assert 1 <= qo <= kv, case
        if case is None:
            assert tier.max_kv // 2 < kv <= tier.max_kv
        expected = {"single_token": (1, 1), "empty_kv": (0, 1), "long_kv": (tier.long_kv, None),
                    "qo_equals_kv": (qo, kv)}.get(case)
        if expected:
            assert kv == expected[0] and (expected[1] is None or qo == expected[1]), case
    assert _lens(generate_inputs(d, size, 0, case="long_kv"))[1] <= gen.LONG_KV_QUERIES


def test_score_cases_shape_the_one_requests_keys():
    x = generate_inputs(_d(DECODE), "small", 0, case="uniform_keys")
    k = x.values["k"]
    assert torch.equal(k, k[:1].expand_as(k))
    x = generate_inputs(_d(PREFILL), "small", 0, case="scores_far_negative")
    assert bool((x.values["k"][..., 0] == -256).all())


def test_an_unknown_input_leaves_the_case_to_the_declaration():
    d = _d(DECODE)
    data = d.as_dict
    bad = _variant(d, inputs={**data["inputs"], "kv_indptr": {"shape": ["num_qo_heads"], "dtype": "int32"}},
                   reference=data["reference"].replace("sm_scale)", "sm_scale, kv_indptr)"))
    assert generate_inputs(bad).source == "declared"
    with pytest.raises(Exception, match="does not know input"):
        generate_inputs(bad, case="long_kv")


# -- the float64 truth ------------------------------------------------------------------------------------------
def _truth(d, x):
    return get_ground_truth("torch", d, device="cpu")(x)


@pytest.mark.parametrize("case", [None, "qo_equals_kv", "one_key_dominates"])
def test_the_truth_is_the_ragged_truth_with_one_request(case):
    x = generate_inputs(_d(PREFILL), "small", 0, case=case)
    kv, qo = _lens(x)
    ragged = dataclasses.replace(x, values={**x.values, "qo_indptr": torch.tensor([0, qo], dtype=torch.int32),
                                            "kv_indptr": torch.tensor([0, kv], dtype=torch.int32)})
    got, want = _truth(_d(PREFILL), x), _truth(_d(RAGGED), ragged)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_decode_truth_drops_the_query_axis_and_gives_the_empty_softmax():
    d = _d(DECODE)
    out, lse = _truth(d, generate_inputs(d, "small", 0, case="empty_kv"))
    assert out.shape == (32, 128) and lse.shape == (32,)
    assert bool((out == 0).all()) and bool(torch.isneginf(lse).all())
    out, lse = _truth(d, generate_inputs(d, "small", 0, case="zero_query"))  # uniform weights: lse = log2(kv_len)
    kv = generate_inputs(d, "small", 0, case="zero_query").values["k"].shape[0]
    assert torch.allclose(lse, torch.full_like(lse, math.log2(kv)))


# -- FlashInfer adapters (a fake module) ------------------------------------------------------------------------
CALLS: list[dict] = []


def _attend(q, k, v, kv_layout, sm_scale, causal=False, return_lse=False):
    """A stand-in kernel: float64 attention with the layout and mask the keywords ask for."""
    if kv_layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    decode = q.dim() == 2
    qq = (q[None] if decode else q).double()
    kk, vv = k.double(), v.double()
    g = qq.shape[1] // kk.shape[1]
    kk, vv = kk.repeat_interleave(g, dim=1), vv.repeat_interleave(g, dim=1)
    s = torch.einsum("qhd,khd->hqk", qq, kk) * sm_scale
    if causal:
        i = torch.arange(s.shape[1])[:, None]
        s = s.masked_fill(torch.arange(s.shape[2])[None, :] > i + (s.shape[2] - s.shape[1]), -math.inf)
    out = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vv).to(q.dtype)
    lse = (torch.logsumexp(s, dim=-1) / math.log(2)).transpose(0, 1).float()
    if decode:
        out, lse = out[0], lse[0]
    return (out, lse) if return_lse else out


def _decode(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE", use_tensor_cores=False, sm_scale=None,
            return_lse=False):
    CALLS.append(dict(kv_layout=kv_layout, use_tensor_cores=use_tensor_cores, return_lse=return_lse, k=k.shape))
    return _attend(q, k, v, kv_layout, sm_scale, return_lse=return_lse)


def _old_decode(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE", use_tensor_cores=False, sm_scale=None):
    return _attend(q, k, v, kv_layout, sm_scale)


def _prefill(q, k, v, causal=False, kv_layout="NHD", sm_scale=None, backend="auto", return_lse=False):
    CALLS.append(dict(kv_layout=kv_layout, causal=causal, backend=backend, return_lse=return_lse, k=k.shape))
    return _attend(q, k, v, kv_layout, sm_scale, causal=causal, return_lse=return_lse)


def _fake_flashinfer(monkeypatch, version, decode=_decode, prefill=_prefill, cc=(9, 0)):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    module.decode = types.SimpleNamespace(single_decode_with_kv_cache=decode)
    module.prefill = types.SimpleNamespace(single_prefill_with_kv_cache=prefill)
    install_flashinfer(monkeypatch, module, version, cc=cc)
    CALLS.clear()
    return module


def test_flashinfer_is_not_installed_here():
    with pytest.raises(GroundTruthUnavailable) as e:
        get_ground_truth("flashinfer", _d(DECODE), device="cuda")
    assert e.value.kind in ("not-installed", "import-failed")


def test_paths_cover_every_call_mode():
    assert paths("flashinfer", _d(DECODE)) == [None, *fs.DECODE_MODES, "tensor-cores",
                                               *(f"tensor-cores+{m}" for m in fs.DECODE_MODES)]
    assert paths("flashinfer", _d(PREFILL)) == [None, *fs.PREFILL_MODES]


def _run(path, mode, case=None, device="cuda"):
    d = _d(path)
    gt = dataclasses.replace(get_ground_truth("flashinfer", d, device=device, path=mode), device="cpu")
    x = generate_inputs(d, "small", 0, case=case)
    return gt(x), _truth(d, x)


def _close(got, want) -> bool:
    return all(torch.allclose(g.double(), w, atol=2e-2, rtol=2e-2) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("mode, layout, tc", [(None, "NHD", False), ("hnd", "HND", False),
                                              ("tensor-cores", "NHD", True), ("tensor-cores+hnd", "HND", True)])
def test_decode_modes_pass_layout_tensor_cores_and_lse(monkeypatch, mode, layout, tc):
    _fake_flashinfer(monkeypatch, "0.6.6")
    got, want = _run(DECODE, mode)
    assert len(got) == 2 and _close(got, want)
    (call,) = CALLS
    assert call["kv_layout"] == layout and call["use_tensor_cores"] is tc and call["return_lse"] is True
    assert call["k"][0 if layout == "HND" else 1] == 8  # num_kv_heads first in HND


@pytest.mark.parametrize("mode, layout, backend", [(None, "NHD", "fa2"), ("hnd", "HND", "fa2"), ("fa3", "NHD", "fa3"),
                                                   ("fa3-hnd", "HND", "fa3")])
def test_prefill_modes_pass_layout_backend_causal_and_lse(monkeypatch, mode, layout, backend):
    _fake_flashinfer(monkeypatch, "0.6.6")
    monkeypatch.setattr(fs, "_device_cc", lambda t: (9, 0))
    d = _d(PREFILL)
    x = generate_inputs(d, "small", 0)
    adapter = next(a for a in fs.ADAPTERS if a.op_type == "single_prefill")
    got = adapter.fn(Call(d, x, sys.modules["flashinfer"], Version("0.6.6"), mode=mode))
    assert _close(got, _truth(d, x))
    (call,) = CALLS
    assert call == dict(kv_layout=layout, causal=True, backend=backend, return_lse=True,
                        k=(8, *x.values["k"].shape[:1], 128) if layout == "HND" else tuple(x.values["k"].shape))


def test_fa3_needs_sm90(monkeypatch):
    _fake_flashinfer(monkeypatch, "0.6.6")
    monkeypatch.setattr(fs, "_device_cc", lambda t: (10, 0))
    d = _d(PREFILL)
    x = generate_inputs(d, "small", 0)
    adapter = next(a for a in fs.ADAPTERS if a.op_type == "single_prefill")
    with pytest.raises(GroundTruthUnavailable, match="arch-unsupported: .*needs sm90, have sm100"):
        adapter.fn(Call(d, x, sys.modules["flashinfer"], Version("0.6.6"), mode="fa3"))


def test_a_decode_without_return_lse_is_api_missing_before_0_2_6(monkeypatch):
    _fake_flashinfer(monkeypatch, "0.2.5", decode=_old_decode)
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*no return_lse \(needs >=0.2.6\)"):
        get_ground_truth("flashinfer", _d(DECODE), device="cuda")
    data = _d(DECODE).as_dict
    output_only = _variant(_d(DECODE), outputs={"output": data["outputs"]["output"]},
                           reference=data["reference"].replace("return output, lse", "return output")
                           .replace("return output.to(q.dtype), lse", "return output.to(q.dtype)"))
    gt = dataclasses.replace(get_ground_truth("flashinfer", output_only, device="cuda"), device="cpu")
    x = generate_inputs(output_only, "small", 0)
    (out,) = gt(x)
    assert torch.allclose(out.double(), _truth(output_only, x)[0], atol=2e-2, rtol=2e-2)


def test_a_prefill_before_0_2_0_is_api_missing(monkeypatch):
    _fake_flashinfer(monkeypatch, "0.1.6")
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*needs >=0.2.0"):
        get_ground_truth("flashinfer", _d(PREFILL), device="cuda")


@pytest.mark.parametrize("path", [DECODE, PREFILL], ids=lambda p: p.stem)
def test_the_plan_launches_on_the_live_tensors(monkeypatch, path):
    """modes.py's plan-reuse (the graph path's launch, run on stand-in data and then on the case's)."""
    fi = _fake_flashinfer(monkeypatch, "0.6.6")
    d = _d(path)
    x = generate_inputs(d, "small", 0)
    adapter = next(a for a in fs.ADAPTERS if a.applies(d) is None)
    got = modes.run(adapter, Call(d, x, fi, Version("0.6.6"), mode="plan-reuse"))
    assert _close(got, _truth(d, x))


def test_the_adapters_refuse_the_other_stage():
    dec, pre = (next(a for a in fs.ADAPTERS if a.op_type == op) for op in ("single_decode", "single_prefill"))
    assert dec.applies(_d(DECODE)) is None and pre.applies(_d(PREFILL)) is None
    assert "rank 3" in dec.applies(_variant(_d(PREFILL), op_type="single_decode"))


# -- roofline ---------------------------------------------------------------------------------------------------
def test_flops_count_the_one_request():
    d = _d(PREFILL)
    x = generate_inputs(d, "small", 0, case="qo_equals_kv")
    kv, qo = _lens(x)
    assert work(d, x).flops == 2 * 32 * (qo * (qo + 1) // 2) * 256
    d = _d(DECODE)
    x = generate_inputs(d, "small", 0, case="long_kv")
    assert work(d, x).flops == 2 * 32 * x.values["k"].shape[0] * 256


# -- planted bugs -----------------------------------------------------------------------------------------------
BOUNDARY = {
    "single_decode_h32_kv8_d128:no-max-subtraction": "scores_far_negative",
    "single_prefill_causal_h32_kv8_d128:no-max-subtraction": "scores_large",
    "single_decode_h32_kv8_d128:flush-subnormal-q": "subnormal_query",
    "single_decode_h32_kv8_d128:lse-zero-on-empty": "empty_kv",
    "single_decode_h32_kv8_d128:last-chunk-only": "long_kv",
    "single_prefill_causal_h32_kv8_d128:mask-top-left": None,
    "single_prefill_causal_h32_kv8_d128:mask-strict": "single_token",
}
WRONG_MATH = ("mask-top-left", "mask-strict")  # caught on typical inputs as well
FAMILY = [m for m in MUTANTS if m.definition.startswith("single_")]


def _passes(d, case) -> bool:
    x = generate_inputs(d, "small", 0, case=case)
    try:
        actual = run_reference(d, x)
    except Exception:  # noqa: BLE001
        return False
    return all(r.passed for r in compare_with_model(d, x, actual, _truth(d, x), tolerance_for(d)))


def test_every_family_mutant_has_its_case():
    assert {m.name for m in FAMILY} == set(BOUNDARY)


@pytest.mark.parametrize("name", sorted(BOUNDARY))
def test_a_planted_bug_is_caught_by_its_case(name):
    (mutant,) = [m for m in FAMILY if m.name == name]
    d = _d(ROOT / mutant.definition.rsplit("_h", 1)[0].replace("_causal", "") / f"{mutant.definition}.json")
    bad = mutate(d, mutant)
    case = BOUNDARY[name]
    assert _passes(d, case), f"the true reference fails {case}"
    assert not _passes(bad, case), f"{name} survives {case}"
    if mutant.id not in WRONG_MATH:
        assert _passes(bad, None), f"{name} is caught on typical inputs already: not a boundary bug"

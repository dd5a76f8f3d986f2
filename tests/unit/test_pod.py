"""pod (FlashInfer's PODWithPagedKVCacheWrapper): the generator makes the lengths each case names
(docs/boundary/pod.md), the float64 truth equals the two halves computed apart (single-request causal prefill,
paged decode) and agrees with the reference, the FlashInfer adapter plans and runs the wrapper with the keywords
each release takes (a fake module: no GPU here), and each planted bug is caught by its case."""

from __future__ import annotations

import math
import types
from pathlib import Path

import pytest
import torch
from fakes import install_flashinfer
from packaging.version import Version
from planted import assert_caught_by_its_case, assert_family_cases, truth

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.groundtruth import GroundTruthUnavailable, get_ground_truth, modes, paths
from flashinfer_trace.groundtruth import flashinfer_pod as fpod
from flashinfer_trace.groundtruth import torch_pod as tpod
from flashinfer_trace.groundtruth.base import Call
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.inputs import pod as gen
from flashinfer_trace.mutants import MUTANTS
from flashinfer_trace.testing import run_reference
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import compare_with_model, model_for

ROOT = Path(__file__).resolve().parents[2] / "definitions"
DEFS = sorted((ROOT / "pod").glob("*.json"))
GQA = "pod_h32_kv8_d128_ps16"
MHA = "pod_h32_kv32_d128_ps16"


def _pages(x):
    p = x.values["kv_indptr"].tolist()
    return [p[i + 1] - p[i] for i in range(len(p) - 1)]


def _decode_lens(x):
    ps = x.values["k_cache"].shape[1]
    return [(n - 1) * ps + int(last) for n, last in zip(_pages(x), x.values["kv_last_page_len"].tolist(), strict=True)]


# -- definitions and the generator ------------------------------------------------------------------------------
def test_the_definitions_name_the_wrapper_a_model_and_both_outputs():
    assert len(DEFS) == 2
    for path in DEFS:
        d = load_definition(path)
        assert d.op_type == "pod" and "fi_api:flashinfer.pod.PODWithPagedKVCacheWrapper" in d.tags
        assert any(t.startswith("model:") for t in d.tags) and list(d.outputs) == ["output_p", "output_d"]
        assert d.const_axes["page_size"] == 16 and "qo_len >= 1 and qo_len <= kv_len" in d.constraints
    assert {load_definition(p).const_axes["num_kv_heads"] for p in DEFS} == {8, 32}


def test_edge_cases():
    assert edge_cases(load_definition(GQA)) == list(gen.CASES)
    assert {"prefill_one_token", "prefill_square", "single_decode", "decode_one_key", "scores_far_negative",
            "one_key_dominates"} <= set(gen.CASES)


@pytest.mark.parametrize("name", [GQA, MHA])
@pytest.mark.parametrize("case", [None, *gen.CASES])
def test_every_case_keeps_the_contract(name, case):
    d = load_definition(name)
    x = generate_inputs(d, "small", 0, case=case)  # finish() checks every constraint
    qo, kv = x.values["q_p"].shape[0], x.values["k_p"].shape[0]
    assert 1 <= qo <= kv and x.values["q_d"].shape[0] == len(_pages(x)) >= 1
    assert min(_decode_lens(x)) >= 1 and x.values["sm_scale"] == pytest.approx(1 / math.sqrt(128))


def test_the_cases_make_their_lengths():
    d = load_definition(GQA)
    typical = generate_inputs(d, "small", 0)
    assert 2 <= typical.values["q_p"].shape[0] < typical.values["k_p"].shape[0]
    assert min(_pages(typical)) >= 2 and len(_pages(typical)) >= 2
    x = generate_inputs(d, "small", 0, case="prefill_one_token")
    assert x.values["q_p"].shape[0] == 1 < x.values["k_p"].shape[0]
    x = generate_inputs(d, "small", 0, case="prefill_square")
    assert x.values["q_p"].shape[0] == x.values["k_p"].shape[0] >= 2
    assert generate_inputs(d, "small", 0, case="single_decode").values["q_d"].shape[0] == 1
    assert 1 in _decode_lens(generate_inputs(d, "small", 0, case="decode_one_key"))


# -- the float64 truth ------------------------------------------------------------------------------------------
def _sdpa(q, k, v, causal_offset, scale):
    """One request's attention, heads by torch's SDPA in float64 with an explicit bottom-right mask."""
    group = q.shape[1] // k.shape[1]
    qq, kk, vv = (t.double().transpose(0, 1) for t in (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)))
    mask = None
    if causal_offset is not None:
        i = torch.arange(q.shape[0])[:, None]
        mask = torch.arange(k.shape[0])[None, :] <= i + causal_offset
    return torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=scale).transpose(0, 1)


@pytest.mark.parametrize("case", [None, "prefill_one_token", "prefill_square", "decode_one_key"])
def test_the_truth_is_the_two_halves_apart(case):
    d = load_definition(GQA)
    x = generate_inputs(d, "small", 0, case=case)
    v = x.values
    out_p, out_d = tpod.pod(Call(d, x, None, None))
    qo, kv = v["q_p"].shape[0], v["k_p"].shape[0]
    want_p = _sdpa(v["q_p"], v["k_p"], v["v_p"], kv - qo, v["sm_scale"])
    assert torch.allclose(out_p.double(), want_p.to(out_p.dtype).double(), atol=1e-2, rtol=1e-2)
    ps, p = v["k_cache"].shape[1], v["kv_indptr"].tolist()
    for b, n in enumerate(_decode_lens(x)):
        pages = v["kv_indices"][p[b]:p[b + 1]].long()
        k = v["k_cache"][pages].reshape(-1, *v["k_cache"].shape[2:])[:n]
        vv = v["v_cache"][pages].reshape(-1, *v["v_cache"].shape[2:])[:n]
        want = _sdpa(v["q_d"][b:b + 1], k, vv, None, v["sm_scale"])[0]
        assert torch.allclose(out_d[b].double(), want.to(out_d.dtype).double(), atol=1e-2, rtol=1e-2)
        if n == 1:  # one key: the output is its value
            assert torch.equal(out_d[b], vv[0].repeat_interleave(4, 0).to(out_d.dtype))
    assert ps == 16


def test_the_prefill_mask_is_bottom_right():
    m = tpod.prefill_mask(2, 5, "cpu")
    assert m.tolist() == [[True] * 4 + [False], [True] * 5]
    assert tpod.prefill_mask(3, 3, "cpu").sum().item() == 6


@pytest.mark.parametrize("name", [GQA, MHA])
@pytest.mark.parametrize("case", [None, "prefill_square", "decode_one_key", "scores_large", "one_key_dominates"])
def test_the_reference_agrees_with_the_truth(name, case):
    d = load_definition(name)
    x = generate_inputs(d, "small", 0, case=case)
    got, want = run_reference(d, x), truth(d, x)
    assert all(r.passed for r in compare_with_model(d, x, got, want, tolerance_for(d)))


def test_the_error_model_covers_both_halves():
    m = model_for(load_definition(GQA))
    assert m is not None and m.absolute_inputs == ("v_p", "v_cache") and m.outputs == ("output_p", "output_d")


# -- the FlashInfer adapter (a fake module) ---------------------------------------------------------------------
CALLS: list[dict] = []


def _wrapper_class(*, plan_scale=True, causal_kw=True):
    class Wrapper:
        def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False):
            self.layout = kv_layout

        def _plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kw):
            CALLS.append(dict(heads=(num_qo_heads, num_kv_heads, head_dim), page_size=page_size, **kw))
            self.paged = (indptr.clone(), indices.clone(), last_page_len.clone(), page_size)
            self.scale = kw.get("sm_scale")

        def _run(self, q_p, k_p, v_p, q_d, cache, causal_p=False, sm_scale_p=None):
            indptr, indices, last, ps = self.paged
            kc, vc = cache if isinstance(cache, tuple) else cache.unbind(1)
            scale_d = self.scale or 1 / math.sqrt(q_d.shape[-1])
            mask = tpod.prefill_mask(q_p.shape[0], k_p.shape[0], q_p.device) if causal_p else None
            out_p = tpod.attend(q_p, k_p, v_p, mask, sm_scale_p or 1 / math.sqrt(q_p.shape[-1])).to(q_p.dtype)
            fk, fv = kc.flatten(0, 1), vc.flatten(0, 1)
            out_d = torch.stack([tpod.attend(q_d[b:b + 1], fk[r], fv[r], None, scale_d)[0]
                                 for b, r in enumerate(tpod.decode_slots(indptr, indices, last, ps))]).to(q_d.dtype)
            CALLS.append(dict(run=True, causal_p=causal_p, sm_scale_p=sm_scale_p, tuple=isinstance(cache, tuple)))
            return out_p, out_d

    if plan_scale:
        def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                 pos_encoding_mode="NONE", window_left=-1, q_data_type="float16", kv_data_type=None, data_type=None,
                 sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True):
            self._plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                       q_dtype=q_data_type, kv_dtype=kv_data_type, sm_scale=sm_scale)
    else:
        def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                 q_data_type="float16"):
            self._plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                       q_dtype=q_data_type)
    if causal_kw:
        def run(self, q_p, k_p, v_p, q_d, paged_kv_cache_d, custom_mask_p=None, packed_custom_mask_p=None,
                causal_p=False, kv_layout_p="NHD", sm_scale_p=None, return_lse_p=False, enable_pdl=None):
            return self._run(q_p, k_p, v_p, q_d, paged_kv_cache_d, causal_p, sm_scale_p)
    else:
        def run(self, q_p, k_p, v_p, q_d, paged_kv_cache_d):
            return self._run(q_p, k_p, v_p, q_d, paged_kv_cache_d)
    Wrapper.plan, Wrapper.run = plan, run
    return Wrapper


def _fake(monkeypatch, version, **kw):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    module.pod = types.SimpleNamespace(PODWithPagedKVCacheWrapper=_wrapper_class(**kw))
    install_flashinfer(monkeypatch, module, version)
    CALLS.clear()
    return module


def _close(got, want) -> bool:
    return all(torch.allclose(g.double(), w.double(), atol=2e-2, rtol=2e-2) for g, w in zip(got, want, strict=True))


def test_flashinfer_is_not_installed_here():
    with pytest.raises(GroundTruthUnavailable) as e:
        get_ground_truth("flashinfer", load_definition(GQA), device="cuda")
    assert e.value.kind in ("not-installed", "import-failed")


def test_paths_cover_every_call_mode():
    assert paths("flashinfer", load_definition(GQA)) == [None, *fpod.MODES]
    assert paths("torch", load_definition(GQA)) == [None]


@pytest.mark.parametrize("mode", [None, "single-tensor"])
@pytest.mark.parametrize("case", [None, "prefill_square", "decode_one_key"])
def test_plan_and_run_pass_the_pages_heads_scale_and_causal_prefill(monkeypatch, mode, case):
    fi = _fake(monkeypatch, "0.7.2.post1")
    d = load_definition(GQA)
    x = generate_inputs(d, "small", 0, case=case)
    got = fpod.ADAPTERS[0].fn(Call(d, x, fi, Version("0.7.2.post1"), mode=mode))
    assert len(got) == 2 and _close(got, truth(d, x))
    plan, run = CALLS
    assert plan["heads"] == (32, 8, 128) and plan["page_size"] == 16
    assert plan["q_dtype"] == torch.bfloat16 and plan["kv_dtype"] == torch.bfloat16
    assert plan["sm_scale"] == pytest.approx(1 / math.sqrt(128))
    assert run == dict(run=True, causal_p=True, sm_scale_p=pytest.approx(1 / math.sqrt(128)), tuple=mode is None)


def test_release_gates(monkeypatch):
    _fake(monkeypatch, "0.2.2")
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*>=0.2.3"):
        get_ground_truth("flashinfer", load_definition(GQA), device="cuda")
    fi = _fake(monkeypatch, "0.2.3", causal_kw=False)
    d = load_definition(GQA)
    x = generate_inputs(d, "small", 0)
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*has no causal_p"):
        fpod.ADAPTERS[0].fn(Call(d, x, fi, Version("0.2.3")))
    fi = _fake(monkeypatch, "0.2.3", plan_scale=False)  # the default scale needs no sm_scale=
    got = fpod.ADAPTERS[0].fn(Call(d, x, fi, Version("0.2.3")))
    assert _close(got, truth(d, x)) and "sm_scale" not in CALLS[0]
    x.values["sm_scale"] = 0.5 * x.values["sm_scale"]
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*plan has no sm_scale"):
        fpod.ADAPTERS[0].fn(Call(d, x, fi, Version("0.2.3")))


def test_the_plan_launches_on_the_live_tensors(monkeypatch):
    fi = _fake(monkeypatch, "0.6.6")
    d = load_definition(MHA)
    x = generate_inputs(d, "small", 0, case="decode_one_key")
    got = modes.run(fpod.ADAPTERS[0], Call(d, x, fi, Version("0.6.6"), mode="plan-reuse"))
    assert _close(got, truth(d, x))
    assert [c.get("run", False) for c in CALLS] == [False, True, True]  # one plan, two runs


def test_graph_needs_a_gpu(monkeypatch):
    fi = _fake(monkeypatch, "0.6.6")
    d = load_definition(GQA)
    x = generate_inputs(d, "small", 0)
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        modes.run(fpod.ADAPTERS[0], Call(d, x, fi, Version("0.6.6"), mode="graph"))


def test_the_adapters_refuse_what_the_wrapper_does_not_return():
    d = load_definition(GQA)
    data = d.as_dict
    bad = d.model_validate({**data, "outputs": {**data["outputs"], "lse_p": {"shape": ["qo_len", "num_qo_heads"],
                                                                            "dtype": "float32"}}})
    assert "lse_p" in fpod.applies(bad) and "lse_p" in tpod.applies(bad) and fpod.applies(d) is None


# -- planted bugs -----------------------------------------------------------------------------------------------
BOUNDARY = {
    "square-offset-clamped": "prefill_square",
    "one-token-top-left": "prefill_one_token",
    "one-page-read-whole": "decode_one_key",
    "no-max-subtraction": "scores_large",
    "finite-mask-sentinel": "scores_far_negative",
}
WRONG_MATH = ("prefill-not-causal", "causal-top-left", "decode-pages-reversed", "decode-gqa-interleaved",
              "decode-sm-scale-dropped", "halves-swapped-head-group")
FAMILY = [m for m in MUTANTS if m.definition.startswith("pod_")]


def test_every_family_mutant_has_its_case():
    assert_family_cases(FAMILY, BOUNDARY, WRONG_MATH)


@pytest.mark.parametrize("mutant", FAMILY, ids=lambda m: m.id)
def test_a_planted_bug_is_caught_by_its_case(mutant):
    assert_caught_by_its_case(mutant, BOUNDARY)

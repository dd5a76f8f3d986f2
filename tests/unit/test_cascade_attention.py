"""cascade_attention (FlashInfer's MultiLevelCascadeAttentionWrapper): the generator makes the level structure each
case names (docs/boundary/cascade_attention.md), the float64 truth is one softmax over each query's concatenated
levels (checked against hand-built attention), the FlashInfer adapter plans and runs the wrapper with the keywords
each release takes (a fake module: no GPU here), and each planted bug is caught by its case."""

from __future__ import annotations

import math
import types
from pathlib import Path

import pytest
import torch
from fakes import install_flashinfer
from packaging.version import Version
from planted import assert_caught_by_its_case, assert_family_cases, passes, truth

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.groundtruth import GroundTruthUnavailable, get_ground_truth, modes, paths
from flashinfer_trace.groundtruth import flashinfer_cascade_attention as fca
from flashinfer_trace.groundtruth import torch_cascade_attention as tca
from flashinfer_trace.groundtruth.base import Call
from flashinfer_trace.inputs import cascade_attention as gen
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.mutants import MUTANTS, mutate
from flashinfer_trace.testing import run_reference
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import compare_with_model

ROOT = Path(__file__).resolve().parents[2] / "definitions"
DEFS = sorted((ROOT / "cascade_attention").glob("*.json"))
L2 = "cascade_attention_l2_causal_h32_kv8_d128_ps16"
L3 = "cascade_attention_l3_h32_kv8_d128_ps16"


def _kv_lens(x, lv):
    p, last = x.values[f"kv_indptr_{lv}"].tolist(), x.values[f"kv_last_page_len_{lv}"].tolist()
    return [max(p[s + 1] - p[s] - 1, 0) * 16 + (last[s] if p[s + 1] > p[s] else 0) for s in range(len(p) - 1)]


def _qo_lens(x, lv):
    p = x.values[f"qo_indptr_{lv}"].tolist()
    return [b - a for a, b in zip(p, p[1:], strict=False)]


# -- definitions and the generator ------------------------------------------------------------------------------
def test_the_definitions_name_the_wrapper_a_model_and_their_levels():
    assert [p.stem for p in DEFS] == [L2, L3]
    for path in DEFS:
        d = load_definition(path)
        assert d.op_type == "cascade_attention" and set(d.outputs) == {"output"}
        assert "fi_api:flashinfer.cascade.MultiLevelCascadeAttentionWrapper" in d.tags
        assert "model:llama-3.1-8b" in d.tags
        assert gen.num_levels(d) == (2 if "_l2_" in d.name else 3)
        assert (d.const_axes["num_qo_heads"], d.const_axes["num_kv_heads"], d.const_axes["page_size"]) == (32, 8, 16)
    assert gen.is_causal(load_definition(L2)) and not gen.is_causal(load_definition(L3))


def test_edge_cases():
    assert edge_cases(load_definition(L2)) == list(gen.CASES)
    assert {"empty_shared", "no_own_kv", "single_request", "long_shared", "scores_far_negative",
            "one_key_dominates"} <= set(gen.CASES)


@pytest.mark.parametrize("name", [L2, L3])
@pytest.mark.parametrize("case", [None, *gen.CASES])
def test_every_case_keeps_the_contract(name, case):
    d = load_definition(name)
    x = generate_inputs(d, "small", 0, case=case)  # finish() checks every constraint
    levels = gen.num_levels(d)
    total = x.values["q"].shape[0]
    pages = torch.cat([x.values[f"kv_indices_{lv}"] for lv in range(levels)])
    assert pages.unique().numel() == pages.numel() and int(pages.max()) < x.values["k_cache"].shape[0]
    for lv in range(levels):
        assert x.values[f"qo_indptr_{lv}"][-1] == total
        last = x.values[f"kv_last_page_len_{lv}"]
        counts = x.values[f"kv_indptr_{lv}"].diff()
        assert bool(((last >= 1) & (last <= 16) | (counts == 0) & (last == 0)).all())
    if case is None:  # the typical batch: no empty level, under causal no query without an own key
        assert all(n > 0 for lv in range(levels) for n in _kv_lens(x, lv))
        assert all(n <= k for n, k in zip(_qo_lens(x, levels - 1), _kv_lens(x, levels - 1), strict=True))


def test_the_cases_make_their_structure():
    d = load_definition(L2)
    x = generate_inputs(d, "small", 0, case="empty_shared")
    assert x.values["kv_indptr_0"].tolist() == [0, 0] and min(_kv_lens(x, 1)) > 0
    x = generate_inputs(d, "small", 0, case="no_own_kv")
    own = _kv_lens(x, 1)
    assert own.count(0) == 1 and own[-1] > 0 and _kv_lens(x, 0)[0] > 0
    x = generate_inputs(d, "small", 0, case="single_request")
    assert x.values["qo_indptr_0"].tolist() == x.values["qo_indptr_1"].tolist() == [0, x.values["q"].shape[0]]
    x = generate_inputs(d, "small", 0, case="long_shared")
    assert _kv_lens(x, 0)[0] == gen.LONG_SHARED["small"] > max(_kv_lens(x, 1))
    x = generate_inputs(d, "small", 0, case="single_token")
    assert set(_qo_lens(x, 1)) == {1}
    x = generate_inputs(load_definition(L3), "small", 0, case="no_own_kv")
    assert len(_qo_lens(x, 1)) in (1, 2) and len(_qo_lens(x, 2)) >= 2


# -- the float64 truth --------------------------------------------------------------------------------------------
def _manual(x, t, keys):
    """Attention of query row t over the flattened cache rows `keys`, written out head by head."""
    q = x.values["q"][t].double()
    k = x.values["k_cache"].flatten(0, 1)[keys].double()
    v = x.values["v_cache"].flatten(0, 1)[keys].double()
    out = torch.empty(32, 128, dtype=torch.float64)
    for h in range(32):
        w = torch.softmax(k[:, h // 4] @ q[h] / math.sqrt(128), dim=0)
        out[h] = w @ v[:, h // 4]
    return out


def _tokens(x, lv, s):
    p = x.values[f"kv_indptr_{lv}"].tolist()
    pages = x.values[f"kv_indices_{lv}"][p[s]:p[s + 1]].long()
    return (pages[:, None] * 16 + torch.arange(16)).flatten()[:_kv_lens(x, lv)[s]]


def test_a_query_attends_to_its_levels_concatenated_causal_on_the_last_only():
    d = load_definition(L2)
    x = generate_inputs(d, "small", 1, case=None)
    (out,) = truth(d, x)
    qo = x.values["qo_indptr_1"].tolist()
    shared = _tokens(x, 0, 0)
    for r in range(len(qo) - 1):
        own, n = _tokens(x, 1, r), qo[r + 1] - qo[r]
        for i in range(n):
            keys = torch.cat([shared, own[:own.numel() - n + i + 1]])
            assert torch.allclose(out[qo[r] + i].double(), _manual(x, qo[r] + i, keys), atol=1e-2, rtol=1e-2)


def test_three_levels_without_mask_read_every_key_of_each_segment():
    d = load_definition(L3)
    x = generate_inputs(d, "small", 2, case=None)
    (out,) = truth(d, x)
    q1, q2 = x.values["qo_indptr_1"].tolist(), x.values["qo_indptr_2"].tolist()
    for r in range(len(q2) - 1):
        g = max(s for s in range(len(q1) - 1) if q1[s] <= q2[r])
        keys = torch.cat([_tokens(x, 0, 0), _tokens(x, 1, g), _tokens(x, 2, r)])
        assert torch.allclose(out[q2[r]].double(), _manual(x, q2[r], keys), atol=1e-2, rtol=1e-2)


def test_an_empty_shared_level_changes_nothing_and_a_query_without_keys_is_zero():
    d = load_definition(L2)
    x = generate_inputs(d, "small", 0, case="no_own_kv")
    rows = tca.keys_of_rows(x.values, 2, x.values["q"].shape[0], 16, causal=True)
    own = _kv_lens(x, 1)
    qo = x.values["qo_indptr_1"].tolist()
    r = own.index(0)
    assert all(torch.equal(rows[t], _tokens(x, 0, 0)) for t in range(qo[r], qo[r + 1]))
    x.values["kv_indptr_0"] = torch.tensor([0, 0], dtype=torch.int32)
    x.values["kv_last_page_len_0"] = torch.tensor([0], dtype=torch.int32)
    x.values["kv_indices_0"] = x.values["kv_indices_0"][:0]
    (out,) = truth(d, x)
    assert not out[qo[r]:qo[r + 1]].any() and out[qo[-2]:].abs().sum() > 0


@pytest.mark.parametrize("name", [L2, L3])
@pytest.mark.parametrize("case", [None, "empty_shared", "no_own_kv", "long_shared", "scores_large"])
def test_the_reference_agrees_with_the_truth(name, case):
    d = load_definition(name)
    x = generate_inputs(d, "small", 0, case=case)
    got, want = run_reference(d, x), truth(d, x)
    assert all(r.passed for r in compare_with_model(d, x, got, want, tolerance_for(d)))


# -- the FlashInfer adapter (a fake module) ---------------------------------------------------------------------
CALLS: list[dict] = []


def _wrapper_class(*, dtypes=True, prewarm=False):
    class Wrapper:
        def __init__(self, num_levels, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False):
            CALLS.append(dict(init=(num_levels, kv_layout)))
            self.levels = num_levels

        def _plan(self, qo, kp, ki, last, num_qo_heads, num_kv_heads, head_dim, page_size, causal=False,
                  sm_scale=None, **kw):
            assert len(qo) == len(kp) == len(ki) == len(last) == self.levels
            CALLS.append(dict(heads=(num_qo_heads, num_kv_heads, head_dim), page_size=page_size, causal=causal,
                              sm_scale=sm_scale, dtypes=all(t.dtype == torch.int32 for t in qo + kp + ki + last),
                              **kw))
            self.tables = {f"{n}_{lv}": t.clone() for n, arr in (("qo_indptr", qo), ("kv_indptr", kp),
                                                                  ("kv_indices", ki), ("kv_last_page_len", last))
                           for lv, t in enumerate(arr)}
            self.causal, self.sm_scale, self.page_size = causal, sm_scale, page_size

        def run(self, q, paged_kv_cache):
            k, v = paged_kv_cache
            CALLS.append(dict(run=True))
            rows = tca.keys_of_rows(self.tables, self.levels, q.shape[0], self.page_size, self.causal)
            out = torch.zeros(q.shape, dtype=torch.float64)
            kf, vf = k.flatten(0, 1).double(), v.flatten(0, 1).double()
            for t, keys in enumerate(rows):
                if keys.numel():
                    s = torch.einsum("hd,nhd->hn", q[t].double(), kf[keys].repeat_interleave(4, 1)) * self.sm_scale
                    out[t] = torch.einsum("hn,nhd->hd", torch.softmax(s, -1), vf[keys].repeat_interleave(4, 1))
            return out.to(q.dtype)

    if dtypes:
        def plan(self, qo, kp, ki, last, num_qo_heads, num_kv_heads, head_dim, page_size, causal=False,
                 pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
                 logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None):
            self._plan(qo, kp, ki, last, num_qo_heads, num_kv_heads, head_dim, page_size, causal, sm_scale,
                       q_dtype=q_data_type, kv_dtype=kv_data_type)
    else:
        def plan(self, qo, kp, ki, last, num_qo_heads, num_kv_heads, head_dim, page_size, causal=False,
                 sm_scale=None):
            self._plan(qo, kp, ki, last, num_qo_heads, num_kv_heads, head_dim, page_size, causal, sm_scale)
    Wrapper.plan = plan
    if prewarm:
        Wrapper.prewarm_paged_kv_stride_variant = lambda self, variant="independent": CALLS.append(dict(prewarm=1))
    return Wrapper


def _fake(monkeypatch, version, **kw):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    module.cascade = types.SimpleNamespace(MultiLevelCascadeAttentionWrapper=_wrapper_class(**kw))
    install_flashinfer(monkeypatch, module, version)
    CALLS.clear()
    return module


def _close(got, want) -> bool:
    return all(torch.allclose(g.double(), w.double(), atol=2e-2, rtol=2e-2) for g, w in zip(got, want, strict=True))


def test_flashinfer_is_not_installed_here():
    with pytest.raises(GroundTruthUnavailable) as e:
        get_ground_truth("flashinfer", load_definition(L2), device="cuda")
    assert e.value.kind in ("not-installed", "import-failed")


def test_paths_cover_every_call_mode():
    assert paths("flashinfer", load_definition(L2)) == [None, *fca.MODES]
    assert paths("torch", load_definition(L2)) == [None]


@pytest.mark.parametrize("name, causal", [(L2, True), (L3, False)])
@pytest.mark.parametrize("case", [None, "no_own_kv", "empty_shared"])
def test_plan_and_run_pass_every_level_causal_and_dtypes(monkeypatch, name, causal, case):
    fi = _fake(monkeypatch, "0.6.6")
    d = load_definition(name)
    x = generate_inputs(d, "small", 0, case=case)
    got = fca.ADAPTERS[0].fn(Call(d, x, fi, Version("0.6.6")))
    assert len(got) == 1 and _close(got, truth(d, x))
    init, plan, run = CALLS
    assert init["init"] == (gen.num_levels(d), "NHD") and run == dict(run=True)
    assert (plan["heads"], plan["page_size"], plan["causal"], plan["dtypes"]) == ((32, 8, 128), 16, causal, True)
    assert plan["q_dtype"] == plan["kv_dtype"] == torch.bfloat16 and plan["sm_scale"] == pytest.approx(128**-0.5)


def test_release_gates_and_keywords(monkeypatch):
    _fake(monkeypatch, "0.1.6")
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*>=0.2.0"):
        get_ground_truth("flashinfer", load_definition(L2), device="cuda")
    fi = _fake(monkeypatch, "0.2.0", dtypes=False)
    d = load_definition(L2)
    x = generate_inputs(d, "small", 0)
    got = fca.ADAPTERS[0].fn(Call(d, x, fi, Version("0.2.0")))  # a plan() without q/kv_data_type: not passed
    assert _close(got, truth(d, x)) and "q_dtype" not in CALLS[1]
    # the K/V-stride variant's prewarm: only for caches of different strides, its purpose (on sm90 the wrapper plans
    # fa3, whose wrappers refuse it: "requires a standard FA2 plan", the seventh run)
    fi = _fake(monkeypatch, "0.7.2.post1", prewarm=True)
    fca.ADAPTERS[0].fn(Call(d, x, fi, Version("0.7.2.post1")))
    assert [list(c)[0] for c in CALLS] == ["init", "heads", "run"]
    fi = _fake(monkeypatch, "0.7.2.post1", prewarm=True)
    v = x.values["v_cache"]
    strided = dict(x.values, v_cache=v.transpose(0, 1).contiguous().transpose(0, 1))  # one layout, other strides
    assert strided["v_cache"].stride() != x.values["k_cache"].stride() and torch.equal(strided["v_cache"], v)
    got = fca.ADAPTERS[0].fn(Call(d, type(x)(**{**vars(x), "values": strided}), fi, Version("0.7.2.post1")))
    assert [list(c)[0] for c in CALLS] == ["init", "heads", "prewarm", "run"] and _close(got, truth(d, x))


def test_the_plan_launches_on_the_live_tensors(monkeypatch):
    fi = _fake(monkeypatch, "0.7.2.post1")
    d = load_definition(L3)
    x = generate_inputs(d, "small", 0, case="no_own_kv")
    got = modes.run(fca.ADAPTERS[0], Call(d, x, fi, Version("0.7.2.post1"), mode="plan-reuse"))
    assert _close(got, truth(d, x))
    assert [c.get("run", False) for c in CALLS] == [False, False, True, True]  # init, one plan, two runs


def test_graph_needs_a_gpu(monkeypatch):
    fi = _fake(monkeypatch, "0.6.6")
    d = load_definition(L2)
    x = generate_inputs(d, "small", 0)
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        modes.run(fca.ADAPTERS[0], Call(d, x, fi, Version("0.6.6"), mode="graph"))


def test_the_adapter_refuses_what_the_wrapper_does_not_return():
    d = load_definition(L2)
    data = d.as_dict
    bad = d.model_validate({**data, "outputs": {**data["outputs"], "lse": {"shape": ["num_qo", "num_qo_heads"],
                                                                            "dtype": "float32"}}})
    assert "output only" in fca.applies(bad) and fca.applies(d) is None
    inputs = {k: v for k, v in data["inputs"].items() if k != "kv_last_page_len_1"}
    bad = d.model_validate({**data, "inputs": inputs})
    assert "kv_last_page_len_1" in tca.applies(bad)


# -- planted bugs -----------------------------------------------------------------------------------------------
BOUNDARY = {
    "empty-level-nan": "empty_shared",
    "empty-level-lse-zero": "no_own_kv",
    "shared-truncated": "long_shared",
    "no-max-subtraction": "scores_large",
}
WRONG_MATH = ("drops-shared-level", "causal-on-shared", "causal-top-left", "merge-natural-base", "shared-page-shifted",
              "full-last-page", "gqa-interleaved", "sm-scale-dropped", "merge-keeps-old-lse")
FAMILY = [m for m in MUTANTS if m.definition.startswith("cascade_attention_")]


def test_every_family_mutant_has_its_case():
    assert_family_cases(FAMILY, BOUNDARY, WRONG_MATH)


@pytest.mark.parametrize("mutant", FAMILY, ids=lambda m: m.id)
def test_a_planted_bug_is_caught_by_its_case(mutant):
    assert_caught_by_its_case(mutant, BOUNDARY)


@pytest.mark.parametrize("mutant_id, case", [("drops-shared-level", "empty_shared"), ("causal-on-shared",
                                                                                       "empty_shared")])
def test_a_bug_of_the_shared_level_is_invisible_when_it_is_empty(mutant_id, case):
    (m,) = [m for m in FAMILY if m.id == mutant_id]
    d = load_definition(m.definition)
    assert passes(mutate(d, m), case) and not passes(mutate(d, m), None)

"""block_sparse (FlashInfer's BlockSparseAttentionWrapper): the generator makes the BSR layout each case names
(docs/boundary/block_sparse.md), the float64 truth is attention under the layout's dense mask (checked against
single-request attention on the dense case and row by row elsewhere), the FlashInfer adapter plans and runs the
wrapper with the keywords each release takes (a fake module: no GPU here), and each planted bug is caught by its
case."""

from __future__ import annotations

import dataclasses
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
from flashinfer_trace.groundtruth import flashinfer_block_sparse as fbs
from flashinfer_trace.groundtruth import torch_block_sparse as tbs
from flashinfer_trace.groundtruth.base import Call
from flashinfer_trace.inputs import block_sparse as gen
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.mutants import MUTANTS, mutate
from flashinfer_trace.testing import run_reference
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import compare_with_model

ROOT = Path(__file__).resolve().parents[2] / "definitions"
DEFS = sorted((ROOT / "block_sparse").glob("*.json"))
SMALL = "block_sparse_r16_c16_h28_kv4_d128"
BIG = "block_sparse_r64_c64_h32_kv8_d128"
SINGLE = "single_prefill_causal_h32_kv8_d128"


def _rows(x, R):
    """Per block row, the sorted column blocks it lists."""
    p, idx = x.values["indptr"].tolist(), x.values["indices"].tolist()
    return [sorted(idx[p[i]:p[i + 1]]) for i in range(len(p) - 1)]


# -- definitions and the generator ------------------------------------------------------------------------------
def test_the_definitions_name_the_wrapper_a_model_and_their_block_shape():
    assert len(DEFS) == 3
    for path in DEFS:
        d = load_definition(path)
        assert d.op_type == "block_sparse" and "fi_api:flashinfer.sparse.BlockSparseAttentionWrapper" in d.tags
        assert any(t.startswith("model:") for t in d.tags) and set(d.outputs) == {"output", "lse"}
        R, C = gen.block_shape(d)
        assert d.name.startswith(f"block_sparse_r{R}_c{C}_") and R in (16, 64) and C in (16, 64)
        assert d.const_axes["head_dim"] == 128 and "kv_len % block_cols == 0" in d.constraints


def test_edge_cases():
    assert edge_cases(load_definition(SMALL)) == list(gen.CASES)
    assert {"single_block", "dense", "empty_row", "unsorted_indices", "partial_row_block", "long_row",
            "scores_far_negative", "one_key_dominates"} <= set(gen.CASES)


@pytest.mark.parametrize("name", [SMALL, BIG])
@pytest.mark.parametrize("case", [None, *gen.CASES])
def test_every_case_keeps_the_contract(name, case):
    d = load_definition(name)
    R, C = gen.block_shape(d)
    x = generate_inputs(d, "small", 0, case=case)  # finish() checks every constraint
    qo, kv = x.values["q"].shape[0], x.values["k"].shape[0]
    rows = _rows(x, R)
    assert len(rows) == -(-qo // R) and kv % C == 0
    assert all(len(set(r)) == len(r) for r in rows), "duplicates are outside the contract"
    assert x.values["indices"].numel() >= 1 and x.values["sm_scale"] == pytest.approx(1 / math.sqrt(128))


def test_the_cases_make_their_structure():
    d = load_definition(SMALL)
    R, C = gen.block_shape(d)
    x = generate_inputs(d, "small", 0, case="single_block")
    assert x.values["indptr"].tolist() == [0, 1] and x.values["indices"].tolist() == [0]
    assert x.values["q"].shape[0] == R and x.values["k"].shape[0] == C
    x = generate_inputs(d, "small", 0, case="dense")
    nb = x.values["k"].shape[0] // C
    assert all(r == list(range(nb)) for r in _rows(x, R))
    x = generate_inputs(d, "small", 0, case="empty_row")
    rows = _rows(x, R)
    assert sum(not r for r in rows) == 1 and rows[-1] and len(rows) >= 2
    x = generate_inputs(d, "small", 0, case="unsorted_indices")
    p, idx = x.values["indptr"].tolist(), x.values["indices"].tolist()
    assert all(idx[p[i]:p[i + 1]] != sorted(idx[p[i]:p[i + 1]]) for i in range(len(p) - 1))
    x = generate_inputs(d, "small", 0, case="partial_row_block")
    assert x.values["q"].shape[0] % R and x.values["q"].shape[0] > R
    assert generate_inputs(d, "small", 0, case="single_query").values["q"].shape[0] == 1
    x = generate_inputs(d, "small", 0, case="long_row")
    assert len(_rows(x, R)[0]) == gen.LONG_COLS["small"]


def test_one_key_dominates_in_the_most_listed_block():
    d = load_definition(SMALL)
    x = generate_inputs(d, "small", 0, case="one_key_dominates")
    k = x.values["k"][..., 0]
    (hot,) = torch.nonzero((k == 32.0).all(dim=1)).flatten().tolist()
    listed = torch.bincount(x.values["indices"].long())
    assert hot // 16 == int(torch.argmax(listed)) and hot % 16 >= 8


def test_a_definition_without_the_block_axes_is_refused():
    d = load_definition(SMALL)
    data = d.as_dict
    axes = {k: v for k, v in data["axes"].items() if k != "block_cols"}
    axes["kv_len"] = data["axes"]["kv_len"]
    bad = d.model_validate({**data, "axes": axes, "constraints": [c for c in data["constraints"]
                                                                  if "block_cols" not in c]})
    assert "block_rows / block_cols" in tbs.applies(bad)
    with pytest.raises(Exception, match="block_rows and block_cols"):
        generate_inputs(bad, case="dense")


# -- the float64 truth ------------------------------------------------------------------------------------------
def test_the_dense_mask_is_the_layout():
    indptr = torch.tensor([0, 2, 2, 3], dtype=torch.int32)
    indices = torch.tensor([2, 0, 1], dtype=torch.int32)
    m = tbs.dense_mask(indptr, indices, 5, 6, 2, 2)  # rows of 2 (the last one cut to 1), columns of 2
    want = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 1, 1], [0] * 6, [0] * 6, [0, 0, 1, 1, 0, 0]],
                        dtype=torch.bool)
    assert torch.equal(m, want)


def test_dense_layout_is_full_attention():
    """The dense case equals attention over every key: the single_prefill truth (causal, bottom-right aligned)
    given only the last query sees every key, so its one row is that query's full attention."""
    d = load_definition(BIG)
    x = generate_inputs(d, "small", 0, case="dense")
    out, lse = truth(d, x)
    q, k, v = x.values["q"], x.values["k"], x.values["v"]
    s = load_definition(SINGLE)
    one = dataclasses.replace(x, values={"q": q[-1:], "k": k, "v": v, "sm_scale": x.values["sm_scale"]})
    o1, l1 = get_ground_truth("torch", s, device="cpu")(one)
    assert torch.allclose(o1[0].double(), out[-1].double(), atol=8e-3, rtol=8e-3)
    assert torch.allclose(l1[0].double(), lse[-1].double(), atol=1e-5, rtol=1e-6)


def test_a_row_with_no_blocks_is_zero_with_lse_minus_inf_and_the_others_are_not():
    d = load_definition(SMALL)
    x = generate_inputs(d, "small", 0, case="empty_row")
    out, lse = truth(d, x)
    rows = _rows(x, 16)
    empty = rows.index([])
    sl = slice(empty * 16, (empty + 1) * 16)
    assert bool((out[sl] == 0).all()) and bool(torch.isneginf(lse[sl]).all())
    assert bool(torch.isfinite(lse[(empty + 1) * 16:]).all()) and not bool(torch.isnan(out).any())


def test_the_order_of_the_listed_blocks_changes_nothing():
    d = load_definition(SMALL)
    x = generate_inputs(d, "small", 0, case="unsorted_indices")
    p, idx = x.values["indptr"].tolist(), x.values["indices"].tolist()
    srt = torch.tensor([c for i in range(len(p) - 1) for c in sorted(idx[p[i]:p[i + 1]])], dtype=torch.int32)
    y = dataclasses.replace(x, values={**x.values, "indices": srt})
    assert all(torch.equal(a, b) for a, b in zip(truth(d, x), truth(d, y), strict=True))


def test_zero_query_weights_the_listed_keys_uniformly():
    d = load_definition(SMALL)
    x = generate_inputs(d, "small", 0, case="zero_query")
    _, lse = truth(d, x)
    for i, r in enumerate(_rows(x, 16)):
        assert torch.allclose(lse[i * 16:(i + 1) * 16], torch.full_like(lse[:16], math.log2(16 * len(r))))


@pytest.mark.parametrize("case", [None, "partial_row_block", "long_row", "empty_row", "scores_large"])
def test_the_reference_agrees_with_the_truth(case):
    d = load_definition(SMALL)
    x = generate_inputs(d, "small", 0, case=case)
    got, want = run_reference(d, x), truth(d, x)
    assert all(r.passed for r in compare_with_model(d, x, got, want, tolerance_for(d)))


# -- the FlashInfer adapter (a fake module) ---------------------------------------------------------------------
CALLS: list[dict] = []


def _wrapper_class(*, out_kw=True, o_dtype=True):
    class Wrapper:
        def __init__(self, float_workspace_buffer, backend="auto"):
            self.backend = backend

        def _plan(self, indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, mask=None,
                  packed_mask=None, causal=False, sm_scale=None, q_data_type="float16", kv_data_type=None, **kw):
            CALLS.append(dict(backend=self.backend, M=M, N=N, R=R, C=C, heads=(num_qo_heads, num_kv_heads, head_dim),
                              sm_scale=sm_scale, q_dtype=q_data_type, **kw))
            self.layout = (indptr.clone(), indices.clone(), M, N, R, C)
            self.sm_scale = sm_scale

        def _run(self, q, k, v, return_lse=False, out=None, lse=None):
            indptr, indices, M, N, R, C = self.layout
            o, l2 = tbs.attend(q, k, v, tbs.dense_mask(indptr, indices, M, N, R, C), self.sm_scale)
            o, l2 = o.to(q.dtype), l2.float()
            CALLS.append(dict(run=True, return_lse=return_lse, out=out is not None))
            if out is not None:
                out.copy_(o)
                lse.copy_(l2)
                return (out, lse) if return_lse else out
            return (o, l2) if return_lse else o

    if o_dtype:
        def plan(self, indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, mask=None,
                 packed_mask=None, causal=False, sm_scale=None, q_data_type="float16", kv_data_type=None,
                 o_data_type="float16"):
            self._plan(indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, sm_scale=sm_scale,
                       q_data_type=q_data_type, kv_data_type=kv_data_type, o_dtype=o_data_type)
    else:
        def plan(self, indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, mask=None,
                 packed_mask=None, causal=False, sm_scale=None, q_data_type="float16", kv_data_type=None):
            self._plan(indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, sm_scale=sm_scale,
                       q_data_type=q_data_type, kv_data_type=kv_data_type)
    if out_kw:
        def run(self, q, k, v, scale_q=None, scale_k=None, scale_v=None, out=None, lse=None, return_lse=False):
            return self._run(q, k, v, return_lse, out, lse)
    else:
        def run(self, q, k, v, return_lse=False):
            return self._run(q, k, v, return_lse)
    Wrapper.plan, Wrapper.run = plan, run
    return Wrapper


def _fake(monkeypatch, version, cc=(9, 0), **kw):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    module.sparse = types.SimpleNamespace(BlockSparseAttentionWrapper=_wrapper_class(**kw))
    install_flashinfer(monkeypatch, module, version, cc=cc)
    monkeypatch.setattr(fbs, "_device_cc", lambda t: cc)
    CALLS.clear()
    return module


def _close(got, want) -> bool:
    return all(torch.allclose(g.double(), w.double(), atol=2e-2, rtol=2e-2, equal_nan=False)
               for g, w in zip(got, want, strict=True))


def test_flashinfer_is_not_installed_here():
    with pytest.raises(GroundTruthUnavailable) as e:
        get_ground_truth("flashinfer", load_definition(SMALL), device="cuda")
    assert e.value.kind in ("not-installed", "import-failed")


def test_paths_cover_every_call_mode():
    assert paths("flashinfer", load_definition(SMALL)) == [None, *fbs.MODES]
    assert paths("torch", load_definition(SMALL)) == [None]


@pytest.mark.parametrize("mode, backend", [(None, "fa2"), ("out", "fa2"), ("fa3", "fa3")])
@pytest.mark.parametrize("case", [None, "partial_row_block", "empty_row"])
def test_plan_and_run_pass_the_layout_block_shape_backend_and_lse(monkeypatch, mode, backend, case):
    fi = _fake(monkeypatch, "0.6.6")
    d = load_definition(SMALL)
    x = generate_inputs(d, "small", 0, case=case)
    got = fbs.ADAPTERS[0].fn(Call(d, x, fi, Version("0.6.6"), mode=mode))
    want = truth(d, x)
    assert len(got) == 2 and _close(got, want)
    plan, run = CALLS
    assert (plan["backend"], plan["R"], plan["C"], plan["heads"]) == (backend, 16, 16, (28, 4, 128))
    assert plan["M"] == x.values["q"].shape[0] and plan["N"] == x.values["k"].shape[0]
    assert plan["q_dtype"] == torch.bfloat16 and plan["o_dtype"] == torch.bfloat16
    assert plan["sm_scale"] == pytest.approx(1 / math.sqrt(128))
    assert run == dict(run=True, return_lse=True, out=mode == "out")


def test_fa3_needs_sm90(monkeypatch):
    fi = _fake(monkeypatch, "0.6.6", cc=(10, 0))
    d = load_definition(SMALL)
    x = generate_inputs(d, "small", 0)
    with pytest.raises(GroundTruthUnavailable, match="arch-unsupported: .*needs sm90, have sm100"):
        fbs.ADAPTERS[0].fn(Call(d, x, fi, Version("0.6.6"), mode="fa3"))


def test_release_gates(monkeypatch):
    _fake(monkeypatch, "0.1.6")
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*>=0.2.0"):
        get_ground_truth("flashinfer", load_definition(SMALL), device="cuda")
    fi = _fake(monkeypatch, "0.2.2", out_kw=False, o_dtype=False)
    d = load_definition(SMALL)
    x = generate_inputs(d, "small", 0)
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*no out= / lse= \(needs >=0.2.3\)"):
        fbs.ADAPTERS[0].fn(Call(d, x, fi, Version("0.2.2"), mode="out"))
    got = fbs.ADAPTERS[0].fn(Call(d, x, fi, Version("0.2.2")))  # before o_data_type: not passed
    assert _close(got, truth(d, x)) and "o_dtype" not in CALLS[0]


@pytest.mark.parametrize("mode", ["plan-reuse"])
def test_the_plan_launches_on_the_live_tensors(monkeypatch, mode):
    fi = _fake(monkeypatch, "0.7.2.post1")
    d = load_definition(SMALL)
    x = generate_inputs(d, "small", 0, case="empty_row")
    got = modes.run(fbs.ADAPTERS[0], Call(d, x, fi, Version("0.7.2.post1"), mode=mode))
    assert _close(got, truth(d, x))
    assert [c.get("run", False) for c in CALLS] == [False, True, True]  # one plan, two runs


def test_graph_needs_a_gpu(monkeypatch):
    fi = _fake(monkeypatch, "0.6.6")
    d = load_definition(SMALL)
    x = generate_inputs(d, "small", 0)
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        modes.run(fbs.ADAPTERS[0], Call(d, x, fi, Version("0.6.6"), mode="graph"))


def test_the_adapter_refuses_what_the_wrapper_does_not_return():
    d = load_definition(SMALL)
    data = d.as_dict
    bad = d.model_validate({**data, "outputs": {**data["outputs"], "extra": data["outputs"]["lse"]}})
    assert "extra" in fbs.applies(bad) and fbs.applies(d) is None


# -- planted bugs -----------------------------------------------------------------------------------------------
BOUNDARY = {
    "partial-row-dropped": "partial_row_block",
    "empty-row-nan": "empty_row",
    "lse-zero-on-empty": "empty_row",
    "assumes-sorted-indices": "unsorted_indices",
    "last-split-only": "long_row",
    "no-max-subtraction": "scores_large",
}
WRONG_MATH = ("ignores-layout", "indices-one-based", "block-offset-off-by-one", "gqa-interleaved",
              "lse-natural-log", "sm-scale-dropped")
FAMILY = [m for m in MUTANTS if m.definition.startswith("block_sparse_")]


def test_every_family_mutant_has_its_case():
    assert_family_cases(FAMILY, BOUNDARY, WRONG_MATH)


@pytest.mark.parametrize("mutant", FAMILY, ids=lambda m: m.id)
def test_a_planted_bug_is_caught_by_its_case(mutant):
    assert_caught_by_its_case(mutant, BOUNDARY)


def test_ignoring_the_layout_is_right_on_the_dense_layout():
    (m,) = [m for m in FAMILY if m.id == "ignores-layout"]
    d = load_definition(m.definition)
    assert passes(mutate(d, m), "dense") and not passes(mutate(d, m), None)

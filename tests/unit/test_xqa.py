"""xqa (FlashInfer's XQA paged decode, xqa_batch_decode_with_kv_cache / xqa.xqa): the definitions state the API's
regimes, the generator makes what each case promises (docs/boundary/xqa.md), the float64 truth equals attention
computed request by request (SDPA, the sink as an extra key of value 0), the FlashInfer adapter calls both APIs
with the scales the kernel takes (a fake module: no GPU here), and each planted bug is caught by its case."""

from __future__ import annotations

import math
import types
from pathlib import Path

import pytest
import torch
from fakes import install_flashinfer
from packaging.version import Version
from planted import assert_caught_by_its_case, assert_family_cases

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.groundtruth import GroundTruthUnavailable, base, get_ground_truth, modes, paths
from flashinfer_trace.groundtruth import flashinfer_xqa as fx
from flashinfer_trace.groundtruth import torch_xqa as tx
from flashinfer_trace.groundtruth.base import Call
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.inputs import xqa as gen
from flashinfer_trace.mutants import MUTANTS
from flashinfer_trace.testing import run_reference
from flashinfer_trace.timing import roofline
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import compare_with_model, model_for

ROOT = Path(__file__).resolve().parents[2] / "definitions" / "xqa"
LLAMA = "xqa_batch_decode_h32_kv8_d128_ps16"
QWEN = "xqa_batch_decode_h32_kv4_d128_ps32"
SWA = "xqa_batch_decode_h64_kv8_d64_ps64_swa128_sinks"
FP8 = "xqa_batch_decode_h32_kv8_d128_ps16_fp8kv"
NEXT = "xqa_batch_decode_h16_kv2_d256_ps128_fp16"


def _truth(d, x):
    return get_ground_truth("torch", d, device="cpu")(x)


def _slots(x, r: int) -> torch.Tensor:
    v = x.values
    ps, n = v["k_cache"].shape[1], int(v["seq_lens"][r])
    pages = v["block_tables"][r, :-(-n // ps)].long()
    return (pages[:, None] * ps + torch.arange(ps)).flatten()[:n]


# -- definitions -------------------------------------------------------------------------------------------
def test_the_definitions_state_the_api_regimes():
    names = sorted(p.stem for p in ROOT.glob("*.json"))
    assert names == sorted([LLAMA, QWEN, SWA, FP8, NEXT])
    for n in names:
        d = load_definition(n)
        assert d.op_type == "xqa" and "fi_api:flashinfer.decode.xqa_batch_decode_with_kv_cache" in d.tags
        assert any(t.startswith("model:") for t in d.tags) and list(d.outputs) == ["output"]
        assert d.const_axes["page_size"] in (16, 32, 64, 128) and d.const_axes["head_dim"] % 16 == 0
        assert "seq_lens.min().item() >= 1" in d.constraints
    assert {load_definition(n).const_axes["page_size"] for n in names} == {16, 32, 64, 128}
    assert {load_definition(n).const_axes["num_qo_heads"] // load_definition(n).const_axes["num_kv_heads"]
            for n in names} == {4, 8}
    assert load_definition(FP8).inputs["k_cache"].dtype.value == "float8_e4m3fn"
    assert load_definition(NEXT).inputs["query"].dtype.value == "float16"
    swa = load_definition(SWA)
    assert swa.const_axes["window_size"] == 128 and {"sinks", "window_left"} <= set(swa.inputs)


def test_tolerance_error_model_and_roofline():
    assert (tolerance_for(load_definition(LLAMA)).atol, tolerance_for(load_definition(LLAMA)).rtol) == (1e-2, 1e-2)
    assert tolerance_for(load_definition(FP8)).rtol == 1e-1
    m = model_for(load_definition(FP8))
    assert m is not None and m.absolute_inputs == ("v_cache",) and m.outputs == ("output",)
    d = load_definition(SWA)
    x = generate_inputs(d, "small", 0, case="window_edges")
    pairs = sum(min(n, 128) for n in x.values["seq_lens"].tolist())
    assert roofline.work(d, x).flops == 2 * 64 * pairs * 2 * 64


# -- the generator ------------------------------------------------------------------------------------------
def test_edge_cases_follow_the_definition():
    assert edge_cases(load_definition(LLAMA)) == [*gen.CASES, *gen.SCORE_CASES]
    assert edge_cases(load_definition(SWA)) == [*gen.CASES, "window_edges", "sink_dominates", *gen.SCORE_CASES]
    fp8 = edge_cases(load_definition(FP8))
    assert "subnormal_query" not in fp8 and "values_near_max" not in fp8 and "scores_large" in fp8


def test_typical_inputs_keep_the_contract():
    d = load_definition(LLAMA)
    v = generate_inputs(d, "small", 0).values
    lens, table = v["seq_lens"].tolist(), v["block_tables"]
    assert lens[0] > 2 * 16 and v["max_seq_len"] == max(lens) and v["bmm2_scale"] == 1.0
    assert v["bmm1_scale"] == pytest.approx(1 / math.sqrt(128))
    used = torch.cat([table[r, :-(-n // 16)] for r, n in enumerate(lens)])
    assert used.unique().numel() == used.numel() and not bool((used[1:] > used[:-1]).all())
    assert v["k_cache"].shape[0] > used.numel()  # spare pages nobody reads
    w = generate_inputs(load_definition(SWA), "small", 0).values
    assert w["window_left"] == 127 and max(w["seq_lens"].tolist()) > 128


@pytest.mark.parametrize("name", [LLAMA, FP8])
def test_the_cases_make_what_they_promise(name):
    d = load_definition(name)
    ps = d.const_axes["page_size"]

    def lens(case):
        return generate_inputs(d, "small", 0, case=case).values["seq_lens"].tolist()

    assert set(lens("single_token")) == {1} and len(lens("batch1")) == 1
    assert lens("page_edges") == [ps - 1, ps, ps + 1, 2 * ps, 1]
    assert lens("multi_block")[0] > 1024
    x = generate_inputs(d, "small", 0, case="kv_scales")
    assert x.values["bmm2_scale"] < 1 and x.values["bmm1_scale"] < 1 / math.sqrt(d.const_axes["head_dim"])
    x = generate_inputs(d, "small", 0, case="tail_poison")
    read = torch.cat([_slots(x, r) for r in range(len(x.values["seq_lens"]))])
    unread = torch.ones(x.values["v_cache"].flatten(0, 1).shape[0], dtype=torch.bool)
    unread[read] = False
    assert bool((x.values["v_cache"].flatten(0, 1)[unread].float() == gen.POISON_VALUE).all())
    assert not bool((x.values["v_cache"].flatten(0, 1)[read].float() == gen.POISON_VALUE).all())


def test_window_and_sink_cases():
    d = load_definition(SWA)
    x = generate_inputs(d, "small", 0, case="window_edges")
    assert x.values["seq_lens"].tolist() == [127, 128, 129, 130, 257]
    k = x.values["k_cache"].flatten(0, 1)
    edge = _slots(x, 4)[257 - 129]  # the last key outside the window of request 4
    assert float(k[edge, 0, 0]) == 32.0 and float(k[_slots(x, 4)[-1], 0, 0]) == 0.0
    x = generate_inputs(d, "small", 0, case="sink_dominates")
    (out,) = _truth(d, x)
    assert float(out.float().abs().max()) < 1e-10  # the keys' weights ~ e^-40
    x = generate_inputs(d, "small", 0, case="scores_far_negative")
    assert bool((x.values["sinks"] == gen.SINK_NEGLIGIBLE).all())


# -- the float64 truth -------------------------------------------------------------------------------------
def _by_sdpa(x, window_left=None):
    """Each request alone: SDPA in float64 over its gathered keys; a sink is one more key scoring its logit with a
    value of 0 (the softmax's denominator gains exp(sink), the output nothing)."""
    v = x.values
    q, kc, vc = v["query"], v["k_cache"].flatten(0, 1), v["v_cache"].flatten(0, 1)
    group, dim = q.shape[1] // kc.shape[1], q.shape[-1]
    rows = []
    for r, n in enumerate(v["seq_lens"].tolist()):
        s = _slots(x, r)[max(0, n - 1 - window_left) if window_left is not None else 0:]
        k = kc[s].double().repeat_interleave(group, 1).transpose(0, 1)  # [heads, keys, dim]
        vv = vc[s].double().repeat_interleave(group, 1).transpose(0, 1)
        qq = q[r].double()[:, None, :]
        scale = float(v["bmm1_scale"])
        if v.get("sinks") is not None:  # the sink as a key: q . k_sink * scale = sink
            extra = torch.zeros(k.shape[0], 1, dim, dtype=torch.float64)
            extra[:, 0, 0] = v["sinks"].double() / (scale * qq[:, 0, 0])
            k, vv = torch.cat([k, extra], 1), torch.cat([vv, torch.zeros_like(extra)], 1)
        out = torch.nn.functional.scaled_dot_product_attention(qq, k, vv, scale=scale)[:, 0]
        rows.append(out * float(v["bmm2_scale"]))
    return torch.stack(rows)


@pytest.mark.parametrize(("name", "case"), [(LLAMA, None), (QWEN, "page_edges"), (FP8, "kv_scales"), (SWA, None),
                                            (SWA, "window_edges"), (NEXT, "single_token")])
def test_the_truth_is_attention_request_by_request(name, case):
    d = load_definition(name)
    x = generate_inputs(d, "small", 0, case=case)
    (got,) = _truth(d, x)
    want = _by_sdpa(x, x.values.get("window_left"))
    assert got.dtype == torch.float16 if name == NEXT else got.dtype == torch.bfloat16
    assert torch.allclose(got.double(), want, atol=1e-2, rtol=1e-2)
    if case == "single_token":  # one key: its value times bmm2_scale
        k0 = x.values["v_cache"].flatten(0, 1)[_slots(x, 0)[0]].repeat_interleave(8, 0)
        assert torch.equal(got[0], k0.to(got.dtype))


def test_the_slot_table_and_the_mask():
    table = torch.tensor([[3, 1], [0, 2]])
    assert tx.slot_table(table, 2, 4).tolist() == [[6, 7, 2, 3], [0, 1, 4, 5]]
    assert tx.visible(torch.tensor([3, 1]), 4, None).tolist() == [[True] * 3 + [False], [True] + [False] * 3]
    assert tx.visible(torch.tensor([4]), 4, 1).tolist() == [[False, False, True, True]]


def test_the_truth_in_chunks_is_the_truth_at_once(monkeypatch):
    d = load_definition(SWA)
    x = generate_inputs(d, "small", 0)
    whole = _truth(d, x)[0]
    monkeypatch.setattr(tx, "CHUNK_ELEMENTS", 1)  # one request a chunk
    assert torch.equal(_truth(d, x)[0], whole)


@pytest.mark.parametrize(("name", "case"), [(QWEN, "tail_poison"), (NEXT, "values_near_max"), (FP8, "scores_large")])
def test_the_reference_agrees_with_the_truth(name, case):
    d = load_definition(name)
    x = generate_inputs(d, "small", 0, case=case)
    assert all(r.passed for r in compare_with_model(d, x, run_reference(d, x), _truth(d, x), tolerance_for(d)))


# -- the FlashInfer adapter (a fake module) ------------------------------------------------------------------
CALLS: list[dict] = []


def _fake_xqa(q, k_cache, v_cache, page_table, seq_lens, output, workspace_buffer, semaphores, num_kv_heads,
              page_size, sinks=None, q_scale=1.0, kv_scale=1.0, sliding_win_size=0, kv_layout="NHD", sm_count=None,
              enable_pdl=None, rcp_out_scale=1.0):
    """The kernel's documented math: scores q . k * q_scale * kv_scale / sqrt(d), output * kv_scale * rcp."""
    kv = kv_scale.item() if isinstance(kv_scale, torch.Tensor) else kv_scale
    CALLS.append(dict(api="xqa", q_scale=q_scale, kv_scale=kv_scale, win=sliding_win_size, layout=kv_layout,
                      lens_dtype=seq_lens.dtype, sinks=None if sinks is None else tuple(sinks.shape)))
    if kv_layout == "HND":
        k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    d = load_definition(LLAMA)
    values = {"query": q[:, 0], "k_cache": k_cache, "v_cache": v_cache, "block_tables": page_table,
              "seq_lens": seq_lens[:, 0].to(torch.int64), "bmm1_scale": q_scale * kv / math.sqrt(q.shape[-1]),
              "bmm2_scale": kv * rcp_out_scale, "sinks": None if sinks is None else sinks.reshape(-1),
              "window_left": sliding_win_size - 1 if sliding_win_size else None}
    (out,) = tx.xqa(Call(d, types.SimpleNamespace(values=values), None, None))
    output[:, 0].copy_(out)


def _fake_batch_decode(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, bmm1_scale=1.0,
                       bmm2_scale=1.0, window_left=-1, out=None, sinks=None, kv_layout="NHD", enable_pdl=None):
    CALLS.append(dict(api="batch", tuple=isinstance(kv_cache, tuple), layout=kv_layout, window_left=window_left))
    k, v = kv_cache if isinstance(kv_cache, tuple) else kv_cache.unbind(1)
    kv_heads = k.shape[2] if kv_layout == "NHD" else k.shape[1]
    page = k.shape[1] if kv_layout == "NHD" else k.shape[2]
    out = torch.empty_like(query) if out is None else out
    _fake_xqa(query.unsqueeze(1), k, v, block_tables, seq_lens.unsqueeze(1), out.unsqueeze(1), None, None, kv_heads,
              page, sinks=None if sinks is None else sinks.reshape(kv_heads, -1),
              q_scale=bmm1_scale / bmm2_scale * query.shape[-1] ** 0.5, kv_scale=bmm2_scale,
              sliding_win_size=window_left + 1 if window_left >= 0 else 0, kv_layout=kv_layout)
    CALLS.pop()
    return out


def _fake(monkeypatch, version):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    module.decode = types.SimpleNamespace(xqa_batch_decode_with_kv_cache=_fake_batch_decode)
    module.xqa = types.SimpleNamespace(xqa=_fake_xqa)
    install_flashinfer(monkeypatch, module, version)
    monkeypatch.setattr(fx, "workspace", lambda device, zeroed=False: torch.zeros(16 << 20, dtype=torch.uint8))
    CALLS.clear()
    return module


def test_flashinfer_is_not_installed_here():
    with pytest.raises(GroundTruthUnavailable) as e:
        get_ground_truth("flashinfer", load_definition(LLAMA), device="cuda")
    assert e.value.kind in ("not-installed", "import-failed")


def test_paths_cover_every_call_mode():
    assert paths("flashinfer", load_definition(LLAMA)) == [None, *fx.MODES, "graph"]


@pytest.mark.parametrize("mode", [None, "stacked", "hnd", "xqa-raw"])
@pytest.mark.parametrize(("name", "case"), [(SWA, "window_edges"), (FP8, None)])
def test_every_path_computes_the_definition(monkeypatch, mode, name, case):
    fi = _fake(monkeypatch, "0.7.2.post1")
    d = load_definition(name)
    x = generate_inputs(d, "small", 0, case=case)
    (got,) = fx.ADAPTERS[0].fn(Call(d, x, fi, Version("0.7.2.post1"), mode=mode))
    assert torch.allclose(got.double(), _truth(d, x)[0].double(), atol=1e-2, rtol=1e-2)
    call = CALLS[-1]
    if mode == "xqa-raw":  # the wrapper's own mapping: kv_scale = bmm2, q_scale = bmm1 / bmm2 * sqrt(d)
        bmm1, bmm2 = x.values["bmm1_scale"], x.values["bmm2_scale"]
        dim = d.const_axes["head_dim"]
        assert call["kv_scale"] == bmm2 and call["q_scale"] == pytest.approx(bmm1 / bmm2 * math.sqrt(dim))
        assert call["lens_dtype"] == torch.uint32
        assert call["win"] == (128 if name == SWA else 0) and call["sinks"] == ((8, 8) if name == SWA else None)
    else:
        assert call["layout"] == ("HND" if mode == "hnd" else "NHD")


def test_release_gates_and_the_old_kv_scale(monkeypatch):
    _fake(monkeypatch, "0.4.1")
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*>=0.5.0"):
        get_ground_truth("flashinfer", load_definition(LLAMA), device="cuda")
    fi = _fake(monkeypatch, "0.5.0")
    d = load_definition(LLAMA)
    x = generate_inputs(d, "small", 0)
    fx.ADAPTERS[0].fn(Call(d, x, fi, Version("0.5.0"), mode="xqa-raw"))
    assert isinstance(CALLS[-1]["kv_scale"], torch.Tensor)  # 0.5.0 / 0.5.1 take kv_scale as a tensor
    monkeypatch.setattr(base, "cuda_capability", lambda device: (8, 0))
    with pytest.raises(GroundTruthUnavailable, match="arch-unsupported"):
        get_ground_truth("flashinfer", d, device="cuda")


def test_graph_needs_a_gpu(monkeypatch):
    fi = _fake(monkeypatch, "0.7.2.post1")
    d = load_definition(LLAMA)
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        modes.run(fx.ADAPTERS[0], Call(d, generate_inputs(d, "small", 0), fi, Version("0.7.2.post1"), mode="graph"))


def test_the_adapters_refuse_what_the_api_does_not_return():
    d = load_definition(LLAMA)
    data = d.as_dict
    bad = d.model_validate({**data, "outputs": {**data["outputs"], "lse": {"shape": ["batch_size", "num_qo_heads"],
                                                                        "dtype": "float32"}}})
    assert "lse" in tx.applies(bad) and fx.applies(d) is None


# -- planted bugs ------------------------------------------------------------------------------------------
BOUNDARY = {
    "single-key-as-empty": "single_token",
    "full-last-page-dropped": "page_edges",
    "max-over-whole-pages": "tail_poison",
    "long-kv-capped-1024": "multi_block",
    "bmm2-scale-dropped": "kv_scales",
    "no-max-subtraction": "scores_large",
    "finite-max-init": "scores_far_negative",
    "query-ftz": "subnormal_query",
    "window-edge-off-by-one": "window_edges",
}
WRONG_MATH = ("sink-weight-clamped", "sinks-dropped", "sink-scaled-like-a-score", "pages-reversed", "gqa-interleaved",
              "bmm1-scale-dropped", "values-from-key-cache", "window-ignored", "window-one-short", "v-scale-on-scores")
FAMILY = [m for m in MUTANTS if m.definition.startswith("xqa_")]


def test_every_family_mutant_has_its_case():
    assert_family_cases(FAMILY, BOUNDARY, WRONG_MATH)


@pytest.mark.parametrize("mutant", FAMILY, ids=lambda m: m.id)
def test_a_planted_bug_is_caught_by_its_case(mutant):
    assert_caught_by_its_case(mutant, BOUNDARY)

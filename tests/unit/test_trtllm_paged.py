"""trtllm_paged (FlashInfer's trtllm_fmha_v2_prefill and trtllm_batch_decode_with_kv_cache): the generator makes the
lengths each case names (docs/boundary/trtllm_paged.md), the float64 truth equals per-request SDPA and does not
depend on the cache layout, the reference agrees with it, the FlashInfer adapter passes each release's arguments for
every path (a fake module: no GPU here), the release and arch gates hold, and each planted bug is caught by its
case."""

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
from flashinfer_trace.groundtruth import GroundTruthUnavailable, get_ground_truth, modes, paths
from flashinfer_trace.groundtruth import flashinfer_trtllm_paged as ftrt
from flashinfer_trace.groundtruth import torch_trtllm_paged as ttrt
from flashinfer_trace.groundtruth.base import Call
from flashinfer_trace.groundtruth.torch_pod import attend, prefill_mask
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.inputs import trtllm_paged as gen
from flashinfer_trace.mutants import MUTANTS
from flashinfer_trace.testing import run_reference
from flashinfer_trace.timing.roofline import work
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import compare_with_model, error_scales, model_for

ROOT = Path(__file__).resolve().parents[2] / "definitions"
DEFS = sorted((ROOT / "trtllm_paged").glob("*.json"))
PREFILL = "trtllm_fmha_v2_prefill_paged_causal_h32_kv8_d128_ps32"  # HND bf16
PREFILL_NHD = "trtllm_fmha_v2_prefill_paged_causal_nhd_h28_kv4_d128_ps128_fp16"
RAGGED = "trtllm_fmha_v2_prefill_ragged_causal_h32_kv4_d128"
DECODE = "trtllm_batch_decode_h32_kv8_d128_ps16"  # HND bf16
DECODE_NHD = "trtllm_batch_decode_nhd_h64_kv8_d128_ps64_fp16"


def _truth(d, x):
    return get_ground_truth("torch", d, device="cpu")(x)


def _lens(x):
    """(qo lengths, kv lengths) per request."""
    v = x.values
    if "cum_seq_lens" in v:
        c = v["cum_seq_lens"].tolist()
        n = [b - a for a, b in zip(c[:-1], c[1:], strict=True)]
        return n, n
    kv = v["seq_lens"].tolist()
    if "cum_seq_lens_q" in v:
        c = v["cum_seq_lens_q"].tolist()
        return [b - a for a, b in zip(c[:-1], c[1:], strict=True)], kv
    return [1] * len(kv), kv


# -- definitions and the generator ------------------------------------------------------------------------------
def test_the_definitions_name_their_api_a_model_and_one_output():
    assert [p.stem for p in DEFS] == sorted([PREFILL, PREFILL_NHD, RAGGED, DECODE, DECODE_NHD])
    for path in DEFS:
        d = load_definition(path)
        api = "decode.trtllm_batch_decode_with_kv_cache" if "decode" in d.name else "prefill.trtllm_fmha_v2_prefill"
        assert d.op_type == "trtllm_paged" and f"fi_api:flashinfer.{api}" in d.tags and list(d.outputs) == ["output"]
        assert any(t.startswith("model:") for t in d.tags) and gen.kind(d)
    assert [gen.kv_layout(load_definition(n)) for n in (PREFILL, PREFILL_NHD, DECODE, DECODE_NHD)] == \
        ["HND", "NHD", "HND", "NHD"]


def test_edge_cases_by_kind():
    assert edge_cases(load_definition(PREFILL))[:5] == list(gen.STRUCTURE["prefill"])
    assert "causal_square" not in edge_cases(load_definition(DECODE)) and "page_edges" in edge_cases(
        load_definition(DECODE))
    assert edge_cases(load_definition(RAGGED))[:3] == ["single_token", "batch1", "long_kv"]
    assert {"scores_far_negative", "scores_large", "one_key_dominates"} <= set(edge_cases(load_definition(RAGGED)))


@pytest.mark.parametrize("name", [PREFILL, RAGGED, DECODE_NHD])
def test_every_case_keeps_the_contract(name):
    d = load_definition(name)
    for case in [None, *edge_cases(d)]:
        x = generate_inputs(d, "small", 0, case=case)  # finish() checks every constraint
        qo, kv = _lens(x)
        assert min(qo) >= 1 and all(q <= k for q, k in zip(qo, kv, strict=True))
        assert x.values["sm_scale"] == pytest.approx(1 / math.sqrt(128))
        if "block_tables" in x.values:
            t, ps = x.values["block_tables"], d.const_axes["page_size"]
            used = [t[b, :-(-n // ps)] for b, n in enumerate(kv)]
            assert t.shape[1] > max(len(u) for u in used)  # an entry past every request's pages
            flat = torch.cat(used)
            assert flat.unique().numel() == flat.numel()  # no page shared between requests


def test_the_cases_make_their_lengths():
    d = load_definition(PREFILL)
    qo, kv = _lens(generate_inputs(d, "small", 0))
    assert all(2 <= q < k for q, k in zip(qo, kv, strict=True)) and len(kv) >= 2
    qo, kv = _lens(generate_inputs(d, "small", 0, case="single_token"))
    assert set(qo) == {1} and min(kv) > 1
    qo, kv = _lens(generate_inputs(d, "small", 0, case="causal_square"))
    assert qo == kv and min(qo) >= 2
    assert _lens(generate_inputs(d, "small", 0, case="page_edges"))[1] == [33, 64, 32, 1]
    assert len(_lens(generate_inputs(d, "small", 0, case="batch1"))[1]) == 1
    assert max(_lens(generate_inputs(d, "small", 0, case="long_kv"))[1]) == gen.LONG["small"]
    dec = load_definition(DECODE)
    assert min(_lens(generate_inputs(dec, "small", 0))[1]) > 16
    assert set(_lens(generate_inputs(dec, "small", 0, case="single_token"))[1]) == {1}
    assert set(_lens(generate_inputs(load_definition(RAGGED), "small", 0, case="single_token"))[0]) == {1}


def test_pages_are_shuffled_and_the_score_case_shapes_an_hnd_cache():
    d = load_definition(PREFILL)
    x = generate_inputs(d, "small", 0, case="scores_large")
    flat = torch.cat([x.values["block_tables"][b, :-(-n // 32)] for b, n in enumerate(x.values["seq_lens"].tolist())])
    assert not bool((flat[1:] > flat[:-1]).all())
    rows = ttrt.request_rows(x.values["block_tables"], x.values["seq_lens"], 32)
    keys = ttrt.nhd_rows(x.values["k_cache"], "HND")[torch.cat(rows)]
    assert bool((keys[..., 0] == 64).all())  # coordinate 0 of every key read, through the HND layout


# -- the float64 truth ------------------------------------------------------------------------------------------
def _sdpa(q, k, v, offset, scale):
    """One request's attention by torch's SDPA in float64 with an explicit bottom-right mask (None: no mask)."""
    group = q.shape[1] // k.shape[1]
    qq, kk, vv = (t.double().transpose(0, 1) for t in (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)))
    mask = None if offset is None else torch.arange(k.shape[0])[None, :] <= torch.arange(q.shape[0])[:, None] + offset
    return torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=scale).transpose(0, 1)


@pytest.mark.parametrize(("name", "case"), [(PREFILL, None), (PREFILL, "causal_square"), (DECODE, "page_edges"),
                                            (RAGGED, None)])
def test_the_truth_is_per_request_sdpa(name, case):
    d = load_definition(name)
    x = generate_inputs(d, "small", 0, case=case)
    v, (out,) = x.values, ttrt.trtllm_paged(Call(d, x, None, None))
    qo, kv = _lens(x)
    start = 0
    for b, (q, n) in enumerate(zip(qo, kv, strict=True)):
        if "key" in v:
            k, vv = v["key"][start:start + n], v["value"][start:start + n]
        else:
            ps = d.const_axes["page_size"]
            pages = v["block_tables"][b, :-(-n // ps)].long()
            k, vv = (v[c][pages].transpose(1, 2).reshape(-1, *v[c].shape[1:2], 128)[:n] for c in ("k_cache", "v_cache"))
        want = _sdpa(v["query"][start:start + q], k, vv, None if "decode" in name else n - q, v["sm_scale"])
        assert torch.allclose(out[start:start + q].double(), want.to(out.dtype).double(), atol=1e-2, rtol=1e-2)
        start += q


def test_the_truth_does_not_depend_on_the_cache_layout():
    d = load_definition(DECODE)
    x = generate_inputs(d, "small", 0)
    nhd = load_definition(DECODE_NHD)  # another definition; its layout reading is the point, not its shapes
    data = nhd.as_dict
    as_nhd = nhd.model_validate({**data, "axes": {**data["axes"], "num_qo_heads": {"type": "const", "value": 32},
                                                  "page_size": {"type": "const", "value": 16}},
                                 "inputs": {**data["inputs"], "query": {**data["inputs"]["query"], "dtype": "bfloat16"},
                                            **{c: {**data["inputs"][c], "dtype": "bfloat16"}
                                               for c in ("k_cache", "v_cache")}},
                                 "outputs": {"output": {**data["outputs"]["output"], "dtype": "bfloat16"}}})
    y = x.clone()
    for c in ("k_cache", "v_cache"):
        y.values[c] = x.values[c].transpose(1, 2).contiguous()
    assert torch.equal(ttrt.trtllm_paged(Call(d, x, None, None))[0], ttrt.trtllm_paged(Call(as_nhd, y, None, None))[0])


@pytest.mark.parametrize(("name", "case"), [(PREFILL, "one_key_dominates"), (PREFILL_NHD, None),
                                            (RAGGED, "scores_far_negative"), (DECODE, "long_kv"),
                                            (DECODE_NHD, "values_near_max")])
def test_the_reference_agrees_with_the_truth(name, case):
    d = load_definition(name)
    x = generate_inputs(d, "small", 0, case=case)
    assert all(r.passed for r in compare_with_model(d, x, run_reference(d, x), _truth(d, x), tolerance_for(d)))


def test_the_error_model_takes_the_values_of_either_kind():
    for name, value in ((DECODE, "v_cache"), (RAGGED, "value")):
        d = load_definition(name)
        x = generate_inputs(d, "small", 0)
        assert model_for(d) is not None
        (scale,) = error_scales(d, x)
        y = x.clone()
        y.values[value] = y.values[value].abs()
        assert torch.equal(scale, _truth(d, y)[0].abs())


def test_roofline_counts_the_visible_pairs_and_the_keys_read():
    d = load_definition(PREFILL)
    x = generate_inputs(d, "small", 0, case="causal_square")
    w = work(d, x)
    qo, _ = _lens(x)
    assert w.detail["visible_pairs"] == sum(q * (q + 1) // 2 for q in qo)
    assert w.flops == 2 * 32 * w.detail["visible_pairs"] * 2 * 128
    dec = load_definition(DECODE)
    y = generate_inputs(dec, "small", 0)
    assert work(dec, y).detail["kv_tokens_read"] == sum(_lens(y)[1])


# -- the FlashInfer adapter (a fake module) ---------------------------------------------------------------------
CALLS: list[dict] = []


def _fake_prefill(qkv, input_layout, workspace_buffer, seq_lens, max_q_len, max_kv_len, bmm1_scale, bmm2_scale,
                  batch_size, cum_seq_lens_q, cum_seq_lens_kv, block_tables=None, out=None, out_dtype=None,
                  mask_mode="causal", window_left=-1):
    CALLS.append(dict(layout=input_layout, batch=batch_size, max_q=max_q_len, max_kv=max_kv_len, scale=bmm1_scale,
                      bmm2=bmm2_scale, mask=mask_mode, out=out is not None,
                      tables=None if block_tables is None else tuple(block_tables.shape)))
    cq, ckv, lens = cum_seq_lens_q.tolist(), cum_seq_lens_kv.tolist(), seq_lens.tolist()
    if input_layout == "PACKED_QKV":
        q, k, v = qkv.unbind(1)
    elif input_layout == "CONTIGUOUS_Q_KV":
        q, (k, v) = qkv[0], qkv[1].unbind(1)
    elif input_layout == "SEPARATE_Q_K_V":
        q, k, v = qkv
    else:
        q, paged = qkv
        layout = input_layout[-3:]
        if isinstance(paged, tuple):  # one allocation, V's block offsets relative to K's base
            kc, vc = paged
            assert vc.data_ptr() - kc.data_ptr() == kc.numel() * kc.element_size() and block_tables.dim() == 3
            k_pages, v_pages = block_tables[:, 0], block_tables[:, 1] - kc.shape[0]
        else:
            kc, vc = paged.unbind(1)
            k_pages = v_pages = block_tables
        assert block_tables.dtype == torch.int32
        ps = kc.shape[2 if layout == "HND" else 1]
        rk, rv = ttrt.request_rows(k_pages, seq_lens, ps), ttrt.request_rows(v_pages, seq_lens, ps)
        fk, fv = ttrt.nhd_rows(kc, layout), ttrt.nhd_rows(vc, layout)
        k = torch.cat([fk[r] for r in rk])
        v = torch.cat([fv[r] for r in rv])
        ckv = [0, *torch.tensor(lens).cumsum(0).tolist()]
    res = torch.zeros_like(q) if out is None else out
    for b in range(batch_size):
        s, e, ks, ke = cq[b], cq[b + 1], ckv[b], ckv[b + 1]
        assert ke - ks == lens[b]
        res[s:e] = attend(q[s:e], k[ks:ke], v[ks:ke], prefill_mask(e - s, ke - ks, q.device), bmm1_scale).to(q.dtype)
    return res


def _fake_decode(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, bmm1_scale=1.0,
                 bmm2_scale=1.0, window_left=-1, out=None, out_dtype=None, kv_layout="HND", enable_pdl=None,
                 backend="auto"):
    CALLS.append(dict(tuple=isinstance(kv_cache, tuple), layout=kv_layout, backend=backend, max_seq=max_seq_len,
                      scale=bmm1_scale, bmm2=bmm2_scale, out=out is not None,
                      zeroed=bool((workspace_buffer[:1 << 16] == 0).all())))
    kc, vc = kv_cache if isinstance(kv_cache, tuple) else kv_cache.unbind(1)
    rows = ttrt.request_rows(block_tables, seq_lens, kc.shape[2 if kv_layout == "HND" else 1])
    fk, fv = ttrt.nhd_rows(kc, kv_layout), ttrt.nhd_rows(vc, kv_layout)
    res = torch.zeros_like(query) if out is None else out
    for b, r in enumerate(rows):
        res[b] = attend(query[b:b + 1], fk[r], fv[r], None, bmm1_scale)[0].to(query.dtype)
    return res


def _fake(monkeypatch, version, cc=(9, 0)):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    module.prefill = types.SimpleNamespace(trtllm_fmha_v2_prefill=_fake_prefill)
    module.decode = types.SimpleNamespace(trtllm_batch_decode_with_kv_cache=_fake_decode)
    install_flashinfer(monkeypatch, module, version, cc=cc)
    CALLS.clear()
    return module


def _adapter(name):
    return ftrt.ADAPTERS[-2] if "decode" in name else ftrt.ADAPTERS[0 if "paged" in name else 2]


def test_flashinfer_is_not_installed_here():
    with pytest.raises(GroundTruthUnavailable) as e:
        get_ground_truth("flashinfer", load_definition(PREFILL), device="cuda")
    assert e.value.kind in ("not-installed", "import-failed")


def test_paths_cover_every_call_mode():
    assert paths("flashinfer", load_definition(PREFILL)) == [None, *ftrt.PAGED_MODES]
    assert paths("flashinfer", load_definition(RAGGED)) == [None, *ftrt.RAGGED_MODES]
    assert paths("flashinfer", load_definition(DECODE)) == [None, *ftrt.DECODE_MODES]


@pytest.mark.parametrize(("name", "mode", "layout"), [
    (PREFILL, None, "Q_PAGED_KV_HND"), (PREFILL, "other-kv-layout", "Q_PAGED_KV_NHD"),
    (PREFILL_NHD, "separate-kv", "Q_PAGED_KV_NHD"), (PREFILL, "out", "Q_PAGED_KV_HND"),
    (RAGGED, None, "SEPARATE_Q_K_V"), (RAGGED, "contiguous-q-kv", "CONTIGUOUS_Q_KV")])
def test_the_prefill_paths_pass_layout_lengths_and_scale(monkeypatch, name, mode, layout):
    fi = _fake(monkeypatch, "0.7.2.post1")
    d = load_definition(name)
    x = generate_inputs(d, "small", 0, case="page_edges" if "paged" in name else None)
    got = _adapter(name).fn(Call(d, x, fi, Version("0.7.2.post1"), mode=mode))
    assert torch.allclose(got[0].double(), _truth(d, x)[0].double(), atol=1e-2, rtol=1e-2)
    (call,) = CALLS
    qo, kv = _lens(x)
    assert call["layout"] == layout and call["batch"] == len(kv) and call["mask"] == "causal"
    assert (call["max_q"], call["max_kv"]) == (max(qo), max(kv)) and call["out"] == (mode == "out")
    assert call["scale"] == pytest.approx(1 / math.sqrt(128)) and call["bmm2"] == 1.0
    assert call["tables"] == (None if name == RAGGED else (len(kv), 2, x.values["block_tables"].shape[1])
                              if mode == "separate-kv" else tuple(x.values["block_tables"].shape))


@pytest.mark.parametrize("mode", [None, "tuple-kv", "other-kv-layout", "out", "xqa"])
def test_the_decode_paths_pass_cache_layout_and_backend(monkeypatch, mode):
    fi = _fake(monkeypatch, "0.6.6")
    d = load_definition(DECODE)
    x = generate_inputs(d, "small", 0, case="single_token")
    got = _adapter(DECODE).fn(Call(d, x, fi, Version("0.6.6"), mode=mode))
    assert torch.allclose(got[0].double(), _truth(d, x)[0].double(), atol=1e-2, rtol=1e-2)
    (call,) = CALLS
    assert call["layout"] == ("NHD" if mode == "other-kv-layout" else "HND") and call["tuple"] == (mode == "tuple-kv")
    assert call["backend"] == ("xqa" if mode == "xqa" else "auto") and call["out"] == (mode == "out")
    assert call["max_seq"] == 1 and call["scale"] == pytest.approx(1 / math.sqrt(128)) and call["zeroed"]


def test_packed_qkv_is_for_mha_only(monkeypatch):
    fi = _fake(monkeypatch, "0.7.2.post1")
    d = load_definition(RAGGED)
    with pytest.raises(GroundTruthUnavailable, match="unsupported: .*as many kv heads"):
        _adapter(RAGGED).fn(Call(d, generate_inputs(d, "small", 0), fi, Version("0.7.2.post1"), mode="packed-qkv"))


def test_release_and_arch_gates(monkeypatch):
    _fake(monkeypatch, "0.6.6")
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*>=0.6.7"):
        get_ground_truth("flashinfer", load_definition(PREFILL), device="cuda")
    _fake(monkeypatch, "0.7.2.post1", cc=(10, 0))  # fmha_v2 builds for majors 9 and 12
    with pytest.raises(GroundTruthUnavailable, match="arch-unsupported"):
        get_ground_truth("flashinfer", load_definition(RAGGED), device="cuda")
    _fake(monkeypatch, "0.4.1")  # trtllm-gen only before XQA came (0.5.0): sm100
    with pytest.raises(GroundTruthUnavailable, match="arch-unsupported"):
        get_ground_truth("flashinfer", load_definition(DECODE), device="cuda")
    _fake(monkeypatch, "0.2.5")
    with pytest.raises(GroundTruthUnavailable, match="api-missing"):
        get_ground_truth("flashinfer", load_definition(DECODE), device="cuda")
    fi = _fake(monkeypatch, "0.6.14")
    d = load_definition(PREFILL)
    with pytest.raises(GroundTruthUnavailable, match=r"api-missing: .*separate \(k_cache, v_cache\) from 0.7.0"):
        _adapter(PREFILL).fn(Call(d, generate_inputs(d, "small", 0), fi, Version("0.6.14"), mode="separate-kv"))


def test_plan_reuse_launches_on_the_live_tensors(monkeypatch):
    fi = _fake(monkeypatch, "0.7.2.post1")
    d = load_definition(PREFILL)
    x = generate_inputs(d, "small", 0)
    got = modes.run(_adapter(PREFILL), Call(d, x, fi, Version("0.7.2.post1"), mode="plan-reuse"))
    assert torch.allclose(got[0].double(), _truth(d, x)[0].double(), atol=1e-2, rtol=1e-2) and len(CALLS) == 2
    with pytest.raises(GroundTruthUnavailable, match="no-gpu"):
        modes.run(_adapter(DECODE), Call(load_definition(DECODE), generate_inputs(load_definition(DECODE), "small", 0),
                                         fi, Version("0.7.2.post1"), mode="graph"))


def test_the_adapters_refuse_fi_trace_shaped_files():
    d = load_definition(DECODE)
    data = d.as_dict
    bad = d.model_validate({**data, "inputs": {("kv_cache" if k == "k_cache" else k): v
                                               for k, v in data["inputs"].items()}})
    assert "needs the inputs" in ttrt.applies(bad) and ftrt.ADAPTERS[-1].applies(bad)
    assert gen.kind(bad) == "" and edge_cases(bad) == []  # the generator leaves such a file to its init
    assert ftrt.ADAPTERS[0].applies(d) is not None and ftrt.ADAPTERS[-1].applies(d) is None


# -- planted bugs -----------------------------------------------------------------------------------------------
BOUNDARY = {
    "square-offset-clamped": "causal_square",
    "one-query-top-left": "single_token",
    "full-last-page-dropped": "page_edges",
    "full-last-page-dropped-decode": "page_edges",
    "one-page-read-whole": "single_token",
    "keys-capped-at-128": "long_kv",
    "no-max-subtraction": "scores_large",
    "finite-mask-sentinel": "scores_far_negative",
}
WRONG_MATH = ("causal-top-left", "pages-sorted", "hnd-read-as-nhd", "gqa-interleaved", "gqa-interleaved-prefill",
              "sm-scale-dropped", "ragged-not-causal")
FAMILY = [m for m in MUTANTS if m.definition.startswith("trtllm_")]


def test_every_family_mutant_has_its_case():
    assert_family_cases(FAMILY, BOUNDARY, WRONG_MATH)


@pytest.mark.parametrize("mutant", FAMILY, ids=lambda m: m.id)
def test_a_planted_bug_is_caught_by_its_case(mutant):
    assert_caught_by_its_case(mutant, BOUNDARY)

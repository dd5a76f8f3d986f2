"""dequantize_fp4 (paged NVFP4 KV-cache dequantization): the generator's boundary cases make what
docs/boundary/dequantize_fp4.md says, the float64 truth decodes e2m1 / e4m3 by their definitions and matches
hand-computed rows, refuses inputs outside the contract, and the FlashInfer adapter gates per release and passes
every call mode's layout through correctly (a fake module: no GPU here), and each planted bug is caught by its
case."""

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
from planted import agrees, assert_boundary_bug

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.groundtruth import GroundTruthUnavailable, get_ground_truth, modes, paths
from flashinfer_trace.groundtruth import flashinfer_dequantize_fp4 as fdq
from flashinfer_trace.groundtruth import torch_dequantize_fp4 as tdq
from flashinfer_trace.groundtruth.base import Call
from flashinfer_trace.inputs import dequantize_fp4 as gen
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.mutants import MUTANTS
from flashinfer_trace.testing import run_reference
from flashinfer_trace.timing.roofline import work
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import compare_with_model

DEFS = Path(__file__).resolve().parents[2] / "definitions" / "dequantize_fp4"
NHD = DEFS / "nvfp4_kv_dequantize_paged_h8_dk128_dv128_ps16.json"
HND = DEFS / "nvfp4_kv_dequantize_paged_hnd_h8_dk128_dv128_ps16.json"
PS1 = DEFS / "nvfp4_kv_dequantize_paged_h4_dk128_dv128_ps1_fp16.json"
PS5 = DEFS / "nvfp4_kv_dequantize_paged_hnd_h2_dk64_dv64_ps5_fp16.json"
ALL = sorted(DEFS.glob("*.json"))


def _d(path):
    return load_definition(path)


def _pages(x) -> list[list[int]]:
    ps = x.axes["page_size"]
    return [x.values["block_tables"][b, :-(-n // ps)].tolist() for b, n in enumerate(x.values["seq_lens"].tolist())]


# -- the generator ----------------------------------------------------------------------------------------------
def test_the_definitions_are_the_families():
    assert len(ALL) == 4 and {_d(p).op_type for p in ALL} == {"dequantize_fp4"}
    assert all(any(t.startswith("coverage:") for t in _d(p).tags) for p in ALL)
    assert edge_cases(_d(NHD)) == list(gen.CASES)


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
@pytest.mark.parametrize("case", [None, *gen.CASES])
def test_every_case_keeps_the_contract(path, case):
    x = generate_inputs(_d(path), "small", 0, case=case)
    v = x.values
    lens = v["seq_lens"].tolist()
    assert x.axes["max_seq_len"] > max(lens)  # every request has rows that must keep the sentinel
    for out in ("output_k", "output_v"):
        assert bool((v[out] == gen.SENTINEL).all())
    for sf in ("k_scales", "v_scales"):
        assert not bool(((v[sf].view(torch.uint8) & 0x7F) == 0x7F).any())  # no NaN code
    ids = [p for pages in _pages(x) for p in pages]
    if case != "shared_pages":
        assert len(set(ids)) == len(ids)
    assert x.axes["num_pages"] > len(set(ids))  # spare pages


def test_typical_data_hold_every_code():
    x = generate_inputs(_d(NHD), "small", 0)
    assert set(x.values["paged_k_cache"].unique().tolist()) == set(range(256))  # every e2m1 pair: +-0, +-6
    codes = set(x.values["k_scales"].view(torch.uint8).unique().tolist())
    assert codes == set(range(256)) - {0x7F, 0xFF}  # subnormals, +-448, +-0
    assert 2.0 ** -4 <= float(x.values["k_scale"]) <= 2.0 ** 4


def test_empty_request_has_no_pages_first_and_last():
    lens = generate_inputs(_d(NHD), "small", 0, case="empty_request").values["seq_lens"].tolist()
    assert lens[0] == lens[-1] == 0 and all(n > 0 for n in lens[1:-1])


@pytest.mark.parametrize("path", [NHD, PS5], ids=lambda p: p.stem)
def test_page_edges_fill_pages_exactly_and_one_past(path):
    x = generate_inputs(_d(path), "small", 0, case="page_edges")
    ps = x.axes["page_size"]
    assert x.values["seq_lens"].tolist()[:6] == [ps, ps + 1, 2 * ps, ps - 1, 1, 3 * ps - 1]


def test_shared_pages_share_a_prefix_and_reverse_one_list():
    pages = _pages(generate_inputs(_d(NHD), "small", 0, case="shared_pages"))
    assert pages[1][0] == pages[0][0] and pages[2] == sorted(pages[2], reverse=True)


def test_scale_landmarks_cycle_and_bytes_count_up():
    x = generate_inputs(_d(HND), "small", 0, case="scale_landmarks")
    codes = x.values["k_scales"].view(torch.uint8).reshape(-1)[:8].tolist()
    assert codes == list(gen.LANDMARKS)
    assert x.values["paged_v_cache"].reshape(-1)[:256].tolist() == list(range(256))


@pytest.mark.parametrize("path", [NHD, PS1], ids=lambda p: p.stem)
def test_near_overflow_puts_the_largest_products_at_the_edge(path):
    d = _d(path)
    x = generate_inputs(d, "small", 0, case="near_overflow")
    big = torch.finfo(x.values["output_k"].dtype).max
    k, v = float(x.values["k_scale"]), float(x.values["v_scale"])
    assert math.log2(k).is_integer() and v == 2 * k and 2688 * k <= big < 2688 * v
    assert bool((x.values["k_scales"].view(torch.uint8) == 0x7E).any())
    out_k, out_v = get_ground_truth("torch", d, device="cpu")(x)
    assert bool(torch.isfinite(out_k).all()) and bool(out_v.isinf().any())
    assert float(out_k.abs().max()) == 2688 * k  # +-6 x 448 x k_scale, finite


def test_zero_global_scale_zeroes_k_only():
    x = generate_inputs(_d(NHD), "small", 0, case="zero_global_scale")
    assert float(x.values["k_scale"]) == 0.0 and float(x.values["v_scale"]) > 0


# -- the float64 truth ------------------------------------------------------------------------------------------
def test_the_tables_are_the_formats():
    assert tdq.e2m1_table().tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0,
                                         -4.0, -6.0]
    assert math.copysign(1.0, tdq.e2m1_table()[8].item()) == -1.0
    e4m3 = tdq.e4m3_table()
    torch_fp8 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float64)
    assert torch.equal(e4m3.nan_to_num(7.0), torch_fp8.nan_to_num(7.0))
    assert e4m3[0x7E] == 448 and e4m3[0x01] == 2.0 ** -9 and e4m3[0x08] == 2.0 ** -6 and e4m3[0x7F].isnan()
    assert tdq.overflow_threshold(torch.float16) == 65520.0
    assert tdq.overflow_threshold(torch.bfloat16) == 2.0 ** 128 - 2.0 ** 119


def _hand_case(path=NHD):
    """One request of 17 tokens over pages [2, 0] (page_size 16) and one of 0, max_seq_len 18: row 0 of K is byte
    0x71 (0.5 then 6.0) under scale 0x38 (1.0) then byte 0x9A (-1.0 then -0.5), the rest 0; its second block's scale
    is 0x01 (2^-9); k_scale 2, v_scale 0.25."""
    d = _d(path)
    i32 = torch.int32
    k = torch.zeros(3, 16, 8, 64, dtype=torch.uint8)
    v = torch.full((3, 16, 8, 64), 0x22, dtype=torch.uint8)  # 1.0, 1.0
    ks = torch.full((3, 16, 8, 8), 0x38, dtype=torch.uint8)
    vs = torch.full((3, 16, 8, 8), 0x40, dtype=torch.uint8)  # 2.0
    k[2, 0, 0, :2] = torch.tensor([0x71, 0x9A], dtype=torch.uint8)
    k[2, 0, 0, 8] = 0x77  # element 16, 17: +6 +6 in the second block
    ks[2, 0, 0, 1] = 0x01
    k[0, 0, 3, 0] = 0x0F  # token 16 (page 0, slot 0), head 3: -6.0 then 0.0
    sentinel = torch.full((2, 18, 8, 128), gen.SENTINEL, dtype=torch.bfloat16)
    values = dict(paged_k_cache=k, paged_v_cache=v, k_scales=ks.view(torch.float8_e4m3fn),
                  v_scales=vs.view(torch.float8_e4m3fn), block_tables=torch.tensor([[2, 0], [1, 1]], dtype=i32),
                  seq_lens=torch.tensor([17, 0], dtype=i32), k_scale=torch.tensor(2.0), v_scale=torch.tensor(0.25),
                  output_k=sentinel.clone(), output_v=sentinel.clone())
    if path == HND:
        for n in ("paged_k_cache", "paged_v_cache", "k_scales", "v_scales"):
            values[n] = values[n].transpose(1, 2).contiguous()
    return d, values


def _truth(d, values):
    return tdq.dequantize(Call(d, types.SimpleNamespace(values=values), None, None))


@pytest.mark.parametrize("path", [NHD, HND], ids=lambda p: p.stem)
def test_truth_matches_hand_computed_rows(path):
    d, values = _hand_case(path)
    k, v = _truth(d, values)
    assert k.dtype == torch.float64
    assert k[0, 0, 0, :4].tolist() == [1.0, 12.0, -2.0, -1.0]
    assert k[0, 0, 0, 16:18].tolist() == [6 * 2.0 ** -9 * 2] * 2
    assert k[0, 16, 3, :2].tolist() == [-12.0, 0.0] and k[0, 0, 1].abs().sum() == 0
    assert bool((v[0, :17] == 0.5).all())  # 1.0 x 2.0 x 0.25
    assert bool((k[0, 17:] == gen.SENTINEL).all()) and bool((k[1] == gen.SENTINEL).all())  # past the lengths


@pytest.mark.parametrize("change, message", [
    (dict(seq_lens=torch.tensor([19, 0], dtype=torch.int32)), "length 19 outside"),
    (dict(block_tables=torch.tensor([[2, 7], [1, 1]], dtype=torch.int32)), "page id outside"),
    (dict(seq_lens=torch.tensor([17, 33], dtype=torch.int32)), "length 33 outside"),
])
def test_truth_refuses_inputs_outside_the_contract(change, message):
    d, values = _hand_case()
    with pytest.raises(ValueError, match=message):
        _truth(d, {**values, **change})


def test_truth_refuses_a_nan_scale():
    d, values = _hand_case()
    ks = values["k_scales"].view(torch.uint8).clone()
    ks[1, 3, 2, 0] = 0xFF
    with pytest.raises(ValueError, match="NaN code"):
        _truth(d, {**values, "k_scales": ks.view(torch.float8_e4m3fn)})


def test_hnd_and_nhd_truths_agree_on_the_same_cache():
    nhd, hnd = _truth(*_hand_case(NHD)), _truth(*_hand_case(HND))
    assert all(torch.equal(a, b) for a, b in zip(nhd, hnd, strict=True))


def test_the_reference_agrees_with_the_truth_within_one_ulp():
    for path in ALL:
        d = _d(path)
        tol = tolerance_for(d)
        want = 2.0 ** -7 if "fp16" not in path.stem else 2.0 ** -10
        assert (tol.atol, tol.rtol, tol.matched_ratio) == (0.0, want, 1.0)
        x = generate_inputs(d, "small", 1)
        results = compare_with_model(d, x, run_reference(d, x), get_ground_truth("torch", d, device="cpu")(x), tol)
        assert all(r.passed for r in results)


def test_roofline_counts_the_tokens_read_and_written():
    d = _d(NHD)
    x = generate_inputs(d, "small", 0)
    w = work(d, x)
    tokens = int(x.values["seq_lens"].sum())
    assert w.flops == 2 * tokens * 8 * 256
    assert w.detail["bytes_written"]["output_k"] == tokens * 8 * 128 * 2
    assert w.detail["bytes_read"]["paged_k_cache"] == tokens * 8 * 64 and w.detail["bytes_read"]["output_k"] == 0


# -- the FlashInfer adapter (a fake module) ------------------------------------------------------------------------
CALLS: list[dict] = []


def _fake_paged(paged_kv_cache, kv_cache_sf, block_tables, seq_lens, k_scale, v_scale, output_k, output_v,
                kv_layout="NHD"):
    """FlashInfer's documented semantics, for the fake: tuple or 5-D [pages, 2, ...] caches, NHD or HND, scales as
    float8_e4m3fn or uint8, written in place; torch's own fp8 conversion decodes the scales."""
    CALLS.append(dict(tuple=isinstance(paged_kv_cache, tuple), layout=kv_layout, table=block_tables.dtype,
                      scales=(kv_cache_sf[0] if isinstance(kv_cache_sf, tuple) else kv_cache_sf).dtype))
    caches = paged_kv_cache if isinstance(paged_kv_cache, tuple) else paged_kv_cache.unbind(1)
    sfs = kv_cache_sf if isinstance(kv_cache_sf, tuple) else kv_cache_sf.unbind(1)
    lut = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
    for cache, sf, g, out in zip(caches, sfs, (k_scale, v_scale), (output_k, output_v), strict=True):
        if kv_layout == "HND":
            cache, sf = cache.transpose(1, 2), sf.transpose(1, 2)
        ps = cache.shape[1]
        scale = sf.view(torch.float8_e4m3fn).float()
        for b, n in enumerate(seq_lens.tolist()):
            for t in range(n):
                page, slot = int(block_tables[b, t // ps]), t % ps
                codes = torch.stack([cache[page, slot] & 15, cache[page, slot] >> 4], -1).flatten(-2).long()
                val = lut[codes] * scale[page, slot].repeat_interleave(16, -1) * g.float()
                out[b, t] = val.to(out.dtype)


def _fake_flashinfer(monkeypatch, version, cc=(9, 0), **quantization):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    module.quantization = types.SimpleNamespace(**quantization)
    install_flashinfer(monkeypatch, module, version, cc=cc)
    return module


FULL = dict(nvfp4_kv_dequantize_paged=_fake_paged)


def test_flashinfer_is_not_installed_here():
    with pytest.raises(GroundTruthUnavailable) as e:
        get_ground_truth("flashinfer", _d(NHD), device="cuda")
    assert e.value.kind in ("not-installed", "import-failed")


def test_paths_cover_every_call_mode():
    for path in ALL:
        assert paths("flashinfer", _d(path)) == [None, *fdq.MODES, "graph"]


def test_releases_before_0_6_15_are_api_missing(monkeypatch):
    _fake_flashinfer(monkeypatch, "0.6.14", **FULL)
    with pytest.raises(GroundTruthUnavailable, match="api-missing: .*needs >=0.6.15"):
        get_ground_truth("flashinfer", _d(NHD), device="cuda")


def test_a_release_without_the_function_is_api_missing(monkeypatch):
    _fake_flashinfer(monkeypatch, "0.7.2")
    with pytest.raises(GroundTruthUnavailable, match="api-missing: .*quantization.nvfp4_kv_dequantize_paged"):
        get_ground_truth("flashinfer", _d(NHD), device="cuda")


def test_sm80_and_up_only(monkeypatch):
    _fake_flashinfer(monkeypatch, "0.7.2.post1", cc=(7, 5), **FULL)
    with pytest.raises(GroundTruthUnavailable, match="arch-unsupported: .*sm80"):
        get_ground_truth("flashinfer", _d(NHD), device="cuda")
    _fake_flashinfer(monkeypatch, "0.7.2.post1", cc=(8, 0), **FULL)
    assert get_ground_truth("flashinfer", _d(NHD), device="cuda") is not None


def _run(path, mode, case=None):
    d = _d(path)
    gt = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path=mode), device="cpu")
    x = generate_inputs(d, "small", 0, case=case)
    return gt(x), get_ground_truth("torch", d, device="cpu")(x), d, x


@pytest.mark.parametrize("path, mode", [(p, m) for p in (NHD, HND) for m in (None, *fdq.MODES)] + [(PS5, None)],
                         ids=str)
def test_every_mode_passes_the_layout_through(monkeypatch, path, mode):
    _fake_flashinfer(monkeypatch, "0.6.15", **FULL)
    CALLS.clear()
    got, want, d, x = _run(path, mode, case="page_edges")
    assert all(r.passed for r in compare_with_model(d, x, got, want, tolerance_for(d)))
    assert bool((got[0][0, x.values["seq_lens"][0]:] == gen.SENTINEL).all())  # the rows past the length
    (call,) = CALLS
    hnd = (path != NHD) != (mode == "other-kv-layout")
    assert call["layout"] == ("HND" if hnd else "NHD") and call["tuple"] == (mode != "stacked")
    assert call["table"] == (torch.int64 if mode == "int64-table" else torch.int32)
    assert call["scales"] == (torch.uint8 if mode == "uint8-scales" else torch.float8_e4m3fn)


def test_the_inputs_are_not_written(monkeypatch):
    _fake_flashinfer(monkeypatch, "0.6.15", **FULL)
    d = _d(NHD)
    x = generate_inputs(d, "small", 0)
    before = x.values["output_k"].clone()
    fdq.dequantize(Call(d, x, sys.modules["flashinfer"], Version("0.6.15")))
    assert torch.equal(x.values["output_k"], before)  # clones were written, not the case's buffers


def test_the_plan_launches_on_the_live_tensors(monkeypatch):
    """modes.py's plan-reuse runs the graph path's launch on stand-in data (the scales flipped), then on the case's,
    in the same tensors (a CUDA graph replays it the same way; the CPU has no graph)."""
    fi = _fake_flashinfer(monkeypatch, "0.6.15", **FULL)
    d = _d(HND)
    x = generate_inputs(d, "small", 0)
    (adapter,) = fdq.ADAPTERS
    got = modes.run(adapter, Call(d, x, fi, Version("0.6.15"), mode="plan-reuse"))
    assert agrees(d, x, got)


# -- planted bugs ---------------------------------------------------------------------------------------------------
BOUNDARY = {  # mutant id -> the case that catches it (None: typical inputs already do)
    "nibble-order": None,
    "scale-per-32": None,
    "scale-block-shifted": None,
    "subnormal-scale-flushed": "scale_landmarks",
    "global-scale-ignored": None,
    "zero-global-scale-as-one": "zero_global_scale",
    "kv-global-swapped": None,
    "rows-past-length": None,
    "empty-request-one-row": "empty_request",
    "full-last-page-dropped": "page_edges",
    "pages-contiguous": "page_edges",
    "read-as-hnd": None,
    "read-as-nhd": None,
    "overflow-saturates": "near_overflow",
}
PASS_TYPICAL = ("zero-global-scale-as-one", "empty-request-one-row", "overflow-saturates")  # only their case shows
FAMILY = [m for m in MUTANTS if m.definition.startswith("nvfp4_kv_dequantize_paged")]


def test_every_family_mutant_has_its_case():
    assert {m.id for m in FAMILY} == set(BOUNDARY) and not [m for m in FAMILY if m.gpu_only or m.survives]


@pytest.mark.parametrize("name", sorted(BOUNDARY))
def test_a_planted_bug_is_caught_by_its_case(name):
    (mutant,) = [m for m in FAMILY if m.id == name]
    assert_boundary_bug(mutant, [BOUNDARY[name]], sizes=("small",) if name in PASS_TYPICAL else ())

"""page_append (paged KV-cache append): the generator's boundary cases make what docs/boundary/page_append.md
says, the float64 truth matches hand-computed caches and refuses inputs outside the contract, the FlashInfer
adapters gate per release and pass every call mode's layout through correctly (a fake module: no GPU here), and
each planted bug is caught by its case."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import pytest
import torch
from fakes import install_flashinfer
from packaging.version import Version
from planted import assert_boundary_bug, mutant_named

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.groundtruth import GroundTruthUnavailable, get_ground_truth, modes, paths
from flashinfer_trace.groundtruth import flashinfer_page_append as fpa
from flashinfer_trace.groundtruth import torch_page_append as tpa
from flashinfer_trace.groundtruth.base import Call
from flashinfer_trace.inputs import CaseTooLarge, edge_cases, generate_inputs
from flashinfer_trace.inputs import page_append as gen
from flashinfer_trace.mutants import MUTANTS, kill
from flashinfer_trace.verdict.compare import tolerance_for

DEFS = Path(__file__).resolve().parents[2] / "definitions" / "page_append"
PS16 = DEFS / "append_paged_kv_cache_kv8_d128_ps16.json"
PS1 = DEFS / "append_paged_kv_cache_kv8_d128_ps1.json"
FP8 = DEFS / "append_paged_kv_cache_kv8_d128_ps16_fp8_e4m3.json"
MLA = DEFS / "append_paged_mla_kv_cache_ckv512_kpe64_ps64.json"
ALL = sorted(DEFS.glob("*.json"))


def _d(path):
    return load_definition(path)


def _layout(x) -> dict:
    """Per request: (pages, seq_len, appended positions in token order), from the generated tensors."""
    v = x.values
    indptr, last = v["kv_indptr"].tolist(), v["kv_last_page_len"].tolist()
    ps = next(t for n, t in v.items() if n.endswith("cache")).shape[1]
    out = {}
    for r in range(len(last)):
        pages = v["kv_indices"][indptr[r]:indptr[r + 1]].tolist()
        seq = 0 if not pages else (len(pages) - 1) * ps + last[r]
        pos = [p for b, p in zip(v["batch_indices"].tolist(), v["positions"].tolist(), strict=True) if b == r]
        out[r] = (pages, seq, pos)
    return out


# -- the generator ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
@pytest.mark.parametrize("case", [None, *gen.CASES[:-1]])
def test_every_case_appends_the_tail_of_each_sequence_on_distinct_slots(path, case):
    d = _d(path)
    x = generate_inputs(d, "small", 0, case=case)
    ps = x.axes["page_size"]
    slots = set()
    for pages, seq, pos in _layout(x).values():
        assert sorted(pos) == list(range(seq - len(pos), seq))  # the appended tokens end the sequence
        assert len(pages) == -(-seq // ps)
        slots |= {(pages[p // ps], p % ps) for p in pos}
    assert len(slots) == x.axes["nnz_kv"]
    ids = x.values["kv_indices"].tolist()
    assert len(set(ids)) == len(ids) and x.axes["num_pages"] > len(ids)  # no shared page, spare pages left


def test_decode_appends_one_token_per_request():
    x = generate_inputs(_d(PS16), "small", 0, case="decode")
    assert all(len(pos) == 1 for _, _, pos in _layout(x).values())
    assert x.axes["batch_size"] == gen.DECODE_REQUESTS["small"]


@pytest.mark.parametrize("path", [PS16, MLA], ids=lambda p: p.stem)
def test_page_boundary_crosses_pages_and_fills_last_pages_exactly(path):
    x = generate_inputs(_d(path), "small", 0, case="page_boundary")
    ps = x.axes["page_size"]
    reqs = list(_layout(x).values())
    assert (reqs[0][2][0] % ps, len({p // ps for p in reqs[0][2]})) == (ps - 1, 2)  # last slot, then the next page
    assert reqs[1][2][0] % ps == 0 and len(reqs[1][2]) == ps  # a fresh page, filled
    assert len({p // ps for p in reqs[2][2]}) == 3
    full = [r for r, last in enumerate(x.values["kv_last_page_len"].tolist()) if last == ps]
    assert {1, 3} <= set(full)


def test_zero_append_leaves_requests_out_and_has_an_empty_one():
    x = generate_inputs(_d(PS16), "small", 0, case="zero_append")
    reqs = _layout(x)
    counts = [len(pos) for _, _, pos in reqs.values()]
    assert counts[0] == counts[-1] == 0 and counts[2] == 0 and any(counts)
    assert reqs[2][:2] == ([], 0) and x.values["kv_last_page_len"][2] == 0
    assert all(pages for r, (pages, _, _) in reqs.items() if r != 2)  # the others keep their cached tokens


def test_reversed_pages_are_descending_per_request_and_interleaved():
    x = generate_inputs(_d(PS1), "small", 0, case="reversed_pages")
    lists = [pages for pages, _, _ in _layout(x).values()]
    assert all(p == sorted(p, reverse=True) and len(set(p)) == len(p) for p in lists)
    spans = [(min(p), max(p)) for p in lists if p]
    assert any(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(spans) for b in spans[i + 1:])  # interleaved


def test_shuffled_tokens_are_out_of_request_order():
    b = generate_inputs(_d(PS16), "small", 0, case="shuffled_tokens").values["batch_indices"]
    assert bool((b[1:] < b[:-1]).any())


@pytest.mark.parametrize("path", [PS16, FP8], ids=lambda p: p.stem)
def test_bit_patterns_hold_the_landmarks_and_the_whole_code_range(path):
    x = generate_inputs(_d(path), "small", 0, case="bit_patterns")
    key = x.values["append_key"]
    fi = torch.finfo(key.dtype)
    head = key.reshape(-1)[:8].to(torch.float32)
    want = torch.tensor([0.0, -0.0, fi.tiny * fi.eps, -fi.tiny * fi.eps, fi.tiny, -fi.tiny, fi.max, -fi.max])
    assert torch.equal(head, want.to(key.dtype).to(torch.float32)) and bool(torch.signbit(head[1]))
    wide = key.to(torch.float32)
    assert bool(torch.isfinite(wide).all()) and float(wide.abs().max()) == fi.max
    assert bool(((wide != 0) & (wide.abs() < fi.tiny)).any())  # subnormals beyond the landmarks
    for cache in ("k_cache", "v_cache"):
        assert float(x.values[cache].to(torch.float32).abs().max()) > fi.max / 4


def test_large_page_index_is_too_large_on_this_cpu_and_reaches_the_offset_when_small(monkeypatch):
    d = _d(PS16)
    with pytest.raises(CaseTooLarge, match="past element 2\\*\\*31"):
        generate_inputs(d, "small", 0, case="large_page_index")
    monkeypatch.setattr(gen, "INT32_ELEMENTS", 2**20)  # the same construction at a CPU's scale
    x = generate_inputs(d, "small", 0, case="large_page_index")
    n, ids = x.axes["num_pages"], x.values["kv_indices"].tolist()
    assert (n - 1) * 16 * 8 * 128 >= 2**20 and {0, n - 1} <= set(ids)
    last_page_of = [pages[-1] for pages, _, _ in _layout(x).values() if pages]
    assert n - 1 in last_page_of


def test_edge_cases_are_the_generators():
    assert edge_cases(_d(MLA)) == list(gen.CASES)


# -- the float64 truth ------------------------------------------------------------------------------------------
def _hand_case():
    """Two requests, page_size 16: request 0 owns pages [3, 1] (20 tokens, the last 5 appended: position 15 is slot
    15 of page 3, positions 16..19 slots 0..3 of page 1); request 1 owns page [0] (3 tokens, none appended)."""
    d = _d(PS16)
    k = torch.randn(5, 16, 8, 128).to(torch.bfloat16)
    v = torch.randn(5, 16, 8, 128).to(torch.bfloat16)
    ak, av = torch.randn(5, 8, 128).to(torch.bfloat16), torch.randn(5, 8, 128).to(torch.bfloat16)
    i32 = torch.int32
    values = dict(append_key=ak, append_value=av, batch_indices=torch.zeros(5, dtype=i32),
                  positions=torch.arange(15, 20, dtype=i32), k_cache=k, v_cache=v,
                  kv_indices=torch.tensor([3, 1, 0], dtype=i32), kv_indptr=torch.tensor([0, 2, 3], dtype=i32),
                  kv_last_page_len=torch.tensor([4, 3], dtype=i32))
    want_k, want_v = k.to(torch.float64), v.to(torch.float64)
    want_k[3, 15], want_v[3, 15] = ak[0].double(), av[0].double()
    for j in range(4):
        want_k[1, j], want_v[1, j] = ak[1 + j].double(), av[1 + j].double()
    return d, values, (want_k, want_v)


def _truth(d, values):
    return tpa.append(Call(d, types.SimpleNamespace(values=values), None, None))


def test_truth_matches_hand_computed_caches():
    d, values, (want_k, want_v) = _hand_case()
    k, v = _truth(d, values)
    assert k.dtype == torch.float64 and torch.equal(k, want_k) and torch.equal(v, want_v)


@pytest.mark.parametrize("change, message", [
    (dict(positions=torch.arange(16, 21, dtype=torch.int32)), "outside request 0's sequence of 20"),
    (dict(positions=torch.tensor([15, 16, 16, 18, 19], dtype=torch.int32)), "same cache slot"),
    (dict(kv_indices=torch.tensor([3, 9, 0], dtype=torch.int32)), "page id outside"),
    (dict(batch_indices=torch.full((5,), 2, dtype=torch.int32)), "batch index 2 outside"),
])
def test_truth_refuses_inputs_outside_the_contract(change, message):
    d, values, _ = _hand_case()
    with pytest.raises(ValueError, match=message):
        _truth(d, {**values, **change})


# -- the FlashInfer adapters (a fake module) ----------------------------------------------------------------------
def _fake_append(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr,
                 kv_last_page_len, kv_layout="NHD"):
    """FlashInfer's documented semantics, for the fake: a (k, v) tuple or a 5-D [pages, 2, ...] tensor, NHD or
    HND, written in place."""
    k, v = paged_kv_cache if isinstance(paged_kv_cache, tuple) else paged_kv_cache.unbind(1)
    ps = k.shape[1] if kv_layout == "NHD" else k.shape[2]
    for i, (b, p) in enumerate(zip(batch_indices.tolist(), positions.tolist(), strict=True)):
        page = int(kv_indices[int(kv_indptr[b]) + p // ps])
        for cache, row in ((k, append_key[i]), (v, append_value[i])):
            if kv_layout == "NHD":
                cache[page, p % ps] = row
            else:
                cache[page, :, p % ps] = row


def _fake_mla(append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache, kv_indices, kv_indptr,
              kv_last_page_len):
    _fake_append(append_ckv, append_kpe, batch_indices, positions, (ckv_cache, kpe_cache), kv_indices, kv_indptr,
                 kv_last_page_len)


def _fake_positions(append_indptr, seq_lens, nnz, batch_indices=None, positions=None):
    bi = torch.empty(nnz, dtype=torch.int32) if batch_indices is None else batch_indices
    pos = torch.empty(nnz, dtype=torch.int32) if positions is None else positions
    for r in range(len(append_indptr) - 1):
        a, e = int(append_indptr[r]), int(append_indptr[r + 1])
        bi[a:e] = r
        pos[a:e] = torch.arange(int(seq_lens[r]) - (e - a), int(seq_lens[r]))
    return bi, pos


def _old_positions(append_indptr, seq_lens, nnz):  # before 0.6.0: no preallocated outputs
    return _fake_positions(append_indptr, seq_lens, nnz)


def _seq_lens(kv_indptr, kv_last_page_len, page_size):
    return torch.clamp(kv_indptr[1:] - kv_indptr[:-1] - 1, min=0) * page_size + kv_last_page_len


def _fake_flashinfer(monkeypatch, version, **page):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    module.page = types.SimpleNamespace(**page)
    install_flashinfer(monkeypatch, module, version)
    return module


FULL = dict(append_paged_kv_cache=_fake_append, append_paged_mla_kv_cache=_fake_mla,
            get_batch_indices_positions=_fake_positions, get_seq_lens=_seq_lens)


def test_flashinfer_is_not_installed_here():
    with pytest.raises(GroundTruthUnavailable) as e:
        get_ground_truth("flashinfer", _d(PS16), device="cuda")
    assert e.value.kind in ("not-installed", "import-failed")


def test_paths_cover_every_call_mode():
    assert paths("flashinfer", _d(PS16)) == [None, *fpa.KV_MODES, "graph"]
    assert paths("flashinfer", _d(FP8)) == [None, *fpa.KV_MODES]  # no graph: torch cannot flip float8
    assert paths("flashinfer", _d(MLA)) == [None, *fpa.MLA_MODES, "graph"]


@pytest.mark.parametrize("version, path, reason", [
    ("0.1.6", PS16, "needs >=0.2.0"), ("0.2.3", MLA, "needs >=0.2.4"),
])
def test_releases_without_the_batch_indices_api_are_api_missing(monkeypatch, version, path, reason):
    _fake_flashinfer(monkeypatch, version, **FULL)
    with pytest.raises(GroundTruthUnavailable, match=f"api-missing: .*{reason}"):
        get_ground_truth("flashinfer", _d(path), device="cuda")


def test_a_release_without_the_function_is_api_missing(monkeypatch):
    _fake_flashinfer(monkeypatch, "0.6.6", append_paged_kv_cache=_fake_append)
    with pytest.raises(GroundTruthUnavailable, match="api-missing: .*has no page.append_paged_mla_kv_cache"):
        get_ground_truth("flashinfer", _d(MLA), device="cuda")


def _run(path, mode, case=None):
    d = _d(path)
    gt = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda", path=mode), device="cpu")
    x = generate_inputs(d, "small", 0, case=case)
    return gt(x), get_ground_truth("torch", d, device="cpu")(x)


@pytest.mark.parametrize("path, mode", [(PS16, m) for m in (None, *fpa.KV_MODES)] + [(FP8, "hnd-single-tensor")]
                         + [(MLA, m) for m in (None, *fpa.MLA_MODES)], ids=str)
def test_every_mode_passes_the_layout_through(monkeypatch, path, mode):
    _fake_flashinfer(monkeypatch, "0.6.6", **FULL)
    got, want = _run(path, mode, case="page_boundary")
    assert len(got) == 2 and all(torch.equal(g.double(), w) for g, w in zip(got, want, strict=True))


def test_the_plan_launches_on_the_live_caches(monkeypatch):
    """modes.py's plan-reuse runs the graph path's launch on stand-in data, then on the case's, in the same tensors
    (a CUDA graph replays it the same way; the CPU has no graph)."""
    fi = _fake_flashinfer(monkeypatch, "0.6.6", **FULL)
    for path in (PS16, MLA):
        d = _d(path)
        x = generate_inputs(d, "small", 0)
        (adapter,) = [a for a in fpa.ADAPTERS if a.applies(d) is None]
        got = modes.run(adapter, Call(d, x, fi, Version("0.6.6"), mode="plan-reuse"))
        want = get_ground_truth("torch", d, device="cpu")(x)
        assert all(torch.equal(g.double(), w) for g, w in zip(got, want, strict=True))


def test_fi_positions_out_needs_0_6_and_grouped_tokens(monkeypatch):
    _fake_flashinfer(monkeypatch, "0.5.3", **{**FULL, "get_batch_indices_positions": _old_positions})
    with pytest.raises(GroundTruthUnavailable, match="api-missing: .*no preallocated batch_indices/positions"):
        _run(PS16, "fi-positions-out")
    got, want = _run(PS16, "fi-positions")
    assert torch.equal(got[0].double(), want[0])
    with pytest.raises(GroundTruthUnavailable, match="unsupported: tokens not grouped by request"):
        _run(PS16, "fi-positions", case="shuffled_tokens")


def test_fi_positions_use_flashinfers_indices_not_the_cases(monkeypatch):
    """A get_batch_indices_positions that is off by one moves every token: the path compares FlashInfer's whole
    pipeline, not the case's indices."""
    def off_by_one(append_indptr, seq_lens, nnz, batch_indices=None, positions=None):
        bi, pos = _fake_positions(append_indptr, seq_lens, nnz)
        return bi, pos - 1

    _fake_flashinfer(monkeypatch, "0.6.6", **{**FULL, "get_batch_indices_positions": off_by_one})
    got, want = _run(PS16, "fi-positions")
    assert not torch.equal(got[0].double(), want[0])


# -- planted bugs ---------------------------------------------------------------------------------------------------
BOUNDARY = {  # mutant -> the case that catches it (None: typical inputs already do)
    "append_paged_kv_cache_kv8_d128_ps16:pages-contiguous": "reversed_pages",
    "append_paged_kv_cache_kv8_d128_ps16:last-page-only": "page_boundary",
    "append_paged_kv_cache_kv8_d128_ps16:full-last-page-dropped": "page_boundary",
    "append_paged_kv_cache_kv8_d128_ps16:requests-renumbered": "zero_append",
    "append_paged_kv_cache_kv8_d128_ps16:zeroed-cache": None,
    "append_paged_kv_cache_kv8_d128_ps16:flushes-subnormals": "bit_patterns",
    "append_paged_kv_cache_kv8_d128_ps16:through-float16": "bit_patterns",
    "append_paged_mla_kv_cache_ckv512_kpe64_ps64:last-page-only": "page_boundary",
    "append_paged_mla_kv_cache_ckv512_kpe64_ps64:pages-contiguous": "page_boundary",
}
PASS_TYPICAL = ("requests-renumbered", "flushes-subnormals", "through-float16")  # bugs only their case shows
FAMILY = [m for m in MUTANTS if m.definition.startswith("append_paged")]


def test_every_family_mutant_has_its_case():
    assert {m.name for m in FAMILY if not m.gpu_only} == set(BOUNDARY)
    assert {m.id for m in FAMILY if m.gpu_only} == {"int32-offset"}


@pytest.mark.parametrize("name", sorted(BOUNDARY))
def test_a_planted_bug_is_caught_by_its_case(name):
    mutant = mutant_named(FAMILY, name)
    assert_boundary_bug(mutant, [BOUNDARY[name]], sizes=("small",) if mutant.id in PASS_TYPICAL else ())


def test_the_int32_offset_bug_is_left_to_a_gpu():
    (mutant,) = [m for m in FAMILY if m.id == "int32-offset"]
    k = kill(mutant, "torch", device="cpu")
    assert k.killed is None and "not judged on the CPU" in k.how
    assert tolerance_for(_d(PS16)).atol == 0 and tolerance_for(_d(PS16)).matched_ratio == 1.0

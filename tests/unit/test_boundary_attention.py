"""The attention families' boundary-seeking edge cases (inputs/attention.py, inputs/dsa.py,
docs/boundary/attention.md): each case makes the inputs it promises, replays bit for bit, and the
torch ground truth gives the documented answer at the boundary (a query with no key: output 0, lse
-inf) while reading only the pages it is given."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from flashinfer_trace import semantics as sem
from flashinfer_trace.dataset import Dataset, load_definition
from flashinfer_trace.definition import Definition
from flashinfer_trace.groundtruth import get_ground_truth
from flashinfer_trace.inputs import CaseTooLarge, Inputs, common, edge_cases, generate_inputs
from flashinfer_trace.inputs import attention as att
from flashinfer_trace.inputs.common import Builder

GQA_DECODE = "gqa_paged_decode_h32_kv8_d128_ps1"
GQA_PREFILL = "gqa_paged_prefill_causal_h32_kv8_d128_ps1"
PS16_PREFILL = "gqa_paged_prefill_causal_h32_kv8_d128_ps16"
RAGGED = "gqa_ragged_prefill_causal_h32_kv8_d128"
FP16_DECODE = "gqa_paged_decode_h32_kv8_d128_ps1_fp16"
MLA_DECODE = "mla_paged_decode_h16_ckv512_kpe64_ps1"
MLA_PREFILL = "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1"
MLA_RAGGED = "mla_ragged_prefill_causal_h16_qk192_vo128"
DSA = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"
DSA_PS1 = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps1"
LAYOUTS = [GQA_DECODE, GQA_PREFILL, PS16_PREFILL, RAGGED, MLA_DECODE, MLA_RAGGED]
DEFINITIONS = Path(__file__).resolve().parents[2] / "definitions"
F32_EXP_OVERFLOW = math.log(torch.finfo(torch.float32).max)  # ~88.7


def case(name: str, which: str, size: str = "small") -> tuple[Definition, Inputs]:
    d = load_definition(name)
    return d, generate_inputs(d, size, seed=0, case=which)


def requests(d: Definition, x: Inputs) -> list[tuple[int, int, torch.Tensor]]:
    """Per request: its query rows and its key rows (flat cache slots, or ragged rows), in order."""
    v = x.values
    kv_indptr = v["kv_indptr"].to(torch.int64)
    n = kv_indptr.numel() - 1
    qo = v["qo_indptr"].tolist() if "qo_indptr" in v else list(range(n + 1))
    if "kv_indices" in v:
        ps = sem.page_size(d)
        slots = sem.request_token_slots(kv_indptr, v["kv_indices"], ps,
                                        sem.last_page_lens(kv_indptr, ps, v.get("kv_last_page_len")))
    else:
        ptr = kv_indptr.tolist()
        slots = [torch.arange(ptr[b], ptr[b + 1]) for b in range(n)]
    return [(qo[b], qo[b + 1], slots[b]) for b in range(n)]


def queries_and_keys(x: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 queries [rows, H, D] and keys [slots, Hk, D] (absorbed MLA: one latent head [ckv | kpe])."""
    v = x.values
    if "q_pe" in v:
        q = torch.cat([v["q_nope"], v["q_pe"]], -1).double()
        k = torch.cat([v["ckv_cache"].flatten(0, 1), v["kpe_cache"].flatten(0, 1)], -1).double()[:, None]
        return q, k
    k = v["k_cache"].flatten(0, 1) if "k_cache" in v else v["k"]
    return v["q"].double(), k.double()


def raw_scores(d: Definition, x: Inputs):
    """Per request with queries and keys: (raw q . k [Lq, H, Lk] in float64, causal visibility [Lq, Lk])."""
    q, keys = queries_and_keys(x)
    group = q.shape[1] // keys.shape[1]
    for q0, q1, slots in requests(d, x):
        if q1 == q0 or slots.numel() == 0:
            continue
        k = keys[slots].repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->qhk", q[q0:q1], k)
        lq, lk = q1 - q0, slots.numel()
        visible = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq) if sem.is_causal(d) \
            else torch.ones(lq, lk, dtype=torch.bool)
        yield s, visible


def lengths(d: Definition, x: Inputs) -> tuple[list[int], list[int]]:
    kv = [s.numel() for _, _, s in requests(d, x)]
    qo = [q1 - q0 for q0, q1, _ in requests(d, x)]
    return kv, qo


# -- the score cases ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", LAYOUTS)
def test_scores_far_negative_put_every_score_below_a_finite_sentinel(name):
    d, x = case(name, "scores_far_negative")
    scale = x.values["sm_scale"]
    for s, _ in raw_scores(d, x):
        assert float(s.max()) < -5e4
        spread = (s * scale).std(dim=-1)  # an ordinary softmax below the offset: neither one-hot nor flat
        if s.shape[-1] > 4:
            assert 0.3 < float(spread.mean()) < 10


@pytest.mark.parametrize("name", LAYOUTS)
def test_scores_large_overflow_exp_without_the_max(name):
    d, x = case(name, "scores_large")
    for s, _ in raw_scores(d, x):
        assert float((s * x.values["sm_scale"]).min()) > F32_EXP_OVERFLOW


@pytest.mark.parametrize("name", [GQA_DECODE, RAGGED, MLA_DECODE])
def test_score_offsets_leave_float32_sums_exact(name):
    """The offsets ride on grids that make every float32 product and partial sum exact: a float32 q . k
    equals the float64 one, so the case judges the softmax, not the rounding of its inputs."""
    d, x = case(name, "scores_far_negative")
    q, k = queries_and_keys(x)
    assert torch.equal(torch.round(q * 16) / 16, q) and torch.equal(torch.round(k * 8) / 8, k)
    for s, _ in raw_scores(d, x):
        assert torch.equal(s, s.float().double()) and float(s.abs().max()) < 2**17


@pytest.mark.parametrize("name", [GQA_DECODE, GQA_PREFILL, RAGGED, MLA_DECODE])
def test_one_key_dominates_each_request_in_its_second_half(name):
    d, x = case(name, "one_key_dominates")
    for s, _ in raw_scores(d, x):
        w = torch.softmax(s[-1] * x.values["sm_scale"], dim=-1)  # the last query sees every key
        best = w.argmax(dim=-1)
        assert float(w.max(dim=-1).values.min()) > 0.999 and bool((best == best[0]).all())
        assert int(best[0]) >= s.shape[-1] // 2


@pytest.mark.parametrize("name", [GQA_DECODE, PS16_PREFILL, RAGGED, MLA_DECODE])
def test_uniform_keys_and_zero_query_tie_every_score(name):
    d, x = case(name, "uniform_keys")
    _, keys = queries_and_keys(x)
    for _, _, slots in requests(d, x):
        assert bool((keys[slots] == keys[slots[:1]]).all())
    d, x = case(name, "zero_query")
    for s, _ in raw_scores(d, x):
        assert not bool(s.any())


@pytest.mark.parametrize("name,dtype", [(FP16_DECODE, torch.float16), (GQA_PREFILL, torch.bfloat16),
                                        (MLA_DECODE, torch.bfloat16)])
def test_values_near_max_keep_one_sign_per_channel(name, dtype):
    d, x = case(name, "values_near_max")
    v = x.values["ckv_cache" if "ckv_cache" in x.values else "v_cache"].flatten(0, -2).double()
    assert v.dtype == torch.float64 and bool(v.isfinite().all())
    top = float(v.abs().max())
    assert att.value_scale(dtype) <= top <= torch.finfo(dtype).max
    if dtype == torch.float16:
        assert top > torch.finfo(dtype).max / 4
    assert bool((v[:, 0::2] >= 0).all()) and bool((v[:, 1::2] <= 0).all())
    for s, _ in raw_scores(d, x):  # the scores stay ordinary (MLA: q_nope scaled down as the latent is scaled up)
        assert float((s * x.values["sm_scale"]).abs().max()) < 100


@pytest.mark.parametrize("name", [GQA_DECODE, FP16_DECODE, RAGGED, MLA_DECODE])
def test_subnormal_queries_score_like_ordinary_ones(name):
    d, x = case(name, "subnormal_query")
    r = att.roles(d)
    q = x.values[r.score_query]
    tiny = torch.finfo(q.dtype).tiny
    assert bool((q.abs() > 0).all()) and bool((q.abs() < tiny).all())  # every element subnormal
    if r.value_query:
        assert not bool(x.values[r.value_query].any())
    for s, _ in raw_scores(d, x):  # products of +-1: integer scores, spread like N(0, head_dim)
        assert torch.equal(s, s.round()) and float(s.abs().max()) <= q.shape[-1]
        assert float(s.std()) > 1


# -- structure ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [GQA_PREFILL, PS16_PREFILL, RAGGED, MLA_PREFILL, MLA_RAGGED])
def test_fully_masked_rows_are_zero_and_neg_inf_in_the_ground_truth(name):
    d, x = case(name, "fully_masked_rows")
    kv, qo = lengths(d, x)
    assert any(q > k for q, k in zip(qo, kv, strict=True)) and any(q <= k for q, k in zip(qo, kv, strict=True))
    out, lse = get_ground_truth("torch", d)(x)
    masked = torch.zeros(out.shape[0], dtype=torch.bool)
    for (q0, q1, _), k in zip(requests(d, x), kv, strict=True):
        masked[q0:q0 + max(0, (q1 - q0) - k)] = True
    assert int(masked.sum()) >= att.TIERS["small"].edge_qo
    assert bool(torch.isneginf(lse[masked]).all()) and not bool(out[masked].any())
    assert bool(lse[~masked].isfinite().all())


@pytest.mark.parametrize("name", [GQA_DECODE, GQA_PREFILL, RAGGED, MLA_DECODE])
def test_empty_kv_and_empty_qo_sit_at_both_ends_of_the_batch(name):
    d, x = case(name, "empty_kv")
    kv, qo = lengths(d, x)
    assert kv[0] == kv[-1] == 0 and all(k > 0 for k in kv[1:-1])
    out, lse = get_ground_truth("torch", d)(x)
    if att.is_prefill(d):
        assert qo[0] > 0 and qo[-1] == 0  # the first request's queries have no key at all
        assert bool(torch.isneginf(lse[:qo[0]]).all()) and not bool(out[:qo[0]].any())
        d, x = case(name, "empty_qo")
        kv, qo = lengths(d, x)
        assert qo[0] == qo[-1] == 0 and all(k > 0 for k in kv)
    else:
        assert "empty_qo" not in edge_cases(d)
        assert bool(torch.isneginf(lse[0]).all()) and bool(torch.isneginf(lse[-1]).all())


@pytest.mark.parametrize("name", [GQA_DECODE, GQA_PREFILL, PS16_PREFILL, MLA_RAGGED])
def test_long_kv_has_one_long_request(name):
    for size in ("small", "medium"):
        d, x = case(name, "long_kv", size)
        kv, qo = lengths(d, x)
        assert max(kv) >= att.TIERS[size].long_kv and min(kv) < att.TIERS[size].long_kv
        if att.is_prefill(d):
            assert 1 <= qo[kv.index(max(kv))] <= 4  # a few queries over a long prefix


def test_masked_cases_only_where_the_definition_allows_queries_without_keys():
    prefill = load_definition(GQA_PREFILL)
    assert {"fully_masked_rows", "empty_kv", "empty_qo"} <= set(edge_cases(prefill)) and att.allows_masked_rows(prefill)
    data = prefill.model_dump(mode="json")
    data["constraints"].append(
        "((kv_indptr[1:] - kv_indptr[:-1]) - (qo_indptr[1:] - qo_indptr[:-1])).min().item() >= 0")
    strict = Definition.model_validate(data)  # a file that requires qo_len <= kv_len excludes them by contract
    assert not att.allows_masked_rows(strict)
    assert "fully_masked_rows" not in edge_cases(strict) and "empty_kv" not in edge_cases(strict)
    assert "empty_qo" in edge_cases(strict)
    decode = edge_cases(load_definition(GQA_DECODE))
    assert "empty_kv" in decode and "fully_masked_rows" not in decode and "empty_qo" not in decode


@pytest.mark.parametrize("name", [GQA_PREFILL, RAGGED, MLA_DECODE, DSA])
def test_boundary_cases_replay_bit_for_bit(name):
    d = load_definition(name)
    for c in [*att.SCORE_CASES, "empty_kv", "fully_masked_rows"]:
        if c not in edge_cases(d):
            continue
        a, b = generate_inputs(d, "small", seed=2, case=c), generate_inputs(d, "small", seed=2, case=c)
        for k, t in a.values.items():
            assert torch.equal(t, b.values[k]) if isinstance(t, torch.Tensor) else t == b.values[k], (c, k)


# -- large_offsets: a cache past 2**31 elements -------------------------------------------------
@pytest.mark.parametrize("name", [GQA_DECODE, GQA_PREFILL, PS16_PREFILL, RAGGED, MLA_DECODE, MLA_RAGGED, DSA])
def test_large_offsets_is_too_large_for_a_small_machine(name, monkeypatch):
    monkeypatch.setattr(common, "memory_budget", lambda device: 16 * 2**30)
    with pytest.raises(CaseTooLarge, match=r"past 2\*\*31 elements needs \d+\.\d GiB \(x6"):
        generate_inputs(load_definition(name), "small", seed=0, case="large_offsets")


@pytest.mark.parametrize("name", [GQA_DECODE, PS16_PREFILL, MLA_DECODE])
def test_large_offsets_pages_sit_past_int32_elements(name):
    d = load_definition(name)
    b = Builder(d, "small", 0, "large_offsets")
    ps = d.const_axes["page_size"]
    kv, _ = att.lengths(b, att.is_prefill(d), 1 if "kv_last_page_len" in d.inputs else ps)
    att._paged_structure(b, kv)
    cache = "ckv_cache" if "ckv_cache" in d.inputs else "k_cache"
    per_page = math.prod(b.shape(cache)[1:])
    assert b.axes["num_pages"] * per_page * 2 > 2**32  # bytes past 2**32 as well (bf16)
    pages = b.values["kv_indices"].to(torch.int64)
    assert int(pages[0]) == 0 and bool((pages[1:] * per_page >= 2**31).all())


def test_large_offsets_ragged_keys_follow_a_request_without_queries(monkeypatch):
    seen = {}

    def stop(b, names, slots, paged):
        seen.update(indptr=b.values["kv_indptr"].tolist(), slots=slots, shapes={n: b.shape(n) for n in names})
        raise CaseTooLarge("stop here")

    monkeypatch.setattr(att, "_put_sparse_kv", stop)
    with pytest.raises(CaseTooLarge):
        generate_inputs(load_definition(MLA_RAGGED), "small", seed=0, case="large_offsets")
    first = seen["indptr"][1]
    for name, shape in seen["shapes"].items():  # k [.., 16, 192] and v [.., 16, 128] both pass 2**31 elements
        assert first * math.prod(shape[1:]) >= 2**31, name
    assert all(int(s.min()) >= first for s in seen["slots"]) and len(seen["slots"]) == att.TIERS["small"].few


def _virtual(t: torch.Tensor, pages: int) -> torch.Tensor:
    """A cache of `pages` pages that all alias page 0: the shape of 2**31 elements, the memory of one page."""
    return t[:1].expand(pages, *t.shape[1:])


@pytest.mark.parametrize("name", [GQA_DECODE, MLA_DECODE])
def test_torch_ground_truth_gathers_pages_before_widening(name):
    """Over a cache shaped past 2**31 elements (every page aliases one), the ground truth reads the listed
    pages only: widening the whole cache to float64 would need 32 GiB. One key repeated: output = its value."""
    d = load_definition(name)
    x = generate_inputs(d, "small", seed=0, case="batch1")
    v = dict(x.values)
    caches = [n for n in ("k_cache", "v_cache", "ckv_cache", "kpe_cache") if n in v]
    per_page = math.prod(v[caches[0]].shape[1:])
    pages = 2**31 // per_page + 64
    for n in caches:
        v[n] = _virtual(v[n], pages)
    v["kv_indices"] = (pages - 1 - torch.arange(v["kv_indices"].numel())).to(torch.int32)
    axes = {**x.axes, "num_pages": pages}
    out, lse = get_ground_truth("torch", d)(Inputs(x.definition, x.size, x.seed, x.case, v, axes))
    value = (v["v_cache"][0, 0] if "v_cache" in v else v["ckv_cache"][0, 0]).double()  # [Hk, D] or [D]
    expect = value.repeat_interleave(out.shape[1] // value.shape[0], dim=0) if value.dim() == 2 else value
    assert torch.allclose(out[0], expect, rtol=0, atol=1e-12) and bool(lse.isfinite().all())


def test_dsa_ground_truth_gathers_slots_before_widening():
    d = load_definition(DSA_PS1)  # page_size 1: the aliased cache flattens to slots without a copy
    x = generate_inputs(d, "small", seed=0, case="single_token")
    v = dict(x.values)
    ps = d.const_axes["page_size"]
    pages = 2**31 // (ps * 512) + 4
    v["ckv_cache"], v["kpe_cache"] = _virtual(v["ckv_cache"], pages), _virtual(v["kpe_cache"], pages)
    idx = v["sparse_indices"].to(torch.int64)
    v["sparse_indices"] = torch.where(idx >= 0, pages * ps - 1 - idx, -1).to(torch.int32)
    out, lse = get_ground_truth("torch", d)(Inputs(x.definition, x.size, x.seed, x.case, v,
                                                   {**x.axes, "num_pages": pages}))
    assert bool(out.isfinite().all()) and bool(lse.isfinite().all())


# -- the coverage definitions -------------------------------------------------------------------
def test_every_gqa_group_size_has_a_decode_a_paged_prefill_and_a_ragged_prefill():
    defs = [*Dataset(DEFINITIONS).select(op_type="gqa_paged"), *Dataset(DEFINITIONS).select(op_type="gqa_ragged")]
    for stage, op_type in (("decode", "gqa_paged"), ("prefill", "gqa_paged"), ("prefill", "gqa_ragged")):
        groups = {d.const_axes["num_qo_heads"] // d.const_axes["num_kv_heads"] for d in defs
                  if d.op_type == op_type and sem.stage(d) == stage and d.const_axes["head_dim"] == 128
                  and d.const_axes.get("page_size", 1) == 1 and d.inputs["q"].dtype.value == "bfloat16"}
        assert set(range(1, 9)) <= groups, (stage, op_type, sorted(groups))
    names = {d.name for d in defs}
    assert {f"{n}_fp16" for n in (GQA_DECODE, GQA_PREFILL, RAGGED)} <= names
    for ps in (16, 64):
        for stage in ("decode", "prefill_causal"):
            d = load_definition(f"gqa_paged_{stage}_h32_kv8_d128_ps{ps}")
            assert d.const_axes["page_size"] == ps and "kv_last_page_len" in d.inputs

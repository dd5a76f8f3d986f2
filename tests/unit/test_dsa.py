"""dsa_paged (DeepSeek-V3.2 sparse attention and fp8 top-k indexer): generator, torch ground truth,
the index-set comparison, FlashInfer adapters (fakes), extraction, planted bugs."""

import dataclasses
import types
from pathlib import Path

import pytest
import torch
from fakes import install_flashinfer

from flashinfer_trace.dataset import load_definition, load_path
from flashinfer_trace.groundtruth import GroundTruthUnavailable, base, get_ground_truth
from flashinfer_trace.groundtruth.torch_dsa import indexer_scores, unpack_index_cache
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.inputs.dsa import FP8_E4M3_MAX, POISON_SCALE, pack_index_cache
from flashinfer_trace.verdict import topk as compare_topk
from flashinfer_trace.verdict.compare import Tolerance

ATT1 = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps1"
ATT64 = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"
IDX = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"
PUBLIC = Path("/tmp/public/flashinfer_trace/definitions/dsa_paged")
TOL = Tolerance(0.1, 0.2, 0.9)


def public(name):
    path = PUBLIC / f"{name}.json"
    if not path.is_file():
        pytest.skip("the public dataset is not on this machine")
    return load_path(path)


# -- the generator ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [ATT1, ATT64])
def test_sparse_indices_are_distinct_slots_with_tail_padding(name):
    d = load_definition(name)
    x = generate_inputs(d, "small", seed=0)
    idx, pool = x.values["sparse_indices"], x.axes["num_pages"] * x.axes["page_size"]
    assert idx.dtype == torch.int32 and tuple(idx.shape) == (x.axes["num_tokens"], 2048) and pool > 2048
    counts = (idx >= 0).sum(dim=1)
    assert int(counts[0]) == 2048 and bool((counts < 2048).any())  # one full row, padded rows too
    for row, n in zip(idx, counts.tolist(), strict=True):
        assert bool((row[:n] >= 0).all()) and bool((row[n:] == -1).all())  # -1 at the tail
        assert row[:n].unique().numel() == n and int(row.max()) < pool
    assert x.values["sm_scale"] == pytest.approx(1 / 192 ** 0.5)


def test_attention_edge_cases():
    d = load_definition(ATT64)
    assert edge_cases(d)[-1] == "page_boundary" and "page_boundary" not in edge_cases(load_definition(ATT1))
    few = generate_inputs(d, "small", seed=0, case="fewer_than_topk").values["sparse_indices"]
    assert int((few >= 0).sum(dim=1).max()) <= 64
    empty = generate_inputs(d, "small", seed=0, case="empty_row").values["sparse_indices"]
    assert bool((empty == -1).all(dim=1).any())
    scattered = generate_inputs(d, "small", seed=0, case="scattered_padding").values["sparse_indices"]
    first_pad = (scattered == -1).int().argmax(dim=1)
    assert any(bool((r[int(p):] >= 0).any()) for r, p in zip(scattered, first_pad, strict=True))
    edge = generate_inputs(d, "small", seed=0, case="page_boundary").values["sparse_indices"][0]
    valid = set(edge[edge >= 0].tolist())
    assert any(s % 64 == 63 and s + 1 in valid for s in valid)  # a run that crosses a page boundary


def test_indexer_cache_packs_real_keys_and_poisons_the_tail():
    d = load_definition(IDX)
    x = generate_inputs(d, "small", seed=0)
    v = x.values
    lens = v["seq_lens"].tolist()
    assert max(lens) > 2048 > min(lens) and v["k_index_cache_fp8"].dtype == torch.int8
    assert x.axes["max_num_pages"] * 64 >= 2048
    codes, scales = unpack_index_cache(v["k_index_cache_fp8"], 128)
    assert bool((scales > 0).all()) and float((codes.abs().amax(dim=1) - FP8_E4M3_MAX).abs().max()) == 0.0
    # round trip of the packing: the same bytes back
    again = pack_index_cache(codes.to(torch.float8_e4m3fn).view(-1, 64, 128), scales.to(torch.float32).view(-1, 64))
    assert torch.equal(again, v["k_index_cache_fp8"])
    table = v["block_table"].long()
    own = [table[b, :-(-n // 64)] for b, n in enumerate(lens) if n]
    assert torch.cat(own).unique().numel() == sum(p.numel() for p in own)  # no page shared by two requests
    b = lens.index(max(lens))
    slots = (table[b, :-(-lens[b] // 64)][:, None] * 64 + torch.arange(64)).flatten()
    assert slots.numel() > lens[b]  # the longest request ends inside a page
    tail, body = scales[slots[lens[b]:]], scales[slots[:lens[b]]]  # past seq_len: a real key at 64x its scale
    assert all(bool((body == t / POISON_SCALE).any()) for t in tail.unique())
    assert bool((codes[slots[lens[b]:]] == codes[slots[lens[b]:][0]]).all())


def test_indexer_edge_cases_and_reproducibility():
    d = load_definition(IDX)
    assert edge_cases(d) == ["batch1", "shorter_than_topk", "empty_request", "exactly_topk", "tied_scores"]
    assert max(generate_inputs(d, "small", 0, case="shorter_than_topk").values["seq_lens"].tolist()) < 2048
    assert 0 in generate_inputs(d, "small", 0, case="empty_request").values["seq_lens"].tolist()
    assert 2048 in generate_inputs(d, "small", 0, case="exactly_topk").values["seq_lens"].tolist()
    tied = generate_inputs(d, "small", 0, case="tied_scores")
    req = indexer_scores(tied.values, 64)[0]
    assert req.scores.round(decimals=6).unique().numel() <= 5 < req.scores.numel()  # BLAS: last-bit differences
    a, b, c = (generate_inputs(d, "small", s) for s in (0, 0, 1))
    assert all(torch.equal(a.values[k], b.values[k]) for k in a.values)
    assert not torch.equal(a.values["k_index_cache_fp8"], c.values["k_index_cache_fp8"])


# -- the torch ground truth against the references --------------------------------------------------
@pytest.mark.parametrize("name", [ATT1, ATT64, IDX])
@pytest.mark.parametrize("where", ["ours", "public"])
def test_torch_ground_truth_passes_every_reference(name, where):
    from flashinfer_trace.mutants import first_failure

    d = load_definition(name) if where == "ours" else public(name)
    assert first_failure(d, "torch", sizes=("small",), seeds=(0,)) is None


def test_sparse_attention_empty_row_and_bad_index():
    d = load_definition(ATT1)
    x = generate_inputs(d, "small", seed=0, case="empty_row")
    out, lse = get_ground_truth("torch", d, device="cpu")(x)
    empty = (x.values["sparse_indices"] == -1).all(dim=1)
    assert bool((out[empty] == 0).all()) and bool(torch.isneginf(lse[empty]).all())
    assert bool(lse[~empty].isfinite().all())
    bad = dict(x.values, sparse_indices=x.values["sparse_indices"].clone())
    bad["sparse_indices"][0, 0] = 10 ** 6
    with pytest.raises(ValueError, match="sparse_indices: 1 value"):
        get_ground_truth("torch", d, device="cpu")(dataclasses.replace(x, values=bad))


# -- the index-set comparison -----------------------------------------------------------------------
def _indexer_case(case=None):
    d = load_definition(IDX)
    x = generate_inputs(d, "small", seed=0, case=case)
    (expected,) = get_ground_truth("torch", d, device="cpu")(x)
    return d, x, expected, indexer_scores(x.values, 64)


def test_a_reordered_row_passes_and_a_wrong_index_is_a_bug():
    d, x, expected, reqs = _indexer_case()
    shuffled = expected.flip(1)  # the -1 padding moves to the front: still the same sets
    [r] = compare_topk.compare(d, x, (shuffled,), (expected,), TOL)
    assert r.passed and r.widened == 0 and r.error_model == compare_topk.MODEL
    b = 0
    req = reqs[b]
    order = torch.argsort(req.scores, descending=True)
    worst = int(req.slots[order[-1]])  # the request's lowest-scoring token
    wrong = expected.clone()
    wrong[b, 5] = worst
    [r] = compare_topk.compare(d, x, (wrong,), (expected,), TOL)
    assert r.verdict == "bug" and r.mismatched >= 1 and "selected with score" in r.problem
    for mutate, why in ((lambda t: t.__setitem__((b, 1), int(t[b, 0])), "selected twice"),
                        (lambda t: t.__setitem__((b, 0), -1), "ids, expected"),
                        (lambda t: t.__setitem__((b, 0), int(reqs[1].slots[0])), "not tokens of this request")):
        bad = expected.clone()
        mutate(bad)
        [r] = compare_topk.compare(d, x, (bad,), (expected,), TOL)
        assert r.verdict == "bug" and why in r.problem, r.problem


def test_an_exchange_of_tied_tokens_passes():
    d, x, expected, reqs = _indexer_case("tied_scores")
    b = 0
    req = reqs[b]
    kth = torch.topk(req.scores, 2048).values[-1]
    chosen = set(expected[b][expected[b] >= 0].tolist())
    tied_out = [int(s) for s, v in zip(req.slots, req.scores, strict=True)
                if abs(v - kth) < 1e-9 and int(s) not in chosen]
    tied_in = [i for i, s in enumerate(expected[b].tolist()) if s >= 0 and abs(req.scores[req.slots == s] - kth) < 1e-9]
    assert tied_out and tied_in  # the boundary falls inside a group of equal scores
    swapped = expected.clone()
    swapped[b, tied_in[0]] = tied_out[0]
    [r] = compare_topk.compare(d, x, (swapped,), (expected,), TOL)
    assert r.passed and r.widened == 1


# -- FlashInfer adapters (fakes: no GPU here) -------------------------------------------------------
def _fake_flashinfer(monkeypatch, version, **attrs):
    module = types.ModuleType("flashinfer")
    module.__version__ = version
    for k, v in attrs.items():
        setattr(module, k, v)
    install_flashinfer(monkeypatch, module, version, cc=None)
    return module


def _cc(monkeypatch, cc):
    monkeypatch.setattr(base, "cuda_capability", lambda device: cc if str(device).startswith("cuda") else None)


def test_sparse_mla_adapter_skips_precisely(monkeypatch):
    def old_api(query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim, block_tables,
                seq_lens, max_seq_len, sparse_mla_top_k=0, out=None, bmm1_scale=1.0, bmm2_scale=1.0):
        raise AssertionError("must not be called without an lse")

    _fake_flashinfer(monkeypatch, "0.6.6", decode=types.SimpleNamespace(trtllm_batch_decode_with_kv_cache_mla=old_api))
    _cc(monkeypatch, (9, 0))
    with pytest.raises(GroundTruthUnavailable, match="arch-unsupported: .*needs sm100..sm103, have sm90"):
        get_ground_truth("flashinfer", load_definition(ATT64), device="cuda")
    _cc(monkeypatch, (10, 0))
    gt = get_ground_truth("flashinfer", load_definition(ATT64), device="cuda")
    x = generate_inputs(load_definition(ATT64), "small", seed=0)
    with pytest.raises(GroundTruthUnavailable, match="api-missing: .*has no return_lse"):
        dataclasses.replace(gt, device="cpu")(x)
    with pytest.raises(GroundTruthUnavailable) as e:
        get_ground_truth("flashinfer", load_definition(ATT1), device="cuda")
    # ours says the page size; the fi_api-tag fallback (tried when no hand-written adapter applies) says
    # the definition's inputs are not the API's parameters: either is a precise reason
    assert ("page sizes 32 or 64, not 1" in str(e.value) or
            (e.value.kind == "api-missing" and "signature mismatch" in str(e.value))), str(e.value)


def test_sparse_mla_adapter_passes_the_definition_as_one_query_per_request(monkeypatch):
    seen = {}

    def api(query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim, block_tables,
            seq_lens, max_seq_len, sparse_mla_top_k=0, out=None, bmm1_scale=1.0, bmm2_scale=1.0, backend="auto",
            return_lse=False, return_lse_base=None):
        seen.update(q=tuple(query.shape), kv=tuple(kv_cache.shape), table=block_tables, topk=sparse_mla_top_k,
                    scale=bmm1_scale, base=return_lse_base, backend=backend, nope=qk_nope_head_dim, lens=seq_lens)
        t, _, h, _ = query.shape
        return torch.zeros(t, 1, h, kv_lora_rank, dtype=torch.bfloat16), torch.full((t, h), -5e4)

    _fake_flashinfer(monkeypatch, "0.7.2", decode=types.SimpleNamespace(trtllm_batch_decode_with_kv_cache_mla=api))
    _cc(monkeypatch, (10, 0))
    d = load_definition(ATT64)
    x = generate_inputs(d, "small", seed=0, case="empty_row")
    out, lse = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda"), device="cpu")(x)
    t = x.axes["num_tokens"]
    assert seen["q"] == (t, 1, 16, 576) and seen["kv"] == (x.axes["num_pages"], 64, 576) and seen["topk"] == 2048
    assert torch.equal(seen["table"][:, 0], x.values["sparse_indices"]) and seen["base"] == "base2"
    assert seen["backend"] == "trtllm-gen" and seen["nope"] == 128 and seen["scale"] == pytest.approx(1 / 192 ** 0.5)
    empty = (x.values["sparse_indices"] == -1).all(dim=1)
    assert tuple(out.shape) == (t, 16, 512) and bool(torch.isneginf(lse[empty]).all())
    assert bool((lse[~empty] == -5e4).all())  # the finite floor is translated on empty rows only


def test_indexer_adapter_needs_cute_dsl_and_scores_like_the_torch_one(monkeypatch):
    from flashinfer_trace.groundtruth import flashinfer_dsa

    d = load_definition(IDX)
    x = generate_inputs(d, "small", seed=0, case="tied_scores")

    def logits(q, kv, weights, block_tables, seq_lens, max_seq_len):
        assert q.dim() == 4 and q.shape[1] == 1 and kv.dtype == torch.uint8 and block_tables.dtype == torch.int32
        values = dict(x.values, q_index_fp8=q[:, 0], k_index_cache_fp8=kv, weights=weights)
        out = torch.full((q.shape[0], max_seq_len), float("nan"))
        for b, r in enumerate(indexer_scores(values, 64)):
            out[b, :r.scores.numel()] = r.scores.to(torch.float32)
        return out

    _fake_flashinfer(monkeypatch, "0.7.2", fp8_paged_mqa_logits=logits)
    _cc(monkeypatch, (9, 0))
    with pytest.raises(GroundTruthUnavailable, match="arch-unsupported"):
        get_ground_truth("flashinfer", d, device="cuda")
    _cc(monkeypatch, (10, 0))
    gt = dataclasses.replace(get_ground_truth("flashinfer", d, device="cuda"), device="cpu")
    monkeypatch.setattr(flashinfer_dsa.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(GroundTruthUnavailable, match=r"not-installed: nvidia-cutlass-dsl \(cutlass\)"):
        gt(x)
    monkeypatch.setattr(flashinfer_dsa.importlib.util, "find_spec", lambda name: object())
    (got,) = gt(x)
    (want,) = get_ground_truth("torch", d, device="cpu")(x)
    assert all(r.passed for r in compare_topk.compare(d, x, (got,), (want,), TOL))


def test_indexer_adapter_needs_0_7_2(monkeypatch):
    _fake_flashinfer(monkeypatch, "0.6.6", fp8_paged_mqa_logits=lambda *a: None)
    _cc(monkeypatch, (10, 0))
    with pytest.raises(GroundTruthUnavailable, match="api-missing: flashinfer 0.6.6"):
        get_ground_truth("flashinfer", load_definition(IDX), device="cuda")


# -- extraction, timing, planted bugs ---------------------------------------------------------------
def test_deepseek_v32_plans_the_dsa_kernels_and_reproduces_the_shipped_files():
    import json

    from flashinfer_trace.extract import instantiate, plan, select_models

    [cfg] = select_models("deepseek-v3.2")
    assert cfg.family == "deepseek_v32" and cfg.tp == 8
    p = plan(cfg)
    dsa = {s.family: s for s in p.kernels if s.family.startswith("dsa_")}
    names = sorted(instantiate(s, cfg)["name"] for s in p.kernels if s.family.startswith("dsa_"))
    assert names == sorted([ATT1, ATT64, IDX]) and set(dsa) == {"dsa_sparse_attention", "dsa_topk_indexer"}
    assert {"mla_paged", "moe", "rope"} <= {s.family for s in p.kernels}  # everything of V3 too
    for spec in p.kernels:
        if spec.family.startswith("dsa_"):
            d = instantiate(spec, cfg)
            path = Path(__file__).parents[2] / "definitions/dsa_paged" / f"{d['name']}.json"
            shipped = json.loads(path.read_text())
            assert {k: v for k, v in d.items() if k != "tags"} == {k: v for k, v in shipped.items() if k != "tags"}
            assert {"model:deepseek-v3.2", "tp:8"} <= set(shipped["tags"])


@pytest.mark.parametrize("name", [ATT1, IDX])
def test_interface_matches_the_public_files(name):
    ours, theirs = load_definition(name), public(name)
    assert list(ours.inputs) == list(theirs.inputs) and list(ours.outputs) == list(theirs.outputs)
    for a, b in ((ours.inputs, theirs.inputs), (ours.outputs, theirs.outputs)):
        assert all((a[k].shape, a[k].dtype) == (b[k].shape, b[k].dtype) for k in a)
    assert ours.const_axes == theirs.const_axes


def test_roofline_counts_selected_slots_and_scored_tokens():
    from flashinfer_trace.timing.roofline import work

    d = load_definition(ATT64)
    x = generate_inputs(d, "small", seed=0)
    w = work(d, x)
    pairs = int((x.values["sparse_indices"] >= 0).sum())
    assert w.flops == 2 * 16 * pairs * 576 + 2 * 16 * pairs * 512 and w.detail["visible_pairs"] == pairs
    di = load_definition(IDX)
    xi = generate_inputs(di, "small", seed=0)
    assert work(di, xi).flops == int(xi.values["seq_lens"].sum()) * 64 * (2 * 128 + 3)


@pytest.mark.parametrize("mutant", [m.id for m in __import__("flashinfer_trace.mutants", fromlist=["M"]).MUTANTS
                                    if m.definition.startswith("dsa_")])
def test_planted_dsa_bugs_are_caught(mutant):
    from flashinfer_trace.mutants import MUTANTS, kill

    [m] = [m for m in MUTANTS if m.id == mutant and m.definition.startswith("dsa_")]
    k = kill(m, "torch", sizes=("small",), seeds=(0,))
    assert k.killed is True, k.how

"""Op-family templates (flashinfer_trace.extract.templates): every shipped definition is reproduced
from its family's parameters, every family instantiates to a valid standalone definition over a
range of parameters, and the references new to the templates (page_size > 1, GPT-J RoPE, partial
rotary_dim, renormalize-routed MoE in fp8 and bf16) agree with the independent torch ground truth."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from samples import REPRESENTATIVES

from flashinfer_trace.definition import Definition
from flashinfer_trace.extract.templates import FAMILIES
from flashinfer_trace.extract.templates._common import format_float
from flashinfer_trace.groundtruth import torch_ref
from flashinfer_trace.inputs import CaseTooLarge, edge_cases, generate_inputs
from flashinfer_trace.sandbox import compile_reference
from flashinfer_trace.testing import assert_close, get_ground_truth, run_reference, tolerance_for
from flashinfer_trace.validate import check_data

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_DIR = ROOT / "definitions"

DS_MOE = dict(routing="deepseek", weights="fp8_block_scale", top_k=8, num_experts=256, num_local_experts=32,
              hidden_size=7168, intermediate_size=2048, n_group=8, topk_group=4)

# shipped definition name -> (family, parameters)
SHIPPED = {
    "rmsnorm_h4096": ("rmsnorm", dict(hidden_size=4096, eps=1e-5)),
    "fused_add_rmsnorm_h4096": ("fused_add_rmsnorm", dict(hidden_size=4096, eps=1e-5)),
    "gemm_n4096_k4096": ("gemm", dict(n=4096, k=4096)),
    "gqa_paged_decode_h32_kv8_d128_ps1": (
        "gqa_paged", dict(stage="decode", num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=1)),
    "gqa_paged_prefill_causal_h32_kv8_d128_ps1": (
        "gqa_paged", dict(stage="prefill", num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=1)),
    "gqa_ragged_prefill_causal_h32_kv8_d128": ("gqa_ragged", dict(num_qo_heads=32, num_kv_heads=8, head_dim=128)),
    "mla_paged_decode_h16_ckv512_kpe64_ps1": (
        "mla_paged", dict(stage="decode", num_qo_heads=16, head_dim_ckv=512, head_dim_kpe=64, page_size=1)),
    "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1": (
        "mla_paged", dict(stage="prefill", num_qo_heads=16, head_dim_ckv=512, head_dim_kpe=64, page_size=1)),
    "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048": ("moe", DS_MOE),
    "rope_with_cos_sin_cache_neox_style_h32_kv8_d128_rd128": (
        "rope", dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, rotary_dim=128, neox=True)),
    "silu_and_mul_i14336": ("silu_and_mul", dict(intermediate_size=14336)),
    "top_k_sampling_from_probs_v128256": ("sampling", dict(kind="top_k", vocab_size=128256)),
    "top_p_sampling_from_probs_v128256": ("sampling", dict(kind="top_p", vocab_size=128256)),
    "top_k_top_p_sampling_from_probs_v128256": ("sampling", dict(kind="top_k_top_p", vocab_size=128256)),
}

SIGNATURES = {
    "rmsnorm": "(hidden_size: 'int', eps: 'float')",
    "fused_add_rmsnorm": "(hidden_size: 'int', eps: 'float')",
    "gemm": "(n: 'int', k: 'int')",
    "gqa_paged": "(stage: 'str', num_qo_heads: 'int', num_kv_heads: 'int', head_dim: 'int', page_size: 'int')",
    "gqa_ragged": "(num_qo_heads: 'int', num_kv_heads: 'int', head_dim: 'int')",
    "mla_ragged": "(num_heads: 'int', qk_dim: 'int', vo_dim: 'int')",
    "dsa_sparse_attention": "(num_qo_heads: 'int', head_dim_ckv: 'int', head_dim_kpe: 'int', topk: 'int', "
                            "page_size: 'int')",
    "dsa_topk_indexer": "(num_index_heads: 'int', index_head_dim: 'int', topk: 'int', page_size: 'int')",
    "mla_paged": "(stage: 'str', num_qo_heads: 'int', head_dim_ckv: 'int', head_dim_kpe: 'int', page_size: 'int')",
    "rope": "(num_qo_heads: 'int', num_kv_heads: 'int', head_dim: 'int', rotary_dim: 'int', neox: 'bool')",
    "silu_and_mul": "(intermediate_size: 'int')",
    "sampling": "(kind: 'str', vocab_size: 'int')",
    "mamba_ssu": "(nheads: 'int', head_dim: 'int', dstate: 'int', ngroups: 'int')",
    "gdn": "(stage: 'str', num_q_heads: 'int', num_v_heads: 'int', head_size: 'int')",
    "moe": "(routing: 'str', weights: 'str', top_k: 'int', num_experts: 'int', num_local_experts: 'int', "
           "hidden_size: 'int', intermediate_size: 'int', n_group: 'int | None' = None, "
           "topk_group: 'int | None' = None)",
}

FAMILY_TAGS = {"status", "fi_api", "stage", "fused", "quantization", "param"}
EXTRACTOR_TAGS = {"model", "tp", "ep"}


def _gqa(stage, h, kv, d, ps):
    return dict(stage=stage, num_qo_heads=h, num_kv_heads=kv, head_dim=d, page_size=ps)


def _mla(stage, ps, h=16):
    return dict(stage=stage, num_qo_heads=h, head_dim_ckv=512, head_dim_kpe=64, page_size=ps)


def _rope(h, kv, d, rd, neox):
    return dict(num_qo_heads=h, num_kv_heads=kv, head_dim=d, rotary_dim=rd, neox=neox)


def _renorm(weights, top_k, e, el, h, i):
    return dict(routing="renormalize", weights=weights, top_k=top_k, num_experts=e, num_local_experts=el,
                hidden_size=h, intermediate_size=i)


# (family, parameters, expected name)
VARIANTS = [
    ("rmsnorm", dict(hidden_size=2048, eps=1e-6), "rmsnorm_h2048"),
    ("rmsnorm", dict(hidden_size=128, eps=1e-6), "rmsnorm_h128"),
    ("fused_add_rmsnorm", dict(hidden_size=7168, eps=1e-6), "fused_add_rmsnorm_h7168"),
    ("gemm", dict(n=5120, k=2048), "gemm_n5120_k2048"),
    ("gemm", dict(n=16032, k=5120), "gemm_n16032_k5120"),
    ("gqa_paged", _gqa("decode", 64, 8, 128, 1), "gqa_paged_decode_h64_kv8_d128_ps1"),
    ("gqa_paged", _gqa("prefill", 64, 8, 128, 1), "gqa_paged_prefill_causal_h64_kv8_d128_ps1"),
    ("gqa_paged", _gqa("decode", 64, 8, 128, 16), "gqa_paged_decode_h64_kv8_d128_ps16"),
    ("gqa_paged", _gqa("prefill", 64, 8, 128, 16), "gqa_paged_prefill_causal_h64_kv8_d128_ps16"),
    ("gqa_paged", _gqa("decode", 8, 8, 64, 32), "gqa_paged_decode_h8_kv8_d64_ps32"),
    ("gqa_ragged", dict(num_qo_heads=8, num_kv_heads=1, head_dim=128), "gqa_ragged_prefill_causal_h8_kv1_d128"),
    ("gqa_ragged", dict(num_qo_heads=64, num_kv_heads=8, head_dim=128), "gqa_ragged_prefill_causal_h64_kv8_d128"),
    ("mla_paged", _mla("decode", 64), "mla_paged_decode_h16_ckv512_kpe64_ps64"),
    ("mla_paged", _mla("prefill", 64), "mla_paged_prefill_causal_h16_ckv512_kpe64_ps64"),
    ("mla_paged", _mla("decode", 1, h=128), "mla_paged_decode_h128_ckv512_kpe64_ps1"),
    ("rope", _rope(32, 8, 128, 128, True), "rope_with_cos_sin_cache_neox_style_h32_kv8_d128_rd128"),
    ("rope", _rope(16, 1, 64, 64, False), "rope_with_cos_sin_cache_gptj_style_h16_kv1_d64_rd64"),
    ("rope", _rope(32, 8, 128, 64, True), "rope_with_cos_sin_cache_neox_style_h32_kv8_d128_rd64"),
    ("rope", _rope(32, 8, 128, 64, False), "rope_with_cos_sin_cache_gptj_style_h32_kv8_d128_rd64"),
    ("silu_and_mul", dict(intermediate_size=768), "silu_and_mul_i768"),
    ("sampling", dict(kind="top_k", vocab_size=151936), "top_k_sampling_from_probs_v151936"),
    ("sampling", dict(kind="top_p", vocab_size=151936), "top_p_sampling_from_probs_v151936"),
    ("sampling", dict(kind="top_k_top_p", vocab_size=151936), "top_k_top_p_sampling_from_probs_v151936"),
    ("moe", dict(DS_MOE, num_local_experts=256), "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e256_h7168_i2048"),
    ("moe", _renorm("fp8_block_scale", 8, 128, 128, 2048, 768), "moe_fp8_block_scale_renorm_topk8_e128_h2048_i768"),
    ("moe", _renorm("fp8_block_scale", 8, 128, 16, 2048, 768), "moe_fp8_block_scale_renorm_topk8_e16_h2048_i768"),
    ("moe", _renorm("bfloat16", 2, 8, 8, 4096, 14336), "moe_bf16_renorm_topk2_e8_h4096_i14336"),
    ("moe", _renorm("bfloat16", 2, 8, 4, 256, 128), "moe_bf16_renorm_topk2_e4_h256_i128"),
    ("mamba_ssu", dict(nheads=128, head_dim=64, dstate=128, ngroups=8), "mamba_ssu_decode_h128_d64_s128_ng8"),
    ("mamba_ssu", dict(nheads=8, head_dim=16, dstate=32, ngroups=1), "mamba_ssu_decode_h8_d16_s32_ng1"),
]

# New references (not in the shipped files), run at size small against the torch ground truth.
NEW_ATTENTION_ROPE = [
    ("gqa_paged", _gqa("decode", 64, 8, 128, 16)),
    ("gqa_paged", _gqa("prefill", 64, 8, 128, 16)),
    ("gqa_paged", _gqa("prefill", 4, 1, 64, 3)),  # MQA and a page size that is no power of two
    ("mla_paged", _mla("decode", 64)),
    ("mla_paged", _mla("prefill", 64)),
    ("gqa_ragged", dict(num_qo_heads=8, num_kv_heads=1, head_dim=128)),  # MQA head mapping
    ("rope", _rope(16, 1, 64, 64, False)),
    ("rope", _rope(32, 8, 128, 64, True)),
    ("rope", _rope(32, 8, 128, 64, False)),
]
NEW_MOE = [
    _renorm("fp8_block_scale", 8, 128, 128, 2048, 768),  # Qwen3-30B-A3B shape, all experts local
    _renorm("fp8_block_scale", 4, 64, 8, 256, 128),  # expert parallel: a nonzero local_expert_offset
    _renorm("bfloat16", 2, 8, 4, 256, 128),  # a small Mixtral-style case
]

moe_ground_truth = pytest.mark.skipif(
    not hasattr(torch_ref, "renormalize_routing"),
    reason="the torch ground truth has no renormalize routing / bf16 MoE yet (torch_ref.renormalize_routing)",
)


def _without_descriptions(value):
    if isinstance(value, dict):
        return {k: _without_descriptions(v) for k, v in value.items() if k != "description"}
    return value


def _ordered(value):
    """Dict keys in order, recursively (equality of dicts ignores order; the format does not)."""
    if isinstance(value, dict):
        return [(k, _ordered(v)) for k, v in value.items()]
    return value


def _descriptions(d: dict) -> list[str]:
    out = [d["description"]]
    for section in ("axes", "inputs", "outputs"):
        out += [spec["description"] for spec in d[section].values()]
    return out


def _load(family: str, params: dict) -> Definition:
    return Definition.model_validate(FAMILIES[family](**params))


# -- the API --------------------------------------------------------------------------------------------
def test_families_and_signatures():
    assert set(FAMILIES) == set(SIGNATURES)
    for name, fn in FAMILIES.items():
        assert fn.__name__ == name
        assert str(inspect.signature(fn)).split(" -> ")[0] == SIGNATURES[name], name


def test_float_formatting():
    assert format_float(1e-5) == "1e-5"
    assert format_float(1e-6) == "1e-6"
    assert format_float(1.5e-06) == "1.5e-6"
    assert format_float(0.001) == "0.001"
    # the norms keep the public contract (no eps input): the model's eps is a param:eps tag, and the
    # reference's constant of the same value
    for family in ("rmsnorm", "fused_add_rmsnorm"):
        d = FAMILIES[family](hidden_size=8, eps=1e-6)
        assert "eps" not in d["inputs"] and "param:eps=1e-6" in d["tags"] and "EPS = 1e-6" in d["reference"]
        assert "eps" not in d["reference"].split("def run(")[1].split(")")[0]
        with pytest.raises(ValueError, match="eps must be a finite number > 0"):
            FAMILIES[family](hidden_size=8, eps=0.0)


# -- 1. the shipped definitions -------------------------------------------------------------------------
def test_parameter_table_covers_the_first_written_definitions():
    """The fourteen written by hand first; the extracted rest are compared in test_extract.py."""
    assert set(SHIPPED) == set(REPRESENTATIVES) <= {p.stem for p in SHIPPED_DIR.glob("*/*.json")}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_reproduces_shipped_definition(name):
    family, params = SHIPPED[name]
    shipped = json.loads(next(SHIPPED_DIR.glob(f"*/{name}.json")).read_text())
    made = FAMILIES[family](**params)
    assert list(made) == list(shipped)  # the same fields, in the same order
    for key in ("name", "op_type", "constraints", "reference"):
        assert made[key] == shipped[key], key
    for key in ("axes", "inputs", "outputs"):
        assert _ordered(_without_descriptions(made[key])) == _ordered(_without_descriptions(shipped[key])), key
    # family tags only; model / tp / ep are the extractor's
    assert made["tags"] == [t for t in shipped["tags"] if t.split(":")[0] not in EXTRACTOR_TAGS]
    assert all(isinstance(s, str) and s for s in _descriptions(made))
    assert check_data(made, stem=name) == []


# -- 2. every family over several parameter sets --------------------------------------------------------
@pytest.mark.parametrize(("family", "params", "name"), VARIANTS, ids=[v[2] for v in VARIANTS])
def test_variant_is_a_valid_definition(family, params, name):
    d = FAMILIES[family](**params)
    assert d["name"] == name
    assert check_data(d, stem=name) == []
    definition = Definition.model_validate(d)
    assert callable(compile_reference(definition.reference, definition=name))
    assert all(isinstance(s, str) and s for s in _descriptions(d))
    assert {t.split(":")[0] for t in d["tags"]} <= FAMILY_TAGS
    assert "status:reference" in d["tags"]
    # constants are the parameters
    consts = definition.const_axes
    for key in ("hidden_size", "num_qo_heads", "num_kv_heads", "head_dim", "page_size", "rotary_dim",
                "intermediate_size", "vocab_size", "head_dim_ckv", "head_dim_kpe", "num_local_experts"):
        if key in params and key in consts:
            assert consts[key] == params[key], key


def test_page_size_above_one_counts_pages():
    ps1 = FAMILIES["gqa_paged"](**_gqa("prefill", 64, 8, 128, 1))
    ps16 = FAMILIES["gqa_paged"](**_gqa("prefill", 64, 8, 128, 16))
    assert "k_cache[pages, 0]" in ps1["reference"] and "flatten(0, 1)" not in ps1["reference"]
    assert "k_cache[pages].flatten(0, 1)" in ps16["reference"] and "[pages, 0]" not in ps16["reference"]
    assert "(kv_end - kv_start) * page_size" in ps16["reference"]
    # qo_len > kv_len is allowed (a query that sees no key), so pages add no constraint of their own
    assert ps16["constraints"] == ps1["constraints"] and not any("page_size" in c for c in ps16["constraints"])
    assert "PAGES" in ps16["description"] and "every page is full" in ps16["description"]
    mla = FAMILIES["mla_paged"](**_mla("decode", 64))
    assert "ckv_cache[pages].flatten(0, 1)" in mla["reference"] and "[pages, 0]" not in mla["reference"]


def test_descriptions_follow_the_parameters():
    mqa = FAMILIES["gqa_ragged"](num_qo_heads=8, num_kv_heads=1, head_dim=128)["description"]
    assert "8 query heads, 1 kv head, head_dim 128" in mqa and "h // 8 = 0" in mqa
    gqa = FAMILIES["gqa_paged"](**_gqa("decode", 64, 8, 128, 16))["description"]
    assert "h // 8, so kv head g serves query heads 8g..8g+7" in gqa and "BASE 2" in gqa
    rope = FAMILIES["rope"](**_rope(32, 8, 128, 64, False))["description"]
    assert "GPT-J (interleaved)" in rope and "dimensions 64..127" in rope
    moe = FAMILIES["moe"](**_renorm("fp8_block_scale", 8, 128, 16, 2048, 768))["description"]
    assert "[up (0..767); gate (768..1535)]" in moe and "128 experts in total, 16 held locally" in moe
    for family, params, _ in VARIANTS:  # generic: no model of the shipped files named as the kernel's owner
        text = " ".join(_descriptions(FAMILIES[family](**params)))
        assert "Llama-3.1-8B" not in text and "tensor parallelism 8" not in text


@pytest.mark.parametrize(("family", "params", "match"), [
    ("moe", _renorm("fp8_block_scale", 8, 128, 128, 2000, 768), "multiple of the fp8 block size 128"),
    ("moe", _renorm("fp8_block_scale", 8, 128, 128, 2048, 700), "intermediate_size 700 must be a multiple"),
    ("moe", _renorm("bfloat16", 2, 8, 3, 256, 128), "multiple of num_local_experts"),
    ("moe", dict(DS_MOE, n_group=None), "needs n_group and topk_group"),
    ("moe", dict(_renorm("fp8_block_scale", 8, 128, 128, 2048, 768), n_group=8), "deepseek routing only"),
    ("moe", dict(DS_MOE, weights="bfloat16"), "only templated with fp8_block_scale"),
    ("moe", dict(DS_MOE, routing="softmax"), "routing must be one of"),
    ("rope", _rope(32, 8, 128, 63, True), "must be even"),
    ("rope", _rope(32, 8, 64, 128, True), "must not exceed head_dim"),
    ("gqa_paged", _gqa("decode", 32, 5, 128, 1), "multiple of num_kv_heads"),
    ("gqa_paged", _gqa("verify", 32, 8, 128, 1), "stage must be one of"),
    ("sampling", dict(kind="min_p", vocab_size=32000), "kind must be one of"),
    ("rmsnorm", dict(hidden_size=0, eps=1e-6), "hidden_size must be >= 1"),
    ("rmsnorm", dict(hidden_size=64, eps=0.0), "eps must be"),
])
def test_rejects_bad_parameters(family, params, match):
    with pytest.raises(ValueError, match=match):
        FAMILIES[family](**params)


# -- 3. numerics of the new references ----------------------------------------------------------------
def _check_against_torch(d: Definition, seed: int, case: str | None = None) -> None:
    inputs = generate_inputs(d, "small", seed, case=case)
    expected = get_ground_truth("torch", d, device="cpu")(inputs)
    assert_close(run_reference(d, inputs), expected, tolerance=tolerance_for(d), names=list(d.outputs))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("family", "params"), NEW_ATTENTION_ROPE,
                         ids=[FAMILIES[f](**p)["name"] for f, p in NEW_ATTENTION_ROPE])
def test_new_reference_matches_torch(family, params, seed):
    _check_against_torch(_load(family, params), seed)


@pytest.mark.parametrize(("family", "params"), NEW_ATTENTION_ROPE,
                         ids=[FAMILIES[f](**p)["name"] for f, p in NEW_ATTENTION_ROPE])
def test_new_reference_edge_cases_match_torch(family, params):
    d = _load(family, params)
    made = []
    for case in edge_cases(d):
        try:
            _check_against_torch(d, 0, case)
        except CaseTooLarge as e:  # offsets past 2**31: a GPU case, skipped on a CPU with the bytes it needs
            assert case == "large_offsets" and "GiB" in str(e), (case, e)
            continue
        made.append(case)
    assert made, edge_cases(d)


def test_gptj_and_neox_rotate_differently():
    neox, gptj = (_load("rope", _rope(4, 1, 16, 16, style)) for style in (True, False))
    inputs = generate_inputs(neox, "small", 0)
    a, b = run_reference(neox, inputs), run_reference(gptj, inputs)
    assert not a[0].equal(b[0])


@moe_ground_truth
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("params", NEW_MOE, ids=[FAMILIES["moe"](**p)["name"] for p in NEW_MOE])
def test_new_moe_reference_matches_torch(params, seed):
    _check_against_torch(_load("moe", params), seed)


@moe_ground_truth
@pytest.mark.parametrize("params", NEW_MOE[1:], ids=[FAMILIES["moe"](**p)["name"] for p in NEW_MOE[1:]])
def test_new_moe_reference_edge_cases_match_torch(params):
    d = _load("moe", params)
    for case in edge_cases(d):
        _check_against_torch(d, 0, case)

"""The input generators: every case satisfies its definition, replays bit for bit, and the
structural promises of each family hold (shuffled pages, causal lengths, routing that reaches
the local experts, normalised probabilities, ...)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from samples import REPRESENTATIVES

from flashinfer_trace.constraints import check_all
from flashinfer_trace.dataset import load_path
from flashinfer_trace.definition import Definition
from flashinfer_trace.dtypes import torch_dtype
from flashinfer_trace.inputs import (
    SIZES,
    InputGenerationError,
    Inputs,
    UnsupportedOpType,
    common,
    edge_cases,
    generate_inputs,
    set_cache,
    supported_op_types,
)
from flashinfer_trace.inputs import attention as attention_mod
from flashinfer_trace.inputs.common import (
    Stream,
    counter_words,
    log_uniform,
    mix64,
    normal,
    permutation,
    randint,
    random_fp8,
    random_tensor,
    random_words,
    uniform,
)
from flashinfer_trace.inputs.registry import family_for

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "definitions"
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


# -- definitions made here (the shipped ones are tested too, when present) ---------------------
def var():
    return {"type": "var"}


def const(v):
    return {"type": "const", "value": v}


def t(shape, dtype):
    return {"shape": shape, "dtype": dtype}


def variant(d: Definition, **changes) -> Definition:
    """A copy of a definition with some top-level fields replaced (validated afresh)."""
    return Definition.model_validate({**d.as_dict, **changes})


def make(name, op_type, axes, inputs, outputs, constraints=(), tags=(), reference=None):
    args = ", ".join(inputs)
    return Definition.model_validate({
        "name": name, "op_type": op_type, "axes": axes, "inputs": inputs, "outputs": outputs,
        "constraints": list(constraints), "tags": list(tags),
        "reference": reference or f"def run({args}):\n    return None\n",
    })


def gqa_paged(stage, page_size=1, last_page_len=False, h=4, kv=2, d=16):
    prefill = stage == "prefill"
    rows = "total_q" if prefill else "batch_size"
    axes = {"batch_size": var(), "num_pages": var(), "len_indptr": var(), "num_kv_indices": var(),
            "num_qo_heads": const(h), "num_kv_heads": const(kv), "head_dim": const(d),
            "page_size": const(page_size)}
    if prefill:
        axes["total_q"] = var()
    cache = ["num_pages", "page_size", "num_kv_heads", "head_dim"]
    inputs = {"q": t([rows, "num_qo_heads", "head_dim"], "bfloat16"),
              "k_cache": t(cache, "bfloat16"), "v_cache": t(cache, "bfloat16")}
    if prefill:
        inputs["qo_indptr"] = t(["len_indptr"], "int32")
    inputs["kv_indptr"] = t(["len_indptr"], "int32")
    inputs["kv_indices"] = t(["num_kv_indices"], "int32")
    if last_page_len:
        inputs["kv_last_page_len"] = t(["batch_size"], "int32")
    inputs["sm_scale"] = t(None, "float32")
    constraints = ["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"]
    if prefill:
        constraints.append("total_q == qo_indptr[-1].item()")
    suffix = "_lpl" if last_page_len else ""
    return make(f"gqa_paged_{stage}_h{h}_kv{kv}_d{d}_ps{page_size}{suffix}", "gqa_paged", axes, inputs,
                {"output": t([rows, "num_qo_heads", "head_dim"], "bfloat16")}, constraints,
                [f"stage:{stage}"])


def gqa_ragged():
    axes = {"batch_size": var(), "total_q": var(), "total_kv": var(), "len_indptr": var(),
            "num_qo_heads": const(4), "num_kv_heads": const(2), "head_dim": const(16)}
    inputs = {"q": t(["total_q", "num_qo_heads", "head_dim"], "bfloat16"),
              "k": t(["total_kv", "num_kv_heads", "head_dim"], "bfloat16"),
              "v": t(["total_kv", "num_kv_heads", "head_dim"], "bfloat16"),
              "qo_indptr": t(["len_indptr"], "int32"), "kv_indptr": t(["len_indptr"], "int32"),
              "sm_scale": t(None, "float32")}
    return make("gqa_ragged_prefill_causal_h4_kv2_d16", "gqa_ragged", axes, inputs,
                {"output": t(["total_q", "num_qo_heads", "head_dim"], "bfloat16")},
                ["len_indptr == batch_size + 1", "total_q == qo_indptr[-1].item()",
                 "total_kv == kv_indptr[-1].item()"])


def mla_paged(stage):
    prefill = stage == "prefill"
    rows = "total_q" if prefill else "batch_size"
    axes = {"batch_size": var(), "num_pages": var(), "len_indptr": var(), "num_kv_indices": var(),
            "num_qo_heads": const(2), "head_dim_ckv": const(32), "head_dim_kpe": const(8),
            "page_size": const(1)}
    if prefill:
        axes["total_q"] = var()
    inputs = {"q_nope": t([rows, "num_qo_heads", "head_dim_ckv"], "bfloat16"),
              "q_pe": t([rows, "num_qo_heads", "head_dim_kpe"], "bfloat16"),
              "ckv_cache": t(["num_pages", "page_size", "head_dim_ckv"], "bfloat16"),
              "kpe_cache": t(["num_pages", "page_size", "head_dim_kpe"], "bfloat16")}
    if prefill:
        inputs["qo_indptr"] = t(["len_indptr"], "int32")
    inputs |= {"kv_indptr": t(["len_indptr"], "int32"), "kv_indices": t(["num_kv_indices"], "int32"),
               "sm_scale": t(None, "float32")}
    return make(f"mla_paged_{stage}_h2_ckv32_kpe8_ps1", "mla_paged", axes, inputs,
                {"output": t([rows, "num_qo_heads", "head_dim_ckv"], "bfloat16")},
                ["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"])


def rmsnorm(fused=False):
    inputs = {"hidden_states": t(["batch_size", "hidden_size"], "bfloat16")}
    if fused:
        inputs["residual"] = t(["batch_size", "hidden_size"], "bfloat16")
    inputs["weight"] = t(["hidden_size"], "bfloat16")
    return make("fused_add_rmsnorm_h64" if fused else "rmsnorm_h64", "rmsnorm",
                {"batch_size": var(), "hidden_size": const(64)}, inputs,
                {"output": t(["batch_size", "hidden_size"], "bfloat16")}, ["hidden_size == weight.shape[0]"])


def gemm():
    return make("gemm_n32_k64", "gemm", {"M": var(), "N": const(32), "K": const(64)},
                {"A": t(["M", "K"], "float16"), "B": t(["N", "K"], "float16")},
                {"C": t(["M", "N"], "float16")})


def silu_and_mul():
    return make("silu_and_mul_i32", "activation",
                {"num_tokens": var(), "intermediate_size": const(32), "gate_up_size": const(64)},
                {"input": t(["num_tokens", "gate_up_size"], "bfloat16")},
                {"output": t(["num_tokens", "intermediate_size"], "bfloat16")},
                ["gate_up_size == 2 * intermediate_size"])


def rope(max_position=None):
    axes = {"num_tokens": var(), "max_position": var() if max_position is None else const(max_position),
            "num_qo_heads": const(4), "num_kv_heads": const(2), "head_dim": const(32),
            "rotary_dim": const(32)}
    return make(f"rope_h4_kv2_d32_rd32{'' if max_position is None else f'_p{max_position}'}", "rope", axes,
                {"positions": t(["num_tokens"], "int64"),
                 "query": t(["num_tokens", "num_qo_heads", "head_dim"], "bfloat16"),
                 "key": t(["num_tokens", "num_kv_heads", "head_dim"], "bfloat16"),
                 "cos_sin_cache": t(["max_position", "rotary_dim"], "float32")},
                {"query_out": t(["num_tokens", "num_qo_heads", "head_dim"], "bfloat16")},
                ["positions.min().item() >= 0 and positions.max().item() < max_position"],
                tags=["model:llama-3.1-8b"])


def sampling(top_k=True, top_p=True, vocab=1000):
    inputs = {"probs": t(["batch_size", "vocab_size"], "float32")}
    if top_k:
        inputs["top_k"] = t(["batch_size"], "int32")
    if top_p:
        inputs["top_p"] = t(["batch_size"], "float32")
    name = {(True, True): "top_k_top_p", (True, False): "top_k", (False, True): "top_p"}[(top_k, top_p)]
    return make(f"{name}_sampling_from_probs_v{vocab}", "sampling",
                {"batch_size": var(), "vocab_size": const(vocab)}, inputs,
                {"samples": t(["batch_size"], "int64")}, ["abs(probs.sum(1) - 1).max().item() < 1e-3"])


def moe(reference=None):
    """The DeepSeek-V3 fp8 MoE shape family, scaled down: 64 experts in 8 groups, 8 local ones,
    hidden 256, intermediate 128, block 128 (the shipped reference runs on it unchanged)."""
    axes = {"seq_len": var(), "num_experts": const(64), "num_local_experts": const(8),
            "hidden_size": const(256), "intermediate_size": const(128), "gemm1_out_size": const(256),
            "num_hidden_blocks": const(2), "num_intermediate_blocks": const(1),
            "num_gemm1_out_blocks": const(2)}
    inputs = {
        "routing_logits": t(["seq_len", "num_experts"], "float32"),
        "routing_bias": t(["num_experts"], "bfloat16"),
        "hidden_states": t(["seq_len", "hidden_size"], "float8_e4m3fn"),
        "hidden_states_scale": t(["num_hidden_blocks", "seq_len"], "float32"),
        "gemm1_weights": t(["num_local_experts", "gemm1_out_size", "hidden_size"], "float8_e4m3fn"),
        "gemm1_weights_scale": t(["num_local_experts", "num_gemm1_out_blocks", "num_hidden_blocks"],
                                 "float32"),
        "gemm2_weights": t(["num_local_experts", "hidden_size", "intermediate_size"], "float8_e4m3fn"),
        "gemm2_weights_scale": t(["num_local_experts", "num_hidden_blocks", "num_intermediate_blocks"],
                                 "float32"),
        "local_expert_offset": t(None, "int32"),
        "routed_scaling_factor": t(None, "float32"),
    }
    return make("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e8_h256_i128", "moe", axes, inputs,
                {"output": t(["seq_len", "hidden_size"], "bfloat16")},
                ["local_expert_offset >= 0 and local_expert_offset + num_local_experts <= num_experts"],
                reference=reference)


SYNTHETIC = [
    rmsnorm(), rmsnorm(fused=True), gemm(), silu_and_mul(), rope(), rope(max_position=512),
    gqa_paged("decode"), gqa_paged("prefill"), gqa_paged("decode", 16, last_page_len=True),
    gqa_paged("prefill", 16, last_page_len=True), gqa_paged("prefill", 16), gqa_paged("decode", 16),
    gqa_ragged(), mla_paged("decode"), mla_paged("prefill"),
    sampling(), sampling(top_p=False), sampling(top_k=False), moe(),
]
BY_NAME = {d.name: d for d in SYNTHETIC}
ATTENTION = [d for d in SYNTHETIC if d.op_type in attention_mod.OP_TYPES]


def _shipped() -> list[Definition]:
    out = []
    for path in sorted(SHIPPED.rglob("*.json")) if SHIPPED.is_dir() else []:
        if path.stem not in REPRESENTATIVES:
            continue
        try:
            d = load_path(path)
        except Exception:  # a file being written right now; the validate tests report it
            continue
        if d.op_type in supported_op_types():
            out.append(d)
    return out


SHIPPED_DEFS = _shipped()
SHIPPED_CHEAP = [d for d in SHIPPED_DEFS if d.op_type != "moe"]  # the shipped MoE weighs 1.4 GB
SHIPPED_MOE = [d for d in SHIPPED_DEFS if d.op_type == "moe"]
CHEAP_FAMILIES = ("rmsnorm", "activation", "rope", "sampling", "gemm")


def ids(defs):
    return [d.name for d in defs]


# -- checks every case must pass, written independently of the generator ----------------------
def as_comparable(v):
    if isinstance(v, torch.Tensor) and v.dtype in FP8:
        return v.view(torch.uint8)
    return v


def same(a: Inputs, b: Inputs) -> bool:
    if list(a.values) != list(b.values) or a.axes != b.axes:
        return False
    for x, y in zip(a.args(), b.args(), strict=True):
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(as_comparable(x),
                                                                                       as_comparable(y))):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def digest(x: Inputs) -> str:
    h = hashlib.sha256()
    for name, v in x.values.items():
        h.update(name.encode())
        if isinstance(v, torch.Tensor):
            h.update(str(v.dtype).encode() + str(tuple(v.shape)).encode())
            # bytes via tolist, not .numpy(): numpy is not a dependency (torch's CPU wheel lacks it)
            h.update(bytes(as_comparable(v).contiguous().flatten().view(torch.uint8).tolist()))
        else:
            h.update(repr(v).encode())
    return h.hexdigest()


def check_spec(d: Definition, x: Inputs) -> None:
    """Shapes, dtypes, axes and constraints, re-checked from the definition alone."""
    assert list(x.values) == list(d.inputs)
    assert list(x.axes) == list(d.axes)
    for axis, value in d.const_axes.items():
        assert x.axes[axis] == value
    for name, spec in d.inputs.items():
        v = x.values[name]
        if spec.shape is None:
            want = {"int32": int, "int64": int, "float32": float, "bool": bool}[spec.dtype.value]
            assert type(v) is want, name
            continue
        assert isinstance(v, torch.Tensor), name
        assert tuple(v.shape) == tuple(x.axes[a] for a in spec.shape), name
        assert v.dtype == torch_dtype(spec.dtype), name
        if v.is_floating_point() and v.dtype not in FP8:
            assert torch.isfinite(v).all(), name
    check_all(d.constraints, {**x.axes, **x.values}, definition=d.name)


def lens(indptr: torch.Tensor) -> list[int]:
    return (indptr[1:] - indptr[:-1]).tolist()


def request_lengths(d: Definition, x: Inputs) -> tuple[list[int], list[int]]:
    """(kv_lens, qo_lens) per request, read back from the structural tensors."""
    v = x.values
    if d.op_type == "gqa_ragged":
        kv = lens(v["kv_indptr"])
    else:
        ps = d.const_axes.get("page_size", 1)
        pages = lens(v["kv_indptr"])
        if "kv_last_page_len" in v:
            last = v["kv_last_page_len"].tolist()
            kv = [(p - 1) * ps + lp if p else 0 for p, lp in zip(pages, last, strict=True)]
        else:
            kv = [p * ps for p in pages]
    qo = lens(v["qo_indptr"]) if "qo_indptr" in v else [1] * len(kv)
    return kv, qo


def check_attention(d: Definition, x: Inputs) -> None:
    v = x.values
    batch = len(v["kv_indptr"]) - 1
    assert batch >= 1
    for name in ("qo_indptr", "kv_indptr"):
        if name in v:
            p = v[name]
            assert p.dtype == torch.int32 and p[0].item() == 0 and (p[1:] >= p[:-1]).all(), name
    kv, qo = request_lengths(d, x)
    if "qo_indptr" in v:
        if x.case not in ("fully_masked_rows", "empty_kv"):  # the two that give queries no key on purpose
            assert all(q <= k for q, k in zip(qo, kv, strict=True)), (qo, kv)  # causal: queries end the sequence
        assert sum(qo) == x.values[next(n for n in ("q", "q_nope") if n in v)].shape[0]
    if d.op_type != "gqa_ragged":
        idx = v["kv_indices"]
        num_pages = x.axes["num_pages"]
        assert len(idx) == v["kv_indptr"][-1].item()
        assert len(set(idx.tolist())) == len(idx), "a page is used twice"
        assert len(idx) == 0 or (idx.min() >= 0 and idx.max() < num_pages)
        assert num_pages > len(idx), "no spare pages: a kernel reading unlisted pages would go unseen"
        if len(idx) >= 2:
            assert not bool((idx[1:] > idx[:-1]).all()), "kv_indices are sorted: pages not shuffled"
        if "kv_last_page_len" in v:
            ps = d.const_axes["page_size"]
            for p, lp in zip(lens(v["kv_indptr"]), v["kv_last_page_len"].tolist(), strict=True):
                assert (1 <= lp <= ps) if p else lp == 0
    if "sm_scale" in v:
        head = 128 + x.axes["head_dim_kpe"] if d.op_type == "mla_paged" else v["q"].shape[-1]
        assert v["sm_scale"] == pytest.approx(1 / math.sqrt(head), rel=1e-6)


def ds_routing_reference(logits, bias, top_k=8, n_group=8, topk_group=4) -> list[set[int]]:
    """DeepSeek-V3 routing, one token at a time in plain Python (independent of moe.route)."""
    chosen = []
    num_experts = logits.shape[1]
    per_group = num_experts // n_group
    for row in range(logits.shape[0]):
        s = [1 / (1 + math.exp(-float(z))) + float(b) for z, b in zip(logits[row], bias.float(), strict=True)]
        groups = [sorted(s[g * per_group:(g + 1) * per_group], reverse=True) for g in range(n_group)]
        group_score = [grp[0] + grp[1] for grp in groups]
        kept = sorted(range(n_group), key=lambda g: -group_score[g])[:topk_group]
        candidates = [e for g in kept for e in range(g * per_group, (g + 1) * per_group)]
        chosen.append(set(sorted(candidates, key=lambda e: -s[e])[:top_k]))
    return chosen


def local_choices(x: Inputs) -> int:
    off = x.values["local_expert_offset"]
    n_local = x.axes["num_local_experts"]
    routed = ds_routing_reference(x.values["routing_logits"], x.values["routing_bias"])
    return sum(1 for experts in routed for e in experts if off <= e < off + n_local)


# -- every definition, every size tier, every edge case ---------------------------------------
def size_params(defs, *, large: bool):
    """small and medium for all; large only where it is cheap (the dense families, shrunk)."""
    out = []
    for d in defs:
        sizes = SIZES if large and d.op_type in CHEAP_FAMILIES else ("small", "medium")
        if d.op_type == "moe":
            sizes = ("small",)
        out += [pytest.param(d, s, id=f"{d.name}-{s}") for s in sizes]
    return out


def case_params(defs):
    return [pytest.param(d, c, id=f"{d.name}-{c}") for d in defs for c in edge_cases(d)]


@pytest.mark.parametrize("d,size",
                         size_params(SYNTHETIC, large=True) + size_params(SHIPPED_CHEAP, large=False))
def test_every_size_satisfies_the_definition(d, size):
    x = generate_inputs(d, size, seed=0)
    check_spec(d, x)
    assert (x.definition, x.size, x.seed, x.case) == (d.name, size, 0, None)
    if d.op_type in attention_mod.OP_TYPES:
        check_attention(d, x)


@pytest.mark.parametrize("d,case", case_params(SYNTHETIC + SHIPPED_CHEAP))
def test_every_edge_case_satisfies_the_definition(d, case):
    try:
        x = generate_inputs(d, "small", seed=1, case=case)
    except common.CaseTooLarge as e:  # large_offsets: a cache past 2**31 elements, where memory allows
        pytest.skip(str(e))
    check_spec(d, x)
    assert x.case == case
    if d.op_type in attention_mod.OP_TYPES:
        check_attention(d, x)


def test_tiers_grow():
    for d in (gqa_paged("prefill"), rmsnorm(), sampling(), rope()):
        rows = [generate_inputs(d, s).args()[0].shape[0] for s in ("small", "medium")]
        assert rows[0] < rows[1]


# -- reproducibility ------------------------------------------------------------------------
@pytest.mark.parametrize("d", SYNTHETIC, ids=ids(SYNTHETIC))
def test_same_seed_replays_bit_for_bit_and_other_seeds_differ(d):
    a = generate_inputs(d, "small", seed=7)
    b = generate_inputs(d, "small", seed=7)
    assert same(a, b)
    c = generate_inputs(d, "small", seed=8)
    floats = [n for n, v in a.values.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    assert any(not torch.equal(as_comparable(a.values[n]), as_comparable(c.values[n]))
               for n in floats if a.values[n].shape == c.values[n].shape) or a.axes != c.axes


def test_size_and_case_are_part_of_the_seed():
    d = rmsnorm()
    base = generate_inputs(d, "small", seed=0)
    other = generate_inputs(d, "small", seed=0, case="large_values")
    assert not torch.equal(base.values["weight"], other.values["weight"])


def test_global_rng_is_left_alone():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    for d in (gqa_paged("prefill", 16, True), moe(), sampling(), rope()):
        generate_inputs(d, "small", seed=3)
    assert torch.equal(state, torch.get_rng_state())


def test_inputs_do_not_depend_on_cpu_capability_or_thread_count():
    """torch.randn's CPU kernel gives different bits with and without AVX2; the generators
    draw integers only, so a child process on the scalar code path and one thread must agree."""
    defs = [gqa_paged("prefill", 16, True), moe(), sampling(), rope(), rmsnorm(fused=True), gemm()]
    here = {d.name: digest(generate_inputs(d, "small", seed=5)) for d in defs}
    script = (
        "import json, sys, torch\n"
        "torch.set_num_threads(1)\n"
        "sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
        "import test_inputs as T\n"
        "from flashinfer_trace.inputs import generate_inputs\n"
        "defs = [T.gqa_paged('prefill', 16, True), T.moe(), T.sampling(), T.rope(),\n"
        "        T.rmsnorm(fused=True), T.gemm()]\n"
        "print(json.dumps({d.name: T.digest(generate_inputs(d, 'small', seed=5)) for d in defs}))\n"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    out = subprocess.run([sys.executable, "-c", script, str(ROOT / "src"), str(Path(__file__).parent)],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here


def test_generated_on_the_cpu_for_a_device_without_values():
    """The meta device has no values to draw: the case is made on the CPU and moved (shapes kept)."""
    d = gqa_paged("decode")
    meta = generate_inputs(d, "small", seed=2, device="meta")
    cpu = generate_inputs(d, "small", seed=2)
    for name, v in meta.values.items():
        if isinstance(v, torch.Tensor):
            assert v.device.type == "meta" and v.shape == cpu.values[name].shape
        else:
            assert v == cpu.values[name]


def test_the_cache_hands_out_copies_on_the_device_asked_for():
    d = rmsnorm(fused=True)
    fresh = generate_inputs(d, "small", seed=6)
    set_cache(2)
    try:
        first = generate_inputs(d, "small", seed=6)
        second = generate_inputs(d, "small", seed=6)
        meta = generate_inputs(d, "small", seed=6, device="meta")
    finally:
        set_cache(0)
    assert same(first, fresh) and same(second, fresh)
    first.values["residual"].zero_()  # a kernel writing into its inputs changes no later copy
    assert same(second, fresh)
    assert meta.device == "meta" and second.device == "cpu"


# -- the Inputs object ----------------------------------------------------------------------
@pytest.mark.skipif(not SHIPPED_CHEAP, reason="no shipped definitions")
def test_a_definition_can_be_named():
    d = next(d for d in SHIPPED_CHEAP if d.op_type == "rmsnorm")
    by_name = generate_inputs(str(d.source), "small", seed=4)
    assert same(by_name, generate_inputs(d, "small", seed=4))
    assert edge_cases(str(d.source)) == edge_cases(d)


def test_inputs_api():
    d = rmsnorm(fused=True)
    x = generate_inputs(d, "small", seed=0)
    assert x.args() == list(x.values.values()) and list(x.values) == ["hidden_states", "residual", "weight"]
    y = x.clone()
    y.values["residual"].zero_()  # an in-place kernel writing into its inputs
    assert not torch.equal(x.values["residual"], y.values["residual"])
    assert x.values["residual"].abs().sum() > 0
    z = x.to("cpu")
    assert same(x, z) and z.axes == x.axes == {"batch_size": 4, "hidden_size": 64}
    assert "hidden_states=(4, 64):bfloat16" in repr(x) and len(repr(x)) < 300


def test_scalars_are_python_scalars_rounded_to_their_dtype():
    x = generate_inputs(gqa_paged("decode"), "small")
    assert type(x.values["sm_scale"]) is float
    assert x.values["sm_scale"] == torch.tensor(1 / 4.0, dtype=torch.float32).item()
    m = generate_inputs(moe(), "small")
    assert type(m.values["local_expert_offset"]) is int and m.values["routed_scaling_factor"] == 2.5


# -- attention ------------------------------------------------------------------------------
@pytest.mark.parametrize("d", ATTENTION, ids=ids(ATTENTION))
def test_attention_edge_cases(d):
    prefill = "qo_indptr" in d.inputs
    ps = d.const_axes.get("page_size", 1)
    full_pages = d.op_type != "gqa_ragged" and "kv_last_page_len" not in d.inputs
    one_token = ps if full_pages else 1  # without kv_last_page_len the smallest kv is one full page

    x = generate_inputs(d, "small", case="single_token")
    kv, qo = request_lengths(d, x)
    assert kv == [one_token] * len(kv) and qo == [1] * len(kv)
    assert len(kv) == attention_mod.TIERS["small"].batch

    x = generate_inputs(d, "medium", case="batch1")
    assert x.axes["len_indptr"] == 2 and (x.axes.get("batch_size", 1) == 1)

    x = generate_inputs(d, "medium", case="uneven")
    kv, qo = request_lengths(d, x)
    tier = attention_mod.TIERS["medium"]
    assert min(kv) == one_token and max(kv) >= tier.max_kv
    if prefill:
        assert 1 in qo and tier.max_qo in qo

    for seed in range(4):
        x = generate_inputs(d, "small", seed=seed, case="empty")
        kv, qo = request_lengths(d, x)
        empty = qo if prefill else kv
        assert empty.count(0) == 1 and len(empty) > 1, (kv, qo)
        check_attention(d, x)


def test_paged_pages_are_shuffled_with_spares():
    d = gqa_paged("decode")
    x = generate_inputs(d, "medium", seed=0)
    idx = x.values["kv_indices"]
    assert not torch.equal(idx.sort().values, idx)
    assert (idx[1:] - idx[:-1]).abs().float().mean() > 10  # scattered, not runs of neighbours
    assert x.axes["num_pages"] >= len(idx) * 1.2


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**40), stage=st.sampled_from(["decode", "prefill"]),
       last=st.booleans(), case=st.sampled_from([None, *attention_mod.CASES]))
def test_paged_structure_holds_for_any_seed(seed, stage, last, case):
    d = gqa_paged(stage, 16, last_page_len=last, h=2, kv=1, d=8)
    x = generate_inputs(d, "small", seed=seed, case=case)
    check_spec(d, x)
    check_attention(d, x)


# -- moe ------------------------------------------------------------------------------------
def test_moe_routes_tokens_to_local_experts():
    tokens = reached = 0
    for seed in range(6):
        x = generate_inputs(moe(), "medium", seed=seed)
        off, n_local = x.values["local_expert_offset"], x.axes["num_local_experts"]
        assert off % n_local == 0 and 0 <= off <= x.axes["num_experts"] - n_local
        routed = ds_routing_reference(x.values["routing_logits"], x.values["routing_bias"])
        hits = [sum(off <= e < off + n_local for e in experts) for experts in routed]
        assert any(hits), f"seed {seed}: no token reaches the local experts"
        tokens += len(hits)
        reached += sum(h > 0 for h in hits)
        load = [sum(e in experts for experts in routed) for e in range(off, off + n_local)]
        assert max(load) >= 2, "every local expert sees at most one token: M > 1 paths untested"
    assert reached / tokens > 0.6  # most tokens, not all: remote-only tokens must stay zero


def test_moe_offsets_vary_with_the_seed():
    offsets = {generate_inputs(moe(), "small", seed=s).values["local_expert_offset"] for s in range(12)}
    assert len(offsets) >= 3


@pytest.mark.parametrize("seed", range(4))
def test_moe_no_local_tokens_routes_nothing_locally(seed):
    x = generate_inputs(moe(), "medium", seed=seed, case="no_local_tokens")
    assert local_choices(x) == 0


def test_moe_single_token():
    x = generate_inputs(moe(), "small", case="single_token")
    assert x.axes["seq_len"] == 1 and local_choices(x) >= 1


def test_moe_fp8_codes_and_scales():
    x = generate_inputs(moe(), "small")
    for name, v in x.values.items():
        if isinstance(v, torch.Tensor) and v.dtype == torch.float8_e4m3fn:
            assert not ((v.view(torch.uint8) & 0x7F) == 0x7F).any(), f"{name} has NaN codes"
            mag = v.float().abs()
            assert mag.min() >= 0.125 and mag.max() <= 1.875
        if name.endswith("_scale"):
            assert (v > 0).all() and torch.isfinite(v).all()
    # weight scales shrink with the contraction dim so that every GEMM output stays O(1)
    assert x.values["gemm1_weights_scale"].mean() < x.values["hidden_states_scale"].mean()


def _shipped_moe_reference():
    if not SHIPPED_MOE:
        pytest.skip("no shipped moe definition")
    return SHIPPED_MOE[0].reference


def test_moe_reference_output_is_finite_and_order_one():
    """The shipped reference on the scaled-down family: O(1) outputs, and exact zeros when no
    token is routed locally (the case exists so that this is tested)."""
    from flashinfer_trace.testing import run_reference

    d = moe(reference=_shipped_moe_reference())
    (out,) = run_reference(d, generate_inputs(d, "medium", seed=0))
    assert torch.isfinite(out.float()).all()
    rms = out.float().pow(2).mean().sqrt().item()
    assert 0.01 < rms < 10, rms
    (zero,) = run_reference(d, generate_inputs(d, "medium", seed=0, case="no_local_tokens"))
    assert not zero.any()


@pytest.mark.skipif(not SHIPPED_MOE, reason="no shipped moe definition")
def test_shipped_moe_small():
    d = SHIPPED_MOE[0]
    x = generate_inputs(d, "small", seed=0)
    check_spec(d, x)
    assert local_choices(x) >= 1
    assert x.values["gemm1_weights"].numel() == math.prod(x.values["gemm1_weights"].shape)


# -- sampling -------------------------------------------------------------------------------
SAMPLING = [d for d in SYNTHETIC + SHIPPED_CHEAP if d.op_type == "sampling"]


@pytest.mark.parametrize("d", SAMPLING, ids=ids(SAMPLING))
def test_sampling_inputs(d):
    x = generate_inputs(d, "medium", seed=0)
    probs = x.values["probs"]
    vocab = probs.shape[1]
    assert (probs >= 0).all()
    assert (probs.double().sum(1) - 1).abs().max() < 1e-5
    top = probs.max(1).values
    assert top.max() > 0.2 and top.min() < top.max() / 2  # peaked rows and flatter ones
    if "top_k" in x.values:
        k = x.values["top_k"]
        assert k.dtype == torch.int32 and (k >= 1).all() and (k <= vocab).all()
        assert (k == vocab).any() and (k < vocab).any()
        assert (generate_inputs(d, "small", case="top_k_1").values["top_k"] == 1).all()
    if "top_p" in x.values:
        p = x.values["top_p"]
        assert p.dtype == torch.float32 and (p > 0).all() and (p <= 1).all() and (p < 1).any()
        small = generate_inputs(d, "small", case="top_p_small").values["top_p"]
        assert (small > 0).all() and (small <= 0.05).all()
    boundary = {"ties_at_cut", "uniform", "one_hot", "last_token", "filters_off", "tiny_probs"}  # see test_boundary_*
    expected = (boundary | ({"top_k_1"} if "top_k" in d.inputs else set())
                | ({"top_p_small", "top_p_exact"} if "top_p" in d.inputs else set()))
    assert set(edge_cases(d)) == expected


# -- the dense families ---------------------------------------------------------------------
def test_norm_and_activation_magnitudes():
    x = generate_inputs(rmsnorm(fused=True), "medium")
    w = x.values["weight"].float()
    assert 0.9 < w.mean() < 1.1 and w.std() > 0.05
    assert 0.9 < x.values["hidden_states"].float().std() < 1.1
    big = generate_inputs(rmsnorm(fused=True), "medium", case="large_values")
    assert 90 < big.values["hidden_states"].float().std() < 110
    assert 90 < big.values["residual"].float().std() < 110
    assert generate_inputs(silu_and_mul(), "small", case="large_values").values["input"].abs().max() > 100
    assert generate_inputs(silu_and_mul(), "small", case="single_token").axes["num_tokens"] == 1


def test_gemm_outputs_are_order_one():
    x = generate_inputs(gemm(), "medium")
    c = x.values["A"].float() @ x.values["B"].float().T
    assert 0.7 < c.std() < 1.3
    big = generate_inputs(gemm(), "medium", case="large_values")
    assert torch.isfinite(big.values["A"] @ big.values["B"].T).all()


def test_rope_positions_and_cache():
    d = rope()
    x = generate_inputs(d, "medium", seed=0)
    pos, cache = x.values["positions"], x.values["cos_sin_cache"]
    assert pos.dtype == torch.int64 and not torch.equal(pos.sort().values, pos)
    assert 0 <= pos.min() and pos.max() < x.axes["max_position"] == cache.shape[0]
    half = cache.shape[1] // 2
    cos, sin = cache[:, :half].double(), cache[:, half:].double()
    assert torch.allclose(cos**2 + sin**2, torch.ones_like(cos), atol=1e-6)
    assert torch.equal(cache[0], torch.cat([torch.ones(half), torch.zeros(half)]))
    # position 1, frequency i: angle theta^(-2i/rd) with theta 5e5 (llama-3)
    i = torch.arange(half, dtype=torch.float64)
    assert torch.allclose(sin[1], torch.sin(500000.0 ** (-2 * i / cache.shape[1])), atol=1e-6)
    assert generate_inputs(rope(max_position=512), "small").axes["max_position"] == 512


# -- the random primitives ------------------------------------------------------------------
def _u64(x: int) -> int:
    return x & (2**64 - 1)


def test_mix64_is_splitmix64():
    """The published SplitMix64 outputs (Vigna's splitmix64.c, seeds 0 and 1234567)."""
    assert [mix64(0, i) for i in range(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert [mix64(1234567, i) for i in range(5)] == [6457827717110365317, 3203168211198807973,
                                                       9817491932198370423, 4593380528125082431,
                                                       16408922859458223821]


@pytest.mark.parametrize("key", [0, 1, 0x5DEECE66D, 2**63 - 1, common.stream_seed("flashinfer", 7)])
def test_counter_words_match_the_python_reference(key):
    """The tensor ops (int64 multiplies that wrap, masked arithmetic shifts) give the bits of the
    plain-integer definition, including counters past 2^32 and sums that wrap past 2^64."""
    for start in (0, 1, 2**32 - 3, 2**40 + 11, 2**62):
        words = counter_words(key, start, 9)
        assert words.dtype == torch.int64
        assert [_u64(w) for w in words.tolist()] == [mix64(key, start + i) for i in range(9)], start


def test_draws_take_consecutive_words_of_their_stream():
    key = common.stream_seed("draws")
    s = Stream(key)
    u = uniform((3,), s)  # two 32-bit halves per word: 2 words
    b = normal((5,), s, dtype=torch.bfloat16)  # four 16-bit quarters per word: 2 words
    f = random_fp8((9,), torch.float8_e4m3fn, s)  # eight bytes per word: 2 words
    w = random_words(2, s)
    assert s.position == 8
    assert torch.equal(w, counter_words(key, 6, 2))
    first = counter_words(key, 0, 2)
    assert torch.equal(u, ((first.view(torch.int32)[:3] >> 8) & 0xFFFFFF).float() * 2.0**-24)
    assert b.shape == (5,) and f.shape == (9,)
    # a replayed stream replays every draw
    t = Stream(key)
    assert torch.equal(uniform((3,), t), u) and torch.equal(normal((5,), t, dtype=torch.bfloat16), b)


def test_streams_are_independent():
    keys = [common.stream_seed("flashinfer-trace-inputs/v2", 0, "d", "small", None, tag) for tag in ("A", "B")]
    a, b = (random_words(1 << 16, Stream(k)) for k in keys)
    assert len(set(a.tolist()) & set(b.tolist())) == 0  # no shared words, so no shifted copies
    assert len(torch.unique(a)) == a.numel()
    ua, ub = (uniform((1 << 18,), Stream(k)).double() for k in keys)
    corr = ((ua - ua.mean()) * (ub - ub.mean())).mean() / (ua.std() * ub.std())
    assert abs(corr) < 0.01  # ~5 standard errors
    # neighbouring keys (the worst case for a counter-based generator) are independent too
    n0, n1 = (normal((1 << 18,), Stream(k)).double() for k in (1000, 1001))
    assert abs((n0 * n1).mean()) < 0.01


def test_every_bit_of_the_words_is_fair():
    w = random_words(1 << 16, Stream(3))
    ones = torch.stack([(w >> i) & 1 for i in range(64)]).sum(1).double() / w.numel()
    assert ((ones - 0.5).abs() < 0.01).all()  # ~5 standard errors per bit


def test_uniform_and_normal_moments():
    u = uniform((1 << 20,), Stream(0)).double()
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.002 and abs(u.var() - 1 / 12) < 0.001
    assert (u * 2**24 == (u * 2**24).round()).all()  # 24-bit grid
    x = normal((1 << 20,), Stream(1)).double()
    assert abs(x.mean()) < 0.01 and abs(x.std() - 1) < 0.01 and x.abs().max() <= 4.0
    assert abs((x**3).mean()) < 0.02 and abs((x**4).mean() - 3) < 0.05  # symmetric, normal kurtosis
    assert 0.6827 - 0.003 < (x.abs() < 1).double().mean() < 0.6827 + 0.003
    assert len(torch.unique(x)) > 0.99 * x.numel()  # float32: no ties to make top-k ambiguous
    y = normal((1 << 18,), Stream(2), scale=3.0, mean=1.0, dtype=torch.bfloat16).double()
    assert abs(y.mean() - 1) < 0.03 and abs(y.std() - 3) < 0.03
    z = normal((1 << 18,), Stream(2), scale=0.5, mean=-2.0).double()
    assert abs(z.mean() + 2) < 0.01 and abs(z.std() - 0.5) < 0.01
    assert normal((3, 0, 2), Stream(2)).shape == (3, 0, 2)


def test_randint_permutation_and_log_uniform():
    r = randint(-3, 7, (100_000,), Stream(4), dtype=torch.int32)
    assert r.dtype == torch.int32 and r.min() == -3 and r.max() == 6
    counts = torch.bincount((r + 3).long(), minlength=10).double()
    assert ((counts - 10_000).abs() < 600).all()  # ~6 standard errors
    with pytest.raises(ValueError, match="empty range"):
        randint(3, 3, (1,), Stream(4))
    for n in (1, 2, 7, 1000):
        p = permutation(n, Stream(n))
        assert sorted(p.tolist()) == list(range(n))
    rows = permutation(50, Stream(5), rows=400)
    assert rows.shape == (400, 50) and (rows.sort(1).values == torch.arange(50)).all()
    assert len({tuple(r) for r in rows.tolist()}) == 400
    first = torch.bincount(rows[:, 0], minlength=50).double()  # where each row starts: uniform
    assert first.max() < 30 and first.min() >= 1
    s = log_uniform((1 << 16,), Stream(6), -3.0, 1.5)
    assert (s >= 2**-3).all() and (s <= 2**1.5).all()
    assert abs(s.log2().double().mean() + 0.75) < 0.02


def test_fp8_codes_are_finite_and_bounded():
    for dtype in FP8:
        f = random_fp8((1 << 16,), dtype, Stream(7))
        mag = f.float().abs()
        assert f.dtype == dtype and torch.isfinite(f.float()).all()
        assert mag.min() >= 0.125 and mag.max() <= 1.875
        assert len(torch.unique(f.view(torch.uint8))) == (64 if dtype == torch.float8_e4m3fn else 32)
    rms = random_fp8((1 << 16,), torch.float8_e4m3fn, Stream(8)).float().pow(2).mean().sqrt()
    assert abs(rms - common.FP8_CODE_RMS) < 0.01


RANDOM_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64, *FP8, torch.int32,
                 torch.int8, torch.bool)


def _random(shape, dtype, key):
    ints = dict(low=-5, high=100) if not dtype.is_floating_point and dtype != torch.bool else {}
    return random_tensor(shape, dtype, Stream(key), scale=0.5, mean=0.25, **ints)


def test_chunked_draws_equal_unchunked(monkeypatch):
    """Chunks only cut the work: any chunk size gives the same bits (sizes chosen to leave ragged
    last chunks and partly used last words)."""
    shapes = [(1,), (7, 3), (1001,), (3, 5, 67)]
    whole = {(s, d): _random(s, d, 11) for s in shapes for d in RANDOM_DTYPES}
    extras = (uniform((333,), Stream(12)), permutation(301, Stream(13), rows=3),
              log_uniform((77,), Stream(14), -1, 1))
    for chunk in (1, 3, 64):
        monkeypatch.setitem(common.CHUNK_WORDS, "cpu", chunk)
        for (s, d), want in whole.items():
            got = _random(s, d, 11)
            assert got.dtype == want.dtype and torch.equal(as_bits(got), as_bits(want)), (s, d, chunk)
        again = (uniform((333,), Stream(12)), permutation(301, Stream(13), rows=3),
                 log_uniform((77,), Stream(14), -1, 1))
        assert all(torch.equal(a, b) for a, b in zip(again, extras, strict=True))


def test_chunked_generation_of_whole_cases_is_unchanged(monkeypatch):
    defs = [gemm(), moe(), gqa_paged("prefill", 16, True), rope(), sampling()]
    want = {d.name: generate_inputs(d, "small", seed=3) for d in defs}
    monkeypatch.setitem(common.CHUNK_WORDS, "cpu", 5)
    for d in defs:
        assert same_bits(generate_inputs(d, "small", seed=3), want[d.name]), d.name


# -- the same case on every device ----------------------------------------------------------
def as_bits(v: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as integers on the CPU: NaN equals the same NaN, -0.0 differs from 0.0."""
    v = v.detach().cpu().contiguous()
    if v.dtype == torch.bool:
        return v.view(torch.uint8)
    return v.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[v.element_size()])


def same_bits(a: Inputs, b: Inputs) -> bool:
    if list(a.values) != list(b.values) or a.axes != b.axes:
        return False
    for x, y in zip(a.args(), b.args(), strict=True):
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape
                    and torch.equal(as_bits(x), as_bits(y))):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def _one_per_family(defs):
    seen = {}
    for d in defs:
        seen.setdefault(d.op_type, d)
    return list(seen.values())


DEVICE_DEFS = SYNTHETIC + _one_per_family(SHIPPED_CHEAP) + SHIPPED_MOE[:1]
DEVICE_CASES = ([pytest.param(d, "small", None, id=f"{d.name}-small") for d in DEVICE_DEFS]
                + [pytest.param(d, "medium", None, id=f"{d.name}-medium") for d in SYNTHETIC]
                + [pytest.param(d, "small", c, id=f"{d.name}-{c}") for d in SYNTHETIC for c in edge_cases(d)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_counter_words_on_cuda_match_the_python_reference():
    for key in (0, 2**63 - 1, common.stream_seed("cuda")):
        for start in (0, 2**32 - 3, 2**62):
            words = counter_words(key, start, 9, "cuda")
            assert words.device.type == "cuda"
            assert [_u64(w) for w in words.cpu().tolist()] == [mix64(key, start + i) for i in range(9)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_random_primitives_on_cuda_equal_the_cpu(monkeypatch):
    """Every dtype path, in CUDA-sized chunks and in chunks small enough to leave ragged ends."""
    shape = (3, 1000, 1001)  # 3 M elements: more than one chunk of 2^20 words for the 4-per-word paths
    for chunk in (None, 1 << 18):
        if chunk:
            monkeypatch.setitem(common.CHUNK_WORDS, "cuda", chunk)
        for dtype in RANDOM_DTYPES:
            cpu = _random(shape, dtype, 21)
            cuda = random_tensor(shape, dtype, Stream(21), scale=0.5, mean=0.25, device="cuda",
                                 **(dict(low=-5, high=100) if not dtype.is_floating_point and dtype != torch.bool
                                    else {}))
            assert cuda.device.type == "cuda" and torch.equal(as_bits(cuda), as_bits(cpu)), (dtype, chunk)
        for fn in (lambda dev: uniform((5, 999), Stream(22), device=dev),
                   lambda dev: permutation(4097, Stream(23), rows=5, device=dev),
                   lambda dev: randint(0, 12345, (999,), Stream(24), device=dev),
                   lambda dev: log_uniform((999,), Stream(25), -2.5, 0.5, device=dev)):
            assert torch.equal(as_bits(fn("cuda")), as_bits(fn("cpu")))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("d,size,case", DEVICE_CASES)
def test_inputs_made_on_cuda_equal_the_cpu_bit_for_bit(d, size, case, monkeypatch):
    """The replay guarantee across devices: a case made on the GPU is the case made on the CPU.
    The large tensors are made on the GPU (they reach the builder there), not copied from a CPU."""
    arrived = {}
    put = common.Builder.put

    def spy(self, name, value):
        if isinstance(value, torch.Tensor):
            arrived[name] = (value.device.type, value.numel())
        return put(self, name, value)

    monkeypatch.setattr(common.Builder, "put", spy)
    on_cuda = generate_inputs(d, size, seed=1, case=case, device="cuda")
    made_where = dict(arrived)
    on_cpu = generate_inputs(d, size, seed=1, case=case, device="cpu")
    assert on_cuda.device == "cuda" and on_cpu.device == "cpu"
    for name, v in on_cuda.values.items():
        if isinstance(v, torch.Tensor):
            assert v.device.type == "cuda", name
    assert same_bits(on_cuda, on_cpu)
    big = {n: where for n, (where, numel) in made_where.items() if numel >= 1 << 16}
    cpu_made = {"probs", "cos_sin_cache"}  # softmax, cos/sin: made on the CPU on purpose, then copied
    assert all(where == "cuda" for n, where in big.items() if n not in cpu_made), big


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_cache_serves_every_device_with_copies():
    d = gqa_paged("prefill", 16, True)
    want = generate_inputs(d, "medium", seed=4)
    set_cache(2)
    try:
        a = generate_inputs(d, "medium", seed=4, device="cuda")  # made on the GPU and kept
        b = generate_inputs(d, "medium", seed=4, device="cuda")
        c = generate_inputs(d, "medium", seed=4, device="cpu")
    finally:
        set_cache(0)
    assert a.device == b.device == "cuda" and c.device == "cpu"
    a.values["q"].zero_()  # a kernel writing into its inputs: no other copy changes
    assert same_bits(b, want) and same_bits(c, want)
    assert a.values["k_cache"].data_ptr() != b.values["k_cache"].data_ptr()


# -- errors ---------------------------------------------------------------------------------
def test_unsupported_op_type():
    """No family generator for it: the declaration makes its inputs (declared.py), and it has no edge cases."""
    d = variant(rmsnorm(), op_type="conv3d", name="conv3d_x")
    with pytest.raises(UnsupportedOpType, match="no input generator for op_type 'conv3d'") as e:
        family_for(d)
    assert isinstance(e.value, InputGenerationError) and "conv3d_x" in str(e.value)
    assert generate_inputs(d).source == "declared" and edge_cases(d) == []
    assert set(supported_op_types()) == {"rmsnorm", "gemm", "gqa_paged", "gqa_ragged", "mla_paged", "mla_ragged",
                                         "moe", "rope", "activation", "sampling", "gdn", "mamba_ssu", "dsa_paged",
                                         "cascade_merge", "page_append", "single_decode", "single_prefill", "layernorm",
                                         "topk", "bmm_fp8", "bmm_bf16", "moe_routing", "segment_gemm",
                                         "block_sparse", "cascade_attention", "pod", "mhc_post",
                                         "dequantize_fp4", "gemm_fp8", "gemm_bf16", "trtllm_paged", "xqa"}


def _renamed_inputs(d: Definition) -> Definition:
    """The definition with every input named otherwise (`fi_<name>`), as a FlashInfer trace of the same op
    type may name them."""
    inputs = {f"fi_{n}": spec for n, spec in d.as_dict["inputs"].items()}
    args = ", ".join(inputs)
    return variant(d, inputs=inputs, reference=f"def run({args}):\n    return None\n")


def _one_per_op_type() -> list:
    seen: dict[str, Definition] = {}
    for path in sorted(SHIPPED.rglob("*.json")):
        if path.parent.name not in seen and path.parent.parent == SHIPPED:
            d = load_path(path)
            seen[d.op_type] = d
    return [pytest.param(d, id=op) for op, d in sorted(seen.items())]


@pytest.mark.parametrize("d", _one_per_op_type())
def test_edge_cases_of_a_file_our_family_does_not_fit(d):
    """A traced file of one of our op types with other input names (0.7.2.post1's segment_gemm has no
    `seg_indptr`): the family does not fit, so it offers no edge case, and listing them never fails (a failure
    here failed the collection of a whole fi_trace shard on the GPU)."""
    other = _renamed_inputs(d)
    assert isinstance(edge_cases(other), list)
    if edge_cases(d) and not edge_cases(other):
        with pytest.raises(InputGenerationError, match="unknown edge case"):
            generate_inputs(other, case=edge_cases(d)[0])


def test_unknown_case_and_size():
    with pytest.raises(InputGenerationError, match="single_token, batch1, uneven, empty"):
        generate_inputs(gqa_paged("decode"), case="large_values")
    with pytest.raises(InputGenerationError, match="unknown size 'huge'"):
        generate_inputs(rmsnorm(), size="huge")
    with pytest.raises(InputGenerationError, match="seed"):
        generate_inputs(rmsnorm(), seed="1")


def test_a_constraint_that_cannot_hold_fails_loudly():
    d = gqa_paged("decode")
    broken = variant(d, constraints=[*d.constraints, "batch_size == 999999"])
    with pytest.raises(InputGenerationError, match="batch_size == 999999") as e:
        generate_inputs(broken)
    assert d.name in str(e.value)


def test_an_input_the_family_does_not_know_is_no_guess_of_the_family():
    """The family refuses it (a guess would test nothing); the inputs then come from the declaration, and say so."""
    d = rmsnorm()
    inputs = {**d.as_dict["inputs"], "mystery": t(["hidden_size"], "bfloat16")}
    mystery = variant(d, inputs=inputs)
    with pytest.raises(InputGenerationError, match="mystery"):
        family_for(mystery).generate(common.Builder(mystery, "small", 0, None))
    assert generate_inputs(mystery).source == "declared"


def test_a_non_finite_value_fails_loudly_wherever_it_is(monkeypatch):
    """The finiteness check runs in chunks (bounded temporaries for a 1 GB weight): a NaN or an
    infinity in any chunk, the last ragged one included, is found."""
    monkeypatch.setattr(common, "_CHECK_CHUNK", 7)
    d = rmsnorm()
    for index, bad in ((0, float("nan")), (255, float("inf")), (130, float("-inf"))):
        b = common.Builder(d, "small", 0, None)
        b.set_axis("batch_size", 4)
        b.put_random("hidden_states")
        b.put_random("weight")
        b.values["hidden_states"].view(-1)[index] = bad
        with pytest.raises(InputGenerationError, match="hidden_states.*non-finite"):
            b.finish()
    b = common.Builder(d, "small", 0, None)
    b.set_axis("batch_size", 4)
    b.put_random("hidden_states")
    b.put_random("weight")
    assert b.finish().values["hidden_states"].shape == (4, 64)


def test_a_const_axis_the_generator_contradicts_fails_loudly():
    d = gqa_paged("decode")  # batch_size fixed at 5, but the small tier makes 3 requests
    fixed = variant(d, axes={**d.as_dict["axes"], "batch_size": const(5)})
    with pytest.raises(InputGenerationError, match="batch_size"):
        generate_inputs(fixed)


def test_moe_without_expert_parallelism_offers_no_no_local_tokens_case():
    d = moe()
    assert "no_local_tokens" in edge_cases(d)
    axes = {**d.as_dict["axes"], "num_local_experts": const(64)}  # every expert local: no token can miss them
    assert "no_local_tokens" not in edge_cases(variant(d, axes=axes))


def test_a_reference_that_orders_its_parameters_otherwise_gets_each_input_by_name():

    from flashinfer_trace.definition import Definition
    from flashinfer_trace.testing import generate_inputs, load_definition, run_reference

    data = json.loads(load_definition("rmsnorm_h4096_fp16").to_json())
    data["reference"] = data["reference"].replace("def run(hidden_states, weight, eps):",
                                                  "def run(weight, eps, hidden_states):")
    assert "def run(weight, eps, hidden_states):" in data["reference"]
    permuted = Definition.model_validate(data)
    assert permuted.run_parameters == ["weight", "eps", "hidden_states"]
    inputs = generate_inputs(permuted, "small", seed=0)
    assert list(inputs.values) == ["weight", "eps", "hidden_states"] and inputs.args()[0] is inputs.values["weight"]
    same = generate_inputs(load_definition("rmsnorm_h4096_fp16"), "small", seed=0)
    (out,), (expected,) = run_reference(permuted, inputs), run_reference(load_definition("rmsnorm_h4096_fp16"), same)
    assert torch.equal(out, expected)


def test_rope_heads_left_var_get_the_tiers_head_counts():
    """The public rope_with_cos_sin_cache_neox_style_d128_rd64 leaves both head counts var."""
    from flashinfer_trace.definition import Definition
    from flashinfer_trace.testing import generate_inputs, load_definition

    data = json.loads(load_definition("rope_with_cos_sin_cache_neox_style_h32_kv8_d128_rd128").to_json())
    for axis in ("num_qo_heads", "num_kv_heads"):
        data["axes"][axis] = {"type": "var", "description": "left to the inputs"}
    var_heads = Definition.model_validate(data)
    small, medium = (generate_inputs(var_heads, size, seed=0) for size in ("small", "medium"))
    assert (small.axes["num_qo_heads"], small.axes["num_kv_heads"]) == (4, 2)
    assert tuple(medium.values["query"].shape[1:]) == (32, 128) and medium.values["key"].shape[1] == 8


def test_kv_last_page_len_declared_as_long_as_the_indptr_gets_a_trailing_unused_entry():
    """Some public gqa_paged_prefill_*_ps64 files declare kv_last_page_len with len_indptr entries."""
    from flashinfer_trace import semantics as sem
    from flashinfer_trace.definition import Definition
    from flashinfer_trace.testing import generate_inputs, load_definition

    data = json.loads(load_definition("gqa_paged_prefill_causal_h32_kv8_d128_ps1").to_json())
    data["axes"]["page_size"]["value"] = 4
    data["constraints"] = []  # the ps1 file's qo_len <= pages holds only for one token a page
    data["inputs"]["kv_last_page_len"] = {"shape": ["len_indptr"], "dtype": "int32"}
    data["reference"] = data["reference"].replace("kv_indices, sm_scale)", "kv_indices, sm_scale, kv_last_page_len)")
    d = Definition.model_validate(data)
    x = generate_inputs(d, "small", seed=0).values
    last, indptr = x["kv_last_page_len"], x["kv_indptr"]
    assert last.shape == indptr.shape and int(last[-1]) == 0
    pages = (indptr[1:] - indptr[:-1]).tolist()
    assert all(1 <= n <= 4 for n, p in zip(last[:-1].tolist(), pages, strict=True) if p)
    assert sem.last_page_lens(indptr, 4, last).tolist() == last[:-1].tolist()


# -- fresh sizes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, most", [(1, None), (4, None), (16, None), (64, None), (2048, None), (8, 16), (4, 16)])
def test_a_fresh_count_is_a_size_no_table_lists(n, most):
    from flashinfer_trace.inputs.common import fresh_count, stream

    drawn = [fresh_count(n, stream("test-fresh", s), most) for s in range(64)]
    assert all(v % 2 == 1 and v & (v - 1) and v >= (9 if most is None or most > 9 else 1) for v in drawn)
    assert all(v <= max(2 * n + 1, 13) and (most is None or v <= most) for v in drawn)
    assert len(set(drawn)) > 1  # drawn, not fixed
    assert drawn == [fresh_count(n, stream("test-fresh", s), most) for s in range(64)]  # replayable


def test_the_fresh_seed_draws_the_counts_and_a_fixed_seed_keeps_the_tier():
    d = rmsnorm()
    fixed = generate_inputs(d, "small", 20261129)
    fresh = generate_inputs(d, "small", 20261129, fresh=True)
    assert fixed.axes["batch_size"] == 4 and fresh.axes["batch_size"] >= 9 and fresh.axes["batch_size"] % 2
    assert same_bits(fresh, generate_inputs(d, "small", 20261129, fresh=True))  # the same case on a replay


def test_a_reference_right_only_at_the_tables_sizes_is_caught_by_the_fresh_counts():
    from flashinfer_trace.mutants import MUTANTS, kill

    m = next(m for m in MUTANTS if m.name == "rmsnorm_h4096:table-sizes-only")
    caught = kill(m, "torch", sizes=("small", "medium"), cases=())
    assert caught.killed and "seed 20261129" in caught.how  # the planted fresh seed's 9-13 rows
    # the fixed seeds pass at both sizes (4 and 64 rows; every edge case's count is a table's too)
    assert kill(m, "torch", sizes=("small", "medium"), cases=(), fresh_seed=None).killed is False

"""Inputs from a definition's declaration alone (inputs/declared.py): definitions from the wild (an op type
no family generator knows, or input names ours do not) get valid, reproducible inputs instead of an
error, by the documented rules per dtype and per name (docs/definitions.md). The definitions are written
here."""

from __future__ import annotations

import json

import pytest
import torch

from flashinfer_trace.check import CheckConfig, Discovered, plan, run
from flashinfer_trace.constraints import check_all
from flashinfer_trace.definition import Definition
from flashinfer_trace.dtypes import DType, torch_dtype
from flashinfer_trace.inputs import EdgeCaseUnavailable, InputGenerationError, edge_cases, generate_inputs
from flashinfer_trace.inputs.declared import AXIS_LADDER, EPS, SEGMENT_MAX
from flashinfer_trace.status import Kind

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def var():
    return {"type": "var"}


def const(v):
    return {"type": "const", "value": v}


def t(shape, dtype, **more):
    return {"shape": shape, "dtype": dtype, **more}


def make(name, op_type, axes, inputs, outputs, constraints=(), reference=None) -> Definition:
    args = ", ".join(inputs)
    return Definition.model_validate({
        "name": name, "op_type": op_type, "axes": axes, "inputs": inputs, "outputs": outputs,
        "constraints": list(constraints),
        "reference": reference or f"def run({args}):\n    return None\n",
    })


def same(a, b) -> bool:
    """Bit-identical values (tensors compared as bytes: an fp8 or fp4 tensor has no torch.equal)."""
    if list(a.values) != list(b.values):
        return False
    for k, x in a.values.items():
        y = b.values[k]
        if isinstance(x, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(
                    x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)):
                return False
        elif x != y:
            return False
    return True


# -- a softmax: the op types the first wild run skipped as no-generator --------------------------------------
SOFTMAX_REF = ("import torch\n\n\ndef run(logits, temperature):\n"
               "    return torch.softmax(logits.float() / temperature, dim=-1)\n")


def softmax() -> Definition:
    return make("softmax_v1000", "softmax", {"batch_size": var(), "vocab_size": const(1000)},
                {"logits": t(["batch_size", "vocab_size"], "bfloat16"), "temperature": t(None, "float32")},
                {"probs": t(["batch_size", "vocab_size"], "float32")}, reference=SOFTMAX_REF)


def test_an_unknown_op_type_gets_declared_inputs_reproducibly():
    d = softmax()
    a = generate_inputs(d, "small", 0)
    assert a.source == "declared" and a.case is None
    assert a.values["logits"].shape == (AXIS_LADDER["small"][0], 1000) and a.values["logits"].dtype == torch.bfloat16
    assert a.values["temperature"] == 1.0  # a float scalar no rule names: 1.0
    assert same(a, generate_inputs(d, "small", 0))  # bit for bit
    assert not torch.equal(a.values["logits"], generate_inputs(d, "small", 1).values["logits"])  # the seed counts
    assert generate_inputs(d, "medium", 0).values["logits"].shape[0] == AXIS_LADDER["medium"][0]
    assert edge_cases(d) == []  # edge cases need to know what an input means


def test_every_dtype_of_the_format_is_filled_with_valid_values():
    dtypes = [x for x in DType if not x.is_string]
    inputs = {f"x_{x.value}": t(["n", "m"], x.value) for x in dtypes}
    d = make("all_dtypes", "wild", {"n": var(), "m": const(6)}, inputs, {"y": t(["n"], "float32")})
    values = generate_inputs(d, "small", 0).values
    for x in dtypes:
        v = values[f"x_{x.value}"]
        assert v.dtype == torch_dtype(x) and v.shape == (4, 6), x
        if v.dtype in FP8 or x == DType.float8_e8m0fnu:
            assert torch.isfinite(v.float()).all(), x  # valid codes only: no NaN / inf byte
    assert values["x_float8_e8m0fnu"].view(torch.uint8).max() < 255
    fp4 = values["x_float4_e2m1"].view(torch.uint8)  # two e2m1 codes a byte: every byte is valid
    assert fp4.unique().numel() > 8
    assert values["x_bool"].any() and not values["x_bool"].all()
    assert values["x_int8"].min() < 0 < values["x_int8"].max()


def test_indptrs_indices_lengths_and_their_constraints():
    axes = {"batch_size": var(), "len_indptr": var(), "total_q": var(), "num_kv_indices": var(), "num_pages": var(),
            "page_size": const(4), "num_experts": const(16), "topk": const(4), "num_rows": var(), "heads": const(2)}
    inputs = {
        "q": t(["total_q", "heads", "8"], "bfloat16"),
        "kv_cache": t(["num_pages", "page_size", "heads", "8"], "float8_e4m3fn"),
        "qo_indptr": t(["len_indptr"], "int32"), "kv_indptr": t(["len_indptr"], "int32"),
        "kv_indices": t(["num_kv_indices"], "int32"), "kv_last_page_len": t(["batch_size"], "int32"),
        "seq_lens": t(["batch_size"], "int32"), "topk_ids": t(["num_rows", "topk"], "int32"),
        "k_scale": t(["num_pages"], "float32"), "probs": t(["num_rows", "num_experts"], "float32"),
        "workspace_buffer": t(["64"], "uint8"), "eps": t(None, "float32"), "page_size_arg": t(None, "int32"),
        "causal": t(None, "bool"),
    }
    constraints = ["len_indptr == batch_size + 1", "total_q == qo_indptr[-1].item()",
                   "num_kv_indices == kv_indptr[-1].item()",
                   "num_kv_indices == 0 or (kv_indices.min().item() >= 0 and kv_indices.max().item() < num_pages)",
                   "((kv_indptr[1:] - kv_indptr[:-1]) - (qo_indptr[1:] - qo_indptr[:-1])).min().item() >= 0",
                   "seq_lens.max().item() <= 5", "num_rows % 8 == 0"]
    d = make("paged_wild", "wild", axes, inputs, {"o": t(["total_q", "heads", "8"], "bfloat16")}, constraints)
    for size in ("small", "medium"):
        x = generate_inputs(d, size, 0)
        v, ax = x.values, x.axes
        qo, kv = v["qo_indptr"].tolist(), v["kv_indptr"].tolist()
        assert qo[0] == kv[0] == 0 and qo[-1] == ax["total_q"] and kv[-1] == ax["num_kv_indices"]
        assert len(qo) == ax["batch_size"] + 1 == ax["len_indptr"]
        assert all(b - a >= 1 for a, b in zip(qo, qo[1:], strict=False))  # monotone, no empty segment
        assert all(1 <= n <= SEGMENT_MAX[size] for n in (b - a for a, b in zip(qo, qo[1:], strict=False)))
        idx = v["kv_indices"]
        assert idx.min() >= 0 and idx.max() < ax["num_pages"] and idx.unique().numel() == idx.numel()  # distinct pages
        assert ax["num_pages"] > ax["num_kv_indices"]  # spare pages nobody reads
        assert 1 <= v["kv_last_page_len"].min() and v["kv_last_page_len"].max() <= 4  # up to the page size
        assert 1 <= v["seq_lens"].min() and v["seq_lens"].max() <= 5  # the constraint's bound
        ids = v["topk_ids"]
        assert ids.min() >= 0 and ids.max() < 16  # in range of the experts axis its name points at
        assert all(len(set(row)) == 4 for row in ids.tolist())  # a token's experts are distinct
        assert ax["num_rows"] % 8 == 0
        assert (v["k_scale"] > 0).all()
        assert torch.allclose(v["probs"].double().sum(-1), torch.ones(ax["num_rows"], dtype=torch.float64))
        assert not v["workspace_buffer"].any()
        assert v["eps"] == EPS and v["causal"] is False and v["page_size_arg"] == 1
        check_all(d.constraints, {**ax, **v}, definition=d.name)


def test_axes_solved_from_equalities_and_scalars_named_like_axes():
    axes = {"K": var(), "K_packed": var(), "M": var(), "num_q_heads": var(), "num_v_heads": var(), "head_dim": var()}
    inputs = {"a": t(["M", "K_packed"], "uint8"), "b": t(["K"], "bfloat16"),
              "v": t(["M", "num_v_heads", "head_dim"], "bfloat16"),
              "q": t(["M", "num_q_heads", "head_dim"], "bfloat16"),
              "head_dim_arg": t(None, "int32"), "head_dim": t(None, "int32"), "sm_scale": t(None, "float32")}
    constraints = ["K_packed == K // 2", "M % 16 == 0", "num_v_heads % num_q_heads == 0", "num_v_heads > num_q_heads"]
    d = make("solved", "wild", axes, inputs, {"o": t(["M"], "float32")}, constraints)
    x = generate_inputs(d, "small", 0)
    ax = x.axes
    assert ax["K_packed"] == ax["K"] // 2 and ax["M"] == 16
    assert ax["num_v_heads"] % ax["num_q_heads"] == 0 and ax["num_v_heads"] > ax["num_q_heads"]
    assert x.values["head_dim"] == ax["head_dim"]  # a scalar named like an axis is that axis
    assert x.values["sm_scale"] == pytest.approx(1 / ax["head_dim"] ** 0.5)


def test_axis_names_say_how_axes_relate():
    """fi_trace's implicit axes: `K_div_block_size` is K // block_size (block_size dividing K), `*_plus_1` one more."""
    axes = {"M": var(), "K": const(96), "N": const(8), "K_div_block_size": var(), "block_size": var(),
            "batch_size": var(), "batch_size_plus_1": var()}
    inputs = {"A": t(["M", "K"], "float8_e4m3fn"), "B": t(["K_div_block_size", "N", "block_size"], "float8_e4m3fn"),
              "offsets": t(["batch_size_plus_1"], "int32"), "x": t(["batch_size"], "bfloat16")}
    ax = generate_inputs(make("relations", "wild", axes, inputs, {"C": t(["M", "N"], "bfloat16")}), "small", 0).axes
    assert ax["K_div_block_size"] * ax["block_size"] == 96 and ax["batch_size_plus_1"] == ax["batch_size"] + 1


def test_a_constraint_on_an_absent_input_is_an_error_naming_it():
    """fi_trace traced a wrapper's run() without its plan(): the indptr is absent, yet a constraint reads it."""
    inputs = {"x": t(["n"], "float32"), "kv_indptr": t(["len_indptr"], "unknown", optional=True)}
    d = make("absent", "wild", {"n": var(), "len_indptr": var()}, inputs, {"y": t(["n"], "float32")},
             ["n == kv_indptr[-1].item()"])
    with pytest.raises(InputGenerationError, match=r"reads input\(s\) kv_indptr, which the file marks absent"):
        generate_inputs(d, "small", 0)


def test_reference_defaults_and_string_arguments():
    ref = "def run(x, alpha=0.5, mode='fast', flag=True):\n    return x\n"
    d = make("defaults", "wild", {"n": var()}, {"x": t(["n"], "float32"), "alpha": t(None, "float32"),
                                                "mode": t(None, "str"), "flag": t(None, "bool")},
             {"y": t(["n"], "float32")}, reference=ref)
    v = generate_inputs(d, "small", 0).values
    assert v["alpha"] == 0.5 and v["mode"] == "fast" and v["flag"] is True
    bare = make("no_default", "wild", {"n": var()}, {"x": t(["n"], "float32"), "mode": t(None, "str")},
                {"y": t(["n"], "float32")}, reference="def run(x, mode):\n    return x\n")
    with pytest.raises(InputGenerationError, match="'mode' is a string argument.*no literal default"):
        generate_inputs(bare, "small", 0)


def test_a_constraint_it_cannot_meet_is_an_error_naming_it():
    d = make("impossible", "wild", {"n": var()}, {"x": t(["n"], "float32")}, {"y": t(["n"], "float32")},
             ["x.min().item() > 100.0"])
    with pytest.raises(InputGenerationError, match=r"declared generator.*x.min\(\).item\(\) > 100.0"):
        generate_inputs(d, "small", 0)


# -- the fallback from a family generator ----------------------------------------------------------------------
def rope_with_offsets() -> Definition:
    """RoPE whose inputs our rope generator does not know (`offsets`, `indptr`: FlashInfer's apply_rope)."""
    axes = {"nnz": var(), "batch_size": var(), "len_indptr": var(), "heads": const(2), "head_dim": const(8)}
    inputs = {"q": t(["nnz", "heads", "head_dim"], "bfloat16"), "k": t(["nnz", "heads", "head_dim"], "bfloat16"),
              "indptr": t(["len_indptr"], "int32"), "offsets": t(["batch_size"], "int32")}
    return make("rope_offsets_h2_d8", "rope", axes, inputs,
                {"q_rope": t(["nnz", "heads", "head_dim"], "bfloat16"), "k_rope": t(["nnz", "heads", "head_dim"],
                                                                                      "bfloat16")},
                ["len_indptr == batch_size + 1", "nnz == indptr[-1].item()"])


def test_a_family_that_does_not_fit_falls_back_to_the_declaration():
    d = rope_with_offsets()
    x = generate_inputs(d, "small", 0)
    assert x.source == "declared"
    assert x.values["indptr"][-1] == x.axes["nnz"] and x.axes["len_indptr"] == x.axes["batch_size"] + 1
    assert "single_token" in edge_cases(d)  # still the family's, but they cannot be made:
    with pytest.raises(EdgeCaseUnavailable, match="edge case 'single_token' needs the rope generator"):
        generate_inputs(d, "small", 0, case="single_token")


def test_check_skips_the_family_edge_cases_it_cannot_make_and_checks_the_rest():
    """An RMSNorm with a flag our rmsnorm generator does not know: declared inputs, compared with the torch
    ground truth; the family's edge cases are `no-generator` skips, not errors."""
    from samples import VALID

    data = json.loads(json.dumps(VALID))
    data["inputs"]["enable_pdl"] = t(None, "bool")
    data["reference"] = data["reference"].replace("def run(hidden_states, weight):",
                                                  "def run(hidden_states, weight, enable_pdl):")
    d = Definition.model_validate(data)
    config = CheckConfig(sources=("torch",), sizes=("small",), seeds=(0,), device="cpu")
    records = list(run(plan(Discovered([d], []), config), config))
    edge = [r for r in records if r.check.value == "edge"]
    assert edge and all(r.status == "skip" and r.kind == Kind.NO_GENERATOR for r in edge)
    assert "needs the norm generator" in edge[0].detail
    rest = [r for r in records if r.check.value != "edge"]
    assert rest and all(r.status == "pass" and r.inputs == "declared" for r in rest)
    assert any(r.check.value == "match" and r.source == "torch" for r in rest)

"""The public files name tensors their own way (`q`/`k` for RoPE, where the shipped definitions say
`query`/`key`); the adapters follow the definition's inputs, not our naming."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch
from packaging.version import Version

from flashinfer_trace import semantics as sem
from flashinfer_trace.definition import Definition
from flashinfer_trace.groundtruth import base, get_ground_truth
from flashinfer_trace.inputs import generate_inputs
from flashinfer_trace.testing import assert_matches, run_reference, tolerance_for

ROPE_REF = """import torch


def run(q, k, cos_sin_cache, positions):
    cs = cos_sin_cache[positions.to(torch.int64)]
    half = cs.shape[-1] // 2
    cos, sin = cs[:, None, :half], cs[:, None, half:]

    def rot(x):
        x = x.to(torch.float32)
        a, b, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin, rest], dim=-1).to(torch.bfloat16)

    return rot(q), rot(k)
"""


def public_rope() -> Definition:
    var, c = {"type": "var"}, lambda v: {"type": "const", "value": v}  # noqa: E731
    t = lambda shape, dtype: {"shape": shape, "dtype": dtype}  # noqa: E731
    return Definition.model_validate({
        "name": "rope_with_cos_sin_cache_neox_style_d64_rd32", "op_type": "rope",
        "axes": {"num_tokens": var, "num_qo_heads": var, "num_kv_heads": var, "head_size": c(64),
                 "rotary_dim": c(32), "max_seq_len": var},
        "inputs": {"q": t(["num_tokens", "num_qo_heads", "head_size"], "bfloat16"),
                   "k": t(["num_tokens", "num_kv_heads", "head_size"], "bfloat16"),
                   "cos_sin_cache": t(["max_seq_len", "rotary_dim"], "float32"),
                   "positions": t(["num_tokens"], "int64")},
        "outputs": {"q_out": t(["num_tokens", "num_qo_heads", "head_size"], "bfloat16"),
                    "k_out": t(["num_tokens", "num_kv_heads", "head_size"], "bfloat16")},
        "reference": ROPE_REF})


def test_rotated_tensors_are_found_by_position_not_name():
    assert sem.rope_rotated(public_rope()) == ["q", "k"]


def test_torch_ground_truth_on_q_and_k():
    d = public_rope()
    x = generate_inputs(d, "small", seed=0)
    assert_matches(d, x, run_reference(d, x), get_ground_truth("torch", d, device="cpu")(x), tolerance_for(d))


def test_flashinfer_adapter_takes_q_and_k(monkeypatch):
    seen = {}

    def apply_rope_with_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox=True):
        seen.update(query=tuple(query.shape), key=tuple(key.shape), head_size=head_size, is_neox=is_neox)
        return query.clone(), key.clone()

    fi = types.ModuleType("flashinfer")
    fi.__version__ = "0.6.6"
    fi.rope = types.SimpleNamespace(apply_rope_with_cos_sin_cache=apply_rope_with_cos_sin_cache)
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    monkeypatch.setattr(base, "installed_version", lambda package: Version("0.6.6"))
    monkeypatch.setattr(base, "_imported", {})
    monkeypatch.setattr(base, "cuda_capability", lambda device: (9, 0))
    d = public_rope()
    gt = get_ground_truth("flashinfer", d, device="cuda")
    assert gt.api == "flashinfer.rope.apply_rope_with_cos_sin_cache"
    x = generate_inputs(d, "small", seed=0)
    q_out, k_out = dataclasses.replace(gt, device="cpu")(x)
    tokens, heads, kv = x.values["q"].shape[0], x.values["q"].shape[1], x.values["k"].shape[1]
    assert seen == {"query": (tokens, heads * 64), "key": (tokens, kv * 64), "head_size": 64, "is_neox": True}
    assert torch.equal(q_out, x.values["q"]) and torch.equal(k_out, x.values["k"])


@pytest.mark.parametrize("extra", [0, 1])
def test_a_rope_that_rotates_other_than_two_tensors_is_refused(extra):
    data = public_rope().model_dump(mode="json")
    if extra:
        data["inputs"]["v"] = data["inputs"]["k"]
        data["reference"] = data["reference"].replace("def run(q, k,", "def run(q, k, v,")
    else:
        del data["inputs"]["k"]
        data["reference"] = data["reference"].replace("def run(q, k,", "def run(q,")
    from flashinfer_trace.groundtruth import flashinfer as fgt

    why = next(a for a in fgt.ADAPTERS if a.op_type == "rope").applies(Definition.model_validate(data))
    assert why and "rotates a query and a key" in why


def test_the_probs_samplers_do_not_claim_a_logits_op():
    """fi_trace files some logits-side ops under `sampling` (top_k_mask_logits: logits, top_k); the
    hand-written sampler adapter needs probs (on the H100 it raised KeyError 'probs' before this)."""
    from flashinfer_trace.groundtruth import flashinfer as fgt

    var = {"type": "var"}
    t = lambda shape, dtype: {"shape": shape, "dtype": dtype}  # noqa: E731
    d = Definition.model_validate({
        "name": "top_k_mask_logits_v32", "op_type": "sampling",
        "axes": {"batch_size": var, "vocab_size": {"type": "const", "value": 32}},
        "inputs": {"logits": t(["batch_size", "vocab_size"], "float32"), "top_k": t(["batch_size"], "int32")},
        "outputs": {"masked": t(["batch_size", "vocab_size"], "float32")},
        "reference": "def run(logits, top_k):\n    return logits\n"})
    why = next(a for a in fgt.ADAPTERS if a.op_type == "sampling").applies(d)
    assert why and "probs" in why

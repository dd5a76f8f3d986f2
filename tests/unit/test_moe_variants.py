"""The public dataset's other MoE shapes: pre-routed (`topk_ids` packing expert id and bfloat16
weight), Llama-4 routing (sigmoid top-k, the weight scaling the token's input) and per-tensor fp8
(per-expert output scales). Each is a small definition with a reference written here in the public
files' style; the torch ground truth must match it and must catch a planted bug in it."""

from __future__ import annotations

import pytest
import torch

from flashinfer_trace import semantics as sem
from flashinfer_trace.definition import Definition
from flashinfer_trace.groundtruth import get_ground_truth
from flashinfer_trace.groundtruth.torch_ref import unpack_routed
from flashinfer_trace.inputs import generate_inputs
from flashinfer_trace.testing import assert_matches, run_reference, tolerance_for

E, H, I = 8, 64, 32  # noqa: E741 (the public references name the intermediate size I)


def _t(shape, dtype):
    return {"shape": shape, "dtype": dtype}


def _axes(top_k: int) -> dict:
    c = lambda v: {"type": "const", "value": v}  # noqa: E731
    return {"seq_len": {"type": "var"}, "num_experts": c(E), "hidden_size": c(H), "intermediate_size": c(I),
            "gemm1_out_size": c(2 * I), "top_k": c(top_k)}


WEIGHTS = {"gemm1_weights": _t(["num_experts", "gemm1_out_size", "hidden_size"], "float32"),
           "gemm2_weights": _t(["num_experts", "hidden_size", "intermediate_size"], "float32")}
OUT = {"output": _t(["seq_len", "hidden_size"], "bfloat16")}

# One expert loop shared by the references below; {route} picks ids/weights, {scale_in} and
# {scale_out} place the routing weight, {s1}/{sg}/{s2} apply per-expert output scales.
BODY = """
import torch


@torch.no_grad()
def run({args}):
    A = hidden_states.to(torch.float32)
    T = A.shape[0]
{route}
    out = torch.zeros(T, {H}, dtype=torch.float32, device=A.device)
    for e in range({E}):
        for k in range({K}):
            rows = torch.nonzero(ids[:, k] == e, as_tuple=False).squeeze(1)
            if rows.numel() == 0:
                continue
            w = wts[rows, k].unsqueeze(1)
            h = ({scale_in}) @ gemm1_weights[e].to(torch.float32).t()
            up = h[:, :{I}]{s1}
            gate = h[:, {I}:]{sg}
            y = (torch.nn.functional.silu(gate) * up) @ gemm2_weights[e].to(torch.float32).t(){s2}
            out.index_add_(0, rows, {scale_out})
    return out.to(torch.bfloat16)
"""

PACKED = """    ids = (topk_ids >> 16).to(torch.int64)
    wts = (topk_ids & 0xFFFF).to(torch.int16).view(torch.bfloat16).to(torch.float32)"""
LLAMA4 = """    wts, ids = torch.topk(torch.sigmoid(routing_logits.to(torch.float32)), k={K}, dim=-1)"""
RENORM = """    top, ids = torch.topk(routing_logits.to(torch.float32), k={K}, dim=-1)
    wts = torch.softmax(top, dim=-1)"""


def definition(kind: str, *, top_k: int = 2, description: str = "", bug: tuple[str, str] | None = None,
               per_tensor: bool = False, on_input: bool = False) -> Definition:
    inputs = {"hidden_states": _t(["seq_len", "hidden_size"], "float8_e4m3fn" if per_tensor else "bfloat16")}
    if kind == "routed":
        inputs = {"topk_ids": _t(["seq_len", "top_k"], "int32"), **inputs}
    else:
        inputs = {"routing_logits": _t(["seq_len", "num_experts"], "bfloat16"), **inputs}
        if kind == "llama4":
            inputs["routing_bias"] = _t(["num_experts"], "bfloat16")  # present, ignored by Llama-4 routing
    inputs.update(WEIGHTS)
    scales = {}
    if per_tensor:
        inputs["gemm1_weights"] = _t(["num_experts", "gemm1_out_size", "hidden_size"], "float8_e4m3fn")
        inputs["gemm2_weights"] = _t(["num_experts", "hidden_size", "intermediate_size"], "float8_e4m3fn")
        for n in sem.MOE_OUTPUT_SCALES:
            inputs[n] = _t(["num_experts"], "float32")
        scales = {"s1": " * output1_scales_scalar[e]", "sg": " * output1_scales_gate_scalar[e]",
                  "s2": " * output2_scales_scalar[e]"}
    code = BODY.format(args=", ".join(inputs), H=H, E=E, I=I, K=top_k,
                       route={"routed": PACKED, "llama4": LLAMA4, "renorm": RENORM}[kind].format(K=top_k),
                       scale_in="A[rows] * w" if on_input else "A[rows]", scale_out="y" if on_input else "y * w",
                       s1=scales.get("s1", ""), sg=scales.get("sg", ""), s2=scales.get("s2", ""))
    if bug:
        assert bug[0] in code, bug
        code = code.replace(*bug)
    name = f"{'trtllm_fp8_per_tensor_scale' if per_tensor else 'moe_bf16'}_{kind}_moe_topk{top_k}_e{E}_h{H}_i{I}"
    return Definition.model_validate({"name": name, "op_type": "moe", "axes": _axes(top_k), "inputs": inputs,
                                      "outputs": OUT, "reference": code, "description": description})


CASES = {
    "routed": dict(kind="routed", description="Routing: Renormalize (pre-computed topk_ids, routing_method_type=1)."),
    "routed-llama4": dict(kind="routed", top_k=1, on_input=True,
                          description="Routing: Llama4 (pre-computed topk_ids, routing_method_type=3)."),
    "llama4": dict(kind="llama4", top_k=1, on_input=True, description="Llama4 routing (sigmoid+top-1)."),
    "per-tensor": dict(kind="renorm", per_tensor=True, description="Renormalize routing (TopK->Softmax)."),
}


def check(d: Definition, seed: int = 0):
    x = generate_inputs(d, "small", seed=seed)
    expected = get_ground_truth("torch", d, device="cpu")(x)
    assert_matches(d, x, run_reference(d, x), expected, tolerance_for(d))
    return x


@pytest.mark.parametrize("case", sorted(CASES))
def test_torch_ground_truth_matches(case):
    for seed in (0, 1):
        check(definition(**CASES[case]), seed)


@pytest.mark.parametrize("case, bug", [
    ("routed", ("y * w", "y")),  # routing weight dropped
    ("routed-llama4", ("A[rows] * w", "A[rows]")),  # Llama-4 weight not applied to the input
    ("llama4", ("torch.sigmoid(routing_logits.to(torch.float32))", "routing_logits.to(torch.float32)")),
    ("per-tensor", (" * output2_scales_scalar[e]", "")),  # GEMM2 output scale dropped
])
def test_planted_bugs_are_caught(case, bug):
    d = definition(**CASES[case], bug=bug)
    with pytest.raises(AssertionError):
        check(d)


def test_routed_ids_are_distinct_local_experts_with_weights_summing_to_one():
    d = definition(**CASES["routed"])
    x = generate_inputs(d, "medium", seed=3)
    ids, w = unpack_routed(x.values["topk_ids"])
    assert ids.shape == (8, 2) and ids.min() >= 0 and ids.max() < E
    assert all(len(set(row)) == 2 for row in ids.tolist())
    assert torch.allclose(w.sum(-1), torch.ones(8, dtype=w.dtype), atol=1e-2)
    assert len(set(ids.flatten().tolist())) < E  # a hot set: experts see several tokens


def test_unpack_reads_the_bfloat16_bits():
    w = torch.tensor([[0.75, -1.5]], dtype=torch.bfloat16)
    packed = (torch.tensor([[3, 7]], dtype=torch.int32) << 16) | (w.view(torch.int16).to(torch.int32) & 0xFFFF)
    ids, weights = unpack_routed(packed)
    assert ids.tolist() == [[3, 7]] and weights.tolist() == [[0.75, -1.5]]


def test_per_tensor_scales_bring_each_gemm_to_order_one():
    d = definition(**CASES["per-tensor"])
    x = generate_inputs(d, "small", seed=0)
    out = run_reference(d, x)[0].float()
    assert torch.isfinite(out).all() and 0.02 < out.abs().mean() < 5


def test_routing_is_read_from_the_description():
    assert sem.moe_routing(definition(**CASES["llama4"])) == sem.MoeRouting("llama4", 1, scales_input=True)
    assert sem.moe_routing(definition(**CASES["routed-llama4"])).scales_input
    assert sem.moe_routing(definition(**CASES["routed"])) == sem.MoeRouting("precomputed", 2)
    assert sem.moe_routing(definition(**CASES["per-tensor"])).kind == "renormalize"
    assert sem.moe_quant(definition(**CASES["per-tensor"])) == "fp8-per-tensor"


def test_the_block_scale_kernels_do_not_claim_these_variants():
    assert "pre-routed" in sem.fp8_moe_applies(definition(**CASES["routed"]))
    assert "fp8-per-tensor" in sem.fp8_moe_applies(definition(**CASES["per-tensor"]))


def test_fp8_without_any_scale_is_refused_with_the_names():
    d = definition(**CASES["per-tensor"])
    data = d.model_dump(mode="json")
    del data["inputs"]["output2_scales_scalar"]
    data["reference"] = data["reference"].replace(", output2_scales_scalar", "")
    why = sem.moe_applies(Definition.model_validate(data))
    assert "output1_scales_scalar" in why and "hidden_states_scale" in why

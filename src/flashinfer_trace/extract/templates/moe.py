"""Routed experts of a mixture-of-experts layer on one expert-parallel rank, op_type moe:

* routing "deepseek", weights "fp8_block_scale": DeepSeek-V3 grouped no-aux routing, FP8 block-scale
  `moe_fp8_block_scale_ds_routing_topk{K}_ng{G}_kg{KG}_e{E_local}_h{H}_i{I}`
  (flashinfer.fused_moe.trtllm_fp8_block_scale_moe);
* routing "renormalize", weights "fp8_block_scale": top-k + softmax over the chosen (Qwen3-MoE style)
  `moe_fp8_block_scale_renorm_topk{K}_e{E_local}_h{H}_i{I}` (same FlashInfer API);
* routing "renormalize", weights "bfloat16": the same routing with bf16 activations and weights (Mixtral style)
  `moe_bf16_renorm_topk{K}_e{E_local}_h{H}_i{I}` (flashinfer.fused_moe.cutlass_fused_moe).

Every variant orders GEMM1's output rows [up; gate] and applies silu to the second half (trtllm convention).
"""

from __future__ import annotations

import re
from typing import Any

from ._common import BLOCK, STATUS, choice, const_axis, definition, positive_int, replace_once, tensor, var_axis

ROUTINGS = ("deepseek", "renormalize")
WEIGHTS = ("fp8_block_scale", "bfloat16")
FP8 = "float8_e4m3fn"
FP8_API = "fi_api:flashinfer.fused_moe.trtllm_fp8_block_scale_moe"
BF16_API = "fi_api:flashinfer.fused_moe.cutlass_fused_moe"

DS_REFERENCE = """import math
import torch

TOP_K = <TOP_K>  # experts per token
N_GROUP = <N_GROUP>  # expert groups (<NUM_EXPERTS> experts / <N_GROUP> = <GROUP_SIZE> per group)
TOPK_GROUP = <TOPK_GROUP>  # groups kept per token
BLOCK = 128  # quantization block size (activations 1x128, weights 128x128)


def dequantize_weight(w, scale):
    # w: [rows, cols] float8, scale: [rows / BLOCK, cols / BLOCK]; one scale per 128x128 tile
    rows, cols = w.shape
    tiles = w.to(torch.float32).view(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
    return (tiles * scale.to(torch.float32)[:, None, :, None]).reshape(rows, cols)


@torch.no_grad()
def run(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor):
    seq_len, num_experts = routing_logits.shape
    hidden_size = hidden_states.shape[1]
    num_local_experts = gemm1_weights.shape[0]
    intermediate_size = gemm2_weights.shape[2]
    device = hidden_states.device

    # 1. Dequantize the activations: one scale per token per 128-wide block of hidden.
    #    hidden_states_scale is stored transposed: [num_hidden_blocks, seq_len].
    x = hidden_states.to(torch.float32).view(seq_len, hidden_size // BLOCK, BLOCK)
    x = (x * hidden_states_scale.to(torch.float32).T[:, :, None]).reshape(seq_len, hidden_size)

    # 2. DeepSeek-V3 routing (no auxiliary loss): the bias steers the choice, not the weights.
    scores = torch.sigmoid(routing_logits.to(torch.float32))  # [seq_len, num_experts]
    biased = scores + routing_bias.to(torch.float32)
    group_size = num_experts // N_GROUP
    # Score of a group = sum of its two best biased scores; keep the TOPK_GROUP best groups. Equal scores at
    # either cut go to the lowest group / expert id: a stable descending sort (torch.topk leaves ties open).
    group_scores = biased.view(seq_len, N_GROUP, group_size).topk(2, dim=-1).values.sum(dim=-1)
    top_groups = group_scores.sort(dim=-1, descending=True, stable=True).indices[:, :TOPK_GROUP]
    group_kept = torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, top_groups, True)
    expert_kept = group_kept.repeat_interleave(group_size, dim=1)  # [seq_len, num_experts]
    # TOP_K experts by biased score among the kept groups (global expert ids).
    topk_ids = biased.masked_fill(~expert_kept, -math.inf).sort(dim=-1, descending=True, stable=True).indices
    topk_ids = topk_ids[:, :TOP_K]
    # Weights: UNBIASED sigmoid scores of the chosen experts, normalised to sum 1, then scaled.
    topk_weights = scores.gather(1, topk_ids)
    topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True) * routed_scaling_factor

    # 3. The local experts (global ids local_expert_offset .. + num_local_experts - 1); tokens routed
    #    to experts held elsewhere contribute nothing here.
    output = torch.zeros(seq_len, hidden_size, dtype=torch.float32, device=device)
    for local in range(num_local_experts):
        hit = topk_ids == local_expert_offset + local  # [seq_len, TOP_K]
        token_ids = hit.any(dim=1).nonzero().flatten()
        if token_ids.numel() == 0:
            continue  # only experts that receive tokens are dequantized
        weight = (topk_weights * hit).sum(dim=1)[token_ids]  # routing weight of this expert per token

        w1 = dequantize_weight(gemm1_weights[local], gemm1_weights_scale[local])  # [2 * I, hidden_size]
        w2 = dequantize_weight(gemm2_weights[local], gemm2_weights_scale[local])  # [hidden_size, I]
        h = x[token_ids] @ w1.T  # [tokens, 2 * I]
        # GEMM1 rows are [up; gate]: silu applies to the SECOND half (trtllm convention).
        up = h[:, :intermediate_size]
        gate = h[:, intermediate_size:]
        act = gate * torch.sigmoid(gate) * up  # silu(gate) * up
        y = act @ w2.T  # [tokens, hidden_size]
        output[token_ids] += weight[:, None] * y

    return output.to(torch.bfloat16)
"""

RENORM_FP8_REFERENCE = """import torch

TOP_K = <TOP_K>  # experts per token
BLOCK = 128  # quantization block size (activations 1x128, weights 128x128)


def dequantize_weight(w, scale):
    # w: [rows, cols] float8, scale: [rows / BLOCK, cols / BLOCK]; one scale per 128x128 tile
    rows, cols = w.shape
    tiles = w.to(torch.float32).view(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
    return (tiles * scale.to(torch.float32)[:, None, :, None]).reshape(rows, cols)


@torch.no_grad()
def run(routing_logits, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm2_weights, gemm2_weights_scale, local_expert_offset):
    seq_len, num_experts = routing_logits.shape
    hidden_size = hidden_states.shape[1]
    num_local_experts = gemm1_weights.shape[0]
    intermediate_size = gemm2_weights.shape[2]
    device = hidden_states.device

    # 1. Dequantize the activations: one scale per token per 128-wide block of hidden.
    #    hidden_states_scale is stored transposed: [num_hidden_blocks, seq_len].
    x = hidden_states.to(torch.float32).view(seq_len, hidden_size // BLOCK, BLOCK)
    x = (x * hidden_states_scale.to(torch.float32).T[:, :, None]).reshape(seq_len, hidden_size)

    # 2. Renormalize routing: the TOP_K experts with the highest logits (global expert ids); their
    #    weights are the softmax over the chosen logits, which equals softmax over all experts, then
    #    top-k, then renormalising the kept probabilities to sum 1. No bias, groups or scaling factor.
    #    Equal logits at the cut go to the lowest expert id: a stable descending sort (torch.topk leaves ties open).
    ranked = routing_logits.to(torch.float32).sort(dim=-1, descending=True, stable=True)
    topk_logits, topk_ids = ranked.values[:, :TOP_K], ranked.indices[:, :TOP_K]  # [seq_len, TOP_K]
    topk_weights = torch.softmax(topk_logits, dim=-1)

    # 3. The local experts (global ids local_expert_offset .. + num_local_experts - 1); tokens routed
    #    to experts held elsewhere contribute nothing here.
    output = torch.zeros(seq_len, hidden_size, dtype=torch.float32, device=device)
    for local in range(num_local_experts):
        hit = topk_ids == local_expert_offset + local  # [seq_len, TOP_K]
        token_ids = hit.any(dim=1).nonzero().flatten()
        if token_ids.numel() == 0:
            continue  # only experts that receive tokens are dequantized
        weight = (topk_weights * hit).sum(dim=1)[token_ids]  # routing weight of this expert per token

        w1 = dequantize_weight(gemm1_weights[local], gemm1_weights_scale[local])  # [2 * I, hidden_size]
        w2 = dequantize_weight(gemm2_weights[local], gemm2_weights_scale[local])  # [hidden_size, I]
        h = x[token_ids] @ w1.T  # [tokens, 2 * I]
        # GEMM1 rows are [up; gate]: silu applies to the SECOND half (trtllm convention).
        up = h[:, :intermediate_size]
        gate = h[:, intermediate_size:]
        act = gate * torch.sigmoid(gate) * up  # silu(gate) * up
        y = act @ w2.T  # [tokens, hidden_size]
        output[token_ids] += weight[:, None] * y

    return output.to(torch.bfloat16)
"""

RENORM_BF16_REFERENCE = """import torch

TOP_K = <TOP_K>  # experts per token


@torch.no_grad()
def run(routing_logits, hidden_states, gemm1_weights, gemm2_weights, local_expert_offset):
    seq_len, num_experts = routing_logits.shape
    hidden_size = hidden_states.shape[1]
    num_local_experts = gemm1_weights.shape[0]
    intermediate_size = gemm2_weights.shape[2]
    device = hidden_states.device
    x = hidden_states.to(torch.float32)

    # 1. Renormalize routing: the TOP_K experts with the highest logits (global expert ids); their
    #    weights are the softmax over the chosen logits, which equals softmax over all experts, then
    #    top-k, then renormalising the kept probabilities to sum 1. No bias, groups or scaling factor.
    #    Equal logits at the cut go to the lowest expert id: a stable descending sort (torch.topk leaves ties open).
    ranked = routing_logits.to(torch.float32).sort(dim=-1, descending=True, stable=True)
    topk_logits, topk_ids = ranked.values[:, :TOP_K], ranked.indices[:, :TOP_K]  # [seq_len, TOP_K]
    topk_weights = torch.softmax(topk_logits, dim=-1)

    # 2. The local experts (global ids local_expert_offset .. + num_local_experts - 1); tokens routed
    #    to experts held elsewhere contribute nothing here.
    output = torch.zeros(seq_len, hidden_size, dtype=torch.float32, device=device)
    for local in range(num_local_experts):
        hit = topk_ids == local_expert_offset + local  # [seq_len, TOP_K]
        token_ids = hit.any(dim=1).nonzero().flatten()
        if token_ids.numel() == 0:
            continue  # only experts that receive tokens are converted to float32
        weight = (topk_weights * hit).sum(dim=1)[token_ids]  # routing weight of this expert per token

        w1 = gemm1_weights[local].to(torch.float32)  # [2 * I, hidden_size]
        w2 = gemm2_weights[local].to(torch.float32)  # [hidden_size, I]
        h = x[token_ids] @ w1.T  # [tokens, 2 * I]
        # GEMM1 rows are [up; gate]: silu applies to the SECOND half (trtllm convention).
        up = h[:, :intermediate_size]
        gate = h[:, intermediate_size:]
        act = gate * torch.sigmoid(gate) * up  # silu(gate) * up
        y = act @ w2.T  # [tokens, hidden_size]
        output[token_ids] += weight[:, None] * y

    return output.to(torch.bfloat16)
"""

RENORM_TEXT = (
    "Routing (renormalize, as in Qwen3-MoE and Mixtral): the TOP_K = {k} experts with the highest routing_logits "
    "are chosen, and their weights are the softmax over the chosen logits, which equals a softmax over all {e} "
    "experts followed by top-k and renormalising the kept probabilities to sum 1 (norm_topk_prob); there is no "
    "routing bias, no expert grouping and no routed scaling factor. Equal logits at the top-k cut go to the lowest "
    "expert id (FlashInfer's routing kernels rank (score, -id) pairs)."
)

DEQUANT_TEXT = (
    "Dequantization: hidden_states (fp8 e4m3) times one float32 scale per token per 128-wide hidden block "
    "(hidden_states_scale is stored TRANSPOSED, [hidden / 128, seq_len]); each expert weight times one float32 "
    "scale per 128x128 tile."
)


def _experts_text(i: int, fp8: bool) -> str:
    text = (
        f"Experts: for each local expert e, h = x @ W1[e]^T ([tokens, {2 * i}]); the {2 * i} GEMM1 output rows are "
        f"ordered [up (0..{i - 1}); gate ({i}..{2 * i - 1})] and act = silu(h[:, {i}:]) * h[:, :{i}], i.e. silu "
        "applies to the SECOND half (the trtllm-gen kernel convention, the opposite of "
        "flashinfer.activation.silu_and_mul); y = act @ W2[e]^T; output = sum over the token's local chosen experts "
        "of weight * y, accumulated in float32 and rounded to bfloat16. Experts on other ranks contribute nothing "
        "(a token routed only elsewhere gets 0); a shared expert, if the model has one, is not part of this op."
    )
    if fp8:
        text += (" The reference keeps the intermediate activation in float32; a kernel that re-quantizes it to fp8 "
                 "before GEMM2 differs by that rounding, so comparisons need fp8-level tolerances.")
    else:
        text += (" Everything is computed in float32 from the bfloat16 inputs; a kernel that rounds the intermediate "
                 "activation to bfloat16 before GEMM2 differs by that rounding (bf16-level tolerances).")
    return text


def _rank_text(e: int, el: int) -> str:
    if e == el:
        return (f"with all {e} experts held locally (no expert parallelism: local_expert_offset is 0 and the local "
                "ids are the global ids)")
    return (f"on one rank of expert parallelism {e // el}: {e} experts in total, {el} held locally (global ids "
            f"local_expert_offset .. local_expert_offset + {el - 1})")


def _check(routing: str, weights: str, top_k: int, e: int, el: int, h: int, i: int,
           n_group: int | None, topk_group: int | None) -> None:
    if e % el:
        raise ValueError(f"num_experts {e} must be a multiple of num_local_experts {el} (whole expert-parallel ranks)")
    if top_k > e:
        raise ValueError(f"top_k {top_k} exceeds num_experts {e}")
    if weights == "fp8_block_scale":
        for what, v in (("hidden_size", h), ("intermediate_size", i)):
            if v % BLOCK:
                raise ValueError(f"{what} {v} must be a multiple of the fp8 block size {BLOCK} "
                                 f"(one scale per 128-wide block / 128x128 tile)")
    if routing == "deepseek":
        if weights != "fp8_block_scale":
            raise ValueError("deepseek routing is only templated with fp8_block_scale weights")
        if n_group is None or topk_group is None:
            raise ValueError("deepseek routing needs n_group and topk_group")
        positive_int("n_group", n_group)
        positive_int("topk_group", topk_group)
        if e % n_group:
            raise ValueError(f"num_experts {e} must be a multiple of n_group {n_group}")
        if e // n_group < 2:
            raise ValueError(f"groups of {e // n_group} expert(s): a group scores the sum of its top-2 experts")
        if topk_group > n_group:
            raise ValueError(f"topk_group {topk_group} exceeds n_group {n_group}")
        if top_k > topk_group * (e // n_group):
            raise ValueError(f"top_k {top_k} exceeds the {topk_group * (e // n_group)} experts of the kept groups")
    elif n_group is not None or topk_group is not None:
        raise ValueError("n_group / topk_group apply to deepseek routing only")


def _fp8_axes(e: int, el: int, h: int, i: int, local_desc: str) -> dict[str, Any]:
    return {
        "seq_len": var_axis("Number of tokens."),
        "num_experts": const_axis(e, "Routed experts in total (n_routed_experts)."),
        "num_local_experts": const_axis(el, local_desc),
        "hidden_size": const_axis(h, "Model hidden size."),
        "intermediate_size": const_axis(i, "Expert MLP intermediate size (moe_intermediate_size)."),
        "gemm1_out_size": const_axis(2 * i, "GEMM1 output width, 2 * intermediate_size ([up; gate])."),
        "num_hidden_blocks": const_axis(h // BLOCK, "hidden_size / 128."),
        "num_intermediate_blocks": const_axis(i // BLOCK, "intermediate_size / 128."),
        "num_gemm1_out_blocks": const_axis(2 * i // BLOCK, "gemm1_out_size / 128."),
    }


def _fp8_tensors() -> dict[str, Any]:
    return {
        "hidden_states": tensor(["seq_len", "hidden_size"], FP8, "Token activations, fp8 quantized."),
        "hidden_states_scale": tensor(["num_hidden_blocks", "seq_len"], "float32",
                                      "Activation scales, transposed: [b, t] scales hidden_states[t, 128b:128(b+1)]."),
        "gemm1_weights": tensor(["num_local_experts", "gemm1_out_size", "hidden_size"], FP8,
                                "Fused up/gate projection of each local expert, rows [up; gate]."),
        "gemm1_weights_scale": tensor(["num_local_experts", "num_gemm1_out_blocks", "num_hidden_blocks"], "float32",
                                      "Scale of each 128x128 tile of gemm1_weights."),
        "gemm2_weights": tensor(["num_local_experts", "hidden_size", "intermediate_size"], FP8,
                                "Down projection of each local expert."),
        "gemm2_weights_scale": tensor(["num_local_experts", "num_hidden_blocks", "num_intermediate_blocks"],
                                      "float32", "Scale of each 128x128 tile of gemm2_weights."),
    }


def moe(routing: str, weights: str, top_k: int, num_experts: int, num_local_experts: int, hidden_size: int,
        intermediate_size: int, n_group: int | None = None, topk_group: int | None = None) -> dict[str, Any]:
    routing = choice("routing", routing, ROUTINGS)
    weights = choice("weights", weights, WEIGHTS)
    k = positive_int("top_k", top_k)
    e = positive_int("num_experts", num_experts)
    el = positive_int("num_local_experts", num_local_experts)
    h = positive_int("hidden_size", hidden_size)
    i = positive_int("intermediate_size", intermediate_size)
    _check(routing, weights, k, e, el, h, i, n_group, topk_group)
    local_desc = f"Experts held by this rank (num_experts / ep = {e} / {e // el})."
    offset = tensor(None, "int32", f"Global id of the first local expert (rank * {el}).")
    logits = tensor(["seq_len", "num_experts"], "float32", f"Router (gate) logits for all {e} experts.")
    output = {"output": tensor(["seq_len", "hidden_size"], "bfloat16",
                               "Weighted sum of the local experts' outputs per token.")}
    constraints = ["local_expert_offset >= 0 and local_expert_offset + num_local_experts <= num_experts"]

    if routing == "deepseek":
        assert n_group is not None and topk_group is not None
        group = e // n_group
        return definition(
            name=f"moe_fp8_block_scale_ds_routing_topk{k}_ng{n_group}_kg{topk_group}_e{el}_h{h}_i{i}",
            op_type="moe",
            description=(
                "The routed-expert part of a MoE layer with DeepSeek-V3-style routing and FP8 block-scale weights "
                f"and activations (DeepSeek's FP8 recipe), {_rank_text(e, el)}. {DEQUANT_TEXT} Routing (no-aux-loss "
                "DeepSeek-V3): s = sigmoid(routing_logits); s_biased = s + routing_bias; the "
                f"{e} experts form N_GROUP = {n_group} groups of {group}, a group's score is the sum of its top-2 "
                f"s_biased; the TOPK_GROUP = {topk_group} best groups are kept and the TOP_K = {k} experts with the "
                "highest s_biased among them are chosen (equal scores at either cut go to the lowest group / expert "
                "id, as FlashInfer's routing kernels rank (score, -id) pairs); the routing weights are the UNBIASED "
                "s of the chosen experts, normalised to sum 1, times routed_scaling_factor (a model constant, 2.5 "
                "in DeepSeek-V3). "
                f"{_experts_text(i, fp8=True)}"
            ),
            tags=[STATUS, f"quantization:{FP8}", FP8_API],
            axes=_fp8_axes(e, el, h, i, local_desc),
            constraints=constraints,
            inputs={
                "routing_logits": logits,
                "routing_bias": tensor(["num_experts"], "bfloat16",
                                       "Expert score correction bias (e_score_correction_bias); affects selection "
                                       "only."),
                **_fp8_tensors(),
                "local_expert_offset": offset,
                "routed_scaling_factor": tensor(None, "float32",
                                                "Multiplier of the normalised routing weights (2.5 for DeepSeek-V3)."),
            },
            outputs=output,
            reference=_fill(DS_REFERENCE, TOP_K=k, N_GROUP=n_group, NUM_EXPERTS=e, GROUP_SIZE=group,
                            TOPK_GROUP=topk_group),
        )

    routing_text = RENORM_TEXT.format(k=k, e=e)
    if weights == "fp8_block_scale" and e == el:
        # the public dataset's contract for this name (moe_fp8_block_scale_renorm_topk8_e128_h2048_i768):
        # every expert local, so no local_expert_offset input, and bfloat16 router logits over the local experts
        axes = _fp8_axes(e, el, h, i, local_desc)
        del axes["num_experts"]
        return definition(
            name=f"moe_fp8_block_scale_renorm_topk{k}_e{el}_h{h}_i{i}",
            op_type="moe",
            description=(
                "The routed-expert part of a MoE layer with renormalize (softmax top-k) routing and FP8 block-scale "
                f"weights and activations (DeepSeek's FP8 recipe), with all {e} experts held locally (no expert "
                "parallelism: the local ids are the global ids, and there is no local_expert_offset input, the "
                f"public dataset's contract for this name). {DEQUANT_TEXT} {routing_text} "
                f"{_experts_text(i, fp8=True)}"
            ),
            tags=[STATUS, f"quantization:{FP8}", FP8_API],
            axes=axes,
            constraints=[],
            inputs={"routing_logits": tensor(["seq_len", "num_local_experts"], "bfloat16",
                                             f"Router (gate) logits for all {e} experts, in the gate's bfloat16."),
                    **_fp8_tensors()},
            outputs=output,
            reference=_all_local(_fill(RENORM_FP8_REFERENCE, TOP_K=k)),
        )
    if weights == "fp8_block_scale":
        return definition(
            name=f"moe_fp8_block_scale_renorm_topk{k}_e{el}_h{h}_i{i}",
            op_type="moe",
            description=(
                "The routed-expert part of a MoE layer with renormalize (softmax top-k) routing and FP8 block-scale "
                f"weights and activations (DeepSeek's FP8 recipe), {_rank_text(e, el)}. {DEQUANT_TEXT} "
                f"{routing_text} {_experts_text(i, fp8=True)}"
            ),
            tags=[STATUS, f"quantization:{FP8}", FP8_API],
            axes=_fp8_axes(e, el, h, i, local_desc),
            constraints=constraints,
            inputs={"routing_logits": logits, **_fp8_tensors(), "local_expert_offset": offset},
            outputs=output,
            reference=_fill(RENORM_FP8_REFERENCE, TOP_K=k),
        )

    return definition(
        name=f"moe_bf16_renorm_topk{k}_e{el}_h{h}_i{i}",
        op_type="moe",
        description=(
            "The routed-expert part of a MoE layer with renormalize (softmax top-k) routing and bfloat16 activations "
            f"and weights (no quantization, no scales), {_rank_text(e, el)}. {routing_text} "
            f"{_experts_text(i, fp8=False)}"
        ),
        tags=[STATUS, BF16_API],
        axes={
            "seq_len": var_axis("Number of tokens."),
            "num_experts": const_axis(e, "Routed experts in total."),
            "num_local_experts": const_axis(el, local_desc),
            "hidden_size": const_axis(h, "Model hidden size."),
            "intermediate_size": const_axis(i, "Expert MLP intermediate size."),
            "gemm1_out_size": const_axis(2 * i, "GEMM1 output width, 2 * intermediate_size ([up; gate])."),
        },
        constraints=constraints,
        inputs={
            "routing_logits": logits,
            "hidden_states": tensor(["seq_len", "hidden_size"], "bfloat16", "Token activations."),
            "gemm1_weights": tensor(["num_local_experts", "gemm1_out_size", "hidden_size"], "bfloat16",
                                    "Fused up/gate projection of each local expert, rows [up; gate]."),
            "gemm2_weights": tensor(["num_local_experts", "hidden_size", "intermediate_size"], "bfloat16",
                                    "Down projection of each local expert."),
            "local_expert_offset": offset,
        },
        outputs=output,
        reference=_fill(RENORM_BF16_REFERENCE, TOP_K=k),
    )


def _all_local(reference: str) -> str:
    """A reference without local_expert_offset: every expert is local, at offset 0."""
    reference = replace_once(reference, "gemm2_weights_scale, local_expert_offset):", "gemm2_weights_scale):")
    reference = replace_once(
        reference,
        "    # 3. The local experts (global ids local_expert_offset .. + num_local_experts - 1); tokens routed\n"
        "    #    to experts held elsewhere contribute nothing here.\n",
        "    # 3. Every expert is held here (no expert parallelism): the local id is the global id.\n")
    return replace_once(reference, "hit = topk_ids == local_expert_offset + local", "hit = topk_ids == local")


def _fill(template: str, **values: int) -> str:
    """Substitute each `<NAME>` placeholder (every occurrence: N_GROUP appears twice in one line)."""
    for key, value in values.items():
        placeholder = f"<{key}>"
        if placeholder not in template:
            raise RuntimeError(f"template has no {placeholder}")
        template = template.replace(placeholder, str(value))
    left = re.search(r"<[A-Z_]+>", template)
    if left:
        raise RuntimeError(f"unfilled placeholder {left.group(0)} in reference template")
    return template

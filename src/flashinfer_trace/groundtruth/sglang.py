"""SGLang ground truth: the `sgl_kernel` operators, the fallback where FlashInfer has no API.

`sgl_kernel` (distributed as sgl-kernel up to 0.3.21, then as sglang-kernel) is compiled against
one exact torch version; against any other it fails to import, and that failure, with its
message, is the skip reason the matrix shows. The Triton fused MoE lives in the full `sglang`
package, which is only importable with its serving stack installed; its adapter is declared
against that package so an environment without it says so.
"""

from __future__ import annotations

import torch

from . import semantics as sem
from .base import Adapter, Call, Package

KERNELS = Package("sgl_kernel", ("sglang-kernel", "sgl-kernel"), "sgl_kernel")
# Importing the Triton MoE module imports the serving stack; its failure is the reason to show.
TRITON_MOE = Package("sglang.srt.layers.moe.fused_moe_triton", ("sglang",), "sglang")
HALF = frozenset({"bfloat16", "float16"})


def rmsnorm(call: Call) -> tuple:
    sk, x = call.module, call.inputs.values
    return (sk.rmsnorm(x["hidden_states"], x["weight"], eps=sem.eps(call.definition)),)


def fused_add_rmsnorm(call: Call) -> tuple:
    """In place, FlashInfer's semantics: input <- norm(input + residual) * w, residual <- the sum."""
    sk, x = call.module, call.inputs.values
    hidden, residual = x["hidden_states"].clone(), x["residual"].clone()
    sk.fused_add_rmsnorm(hidden, residual, x["weight"], eps=sem.eps(call.definition))
    return sem.norm_outputs(call.definition, hidden, residual)


def silu_and_mul(call: Call) -> tuple:
    x = call.inputs.values["input"]
    out = torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype, device=x.device)
    result = call.module.silu_and_mul(x, out)
    return (out if result is None else result,)


def rope(call: Call) -> tuple:
    """In place on flattened [tokens, heads * head_dim] copies."""
    sk, x = call.module, call.inputs.values
    q, k = (x[n].clone() for n in sem.rope_rotated(call.definition))
    tokens, _, head_dim = q.shape
    qf, kf = q.view(tokens, -1), k.view(tokens, -1)
    sk.apply_rope_with_cos_sin_cache_inplace(x["positions"], qf, kf, head_dim, x["cos_sin_cache"],
                                             is_neox=sem.rope_is_neox(call.definition))
    return q, k


def sampling(call: Call) -> tuple:
    """top_k_top_p_sampling_from_probs serves all three: a disabled filter is top_k = vocab or top_p = 1."""
    from ..compare_samples import repeat_rows

    sk, d, x = call.module, call.definition, call.inputs.values
    probs = x["probs"]
    batch, vocab = probs.shape
    g = torch.Generator(device=probs.device).manual_seed(call.inputs.seed + 0x56)
    out = torch.empty(batch, call.draws, dtype=torch.int64, device=probs.device)
    for row in range(batch):
        named = dict(zip(x, repeat_rows(d, call.inputs, call.draws, slice(row, row + 1)), strict=True))
        n = named["probs"].shape[0]
        top_k = named.get("top_k", torch.full((n,), vocab, dtype=torch.int32, device=probs.device))
        top_p = named.get("top_p", torch.ones(n, dtype=torch.float32, device=probs.device))
        out[row] = sk.top_k_top_p_sampling_from_probs(named["probs"], top_k, top_p, deterministic=True,
                                                      generator=g).to(torch.int64)
    return (out,)


def triton_moe(call: Call) -> tuple:
    """sglang's Triton fused MoE with fp8 w8a8 128x128 block scales on this rank's experts.

    Differences from the definition that this adapter translates: w13 rows are [gate; up] in
    sglang (the definition has [up; gate]), expert ids are local, and the routing (this
    package's DeepSeek-V3 routing, unscaled) is passed in; routed_scaling_factor goes to the
    runner config, which applies it in the final reduction. Tokens' choices of experts on other
    ranks get weight 0.
    """
    import importlib

    from .torch_ref import dequantized_activations, route

    d, x = call.definition, call.inputs.values
    topk = importlib.import_module("sglang.srt.layers.moe.topk")
    runner = importlib.import_module("sglang.srt.layers.moe.moe_runner")
    block = sem.moe_block(d)
    act = dequantized_activations(d, x).to(torch.bfloat16)
    scaling = float(x.get("routed_scaling_factor", 1.0))
    ids, weights = route(d, {**x, "routed_scaling_factor": 1.0})
    w1, s1 = x["gemm1_weights"], x["gemm1_weights_scale"]
    local, offset = w1.shape[0], sem.expert_offset(call.definition, x)
    mine = (ids >= offset) & (ids < offset + local)
    inter, inter_blocks = w1.shape[1] // 2, s1.shape[1] // 2
    w13 = torch.cat([w1[:, inter:], w1[:, :inter]], dim=1)
    s13 = torch.cat([s1[:, inter_blocks:], s1[:, :inter_blocks]], dim=1).to(torch.float32)
    routing = topk.StandardTopKOutput(torch.where(mine, weights, 0.0).to(torch.float32),
                                      torch.where(mine, ids - offset, 0).to(torch.int32), x["routing_logits"])
    config = runner.MoeRunnerConfig(activation="silu", inplace=False, routed_scaling_factor=scaling)
    out = call.module.fused_experts(act, w13, x["gemm2_weights"], routing, config, use_fp8_w8a8=True,
                                    w1_scale=s13, w2_scale=x["gemm2_weights_scale"].to(torch.float32),
                                    block_shape=[block, block])
    return (out,)


def _has(*names: str):
    return lambda d: sem.missing_inputs(d, names)


ADAPTERS = [
    Adapter("sglang", "rmsnorm", "sgl_kernel.rmsnorm", rmsnorm, package=KERNELS, requires=("rmsnorm",),
            applies=lambda d: "fused add + norm" if sem.is_fused_add(d) else
            sem.missing_inputs(d, ("hidden_states", "weight")), dtypes=HALF, needs_cuda=True, params=(sem.eps,)),
    Adapter("sglang", "rmsnorm", "sgl_kernel.fused_add_rmsnorm", fused_add_rmsnorm, package=KERNELS,
            requires=("fused_add_rmsnorm",),
            applies=lambda d: None if sem.is_fused_add(d) else "not a fused add + norm", dtypes=HALF,
            needs_cuda=True, params=(sem.eps,)),
    Adapter("sglang", "activation", "sgl_kernel.silu_and_mul", silu_and_mul, package=KERNELS,
            requires=("silu_and_mul",), applies=lambda d: None if "silu" in d.name else "only silu_and_mul",
            dtypes=HALF, needs_cuda=True),
    Adapter("sglang", "rope", "sgl_kernel.apply_rope_with_cos_sin_cache_inplace", rope, package=KERNELS,
            requires=("apply_rope_with_cos_sin_cache_inplace",),
            applies=lambda d: _has(*sem.ROPE_TABLES)(d) or (
                None if len(sem.rope_rotated(d)) == 2 else "rotates a query and a key"),
            dtypes=frozenset(HALF | {"float32"}),
            needs_cuda=True, params=(sem.rope_is_neox,)),
    Adapter("sglang", "sampling", "sgl_kernel.top_k_top_p_sampling_from_probs", sampling, package=KERNELS,
            requires=("top_k_top_p_sampling_from_probs",), applies=_has("probs"), needs_cuda=True,
            kind="sampler"),
    Adapter("sglang", "moe", "sglang.srt.layers.moe.fused_moe_triton.fused_experts (fp8 w8a8, block 128)",
            triton_moe, package=TRITON_MOE, requires=("fused_experts",), applies=sem.fp8_moe_applies,
            params=(sem.moe_routing,), needs_cuda=True),
]

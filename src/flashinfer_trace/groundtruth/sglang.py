"""SGLang ground truth: the `sgl_kernel` operators, and the Triton kernels of the full `sglang` package.

`sgl_kernel` (distributed as sgl-kernel up to 0.3.21, then as sglang-kernel) is compiled against
one exact torch version; against any other it fails to import, and that failure, with its
message, is the skip reason the matrix shows. Signatures read from sglang-kernel 0.4.5 (the kernel
of sglang 0.5.16 / 0.5.17, torch 2.11): `rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None)`,
`fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None)`, `silu_and_mul(input, out=None)`;
0.4.5 exports no `apply_rope_with_cos_sin_cache_inplace` and (off MUSA) no `top_k_top_p_sampling_from_probs`
(sglang 0.5.16 calls `sglang.jit_kernel.rope` and FlashInfer's sampler instead), so those two adapters
are `api-missing` there. The Triton fused MoE and attention live in the full `sglang` package, at
paths that moved between releases (sglang_triton.py has the table, and the attention adapters).
"""

from __future__ import annotations

import dataclasses

import torch

from .. import semantics as sem
from . import sglang_triton
from .base import Adapter, Call, Package
from .sglang_triton import FUSED_EXPERTS, ROPE, RUNNER_CONFIG, SGLANG, TOPK_OUTPUT, needs

KERNELS = Package("sgl_kernel", ("sglang-kernel", "sgl-kernel"), "sgl_kernel")
HALF = frozenset({"bfloat16", "float16"})


def rmsnorm(call: Call) -> tuple:
    sk, x = call.module, call.inputs.values
    return (sk.rmsnorm(x["hidden_states"], x["weight"], eps=sem.eps(call.definition, x)),)


def fused_add_rmsnorm(call: Call) -> tuple:
    """In place, FlashInfer's semantics: input <- norm(input + residual) * w, residual <- the sum."""
    sk, x = call.module, call.inputs.values
    hidden, residual = x["hidden_states"].clone(), x["residual"].clone()
    sk.fused_add_rmsnorm(hidden, residual, x["weight"], eps=sem.eps(call.definition, x))
    return sem.norm_outputs(call.definition, hidden, residual)


def silu_and_mul(call: Call) -> tuple:
    x = call.inputs.values["input"]
    out = torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype, device=x.device)
    result = call.module.silu_and_mul(x, out)
    return (out if result is None else result,)


def _rope_in_place(fn, call: Call, *, cache_in_query_dtype: bool = False) -> tuple:
    """fn(positions, q, k, head_dim, cos_sin_cache, is_neox=) in place on flattened [tokens, heads * head_dim]
    copies: sgl_kernel's apply_rope_with_cos_sin_cache_inplace and sglang's JIT rotary_embedding alike."""
    x = call.inputs.values
    q, k = (x[n].clone() for n in sem.rope_rotated(call.definition))
    tokens, _, head_dim = q.shape
    qf, kf = q.view(tokens, -1), k.view(tokens, -1)
    positions, cache = x["positions"], x["cos_sin_cache"]
    if cache_in_query_dtype:
        positions, cache = positions.long(), cache.to(q.dtype)
    fn(positions, qf, kf, head_dim, cache, is_neox=sem.rope_is_neox(call.definition))
    return q, k


def rope(call: Call) -> tuple:
    return _rope_in_place(call.module.apply_rope_with_cos_sin_cache_inplace, call)


def rope_jit(call: Call) -> tuple:
    """The JIT kernel (elementwise/pos_enc.cuh) reads positions as int64 and the cache as the query's own
    dtype, as sglang's RotaryEmbedding keeps it; a float32 cache would be read as bf16 pairs (inf and nan).
    The cos/sin rounding to bf16 is SGLang's, and the matrix shows it."""
    return _rope_in_place(ROPE.get(call.version), call, cache_in_query_dtype=True)


SAMPLER_ROWS_PER_CALL = 4096


def sampling(call: Call) -> tuple:
    """top_k_top_p_sampling_from_probs serves all three: a disabled filter is top_k = vocab or top_p = 1."""
    from ..inputs.sampling import repeat_rows

    sk, d, x = call.module, call.definition, call.inputs.values
    probs = x["probs"]
    batch, vocab = probs.shape
    g = torch.Generator(device=probs.device).manual_seed(call.inputs.seed + 0x56)
    out = torch.empty(batch, call.draws, dtype=torch.int64, device=probs.device)
    for row in range(batch):
        done = 0
        while done < call.draws:  # in chunks: a check's draws would not fit as one batch of repeated rows
            n = min(call.draws - done, SAMPLER_ROWS_PER_CALL)
            named = dict(zip(x, repeat_rows(d, call.inputs, n, slice(row, row + 1)), strict=True))
            top_k = named.get("top_k", torch.full((n,), vocab, dtype=torch.int32, device=probs.device))
            top_p = named.get("top_p", torch.ones(n, dtype=torch.float32, device=probs.device))
            out[row, done:done + n] = sk.top_k_top_p_sampling_from_probs(
                named["probs"], top_k, top_p, deterministic=True, generator=g).to(torch.int64)
            done += n
    return (out,)


def publish_server_args() -> None:
    """fused_experts reads the process's ServerArgs (`enable_fused_moe_sum_all_reduce`; 0.5.17 through
    `get_exec()`, which exists only once ServerArgs are published) and raises "Global server args is
    not set yet!" without them. When none are published, publish sglang's defaults for a dummy model
    (`model_path="dummy"` skips every model lookup in ServerArgs.__post_init__) through the setter
    every release read has, `server_args.set_global_server_args_for_scheduler`."""
    import importlib

    sa = importlib.import_module("sglang.srt.server_args")
    try:
        sa.get_global_server_args()
        return
    except ValueError:
        pass
    sa.set_global_server_args_for_scheduler(sa.ServerArgs(model_path="dummy"))


def triton_moe(call: Call) -> tuple:
    """sglang's Triton fused MoE with fp8 w8a8 128x128 block scales on this rank's experts.

    Differences from the definition that this adapter translates: w13 rows are [gate; up] in
    sglang (the definition has [up; gate]), expert ids are local, and the routing (this
    package's DeepSeek-V3 routing, unscaled) is passed in; routed_scaling_factor goes to the
    runner config, which applies it in the final reduction. Tokens' choices of experts on other
    ranks get weight 0. The runner runs in place on a copy of the activations: its out-of-place
    path allocates the output through the tensor-parallel group (`get_tp_group()`), which exists
    only inside a server. num_experts = num_local_experts (this rank's experts), as in a
    tensor-parallel deployment, so no expert filtering applies.
    """
    from .torch_ref import dequantized_activations, route

    d, x, v = call.definition, call.inputs.values, call.version
    fused_experts, topk_output, runner_config = (loc.get(v) for loc in (FUSED_EXPERTS, TOPK_OUTPUT, RUNNER_CONFIG))
    publish_server_args()
    block = sem.moe_block(d, x)
    act = dequantized_activations(d, x).to(torch.bfloat16, copy=True).contiguous()  # overwritten in place
    scaling = float(x.get("routed_scaling_factor", 1.0))
    ids, weights = route(d, {**x, "routed_scaling_factor": 1.0})
    w1, s1 = x["gemm1_weights"], x["gemm1_weights_scale"]
    local, offset = w1.shape[0], sem.expert_offset(call.definition, x)
    mine = (ids >= offset) & (ids < offset + local)
    inter, inter_blocks = w1.shape[1] // 2, s1.shape[1] // 2
    w13 = torch.cat([w1[:, inter:], w1[:, :inter]], dim=1).contiguous()
    s13 = torch.cat([s1[:, inter_blocks:], s1[:, :inter_blocks]], dim=1).to(torch.float32).contiguous()
    routing = topk_output(torch.where(mine, weights, 0.0).to(torch.float32),
                          torch.where(mine, ids - offset, 0).to(torch.int32), x["routing_logits"])
    fields = {f.name for f in dataclasses.fields(runner_config)}
    sizes = {k: val for k, val in (("num_experts", local), ("num_local_experts", local), ("top_k", ids.shape[1]))
             if k in fields}
    config = runner_config(activation="silu", inplace=True, routed_scaling_factor=scaling, **sizes)
    out = fused_experts(act, w13, x["gemm2_weights"].contiguous(), routing, config, use_fp8_w8a8=True,
                        w1_scale=s13, w2_scale=x["gemm2_weights_scale"].to(torch.float32).contiguous(),
                        block_shape=[block, block])
    return (act if out is None else out,)


def _has(*names: str):
    return lambda d: sem.missing_inputs(d, names)


ADAPTERS = [
    Adapter("sglang", "rmsnorm", "sgl_kernel.rmsnorm", rmsnorm, package=KERNELS, requires=("rmsnorm",),
            applies=sem.plain_rmsnorm, dtypes=HALF, needs_cuda=True, params=(sem.eps,)),
    Adapter("sglang", "rmsnorm", "sgl_kernel.fused_add_rmsnorm", fused_add_rmsnorm, package=KERNELS,
            requires=("fused_add_rmsnorm",),
            applies=sem.fused_add_rmsnorm, dtypes=HALF, needs_cuda=True, params=(sem.eps,)),
    Adapter("sglang", "activation", "sgl_kernel.silu_and_mul", silu_and_mul, package=KERNELS,
            requires=("silu_and_mul",), applies=lambda d: None if "silu" in d.name else "only silu_and_mul",
            dtypes=HALF, needs_cuda=True),
    Adapter("sglang", "rope", "sgl_kernel.apply_rope_with_cos_sin_cache_inplace", rope, package=KERNELS,
            requires=("apply_rope_with_cos_sin_cache_inplace",),
            applies=lambda d: _has(*sem.ROPE_TABLES)(d) or (
                None if len(sem.rope_rotated(d)) == 2 else "rotates a query and a key"),
            dtypes=frozenset(HALF | {"float32"}),
            needs_cuda=True, params=(sem.rope_is_neox,)),
    Adapter("sglang", "rope", "sglang rotary_embedding (JIT kernel)", rope_jit, package=SGLANG, resolve=needs(ROPE),
            applies=lambda d: _has(*sem.ROPE_TABLES)(d) or (
                None if len(sem.rope_rotated(d)) == 2 else "rotates a query and a key"),
            dtypes=frozenset(HALF | {"float32"}), needs_cuda=True, params=(sem.rope_is_neox,)),
    Adapter("sglang", "sampling", "sgl_kernel.top_k_top_p_sampling_from_probs", sampling, package=KERNELS,
            requires=("top_k_top_p_sampling_from_probs",),
            applies=lambda d: _has("probs")(d) or (None if d.is_sampler else "not a sampler (sglang_topk.py)") or (
                "a min-p sampler (sglang_samplers.py)" if "min_p" in d.inputs else None),
            needs_cuda=True,
            kind="sampler"),
    Adapter("sglang", "moe", "sglang Triton fused_experts (fp8 w8a8, block 128)", triton_moe, package=SGLANG,
            resolve=needs(FUSED_EXPERTS, TOPK_OUTPUT, RUNNER_CONFIG), applies=sem.fp8_moe_applies,
            params=(sem.moe_routing,), needs_cuda=True),
    *sglang_triton.ADAPTERS,
]

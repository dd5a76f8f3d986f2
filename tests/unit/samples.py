"""Sample definitions shared by the unit tests."""

VALID = {
    "name": "rmsnorm_h8",
    "op_type": "rmsnorm",
    "description": "A tiny RMSNorm used by the unit tests.",
    "tags": ["status:reference", "model:toy", "param:eps=1e-05"],  # the reference's EPS, declared
    "axes": {
        "batch_size": {"type": "var"},
        "hidden_size": {"type": "const", "value": 8},
    },
    "constraints": ["hidden_size == weight.shape[0]"],
    "inputs": {
        "hidden_states": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"},
        "weight": {"shape": ["hidden_size"], "dtype": "bfloat16"},
    },
    "outputs": {"output": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"}},
    "reference": (
        "import torch\n\nEPS = 1e-5\n\n\n@torch.no_grad()\ndef run(hidden_states, weight):\n"
        "    x = hidden_states.to(torch.float32)\n"
        "    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)\n"
        "    return (y * weight.to(torch.float32)).to(hidden_states.dtype)\n"
    ),
}

# One or two shipped definitions per op family (the first ones written): the unit tests exercise
# generators and ground truths on these; tests/references covers every shipped definition.
REPRESENTATIVES = (
    "rmsnorm_h4096", "fused_add_rmsnorm_h4096", "gemm_n4096_k4096", "gqa_paged_decode_h32_kv8_d128_ps1",
    "gqa_paged_prefill_causal_h32_kv8_d128_ps1", "gqa_ragged_prefill_causal_h32_kv8_d128",
    "mla_paged_decode_h16_ckv512_kpe64_ps1", "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1",
    "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048",
    "rope_with_cos_sin_cache_neox_style_h32_kv8_d128_rd128", "silu_and_mul_i14336",
    "top_k_sampling_from_probs_v128256", "top_p_sampling_from_probs_v128256",
    "top_k_top_p_sampling_from_probs_v128256",
)

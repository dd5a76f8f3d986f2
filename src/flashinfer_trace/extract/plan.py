"""Which kernels a model's serving stack runs: an architecture's config -> kernel specs.

One plan per architecture family, built from shared pieces (norms, attention, GEMMs, sampling);
tensor parallelism shards heads, intermediate sizes and the vocabulary, expert parallelism the
experts. Linear layers are GEMMs in the dataset's convention (`gemm_n{N}_k{K}`, C = A @ B^T, fp16),
whatever the checkpoint's dtype; DeepSeek's absorbed kv_b batched matmuls and its ragged MHA
prefill have no template and are listed as left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .config import ConfigError, ModelConfig


@dataclass(frozen=True)
class KernelSpec:
    family: str  # a key of templates.FAMILIES
    params: tuple[tuple[str, Any], ...]  # the template's keyword arguments
    roles: tuple[str, ...]  # where the model runs it: "o_proj", "input_layernorm", ...
    parallel: tuple[str, ...] = ()  # "tp:8", "ep:8"

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)


@dataclass
class Plan:
    config: ModelConfig
    kernels: list[KernelSpec] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # parts of the model with no template, and why

    def add(self, family: str, role: str, parallel: tuple[str, ...] = (), **params: Any) -> None:
        key = tuple(sorted(params.items()))
        for i, k in enumerate(self.kernels):
            if k.family == family and k.params == key:
                if role not in k.roles:
                    self.kernels[i] = KernelSpec(family, key, (*k.roles, role), tuple(sorted({*k.parallel, *parallel})))
                return
        self.kernels.append(KernelSpec(family, key, (role,), parallel))


def _shard(what: str, value: int, ways: int, flag: str) -> int:
    if value % ways:
        raise ConfigError(f"{what} {value} is not divisible by {flag} {ways}")
    return value // ways


def _kv_heads(kv: int, tp: int) -> int:
    """KV heads per GPU: sharded while there are enough, else replicated (one per GPU)."""
    if kv >= tp:
        return _shard("num_key_value_heads", kv, tp, "--tp")
    if tp % kv:
        raise ConfigError(f"--tp {tp} neither divides nor is a multiple of num_key_value_heads {kv}")
    return 1


def _norms(p: Plan, hidden: int, eps: float) -> None:
    p.add("rmsnorm", "final_norm", hidden_size=hidden, eps=eps)
    p.add("fused_add_rmsnorm", "input_layernorm / post_attention_layernorm (residual add fused)",
          hidden_size=hidden, eps=eps)


def _gqa(p: Plan, heads: int, kv: int, head_dim: int, page_size: int, tp: tuple[str, ...]) -> None:
    for stage in ("decode", "prefill"):
        p.add("gqa_paged", f"attention ({stage}, paged KV cache)", tp, stage=stage, num_qo_heads=heads,
              num_kv_heads=kv, head_dim=head_dim, page_size=page_size)
    p.add("gqa_ragged", "attention (prefill without cached prefix, ragged KV)", tp, num_qo_heads=heads,
          num_kv_heads=kv, head_dim=head_dim)


def _rope(p: Plan, cfg: ModelConfig, heads: int, kv: int, head_dim: int, tp: tuple[str, ...], neox: bool = True
          ) -> None:
    rotary = int(head_dim * float(cfg.get("partial_rotary_factor") or 1.0))
    p.add("rope", "rotary embedding of q and k (cos/sin cache)", tp, num_qo_heads=heads, num_kv_heads=kv,
          head_dim=head_dim, rotary_dim=rotary, neox=neox)


def _sampling(p: Plan, vocab: int) -> None:
    for kind in ("top_k", "top_p", "top_k_top_p"):
        p.add("sampling", f"{kind.replace('_', '-')} sampling of the next token", kind=kind, vocab_size=vocab)


def _lm_head(p: Plan, vocab: int, hidden: int, tp: int, tags: tuple[str, ...]) -> None:
    p.add("gemm", "lm_head (vocabulary-parallel)", tags, n=math.ceil(vocab / tp), k=hidden)


def _dense_mlp(p: Plan, hidden: int, inter: int, tp: int, tags: tuple[str, ...], role: str) -> None:
    local = _shard(f"{role} intermediate_size", inter, tp, "--tp")
    p.add("gemm", f"{role} gate_up_proj", tags, n=2 * local, k=hidden)
    p.add("silu_and_mul", f"{role} activation (silu(gate) * up)", tags, intermediate_size=local)
    p.add("gemm", f"{role} down_proj", tags, n=hidden, k=local)


def _attention_gemms(p: Plan, hidden: int, heads: int, kv: int, head_dim: int, tags: tuple[str, ...]) -> None:
    p.add("gemm", "qkv_proj", tags, n=(heads + 2 * kv) * head_dim, k=hidden)
    p.add("gemm", "o_proj", tags, n=hidden, k=heads * head_dim)


def _heads(cfg: ModelConfig) -> tuple[int, int, int]:
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return heads, kv, head_dim


def _experts(cfg: ModelConfig, experts: int, inter: int) -> tuple[int, int, tuple[str, ...]]:
    """(local experts, intermediate per local expert, tags): expert parallelism splits the experts,
    plain tensor parallelism splits every expert's intermediate size."""
    if cfg.ep > 1:
        return _shard("experts", experts, cfg.ep, "--ep"), inter, (f"ep:{cfg.ep}",)
    return experts, _shard("moe intermediate_size", inter, cfg.tp, "--tp"), (f"tp:{cfg.tp}",)


def _moe(p: Plan, cfg: ModelConfig, routing: str, experts: int, inter: int, top_k: int, **extra: Any) -> None:
    local, local_inter, tags = _experts(cfg, experts, inter)
    weights = "fp8_block_scale" if cfg.fp8_block else "bfloat16"
    p.add("moe", f"routed experts ({routing} routing)", tags, routing=routing, weights=weights, top_k=top_k,
          num_experts=experts, num_local_experts=local, hidden_size=cfg["hidden_size"],
          intermediate_size=local_inter, **extra)


# -- the architectures ----------------------------------------------------------------------------------
def plan_llama(cfg: ModelConfig, page_size: int) -> Plan:
    p, tp = Plan(cfg), cfg.tp
    hidden, tag = cfg["hidden_size"], (f"tp:{tp}",)
    heads, kv, d = _heads(cfg)
    h, k = _shard("num_attention_heads", heads, tp, "--tp"), _kv_heads(kv, tp)
    _norms(p, hidden, cfg["rms_norm_eps"])
    _attention_gemms(p, hidden, h, k, d, tag)
    _gqa(p, h, k, d, page_size, tag)
    _rope(p, cfg, h, k, d, tag)
    if cfg.family == "llama":
        _dense_mlp(p, hidden, cfg["intermediate_size"], tp, tag, "mlp")
    _lm_head(p, cfg["vocab_size"], hidden, tp, tag)
    _sampling(p, cfg["vocab_size"])
    return p


def plan_mixtral(cfg: ModelConfig, page_size: int) -> Plan:
    p = plan_llama(cfg, page_size)
    hidden, experts = cfg["hidden_size"], cfg["num_local_experts"]
    p.add("gemm", "router gate", (), n=experts, k=hidden)
    _moe(p, cfg, "renormalize", experts, cfg["intermediate_size"], cfg["num_experts_per_tok"])
    return p


def plan_qwen_moe(cfg: ModelConfig, page_size: int) -> Plan:
    if cfg.get("norm_topk_prob") is False:
        raise ConfigError(f"{cfg.source}: norm_topk_prob: false (softmax top-k weights without renormalisation) "
                          f"has no MoE template yet")
    p = plan_llama(cfg, page_size)
    hidden, experts, tp = cfg["hidden_size"], cfg["num_experts"], cfg.tp
    _, _, d = _heads(cfg)
    if cfg["model_type"] == "qwen3_moe":  # per-head q/k RMSNorm before RoPE
        p.add("rmsnorm", "q_norm / k_norm (per head)", hidden_size=d, eps=cfg["rms_norm_eps"])
    p.add("gemm", "router gate", (), n=experts, k=hidden)
    _moe(p, cfg, "renormalize", experts, cfg["moe_intermediate_size"], cfg["num_experts_per_tok"])
    shared = cfg.get("shared_expert_intermediate_size") or 0
    if shared:
        _dense_mlp(p, hidden, shared, tp, (f"tp:{tp}",), "shared expert")
        p.left_out.append("shared_expert_gate (a 1-wide sigmoid gate on the shared expert): no template")
    dense = cfg.get("mlp_only_layers") or []
    if dense or (cfg.get("decoder_sparse_step") or 1) > 1:
        _dense_mlp(p, hidden, cfg["intermediate_size"], tp, (f"tp:{tp}",), "dense mlp")
    return p


def plan_deepseek_v3(cfg: ModelConfig, page_size: int) -> Plan:
    p, tp = Plan(cfg), cfg.tp
    hidden, eps, tag = cfg["hidden_size"], cfg["rms_norm_eps"], (f"tp:{tp}",)
    heads = _shard("num_attention_heads", cfg["num_attention_heads"], tp, "--tp")
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    q_lora, kv_lora = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    _norms(p, hidden, eps)
    p.add("rmsnorm", "q_a_layernorm", hidden_size=q_lora, eps=eps)
    p.add("rmsnorm", "kv_a_layernorm", hidden_size=kv_lora, eps=eps)
    p.add("gemm", "fused_qkv_a_proj_with_mqa", (), n=q_lora + kv_lora + rope, k=hidden)
    p.add("gemm", "q_b_proj", tag, n=heads * (nope + rope), k=q_lora)
    p.add("gemm", "o_proj", tag, n=hidden, k=heads * v)
    for stage in ("decode", "prefill"):
        p.add("mla_paged", f"MLA attention ({stage}, absorbed, paged latent cache)", tag, stage=stage,
              num_qo_heads=heads, head_dim_ckv=kv_lora, head_dim_kpe=rope, page_size=page_size)
    p.add("mla_ragged", "MLA prefill without a cached prefix (ragged MHA, kv_b_proj expanded)", tag,
          num_heads=heads, qk_dim=nope + rope, vo_dim=v)
    p.add("rope", "rotary embedding of q_pe and k_pe (interleaved)", tag, num_qo_heads=heads, num_kv_heads=1,
          head_dim=rope, rotary_dim=rope, neox=False)
    _dense_mlp(p, hidden, cfg["intermediate_size"], tp, tag, f"dense mlp (first {cfg['first_k_dense_replace']} layers)")
    _dense_mlp(p, hidden, cfg["n_shared_experts"] * cfg["moe_intermediate_size"], tp, tag, "shared expert")
    p.add("gemm", "router gate", (), n=cfg["n_routed_experts"], k=hidden)
    if cfg.fp8_block:
        _moe(p, cfg, "deepseek", cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["num_experts_per_tok"],
             n_group=cfg["n_group"], topk_group=cfg["topk_group"])
    _lm_head(p, cfg["vocab_size"], hidden, tp, tag)
    _sampling(p, cfg["vocab_size"])
    p.left_out.append("kv_b_proj absorbed into q (w_kc) and out (w_vc) batched matmuls: no bmm template")
    if not cfg.fp8_block:
        p.left_out.append("routed experts: bf16 weights, but the DeepSeek-routing MoE template is fp8 block-scale")
    return p


LAYER_KINDS = {"M": "mamba2", "*": "attention", "-": "mlp"}


def plan_nemotron_h(cfg: ModelConfig, page_size: int) -> Plan:
    """Nemotron-H: a hybrid_override_pattern of Mamba2 (M), attention (*) and MLP (-) layers, each a
    pre-norm residual block. The attention layers have no positional embedding (no RoPE); the MLP is
    up -> relu(x)^2 -> down, not gated. Mamba2 decode is in_proj, a causal conv1d update, the selective
    state update, a gated RMSNorm and out_proj; tensor parallelism splits heads and groups."""
    p, tp = Plan(cfg), cfg.tp
    hidden, tag = cfg["hidden_size"], (f"tp:{tp}",)
    pattern = cfg["hybrid_override_pattern"]
    unknown = sorted(set(pattern) - set(LAYER_KINDS))
    if unknown:
        raise ConfigError(f"{cfg.source}: hybrid_override_pattern: layer kind(s) {', '.join(map(repr, unknown))} "
                          f"not supported (M mamba2, * attention, - mlp)")
    layers = cfg.get("num_hidden_layers")
    if layers is not None and layers != len(pattern):
        raise ConfigError(f"{cfg.source}: hybrid_override_pattern: {len(pattern)} layers, num_hidden_layers {layers}")
    _norms(p, hidden, cfg["layer_norm_epsilon"])
    if "M" in pattern:
        heads = _shard("mamba_num_heads", cfg["mamba_num_heads"], tp, "--tp")
        groups = _shard("n_groups", cfg["n_groups"], tp, "--tp")
        head_dim, state = cfg["mamba_head_dim"], cfg["ssm_state_size"]
        inner = heads * head_dim
        p.add("gemm", "mamba in_proj ([z, x, B, C, dt])", tag, n=2 * inner + 2 * groups * state + heads, k=hidden)
        p.add("mamba_ssu", "mamba2 selective state update (decode)", tag, nheads=heads, head_dim=head_dim,
              dstate=state, ngroups=groups)
        p.add("gemm", "mamba out_proj", tag, n=hidden, k=inner)
        p.left_out += [f"mamba causal conv1d (kernel {cfg['conv_kernel']}) state update and prefill: no template",
                       "mamba prefill (chunked SSD scan): no template",
                       f"mamba gated RMSNorm (rmsnorm(y * silu(z)) in groups of {inner // groups}): no template"]
    if "*" in pattern:
        heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        d = cfg.get("attention_head_dim") or cfg.get("head_dim") or hidden // heads
        h, k = _shard("num_attention_heads", heads, tp, "--tp"), _kv_heads(kv, tp)
        _attention_gemms(p, hidden, h, k, d, tag)
        _gqa(p, h, k, d, page_size, tag)
    if "-" in pattern:
        local = _shard("mlp intermediate_size", cfg["intermediate_size"], tp, "--tp")
        p.add("gemm", "mlp up_proj", tag, n=local, k=hidden)
        p.add("gemm", "mlp down_proj", tag, n=hidden, k=local)
        p.left_out.append("mlp activation relu(x)^2 (squared ReLU, not gated): no template")
    _lm_head(p, cfg["vocab_size"], hidden, tp, tag)
    _sampling(p, cfg["vocab_size"])
    return p


# DeepSeek's lightning indexer keeps its fp8 keys in pages of 64 tokens (DeepGEMM's paged MQA logits need it)
DSA_INDEXER_PAGE_SIZE = 64


def plan_deepseek_v32(cfg: ModelConfig, page_size: int) -> Plan:
    """DeepSeek-V3.2: V3's kernels plus DeepSeek sparse attention: the fp8 top-k indexer (its heads are
    not split by tensor parallelism) and MLA over the selected tokens, at --page-size and at the
    indexer's page size."""
    p, tp = plan_deepseek_v3(cfg, page_size), cfg.tp
    heads = _shard("num_attention_heads", cfg["num_attention_heads"], tp, "--tp")
    topk = cfg["index_topk"]
    for ps in sorted({page_size, DSA_INDEXER_PAGE_SIZE}):
        p.add("dsa_sparse_attention", "sparse MLA over the indexer's top-k tokens (absorbed, paged latent cache)",
              (f"tp:{tp}",), num_qo_heads=heads, head_dim_ckv=cfg["kv_lora_rank"],
              head_dim_kpe=cfg["qk_rope_head_dim"], topk=topk, page_size=ps)
    p.add("dsa_topk_indexer", "lightning indexer: fp8 index scores + top-k (replicated on every GPU)",
          (f"tp:{tp}",), num_index_heads=cfg["index_n_heads"], index_head_dim=cfg["index_head_dim"], topk=topk,
          page_size=DSA_INDEXER_PAGE_SIZE)
    p.left_out.append("the indexer's wq_b / wk / weights_proj projections, its k LayerNorm and the fp8 "
                      "quantisation of its q and k: not planned")
    return p


def plan_qwen3_next(cfg: ModelConfig, page_size: int) -> Plan:
    """Qwen3-Next: gated DeltaNet linear attention in three of every `full_attention_interval` layers,
    gated full attention (q_proj also emits a sigmoid output gate; partial RoPE) in the others, and a
    512-expert renormalize-routed MoE with a shared expert in every layer. The DeltaNet layer is
    in_proj_qkvz and in_proj_ba, a causal conv1d, the gated delta rule (decode, MTP verification of
    draft tokens, varlen prefill; q and k L2-normalised), a gated RMSNorm and out_proj; tensor
    parallelism splits its key and value heads."""
    if cfg.get("norm_topk_prob") is False:
        raise ConfigError(f"{cfg.source}: norm_topk_prob: false has no MoE template yet")
    p, tp = Plan(cfg), cfg.tp
    hidden, tag = cfg["hidden_size"], (f"tp:{tp}",)
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    if dk != dv:
        raise ConfigError(f"{cfg.source}: linear_key_head_dim {dk} != linear_value_head_dim {dv}: the gdn template "
                          f"has one head_size")
    hk = _shard("linear_num_key_heads", cfg["linear_num_key_heads"], tp, "--tp")
    hv = _shard("linear_num_value_heads", cfg["linear_num_value_heads"], tp, "--tp")
    p.add("gemm", "linear attention in_proj_qkvz", tag, n=2 * hk * dk + 2 * hv * dv, k=hidden)
    p.add("gemm", "linear attention in_proj_ba", tag, n=2 * hv, k=hidden)
    for stage, role in (("decode", "gated delta rule (decode, recurrent state)"),
                        ("mtp", "gated delta rule (MTP: verify draft tokens, state pool)"),
                        ("prefill", "gated delta rule (varlen prefill, chunked)")):
        p.add("gdn", role, tag, stage=stage, num_q_heads=hk, num_v_heads=hv, head_size=dk)
    p.add("gemm", "linear attention out_proj", tag, n=hidden, k=hv * dv)
    heads, kv, d = _heads(cfg)
    h, k = _shard("num_attention_heads", heads, tp, "--tp"), _kv_heads(kv, tp)
    p.add("gemm", "full attention qkv_proj (q with its output gate, k, v)", tag, n=(2 * h + 2 * k) * d, k=hidden)
    p.add("gemm", "full attention o_proj", tag, n=hidden, k=h * d)
    _gqa(p, h, k, d, page_size, tag)
    _rope(p, cfg, h, k, d, tag)
    experts = cfg["num_experts"]
    p.add("gemm", "router gate", (), n=experts, k=hidden)
    _moe(p, cfg, "renormalize", experts, cfg["moe_intermediate_size"], cfg["num_experts_per_tok"])
    shared = cfg.get("shared_expert_intermediate_size") or 0
    if shared:
        _dense_mlp(p, hidden, shared, tp, tag, "shared expert")
    _lm_head(p, cfg["vocab_size"], hidden, tp, tag)
    _sampling(p, cfg["vocab_size"])
    p.left_out += [
        "input / post-attention / final / q / k norms are zero-centred (x * (1 + w), Gemma style): no template",
        f"linear attention causal conv1d (kernel {cfg['linear_conv_kernel_dim']}) over q, k, v: no template",
        "linear attention gated RMSNorm (rmsnorm(o) * silu(z)): no template",
        "full attention output gate (o * sigmoid(gate)) and shared_expert_gate: no template",
    ]
    return p


PLANNERS = {"llama": plan_llama, "mixtral": plan_mixtral, "qwen_moe": plan_qwen_moe, "deepseek_v3": plan_deepseek_v3,
            "nemotron_h": plan_nemotron_h,
            "deepseek_v32": plan_deepseek_v32, "qwen3_next": plan_qwen3_next}


def plan(cfg: ModelConfig, *, page_size: int = 1) -> Plan:
    if page_size < 1:
        raise ConfigError(f"--page-size {page_size}: must be >= 1")
    return PLANNERS[cfg.family](cfg, page_size)

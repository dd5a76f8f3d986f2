"""op_type -> the family generator that makes its inputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from . import (
    activation,
    attention,
    block_sparse,
    bmm,
    cascade,
    cascade_attention,
    dequantize_fp4,
    dsa,
    gdn,
    gemm,
    gemm_bf16,
    gemm_fp8,
    gemma_norm,
    layernorm,
    mamba,
    mhc,
    moe,
    moe_routing,
    norm,
    page_append,
    pod,
    rope,
    samplers,
    sampling,
    segment_gemm,
    single_attention,
    speculative,
    topk,
    topk_select,
    trtllm_paged,
    xqa,
)
from .common import Builder, UnsupportedOpType

_MODULES: tuple[ModuleType, ...] = (norm, gemm, attention, moe, rope, activation, sampling, gdn, mamba, dsa, cascade,
                                     page_append, single_attention, layernorm, topk_select, bmm, moe_routing,
                                     segment_gemm, block_sparse, cascade_attention,
                                     pod, mhc, dequantize_fp4,
                                     gemm_fp8, gemm_bf16, trtllm_paged, xqa)


@dataclass(frozen=True)
class Family:
    name: str  # the module: "attention"
    generate: Callable[[Builder], None]
    edge_cases: Callable[..., list[str]]


FAMILIES: dict[str, Family] = {
    op: Family(m.__name__.rsplit(".", 1)[-1], m.generate, m.edge_cases) for m in _MODULES for op in m.OP_TYPES
}
# Generators that share an op type with a family above and take the definitions their `claims` accepts:
# FlashInfer files the deterministic filters (top_k_renorm_probs, ...) under `sampling`, beside the samplers, and
# the Gemma norms (gemma_rmsnorm, gemma_fused_add_rmsnorm) under `rmsnorm`, beside the plain ones; samplers.py
# takes the samplers other than top-k / top-p over probabilities (min-p, plain, from logits), speculative.py chain
# speculative sampling (draft and target probabilities, draft token ids).
_CLAIMING: tuple[ModuleType, ...] = (topk, gemma_norm, samplers, speculative)


def supported_op_types() -> list[str]:
    return sorted(FAMILIES)


def family_for(definition) -> Family:
    for m in _CLAIMING:
        if m.claims(definition):
            return Family(m.__name__.rsplit(".", 1)[-1], m.generate, m.edge_cases)
    try:
        return FAMILIES[definition.op_type]
    except KeyError:
        raise UnsupportedOpType(
            f"no input generator for op_type {definition.op_type!r} (definition {definition.name!r}; "
            f"supported: {', '.join(supported_op_types())})"
        ) from None

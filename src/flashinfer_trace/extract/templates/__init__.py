"""Op-family templates: each family's reference is written once and instantiated with a definition's
const axes and parameters. An instantiated dict is a complete, standalone definition in the public
flashinfer-trace format that passes `flashinfer_trace.validate.check_data`.

Templates return family-level tags only (`status:reference`, `fi_api:...`, `stage:...`, `fused`,
`quantization:...`); model, tp and ep tags are the extractor's to add.

    FAMILIES["rmsnorm"](hidden_size=4096, eps=1e-5)["name"] == "rmsnorm_h4096"
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import (
    dsa_paged,
    fused_add_rmsnorm,
    gdn,
    gemm,
    gqa_paged,
    gqa_ragged,
    mamba_ssu,
    mla_paged,
    mla_ragged,
    moe,
    rmsnorm,
    rope,
    sampling,
    silu_and_mul,
)

__all__ = ["FAMILIES"]

FAMILIES: dict[str, Callable[..., dict[str, Any]]] = {
    "rmsnorm": rmsnorm.rmsnorm,
    "fused_add_rmsnorm": fused_add_rmsnorm.fused_add_rmsnorm,
    "gemm": gemm.gemm,
    "gqa_paged": gqa_paged.gqa_paged,
    "gqa_ragged": gqa_ragged.gqa_ragged,
    "mla_paged": mla_paged.mla_paged,
    "mla_ragged": mla_ragged.mla_ragged,
    "rope": rope.rope,
    "silu_and_mul": silu_and_mul.silu_and_mul,
    "sampling": sampling.sampling,
    "moe": moe.moe,
    "mamba_ssu": mamba_ssu.mamba_ssu,
    "dsa_sparse_attention": dsa_paged.dsa_sparse_attention,
    "dsa_topk_indexer": dsa_paged.dsa_topk_indexer,
    "gdn": gdn.gdn,
}

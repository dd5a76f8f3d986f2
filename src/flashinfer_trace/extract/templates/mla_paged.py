"""Multi-head latent attention (absorbed form) over a paged latent cache, decode and causal prefill:
`mla_paged_decode_h{H}_ckv{C}_kpe{K}_ps{P}` and `mla_paged_prefill_causal_h{H}_ckv{C}_kpe{K}_ps{P}`
(flashinfer.mla.BatchMLAPagedAttentionWrapper).

page_size 1 gives the shipped references verbatim (`ckv_cache[pages, 0]`); page_size > 1 gathers whole
pages (`ckv_cache[pages].flatten(0, 1)`): without a kv_last_page_len input every page is full.
"""

from __future__ import annotations

from typing import Any

from . import _attention as att
from ._common import STATUS, choice, const_axis, definition, positive_int, replace_once, tensor

DECODE_REFERENCE = """import math
import torch


@torch.no_grad()
def run(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale):
    batch_size, num_qo_heads, head_dim_ckv = q_nope.shape

    output = torch.zeros(batch_size, num_qo_heads, head_dim_ckv, dtype=torch.float32, device=q_nope.device)
    lse = torch.full((batch_size, num_qo_heads), -math.inf, dtype=torch.float32, device=q_nope.device)

    for b in range(batch_size):
        start = int(kv_indptr[b].item())
        end = int(kv_indptr[b + 1].item())
        if end == start:
            continue  # no kv tokens: output stays 0, lse stays -inf
        # page_size is 1, so each page holds one token (slot 0 of the page)
        pages = kv_indices[start:end].long()
        ckv = ckv_cache[pages, 0].to(torch.float32)  # [kv_len, head_dim_ckv]: latent, both key and value
        kpe = kpe_cache[pages, 0].to(torch.float32)  # [kv_len, head_dim_kpe]: rotary part of the key
        qn = q_nope[b].to(torch.float32)  # [num_qo_heads, head_dim_ckv]
        qp = q_pe[b].to(torch.float32)  # [num_qo_heads, head_dim_kpe]

        # Every head shares the single latent kv "head".
        logits = (qn @ ckv.T + qp @ kpe.T) * sm_scale  # [num_qo_heads, kv_len]
        probs = torch.softmax(logits, dim=-1)
        output[b] = probs @ ckv
        lse[b] = torch.logsumexp(logits, dim=-1) / math.log(2.0)  # base 2

    return output.to(q_nope.dtype), lse
"""

DECODE_PS1_GATHER = """\
        # page_size is 1, so each page holds one token (slot 0 of the page)
        pages = kv_indices[start:end].long()
        ckv = ckv_cache[pages, 0].to(torch.float32)  # [kv_len, head_dim_ckv]: latent, both key and value
        kpe = kpe_cache[pages, 0].to(torch.float32)  # [kv_len, head_dim_kpe]: rotary part of the key
"""

DECODE_FULL_PAGES_GATHER = """\
        # Every page is full: the request's tokens are all page_size slots of its pages, pages in
        # kv_indices order and slots in order within a page (kv_len = number of pages * page_size).
        pages = kv_indices[start:end].long()
        ckv = ckv_cache[pages].flatten(0, 1).to(torch.float32)  # [kv_len, head_dim_ckv]: latent, key and value
        kpe = kpe_cache[pages].flatten(0, 1).to(torch.float32)  # [kv_len, head_dim_kpe]: rotary part of the key
"""

PREFILL_REFERENCE = """import math
import torch


@torch.no_grad()
def run(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    total_q, num_qo_heads, head_dim_ckv = q_nope.shape
    batch_size = qo_indptr.shape[0] - 1

    output = torch.zeros(total_q, num_qo_heads, head_dim_ckv, dtype=torch.float32, device=q_nope.device)
    lse = torch.full((total_q, num_qo_heads), -math.inf, dtype=torch.float32, device=q_nope.device)

    for b in range(batch_size):
        q_start = int(qo_indptr[b].item())
        q_end = int(qo_indptr[b + 1].item())
        kv_start = int(kv_indptr[b].item())
        kv_end = int(kv_indptr[b + 1].item())
        qo_len = q_end - q_start
        kv_len = kv_end - kv_start
        if qo_len == 0 or kv_len == 0:
            continue
        # page_size is 1, so each page holds one token (slot 0 of the page)
        pages = kv_indices[kv_start:kv_end].long()
        ckv = ckv_cache[pages, 0].to(torch.float32)  # [kv_len, head_dim_ckv]: latent, both key and value
        kpe = kpe_cache[pages, 0].to(torch.float32)  # [kv_len, head_dim_kpe]
        qn = q_nope[q_start:q_end].to(torch.float32).permute(1, 0, 2)  # [H, qo_len, head_dim_ckv]
        qp = q_pe[q_start:q_end].to(torch.float32).permute(1, 0, 2)  # [H, qo_len, head_dim_kpe]

        # Every head shares the single latent kv "head".
        logits = (torch.matmul(qn, ckv.T) + torch.matmul(qp, kpe.T)) * sm_scale  # [H, qo_len, kv_len]
        # Causal mask aligned bottom-right: query i sits at kv position kv_len - qo_len + i.
        i = torch.arange(qo_len, device=q_nope.device)[:, None]
        j = torch.arange(kv_len, device=q_nope.device)[None, :]
        allowed = j <= i + (kv_len - qo_len)  # [qo_len, kv_len]
        logits = logits.masked_fill(~allowed, -math.inf)

        probs = torch.softmax(logits, dim=-1)
        # A query with no visible key (only possible if qo_len > kv_len) gets output 0, lse -inf.
        probs = torch.where(allowed.any(dim=-1)[:, None], probs, 0.0)
        output[q_start:q_end] = torch.matmul(probs, ckv).permute(1, 0, 2)  # [qo_len, H, head_dim_ckv]
        lse[q_start:q_end] = (torch.logsumexp(logits, dim=-1) / math.log(2.0)).T  # base 2, [qo_len, H]

    return output.to(q_nope.dtype), lse
"""

PREFILL_PS1_HEADER = "    batch_size = qo_indptr.shape[0] - 1\n"
PREFILL_FULL_PAGES_HEADER = """\
    batch_size = qo_indptr.shape[0] - 1
    page_size = ckv_cache.shape[1]  # tokens per page
"""

PREFILL_PS1_GATHER = """\
        kv_start = int(kv_indptr[b].item())
        kv_end = int(kv_indptr[b + 1].item())
        qo_len = q_end - q_start
        kv_len = kv_end - kv_start
        if qo_len == 0 or kv_len == 0:
            continue
        # page_size is 1, so each page holds one token (slot 0 of the page)
        pages = kv_indices[kv_start:kv_end].long()
        ckv = ckv_cache[pages, 0].to(torch.float32)  # [kv_len, head_dim_ckv]: latent, both key and value
        kpe = kpe_cache[pages, 0].to(torch.float32)  # [kv_len, head_dim_kpe]
"""

PREFILL_FULL_PAGES_GATHER = """\
        kv_start = int(kv_indptr[b].item())  # kv_indptr counts pages
        kv_end = int(kv_indptr[b + 1].item())
        qo_len = q_end - q_start
        kv_len = (kv_end - kv_start) * page_size  # every page is full
        if qo_len == 0 or kv_len == 0:
            continue
        # The request's tokens are all page_size slots of its pages: pages in kv_indices order,
        # slots in order within a page.
        pages = kv_indices[kv_start:kv_end].long()
        ckv = ckv_cache[pages].flatten(0, 1).to(torch.float32)  # [kv_len, head_dim_ckv]: latent, key and value
        kpe = kpe_cache[pages].flatten(0, 1).to(torch.float32)  # [kv_len, head_dim_kpe]
"""


def reference(stage: str, page_size: int) -> str:
    if stage == "decode":
        if page_size == 1:
            return DECODE_REFERENCE
        return replace_once(DECODE_REFERENCE, DECODE_PS1_GATHER, DECODE_FULL_PAGES_GATHER)
    if page_size == 1:
        return PREFILL_REFERENCE
    text = replace_once(PREFILL_REFERENCE, PREFILL_PS1_HEADER, PREFILL_FULL_PAGES_HEADER)
    return replace_once(text, PREFILL_PS1_GATHER, PREFILL_FULL_PAGES_GATHER)


def _mla_text(h: int, ckv: int, kpe: int) -> str:
    return (
        f"Multi-head latent attention (DeepSeek-V2/V3 MLA) in its weight-absorbed form, with {h} query heads (per "
        "GPU: the model's query heads divided by the tensor parallelism). The cache stores per token a "
        f"{ckv}-wide compressed latent ckv (shared by all heads, used as both key and value) and a {kpe}-wide "
        "rotary key part kpe. The queries arrive already multiplied by the absorbed W_UK (q_nope, "
        f"{ckv} wide) plus their rotary part q_pe ({kpe} wide): logits = (q_nope . ckv + q_pe . kpe) * sm_scale, "
        "output = softmax(logits) @ ckv (still in the latent space; W_UV is applied afterwards, outside this "
        "kernel). sm_scale is 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim), from the head dim of the query "
        "BEFORE absorption (1 / sqrt(128 + 64) for DeepSeek-V3), times the YaRN mscale^2 factor when long-context "
        f"scaling is on; it is NOT 1 / sqrt(head_dim_ckv + head_dim_kpe) = 1 / sqrt({ckv + kpe}). Computed in "
        "float32, output rounded to bfloat16; lse is the base-2 log-sum-exp of the scaled logits (natural lse / "
        "ln 2), as FlashInfer returns it."
    )


def _layout(page_size: int) -> str:
    if page_size == 1:
        return ("The KV cache is paged with page_size 1: request b's tokens are pages "
                "kv_indices[kv_indptr[b]:kv_indptr[b+1]], in any order and anywhere in the cache.")
    return att.full_pages_text(page_size, "latent cache", "tokens",
                               "ckv_cache[kv_indices[kv_indptr[b]:kv_indptr[b+1]]].flatten(0, 1) (and kpe_cache "
                               "alike)")


def mla_paged(stage: str, num_qo_heads: int, head_dim_ckv: int, head_dim_kpe: int, page_size: int) -> dict[str, Any]:
    stage = choice("stage", stage, att.STAGES)
    h = positive_int("num_qo_heads", num_qo_heads)
    ckv = positive_int("head_dim_ckv", head_dim_ckv)
    kpe = positive_int("head_dim_kpe", head_dim_kpe)
    ps = positive_int("page_size", page_size)
    rows = "batch_size" if stage == "decode" else "total_q"

    axes = att.paged_axes(stage, ps, "cache")
    axes["num_qo_heads"] = const_axis(h, "Query heads per GPU (the model's query heads / tensor parallelism).")
    axes["head_dim_ckv"] = const_axis(ckv, "Width of the compressed kv latent (kv_lora_rank).")
    axes["head_dim_kpe"] = const_axis(kpe, "Width of the decoupled rotary key/query part (qk_rope_head_dim).")
    axes["page_size"] = att.page_size_axis(ps)

    if stage == "decode":
        name = f"mla_paged_decode_h{h}_ckv{ckv}_kpe{kpe}_ps{ps}"
        description = (
            "Batched decode attention: one new query token per request attends to all of the request's cached "
            f"tokens (no mask). {_mla_text(h, ckv, kpe)} {_layout(ps)} A request with zero kv tokens gets output 0 "
            "and lse -inf."
        )
        tags = ["stage:decode", STATUS, "fi_api:flashinfer.mla.BatchMLAPagedAttentionWrapper"]
        constraints = list(att.DECODE_CONSTRAINTS)
        q_nope_desc = "Non-rotary query projected into the latent space (W_UK absorbed)."
        q_pe_desc = "Rotary part of the query (RoPE applied)."
        structure = att.kv_structure_inputs(ps)
        lse_desc = "Base-2 log-sum-exp of the scaled logits; -inf for a request with no kv tokens."
    else:
        name = f"mla_paged_prefill_causal_h{h}_ckv{ckv}_kpe{kpe}_ps{ps}"
        description = (
            "Batched causal prefill attention over a paged latent cache that already holds the new tokens (and any "
            "cached prefix); request b's queries are rows qo_indptr[b]:qo_indptr[b+1]. "
            f"{_mla_text(h, ckv, kpe)} {_layout(ps)} {att.CAUSAL} A request with no queries contributes nothing."
        )
        tags = ["stage:prefill", STATUS, "fi_api:flashinfer.mla.BatchMLAPagedAttentionWrapper"]
        constraints = att.paged_prefill_constraints(ps)
        q_nope_desc = "Non-rotary queries projected into the latent space (W_UK absorbed), all requests concatenated."
        q_pe_desc = "Rotary part of the queries (RoPE applied)."
        structure = {
            "qo_indptr": tensor(["len_indptr"], "int32",
                                "CSR offsets into the queries: request b owns rows qo_indptr[b]:qo_indptr[b+1]."),
            **att.kv_structure_inputs(ps),
        }
        lse_desc = "Base-2 log-sum-exp of the scaled, masked logits."

    return definition(
        name=name,
        op_type="mla_paged",
        description=description,
        tags=tags,
        axes=axes,
        constraints=constraints,
        inputs={
            "q_nope": tensor([rows, "num_qo_heads", "head_dim_ckv"], "bfloat16", q_nope_desc),
            "q_pe": tensor([rows, "num_qo_heads", "head_dim_kpe"], "bfloat16", q_pe_desc),
            "ckv_cache": tensor(["num_pages", "page_size", "head_dim_ckv"], "bfloat16",
                                "Paged compressed-kv latent cache."),
            "kpe_cache": tensor(["num_pages", "page_size", "head_dim_kpe"], "bfloat16",
                                "Paged rotary key cache (RoPE applied)."),
            **structure,
            "sm_scale": tensor(None, "float32",
                               "Softmax scale, 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim) (1 / sqrt(128 + 64) for "
                               "DeepSeek-V3, without YaRN mscale)."),
        },
        outputs={
            "output": tensor([rows, "num_qo_heads", "head_dim_ckv"], "bfloat16",
                             "Attention output in the latent space."),
            "lse": tensor([rows, "num_qo_heads"], "float32", lse_desc),
        },
        reference=reference(stage, ps),
    )

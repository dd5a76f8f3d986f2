"""DeepSeek sparse attention (DSA, DeepSeek-V3.2), op_type `dsa_paged`: two kernels per layer.

* `dsa_sparse_attention_h{H}_ckv{C}_kpe{K}_topk{T}_ps{P}`: absorbed MLA in which each query token
  attends only to the `topk` cache slots its indexer chose (flashinfer's
  `trtllm_batch_decode_with_kv_cache_mla` with `sparse_mla_top_k`).
* `dsa_topk_indexer_fp8_h{H}_d{D}_topk{T}_ps{P}`: the lightning indexer that chooses them: fp8 index
  queries against a paged fp8 key cache in DeepGEMM's packed layout (fp8 keys, then per-token float32
  scales, per page), score = sum_h w_h * relu(q_h . k), the `topk` best tokens per request.

The references are this project's own; the names, axes and inputs follow the public dataset's files
of the same kernels, so a definition extracted here and the public one describe the same interface.
"""

from __future__ import annotations

from typing import Any

from ._common import STATUS, const_axis, definition, positive_int, replace_once, tensor, var_axis

ATTENTION_REFERENCE = """import math
import torch


@torch.no_grad()
def run(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale):
    num_tokens, num_qo_heads, head_dim_ckv = q_nope.shape
    head_dim_kpe = q_pe.shape[-1]
    # One row per cache slot: slot = page * page_size + offset within the page.
    ckv_rows = ckv_cache.reshape(-1, head_dim_ckv)
    kpe_rows = kpe_cache.reshape(-1, head_dim_kpe)

    output = torch.zeros(num_tokens, num_qo_heads, head_dim_ckv, dtype=torch.float32, device=q_nope.device)
    lse = torch.full((num_tokens, num_qo_heads), -math.inf, dtype=torch.float32, device=q_nope.device)

    for t in range(num_tokens):
        slots = sparse_indices[t]
        slots = slots[slots >= 0].long()  # -1 marks an unused entry, anywhere in the row
        if slots.numel() == 0:
            continue  # nothing selected: output stays 0, lse stays -inf
        ckv = ckv_rows[slots].to(torch.float32)  # [n, head_dim_ckv]: the latent is both key and value
        kpe = kpe_rows[slots].to(torch.float32)  # [n, head_dim_kpe]: rotary part of the key
        qn = q_nope[t].to(torch.float32)  # [num_qo_heads, head_dim_ckv]
        qp = q_pe[t].to(torch.float32)  # [num_qo_heads, head_dim_kpe]

        # Every head shares the single latent kv "head".
        logits = (qn @ ckv.T + qp @ kpe.T) * sm_scale  # [num_qo_heads, n]
        output[t] = torch.softmax(logits, dim=-1) @ ckv
        lse[t] = torch.logsumexp(logits, dim=-1) / math.log(2.0)  # base 2

    return output.to(q_nope.dtype), lse
"""

INDEXER_REFERENCE = """import torch

TOPK = 2048


@torch.no_grad()
def run(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    batch_size, num_index_heads, index_head_dim = q_index_fp8.shape
    num_pages, page_size = k_index_cache_fp8.shape[:2]

    # Unpack the cache. A page is one block of bytes: the fp8 keys of its page_size tokens
    # (token-major, index_head_dim bytes each), then their page_size float32 scales. The 4-d shape
    # [num_pages, page_size, 1, index_head_dim + 4] only gives the size.
    raw = k_index_cache_fp8.view(torch.uint8).reshape(num_pages, -1)
    key_bytes = raw[:, : page_size * index_head_dim].contiguous()
    scale_bytes = raw[:, page_size * index_head_dim :].contiguous()
    keys = key_bytes.view(torch.float8_e4m3fn).to(torch.float32).reshape(num_pages * page_size, index_head_dim)
    scales = scale_bytes.view(torch.float32).reshape(num_pages * page_size)
    keys = keys * scales[:, None]  # dequantised: one row per cache slot (page * page_size + offset)

    q = q_index_fp8.to(torch.float32)
    topk_indices = torch.full((batch_size, TOPK), -1, dtype=torch.int32, device=q.device)
    offsets = torch.arange(page_size, device=q.device)
    for b in range(batch_size):
        seq_len = int(seq_lens[b].item())
        if seq_len == 0:
            continue  # no tokens: the row stays -1
        pages = block_table[b, : (seq_len + page_size - 1) // page_size].long()
        slots = (pages[:, None] * page_size + offsets).reshape(-1)[:seq_len]  # the request's tokens, in order

        per_head = q[b] @ keys[slots].T  # [num_index_heads, seq_len]
        scores = (torch.relu(per_head) * weights[b][:, None]).sum(dim=0)  # ReLU per head, then weighted sum
        k = min(TOPK, seq_len)
        best = torch.topk(scores, k).indices
        topk_indices[b, :k] = slots[best].to(torch.int32)  # global token ids

    return topk_indices
"""


def dsa_sparse_attention(num_qo_heads: int, head_dim_ckv: int, head_dim_kpe: int, topk: int,
                         page_size: int) -> dict[str, Any]:
    h = positive_int("num_qo_heads", num_qo_heads)
    ckv = positive_int("head_dim_ckv", head_dim_ckv)
    kpe = positive_int("head_dim_kpe", head_dim_kpe)
    k = positive_int("topk", topk)
    ps = positive_int("page_size", page_size)
    slot = "the page id" if ps == 1 else f"page * {ps} + offset within the page"
    return definition(
        name=f"dsa_sparse_attention_h{h}_ckv{ckv}_kpe{kpe}_topk{k}_ps{ps}",
        op_type="dsa_paged",
        description=(
            "DeepSeek sparse attention (DeepSeek-V3.2): multi-head latent attention in its weight-absorbed form "
            f"in which each query token attends only to the at most {k} cache slots the top-k indexer chose for "
            f"it, for decode and prefill alike (no causal mask: the indices define the keys). {h} query heads "
            f"per GPU share one latent kv head: a {ckv}-wide ckv (both key and value) and a {kpe}-wide rotary "
            "key part kpe. logits = (q_nope . ckv + q_pe . kpe) * sm_scale over the selected slots, output = "
            "softmax(logits) @ ckv (latent space; W_UV is applied outside), lse = base-2 log-sum-exp of the "
            f"scaled logits. Row t of sparse_indices holds slot ids ({slot}); -1 marks an unused entry and may "
            "stand anywhere in the row; a row without a valid entry gives output 0 and lse -inf. sm_scale is "
            "1 / sqrt(qk_nope_head_dim + qk_rope_head_dim) = 1 / sqrt(128 + 64) for DeepSeek-V3.2 (without "
            "YaRN mscale). Computed in float32, output rounded to bfloat16."
        ),
        tags=[STATUS, "sparse:topk", "fi_api:flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla"],
        axes={
            "num_tokens": var_axis("Query tokens (requests in decode, all new tokens in prefill)."),
            "num_qo_heads": const_axis(h, "Query heads per GPU (the model's query heads / tensor parallelism)."),
            "head_dim_ckv": const_axis(ckv, "Width of the compressed kv latent (kv_lora_rank)."),
            "head_dim_kpe": const_axis(kpe, "Width of the decoupled rotary key/query part (qk_rope_head_dim)."),
            "page_size": const_axis(ps, "Token slots per page."),
            "topk": const_axis(k, "Entries per row of sparse_indices (the indexer's top-k)."),
            "num_pages": var_axis("Pages in the latent cache."),
        },
        constraints=[
            "sparse_indices.min().item() >= -1",
            "sparse_indices.max().item() < num_pages * page_size",
        ],
        inputs={
            "q_nope": tensor(["num_tokens", "num_qo_heads", "head_dim_ckv"], "bfloat16",
                             "Non-rotary queries projected into the latent space (W_UK absorbed)."),
            "q_pe": tensor(["num_tokens", "num_qo_heads", "head_dim_kpe"], "bfloat16",
                           "Rotary part of the queries (RoPE applied)."),
            "ckv_cache": tensor(["num_pages", "page_size", "head_dim_ckv"], "bfloat16",
                                "Paged compressed-kv latent cache."),
            "kpe_cache": tensor(["num_pages", "page_size", "head_dim_kpe"], "bfloat16",
                                "Paged rotary key cache (RoPE applied)."),
            "sparse_indices": tensor(["num_tokens", "topk"], "int32",
                                     f"Per query token, the cache slots it attends to ({slot}); -1 = unused."),
            "sm_scale": tensor(None, "float32", "Softmax scale, 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)."),
        },
        outputs={
            "output": tensor(["num_tokens", "num_qo_heads", "head_dim_ckv"], "bfloat16",
                             "Attention output in the latent space."),
            "lse": tensor(["num_tokens", "num_qo_heads"], "float32",
                          "Base-2 log-sum-exp of the scaled logits over the selected slots; -inf for an empty row."),
        },
        reference=ATTENTION_REFERENCE,
    )


def dsa_topk_indexer(num_index_heads: int, index_head_dim: int, topk: int, page_size: int) -> dict[str, Any]:
    h = positive_int("num_index_heads", num_index_heads)
    d = positive_int("index_head_dim", index_head_dim)
    k = positive_int("topk", topk)
    ps = positive_int("page_size", page_size)
    return definition(
        name=f"dsa_topk_indexer_fp8_h{h}_d{d}_topk{k}_ps{ps}",
        op_type="dsa_paged",
        description=(
            "DeepSeek sparse attention's lightning indexer (DeepSeek-V3.2), fp8: for each request's newest token, "
            f"score every token of the request with {h} index heads of width {d}, score[j] = sum_h weights[h] * "
            "relu(q[h] . k[j]) (ReLU per head, before the weighted sum), and return the global ids (page * "
            f"page_size + offset) of the min({k}, seq_len) best, -1 after them; the order of the ids in a row is "
            "not part of the result. The key cache is DeepGEMM's packed fp8 layout with page_size "
            f"{ps}: per page, {ps} x {d} fp8 e4m3 key bytes (token-major) followed by {ps} float32 per-token "
            f"scales, stored as int8 [num_pages, {ps}, 1, {d + 4}] (the shape only gives the size); k[j] = "
            "fp8 code * scale. Request b's tokens are the first seq_lens[b] slots of its pages "
            "block_table[b, :ceil(seq_lens[b] / page_size)]. The weights already include the heads' 1 / sqrt(H), "
            "the query's fp8 scale and the softmax scale. Computed in float32."
        ),
        tags=["stage:indexer", STATUS, "sparse:topk", "quantization:fp8"],
        axes={
            "batch_size": var_axis("Requests (one scored query token each)."),
            "num_index_heads": const_axis(h, "Indexer heads (index_n_heads; not split by tensor parallelism)."),
            "index_head_dim": const_axis(d, "Indexer head dimension (index_head_dim)."),
            "page_size": const_axis(ps, "Token slots per page of the index key cache."),
            "topk": const_axis(k, "Tokens selected per request (index_topk)."),
            "max_num_pages": var_axis("Columns of block_table."),
            "num_pages": var_axis("Pages in the index key cache."),
            "kv_cache_num_heads": const_axis(1, "Key heads in the cache (one: the indexer is MQA)."),
            "head_dim_with_scale": const_axis(d + 4,
                                              f"Bytes per token slot: {d} fp8 key bytes + a 4-byte float32 scale."),
        },
        constraints=[
            "topk <= max_num_pages * page_size",
            "seq_lens.min().item() >= 0",
            "seq_lens.max().item() <= max_num_pages * page_size",
            "block_table.min().item() >= 0",
            "block_table.max().item() < num_pages",
        ],
        inputs={
            "q_index_fp8": tensor(["batch_size", "num_index_heads", "index_head_dim"], "float8_e4m3fn",
                                  "fp8 index queries (RoPE applied)."),
            "k_index_cache_fp8": tensor(["num_pages", "page_size", "kv_cache_num_heads", "head_dim_with_scale"], "int8",
                                        "Packed fp8 index key cache: per page, the fp8 keys then the float32 scales "
                                        "(bytes; read as uint8)."),
            "weights": tensor(["batch_size", "num_index_heads"], "float32",
                              "Per-request head weights (weights_proj(x) * H^-0.5 * q scale * softmax scale)."),
            "seq_lens": tensor(["batch_size"], "int32", "Tokens of each request (0 allowed)."),
            "block_table": tensor(["batch_size", "max_num_pages"], "int32",
                                  "Pages of each request, in sequence order; columns past its pages are not read."),
        },
        outputs={
            "topk_indices": tensor(["batch_size", "topk"], "int32",
                                   "Global token ids of the best-scoring tokens, -1 in the unused entries."),
        },
        reference=replace_once(INDEXER_REFERENCE, "TOPK = 2048\n", f"TOPK = {k}\n"),
    )

"""Independent float64 ground truth for `dsa_paged` (DeepSeek-V3.2 sparse attention and its fp8
top-k indexer), written from the definitions' descriptions, not from their references.

* Sparse attention: per query token, the cache slots its row of `sparse_indices` names (-1 entries
  dropped) become one shared latent key `[ckv | kpe]` and value `ckv`;
  `F.scaled_dot_product_attention` in float64 gives the output, a separate log-sum-exp of the scaled
  logits the base-2 lse. A row with no slot gets output 0 and lse -inf.
* Indexer: the fp8 key codes and their float32 scales are read straight from the packed bytes; the
  per-head dot product is taken on the fp8 codes and the token's scale multiplies the result (the
  factorisation the kernels use; the reference dequantises the keys first), then ReLU per head, the
  weighted sum over heads, and a stable descending sort for the top-k. Outputs are global token ids
  (page * page_size + offset), -1 past min(topk, seq_len).

`indexer_scores` is also what the index-set comparison (`compare_topk.py`) judges a selection by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import Call

F64 = torch.float64


def is_indexer(definition) -> bool:
    return "k_index_cache_fp8" in definition.inputs


def _flat_slots(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


# -- sparse attention -------------------------------------------------------------------------------
def sparse_attention(call: Call) -> tuple:
    x = call.inputs.values
    q = torch.cat([x["q_nope"], x["q_pe"]], dim=-1).to(F64)  # [T, H, ckv + kpe]
    # one row per cached token (views); a token's rows are gathered before they are widened to float64
    ckv, kpe = _flat_slots(x["ckv_cache"]), _flat_slots(x["kpe_cache"])
    scale = float(x["sm_scale"])
    idx = x["sparse_indices"].to(torch.int64)
    slots = ckv.shape[0]
    bad = (idx < -1) | (idx >= slots)
    if bool(bad.any()):
        raise ValueError(f"sparse_indices: {int(bad.sum())} value(s) outside [-1, {slots}) (e.g. "
                         f"{int(idx[bad][0])}): neither a cache slot nor the -1 padding")
    tokens, heads, _ = q.shape
    out = torch.zeros(tokens, heads, ckv.shape[-1], dtype=F64, device=q.device)
    lse = torch.full((tokens, heads), -math.inf, dtype=F64, device=q.device)
    for t in range(tokens):
        chosen = idx[t][idx[t] >= 0]
        if chosen.numel() == 0:
            continue
        v = ckv[chosen].to(F64)  # [n, 512]
        k = torch.cat([v, kpe[chosen].to(F64)], dim=-1)  # [n, 576]
        out[t] = F.scaled_dot_product_attention(q[t][None], k[None], v[None], scale=scale)[0]
        lse[t] = torch.logsumexp((q[t] @ k.T) * scale, dim=-1) / math.log(2.0)
    return out, lse


# -- the indexer ------------------------------------------------------------------------------------
def unpack_index_cache(cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed [num_pages, page_size, 1, head_dim + 4] cache -> (fp8 codes as float64
    [num_pages * page_size, head_dim], float32 scales as float64 [num_pages * page_size]). Per page:
    page_size * head_dim code bytes (token-major), then page_size little-endian float32 scales."""
    num_pages, page_size = cache.shape[:2]
    raw = cache.contiguous().view(torch.uint8).reshape(num_pages, -1)
    if raw.shape[1] != page_size * (head_dim + 4):
        raise ValueError(f"k_index_cache_fp8: {raw.shape[1]} bytes per page, expected page_size * (head_dim + 4) "
                         f"= {page_size * (head_dim + 4)}")
    codes = raw[:, :page_size * head_dim].contiguous().view(torch.float8_e4m3fn)
    scales = raw[:, page_size * head_dim:].contiguous().view(torch.float32)
    return codes.reshape(num_pages * page_size, head_dim).to(F64), scales.reshape(-1).to(F64)


@dataclass(frozen=True)
class RequestScores:
    slots: torch.Tensor  # [seq_len] global token ids (page * page_size + offset), in sequence order
    scores: torch.Tensor  # [seq_len] float64 index scores
    magnitude: torch.Tensor  # [seq_len] sum of |terms| that made each score: its rounding scale


def indexer_scores(values: dict, page_size: int) -> list[RequestScores]:
    """Per request, its tokens' global ids, float64 scores and magnitudes (the error scale of a
    float32 computation of the same score)."""
    q = values["q_index_fp8"].to(F64)  # [B, H, D]
    head_dim = q.shape[-1]
    codes, scales = unpack_index_cache(values["k_index_cache_fp8"], head_dim)
    w = values["weights"].to(F64)  # [B, H]
    lens = values["seq_lens"].to(torch.int64).cpu().tolist()
    table = values["block_table"].to(torch.int64)
    offsets = torch.arange(page_size, device=table.device)
    out = []
    for b, n in enumerate(lens):
        if n < 0 or -(-n // page_size) > table.shape[1]:
            raise ValueError(f"seq_lens[{b}] = {n}: needs {-(-n // page_size)} pages, block_table has "
                             f"{table.shape[1]} columns")
        pages = table[b, :-(-n // page_size)]
        slots = (pages[:, None] * page_size + offsets).reshape(-1)[:n]
        if n and (int(slots.min()) < 0 or int(slots.max()) >= codes.shape[0]):
            raise ValueError(f"block_table[{b}]: a page outside [0, {codes.shape[0] // page_size})")
        k, s = codes[slots], scales[slots]
        per_head = (q[b] @ k.T) * s  # [H, n]: the token's scale on the code dot product
        score = (F.relu(per_head) * w[b][:, None]).sum(dim=0)
        magnitude = ((q[b].abs() @ k.abs().T) * s.abs() * w[b].abs()[:, None]).sum(dim=0)
        out.append(RequestScores(slots, score, magnitude))
    return out


def topk_indexer(call: Call) -> tuple:
    d, x = call.definition, call.inputs.values
    topk = int(d.const_axes["topk"])
    page_size = int(d.const_axes["page_size"])
    reqs = indexer_scores(x, page_size)
    out = torch.full((len(reqs), topk), -1, dtype=torch.int64, device=x["seq_lens"].device)
    for b, r in enumerate(reqs):
        k = min(topk, r.slots.numel())
        order = torch.argsort(r.scores, descending=True, stable=True)[:k]
        out[b, :k] = r.slots[order]
    return (out,)


def indexer_applies(d) -> str | None:
    if not is_indexer(d):
        return "not the top-k indexer (no k_index_cache_fp8 input)"
    absent = [n for n in ("q_index_fp8", "weights", "seq_lens", "block_table") if n not in d.inputs]
    if absent:
        return f"needs input(s) {', '.join(absent)}"
    missing = [a for a in ("topk", "page_size") if a not in d.const_axes]
    return f"needs const axes {', '.join(missing)}" if missing else None


def attention_applies(d) -> str | None:
    if is_indexer(d):
        return "the top-k indexer, not the sparse attention"
    absent = [n for n in ("q_nope", "q_pe", "ckv_cache", "kpe_cache", "sparse_indices", "sm_scale")
              if n not in d.inputs]
    return f"needs input(s) {', '.join(absent)}" if absent else None

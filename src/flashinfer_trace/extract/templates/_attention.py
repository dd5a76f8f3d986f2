"""Description text, axes, inputs and constraints shared by the attention templates (gqa_paged,
gqa_ragged, mla_paged): the paged-cache structure, the causal mask, the GQA head mapping, lse."""

from __future__ import annotations

from typing import Any

from ._common import const_axis, plural, tensor, var_axis

STAGES = ("decode", "prefill")

CAUSAL = (
    "The causal mask is aligned bottom-right: a request with qo_len queries and kv_len keys holds its queries as "
    "the LAST qo_len of its kv_len tokens, so its query i (0-based) attends to kv positions j <= kv_len - qo_len "
    "+ i (with qo_len == kv_len this is the ordinary lower-triangular mask; with a cached prefix every query also "
    "sees the whole prefix). qo_len may exceed kv_len: the first qo_len - kv_len queries then see no key (a request "
    "with no kv at all: none of its queries does) and get output 0 and lse -inf, FlashInfer's convention for a fully "
    "masked row (an empty partial state to merge_state)."
)

GQA_SOFTMAX = (
    "logits = (q . k) * sm_scale, softmax over the request's keys, output = probs @ v; computed in float32, output "
    "rounded to bfloat16. lse is the log-sum-exp of the scaled logits in BASE 2 (natural-log lse / ln 2), as "
    "FlashInfer returns it with return_lse=True (it is what merge_state consumes)."
)

DECODE_CONSTRAINTS = [
    "len_indptr == batch_size + 1",
    "kv_indptr[0].item() == 0",
    "(kv_indptr[1:] - kv_indptr[:-1]).min().item() >= 0",
    "num_kv_indices == kv_indptr[-1].item()",
    "num_kv_indices == 0 or (kv_indices.min().item() >= 0 and kv_indices.max().item() < num_pages)",
]

QO_CONSTRAINTS = [
    "qo_indptr[0].item() == 0",
    "(qo_indptr[1:] - qo_indptr[:-1]).min().item() >= 0",
]

KV_INDPTR_CONSTRAINTS = [
    "kv_indptr[0].item() == 0",
    "(kv_indptr[1:] - kv_indptr[:-1]).min().item() >= 0",
]

# No constraint ties qo_len to kv_len: a query with no visible key is defined (CAUSAL), and the
# fully_masked_rows edge case (inputs/attention.py) makes such rows.
RAGGED_CONSTRAINTS = [*QO_CONSTRAINTS, *KV_INDPTR_CONSTRAINTS,
                      "total_q == qo_indptr[-1].item()",
                      "total_kv == kv_indptr[-1].item()"]


def ragged_axes() -> dict[str, Any]:
    """The var axes of a ragged prefill (gqa_ragged, mla_ragged), before its const axes."""
    return {
        "total_q": var_axis("Total number of query tokens, qo_indptr[-1]."),
        "total_kv": var_axis("Total number of key/value tokens, kv_indptr[-1]."),
        "len_indptr": var_axis("Length of qo_indptr and kv_indptr: the number of requests + 1."),
    }


def ragged_indptrs() -> dict[str, Any]:
    return {
        "qo_indptr": tensor(["len_indptr"], "int32",
                            "CSR offsets into q: request b owns q[qo_indptr[b]:qo_indptr[b+1]]."),
        "kv_indptr": tensor(["len_indptr"], "int32", "CSR offsets into k and v."),
    }


def check_heads(num_qo_heads: int, num_kv_heads: int) -> None:
    if num_qo_heads % num_kv_heads:
        raise ValueError(f"num_qo_heads {num_qo_heads} must be a multiple of num_kv_heads {num_kv_heads}")


def heads_text(num_qo_heads: int, num_kv_heads: int, head_dim: int) -> str:
    return f"{plural(num_qo_heads, 'query head')}, {plural(num_kv_heads, 'kv head')}, head_dim {head_dim}"


def gqa_mapping(num_qo_heads: int, num_kv_heads: int) -> str:
    """How query heads read kv heads (consecutive groups, not strided)."""
    g = num_qo_heads // num_kv_heads
    formula = "query head h reads kv head h // (num_qo_heads / num_kv_heads)"
    if g == 1:
        return f"Grouped-query attention with group size 1 (plain multi-head attention): {formula} = h."
    if num_kv_heads == 1:
        return (f"Grouped-query attention with a single kv head (multi-query attention): {formula} = h // {g} = 0, "
                f"so the one kv head serves all {g} query heads.")
    return f"Grouped-query attention: {formula} = h // {g}, so kv head g serves query heads {g}g..{g}g+{g - 1}."


def paged_prefill_constraints(page_size: int) -> list[str]:
    return [*QO_CONSTRAINTS, *KV_INDPTR_CONSTRAINTS,
            "total_q == qo_indptr[-1].item()",
            "num_kv_indices == kv_indptr[-1].item()",
            "num_kv_indices == 0 or (kv_indices.min().item() >= 0 and kv_indices.max().item() < num_pages)"]


def full_pages_text(page_size: int, cache: str, tokens: str, gather: str) -> str:
    """The page layout for page_size > 1 without kv_last_page_len: every page is full."""
    return (
        f"The {cache} is paged with page_size {page_size} and every page is full (there is no kv_last_page_len "
        "input): request b owns the pages kv_indices[kv_indptr[b]:kv_indptr[b+1]] (kv_indptr and kv_indices count "
        f"PAGES, not tokens), and its kv_len = {page_size} * (kv_indptr[b+1] - kv_indptr[b]) {tokens} are all the "
        f"slots of those pages, page by page in that order and slots 0..{page_size - 1} in order within a page, "
        f"i.e. {gather}; pages may be anywhere in the cache, in any order, and pages not listed are never read."
    )


def paged_axes(stage: str, page_size: int, cache: str) -> dict[str, Any]:
    """The var axes of a paged definition (in the shipped order), before its const axes."""
    axes: dict[str, Any] = {}
    if stage == "decode":
        axes["batch_size"] = var_axis("Number of requests, one query token each.")
    else:
        axes["total_q"] = var_axis("Total number of query tokens over all requests, qo_indptr[-1].")
    if page_size == 1:
        axes["num_pages"] = var_axis(f"Number of pages (= token slots) in the {cache}.")
    else:
        axes["num_pages"] = var_axis(f"Number of pages in the {cache}, {page_size} token slots each.")
    if stage == "decode":
        axes["len_indptr"] = var_axis("Length of kv_indptr, batch_size + 1.")
    else:
        axes["len_indptr"] = var_axis("Length of qo_indptr and kv_indptr: the number of requests + 1.")
    if page_size == 1:
        axes["num_kv_indices"] = var_axis("Total number of kv tokens over all requests, kv_indptr[-1].")
    else:
        axes["num_kv_indices"] = var_axis(
            f"Total number of pages over all requests, kv_indptr[-1] (the kv tokens number {page_size} times that).")
    return axes


def page_size_axis(page_size: int) -> dict[str, Any]:
    if page_size == 1:
        return const_axis(1, "Tokens per page.")
    return const_axis(page_size, "Tokens per page; every page is full.")


def kv_structure_inputs(page_size: int) -> dict[str, Any]:
    """kv_indptr and kv_indices."""
    if page_size == 1:
        return {
            "kv_indptr": tensor(["len_indptr"], "int32",
                                "CSR offsets into kv_indices: request b owns kv_indices[kv_indptr[b]:kv_indptr[b+1]]."),
            "kv_indices": tensor(["num_kv_indices"], "int32", "Page ids of every request's tokens, in sequence order."),
        }
    return {
        "kv_indptr": tensor(["len_indptr"], "int32",
                            "CSR offsets into kv_indices, in pages: request b owns the pages "
                            "kv_indices[kv_indptr[b]:kv_indptr[b+1]]."),
        "kv_indices": tensor(["num_kv_indices"], "int32",
                             "Page ids of every request's pages, in sequence order (every page full)."),
    }

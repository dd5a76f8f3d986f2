"""Sampling from probabilities after top-k and / or top-p filtering:
`{kind}_sampling_from_probs_v{vocab_size}`, op_type sampling (flashinfer.sampling.<kind>_sampling_from_probs)."""

from __future__ import annotations

from typing import Any

from ._common import STATUS, choice, const_axis, definition, positive_int, tensor, var_axis

KINDS = ("top_k", "top_p", "top_k_top_p")

REFERENCES = {
    "top_k": """import torch


@torch.no_grad()
def run(probs, top_k):
    vocab_size = probs.shape[1]
    sorted_probs, sorted_ids = torch.sort(probs.to(torch.float32), dim=-1, descending=True)

    # top-k: keep every token at least as probable as the k-th most probable one (a tie at the
    # k-th probability is kept whole); k <= 0 or k >= vocab_size keeps every token
    k = top_k.to(torch.int64)
    k = torch.where((k <= 0) | (k >= vocab_size), vocab_size, k)
    kth = sorted_probs.gather(1, (k - 1)[:, None])
    kept = sorted_probs * (sorted_probs >= kth)
    kept = kept / kept.sum(dim=-1, keepdim=True)  # renormalise

    # drawn in float64: over float32 probabilities torch.multinomial on a GPU moves ~0.4% of a
    # 128k-token row's mass towards its tail (docs/ground-truth.md, "Sampling")
    choice = torch.multinomial(kept.to(torch.float64), 1)  # a rank in sorted order, [batch_size, 1]
    return sorted_ids.gather(1, choice).squeeze(1).to(torch.int64)
""",
    "top_p": """import torch


@torch.no_grad()
def run(probs, top_p):
    sorted_probs, sorted_ids = torch.sort(probs.to(torch.float32), dim=-1, descending=True)

    # top-p: keep a token while the mass of the tokens strictly more probable than it is below top_p;
    # equal probabilities share the mass before the first of them (a tie is kept or dropped whole);
    # the most probable token is always kept; top_p >= 1 keeps every token
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    first = torch.searchsorted(-sorted_probs, -sorted_probs)  # rank of the first token of each tie
    mass_greater = mass_before.gather(1, first)
    p = top_p.to(torch.float32)[:, None]
    keep = (mass_greater < p) | (first == 0) | (p >= 1)
    kept = sorted_probs * keep
    kept = kept / kept.sum(dim=-1, keepdim=True)  # renormalise

    # drawn in float64: over float32 probabilities torch.multinomial on a GPU moves ~0.4% of a
    # 128k-token row's mass towards its tail (docs/ground-truth.md, "Sampling")
    choice = torch.multinomial(kept.to(torch.float64), 1)  # a rank in sorted order, [batch_size, 1]
    return sorted_ids.gather(1, choice).squeeze(1).to(torch.int64)
""",
    "top_k_top_p": """import torch


@torch.no_grad()
def run(probs, top_k, top_p):
    vocab_size = probs.shape[1]
    sorted_probs, sorted_ids = torch.sort(probs.to(torch.float32), dim=-1, descending=True)

    # 1. top-k: keep every token at least as probable as the k-th most probable one (a tie at the
    #    k-th probability is kept whole); k <= 0 or k >= vocab_size keeps every token; renormalise
    k = top_k.to(torch.int64)
    k = torch.where((k <= 0) | (k >= vocab_size), vocab_size, k)
    kth = sorted_probs.gather(1, (k - 1)[:, None])
    kept = sorted_probs * (sorted_probs >= kth)
    kept = kept / kept.sum(dim=-1, keepdim=True)

    # 2. top-p on the renormalised top-k distribution: keep a token while the mass of the tokens
    #    strictly more probable than it is below top_p (a tie is kept or dropped whole; the most
    #    probable token is always kept; top_p >= 1 keeps every token); renormalise
    mass_before = torch.cumsum(kept, dim=-1) - kept
    first = torch.searchsorted(-kept, -kept)  # rank of the first token of each tie
    mass_greater = mass_before.gather(1, first)
    p = top_p.to(torch.float32)[:, None]
    keep = (mass_greater < p) | (first == 0) | (p >= 1)
    kept = kept * keep
    kept = kept / kept.sum(dim=-1, keepdim=True)

    # drawn in float64: over float32 probabilities torch.multinomial on a GPU moves ~0.4% of a
    # 128k-token row's mass towards its tail (docs/ground-truth.md, "Sampling")
    choice = torch.multinomial(kept.to(torch.float64), 1)  # a rank in sorted order, [batch_size, 1]
    return sorted_ids.gather(1, choice).squeeze(1).to(torch.int64)
""",
}

TOP_K_RULE = ("top-k keeps every token at least as probable as the k-th most probable one, so a tie at the k-th "
              "probability is kept whole (FlashInfer's kernels; top_k <= 0 or >= vocab_size keeps all)")
TOP_P_RULE = ("top-p (nucleus) keeps a token when the total mass of the tokens strictly more probable than it is "
              "< top_p, i.e. the shortest prefix of the tokens sorted by descending probability whose mass reaches "
              "top_p, with tokens of equal probability kept or dropped together; the most probable token is always "
              "kept and top_p >= 1 keeps all")
RANDOM = ("The output is RANDOM (torch.multinomial; the kernel uses its own generator), so it cannot be compared "
          "element-wise: a check verifies that every sample lies in the allowed set and that the empirical "
          "frequencies over many draws match the filtered, renormalised distribution.")


def _description(kind: str, vocab_size: int) -> str:
    vocab = f"(vocabulary of {vocab_size} tokens)"
    if kind == "top_k":
        return (f"Samples one token per row from probabilities restricted to the top-k tokens {vocab}: "
                f"{TOP_K_RULE}; the kept probabilities are renormalised and one token is drawn. {RANDOM}")
    if kind == "top_p":
        return (f"Samples one token per row from probabilities restricted to the top-p nucleus {vocab}: "
                f"{TOP_P_RULE}; the kept probabilities are renormalised and one token is drawn. {RANDOM}")
    return (f"Samples one token per row after a top-k then a top-p filter {vocab}, FlashInfer's default filter "
            f"order (filter_apply_order='top_k_first'). First {TOP_K_RULE}, and the survivors are renormalised; "
            f"then, on that renormalised distribution, {TOP_P_RULE}; the survivors are renormalised again and one "
            "token is drawn. Because top-p reads the renormalised top-k mass, this is not the same as intersecting "
            f"the two filters applied to the raw probabilities. {RANDOM}")


def sampling(kind: str, vocab_size: int) -> dict[str, Any]:
    kind = choice("kind", kind, KINDS)
    vocab_size = positive_int("vocab_size", vocab_size)
    inputs = {
        "probs": tensor(["batch_size", "vocab_size"], "float32",
                        "Next-token probabilities, one distribution per row (rows sum to 1)."),
    }
    if "top_k" in kind:
        inputs["top_k"] = tensor(["batch_size"], "int32",
                                 "Per-row top-k; a value <= 0 or >= vocab_size disables the top-k filter.")
    if "top_p" in kind:
        inputs["top_p"] = tensor(["batch_size"], "float32",
                                 "Per-row top-p threshold in (0, 1]; 1.0 disables the filter.")
    return definition(
        name=f"{kind}_sampling_from_probs_v{vocab_size}",
        op_type="sampling",
        description=_description(kind, vocab_size),
        tags=[STATUS, f"fi_api:flashinfer.sampling.{kind}_sampling_from_probs"],
        axes={
            "batch_size": var_axis("Number of rows (requests) to sample, one token each."),
            "vocab_size": const_axis(vocab_size, "Vocabulary size."),
        },
        constraints=["abs(probs.sum(1) - 1).max().item() < 1e-3"],
        inputs=inputs,
        outputs={"samples": tensor(["batch_size"], "int64", "Sampled token id per row.")},
        reference=REFERENCES[kind],
    )

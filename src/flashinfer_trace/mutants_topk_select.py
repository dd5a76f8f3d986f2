"""Planted bugs of the `topk` family (flashinfer.top_k, top_k_varlen: docs/boundary/topk_select.md), one or more
per boundary class and a few plain ones, each a text edit of a shipped definition's reference: a boundary
mutant is right on typical rows and caught by the case its comment names; a plain one is caught everywhere.
mutants.py appends them to its MUTANTS; tests/unit/test_topk_select.py checks each."""

from __future__ import annotations

from .mutants_model import Mutant, _m

F32 = "top_k_v128256_k50"
BF16 = "top_k_v151936_k20_bf16"
K1 = "top_k_v32000_k1_fp16"
KN = "top_k_v2048_k2048"
VAR = "top_k_varlen_n65536_k2048"
VAR_BF16 = "top_k_varlen_n8192_k1024_bf16"
_LOAD = "    x = input.to(torch.float32)\n"
_ORDER = "    order = torch.argsort(x, dim=-1, descending=True, stable=True)\n"
_TAKE = "    indices = order[:, :k]\n"
_ASCENDING = (_ORDER, _ORDER.replace("True, stable", "False, stable"))
_VORDER = "order = torch.argsort(x[r, :n], descending=True, stable=True)"

MUTANTS: tuple[Mutant, ...] = (
    # ties_at_kth / all_equal: the entries above the k-th value, then the first entry equal to it written into
    # every remaining slot (a tie counter that is not advanced): one id several times once a tie straddles the cut
    _m(F32, "tie-slot-repeated", "every slot after the entries above the k-th value gets the same tied id",
       (_TAKE, "    kth = x.gather(1, order[:, k - 1:k])\n"
               "    above = (x > kth).sum(dim=-1, keepdim=True)\n"
               "    slot = torch.arange(k, device=x.device)[None, :]\n"
               "    indices = torch.where(slot < above, order[:, :k], order.gather(1, above))\n"),
       cls="boundary-ties"),
    # negative_rows (and neg_inf): a radix key that flips the sign bit only, so negative values rank by magnitude
    _m(F32, "negatives-by-magnitude", "negative scores ordered by magnitude (an order-preserving key that does "
       "not invert a negative float's bits)",
       (_ORDER, "    key = torch.where(x < 0, -1.0 / (1.0 - x), x)\n"
                "    order = torch.argsort(key, dim=-1, descending=True, stable=True)\n"), cls="boundary-magnitude"),
    # neg_inf: -inf entries never selected (read as empty slots): a row with fewer than k finite entries
    # returns ids of entries that were never ranked
    _m(VAR, "neg-inf-skipped", "-inf entries treated as padding: never selected, their slots left -1",
       ("        indices[r, :k] = order[:k].to(torch.int32)\n",
        "        ids = order[:k]\n"
        "        ids = torch.where(torch.isinf(x[r, ids]), torch.full_like(ids, -1), ids)\n"
        "        indices[r, :k] = ids.to(torch.int32)\n"), cls="boundary-structure"),
    # last_bit: the key keeps 20 of float32's 24 significand bits (a radix select one pass short): values a few
    # ulps apart tie, and the lowest columns win
    _m(F32, "low-bits-dropped", "ranked on a key with the last 4 significand bits dropped",
       (_ORDER, "    m, e = torch.frexp(x)\n"
                "    key = torch.ldexp(torch.floor(m * 2.0**20) / 2.0**20, e)\n"
                "    order = torch.argsort(key, dim=-1, descending=True, stable=True)\n"), cls="boundary-magnitude"),
    # large_values: bfloat16 ranked in float16 (exact for typical values, inf past 65504)
    _m(BF16, "float16-keys", "bfloat16 scores ranked after a cast to float16",
       (_LOAD, "    x = input.to(torch.float16).to(torch.float32)\n"), cls="boundary-magnitude"),
    # short_rows: a row shorter than top_k padded with 0 (a valid column id), not -1
    _m(VAR_BF16, "pad-with-zero", "the slots past min(top_k, seq_len) filled with 0, not -1",
       ("torch.full((rows, top_k), -1, dtype=torch.int32", "torch.full((rows, top_k), 0, dtype=torch.int32"),
       cls="boundary-parameter"),
    # short_rows: a row shorter than top_k gets no ids at all (k computed as top_k, the row skipped)
    _m(VAR, "short-row-skipped", "a row shorter than top_k is skipped (left all -1)",
       ("        k = min(top_k, n)\n", "        k = min(top_k, n)\n        if n < top_k:\n            continue\n"),
       cls="boundary-parameter"),
    _m(F32, "smallest-k", "the k smallest entries, not the largest", _ASCENDING),
    _m(K1, "argmin", "k = 1 returns the minimum", _ASCENDING),
    _m(KN, "last-column-never-read", "the last column never read (a loop bound of width - 1), its slot given the "
       "best column again", (_ORDER, "    order = torch.argsort(x[:, :-1], dim=-1, descending=True, stable=True)\n"),
       (_TAKE, "    indices = torch.cat([order, order[:, :1]], dim=1)[:, :k]\n")),
    _m(F32, "indices-int32", "indices returned as int32 (the kernel's own), not the API's int64",
       ("    return values, indices", "    return values, indices.to(torch.int32)")),
    _m(BF16, "values-from-next-row", "values read from the next row at the right columns",
       ("    values = torch.gather(input, 1, indices)", "    values = torch.gather(input.roll(-1, 0), 1, indices)")),
    _m(VAR, "reads-past-seq-len", "the whole row ranked, past seq_len (stale columns selected)",
       (_VORDER, "order = torch.argsort(x[r], descending=True, stable=True)")),
    _m(VAR_BF16, "absolute-off-by-one", "ids returned one-based", ("indices[r, :k] = order[:k].to(torch.int32)",
                                                                   "indices[r, :k] = (order[:k] + 1).to(torch.int32)")),
)

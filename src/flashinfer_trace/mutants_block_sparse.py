"""Planted bugs of the `block_sparse` family (docs/boundary/block_sparse.md), each a realistic slip of a
block-sparse attention kernel written as a text edit of a definition's reference. The boundary ones are right on
a typical random layout and caught by the case their comment names; the wrong-math ones are caught everywhere.
mutants.py appends `MUTANTS` to its own; tests/unit/test_block_sparse.py checks each against its case."""

from __future__ import annotations

from .mutants_model import Mutant, _m

DEF = "block_sparse_r16_c16_h28_kv4_d128"  # the cheapest definition, 7 query heads per kv head
_COLS = "        cols = indices[start:end].long()\n"
_SOFTMAX = ("probs = torch.softmax(logits, dim=-1)",
            "probs = torch.exp(logits) / torch.exp(logits).sum(dim=-1, keepdim=True)")
_LSE = ("torch.logsumexp(logits, dim=-1) / math.log(2.0)", "torch.log(torch.exp(logits).sum(dim=-1)) / math.log(2.0)")

MUTANTS: tuple[Mutant, ...] = (
    # partial_row_block / single_query: the block rows counted as qo_len // R, so a short last block row is skipped
    _m(DEF, "partial-row-dropped",
       "block rows counted as qo_len // R: a last block row shorter than R is never computed",
       ("num_row_blocks = indptr.shape[0] - 1", "num_row_blocks = qo_len // R"), cls="boundary-structure"),
    # empty_row: a block row without key blocks divides 0 by 0 (its softmax over nothing) instead of giving 0 / -inf
    _m(DEF, "empty-row-nan", "a block row with no key blocks gets 0 / 0: NaN output and lse",
       ("            continue  # a block row with no key blocks",
        "            output[r0:r1] = float('nan')\n            lse[r0:r1] = float('nan')\n"
        "            continue  # a block row with no key blocks"), cls="boundary-structure"),
    # empty_row: the running lse starts at 0 (log 1), not -inf (log 0): a row that sees nothing reports lse 0
    _m(DEF, "lse-zero-on-empty", "lse initialised to 0, not -inf: a block row with no key blocks reports lse 0",
       ("lse = torch.full((qo_len, num_qo_heads), -math.inf,", "lse = torch.full((qo_len, num_qo_heads), 0.0,"),
       cls="boundary-structure"),
    # unsorted_indices: membership found by binary search in the listed ids, which assumes them ascending
    _m(DEF, "assumes-sorted-indices",
       "a column block is found by binary search in the row's list (assumes ascending ids)",
       (_COLS, "        listed = indices[start:end].long()\n"
               "        j = torch.arange(int(listed.max()) + 1, device=q.device)\n"
               "        pos = torch.searchsorted(listed, j).clamp(max=listed.numel() - 1)\n"
               "        cols = j[listed[pos] == j]\n"), cls="boundary-structure"),
    # long_row: a split-kv merge that keeps only the last 16 blocks' partial state
    _m(DEF, "last-split-only", "a row's blocks split in chunks of 16 and only the last chunk's state kept",
       (_COLS, "        cols = indices[start:end][-16:].long()\n"), cls="boundary-structure"),
    # scores_large (exp overflows) / scores_far_negative (exp underflows): no max subtracted
    _m(DEF, "no-max-subtraction", "softmax and lse without subtracting the row max", _SOFTMAX, _LSE,
       cls="boundary-magnitude"),
    _m(DEF, "ignores-layout", "every column block attended (the layout ignored: dense attention)",
       (_COLS, "        cols = torch.arange(k.shape[0] // C, device=q.device)\n")),
    _m(DEF, "indices-one-based", "column-block ids read as 1-based (block j taken as j - 1; block 0 wraps to the last)",
       (_COLS, "        cols = indices[start:end].long() - 1\n")),
    _m(DEF, "block-offset-off-by-one", "block row i taken to start at query row i * R + 1 (rows shifted by one)",
       ("        r0 = i * R\n        r1 = min(r0 + R, qo_len)\n",
        "        r0 = min(i * R + 1, qo_len)\n        r1 = min(r0 + R, qo_len)\n")),
    _m(DEF, "gqa-interleaved", "query head h read against kv head h % num_kv_heads (interleaved, not grouped)",
       (".view(rows, num_kv_heads, group_size, head_dim).permute(1, 2, 0, 3)",
        ".view(rows, group_size, num_kv_heads, head_dim).permute(2, 1, 0, 3)")),
    _m(DEF, "lse-natural-log", "lse in natural log, not base 2",
       ("torch.logsumexp(logits, dim=-1) / math.log(2.0)", "torch.logsumexp(logits, dim=-1)")),
    _m(DEF, "sm-scale-dropped", "sm_scale never applied to the logits",
       ("logits = torch.matmul(qb, kt) * sm_scale", "logits = torch.matmul(qb, kt)")),
)

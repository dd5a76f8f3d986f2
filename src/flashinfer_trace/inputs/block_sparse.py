"""Block-sparse attention inputs (`block_sparse`: FlashInfer's `BlockSparseAttentionWrapper`): q [qo_len, heads,
dim], k and v [kv_len, kv_heads, dim], and a BSR layout over (block rows of R queries) x (column blocks of C keys),
`indptr` [ceil(qo_len / R) + 1] and `indices` [nnz]. R and C are the definition's const axes `block_rows` and
`block_cols`.

Layout first, tensors second: the case decides the number of block rows and column blocks and which column blocks
each block row lists, which binds qo_len, kv_len, len_indptr and nnz; q, k and v are then drawn. A random layout
lists, per block row, a random non-empty subset of the column blocks (1 .. all, each subset size equally likely),
ascending (the order real layouts come in; `unsorted_indices` shuffles it). Duplicates are never generated: the
definitions say a block row lists distinct column blocks (a repeated block would be counted twice by a kernel that
gathers it as a page and once by the mask the layout stands for, so it is outside the contract, not a case).

Edge cases (docs/boundary/block_sparse.md gives each one's reason):
  single_block: one block row, one column block, the one listed: plain attention of R queries over C keys;
  dense: every block row lists every column block: the result is full (non-causal) attention;
  empty_row: one block row (not the last) lists nothing: its queries' output is 0 and lse -inf (the empty
    softmax), the rows around it ordinary;
  unsorted_indices: every block row lists its blocks in a shuffled order, descending where a shuffle keeps it
    sorted: a kernel that assumes ascending ids (a binary search, a merge) is wrong;
  partial_row_block: qo_len = (rows - 1) * R + r, 1 <= r < R: the last block row is cut short (plan() sets
    the last query offset to M, not rows * R);
  single_query: qo_len 1: one block row holding one query;
  long_row: one block row lists LONG_COLS[size] column blocks (the split-kv path: partial states merged);
  the score cases (attention.SCORE_CASES): the softmax's arithmetic at its limits on a random layout. The
    dominant key of one_key_dominates sits in the second half of the most listed column block, so the block
    rows that list it are one-hot on it and the others must not see it at all.
Left out: causal and element masks (plan's `causal` / `mask`: no definition asks for them; causality over
gathered blocks is not the global causal mask), kv_len not a multiple of C (plan() documents it as required),
an empty layout (nnz 0: plan() reads indices.max(), which fails on an empty tensor).
"""

from __future__ import annotations

import math

import torch

from .attention import SCORE_CASES, _dominant, _ints, roles, shape_scores
from .common import Builder, permutation

OP_TYPES = ("block_sparse",)
KNOWN = ("q", "k", "v", "indptr", "indices", "sm_scale")
CASES = ("single_block", "dense", "empty_row", "unsorted_indices", "partial_row_block", "single_query", "long_row",
         *SCORE_CASES)
ROWS = {"small": 3, "medium": 6, "large": 32}  # block rows of a random layout (at most)
COLS = {"small": 4, "medium": 12, "large": 64}  # column blocks (at most)
LONG_COLS = {"small": 24, "medium": 48, "large": 256}


def edge_cases(definition) -> list[str]:
    return list(CASES)


def block_shape(definition) -> tuple[int, int]:
    """(R, C): the const axes `block_rows` and `block_cols`."""
    const = definition.const_axes
    return int(const["block_rows"]), int(const["block_cols"])


def _grid(b: Builder) -> tuple[int, int]:
    """(block rows, column blocks) of this case."""
    g = b.rng("grid")
    if b.case in ("single_block", "single_query"):
        return 1, 1
    if b.case == "long_row":
        return 1 + _ints(1, 2, g)[0], LONG_COLS[b.size]
    two = b.case in ("empty_row", "partial_row_block")  # a block row before the empty / the cut one
    rows = 1 + _ints(1, ROWS[b.size] - 1, g)[0] if two else _ints(1, ROWS[b.size], g)[0]
    cols = 1 + _ints(1, COLS[b.size] - 1, g)[0]  # at least 2: a choice of blocks to make
    return rows, cols


def layout(b: Builder, rows: int, cols: int) -> list[list[int]]:
    """The column blocks each block row lists, in the order listed."""
    g = b.rng("layout")
    out = []
    for i in range(rows):
        perm = permutation(cols, g).tolist()
        if b.case in ("dense", "single_block", "single_query"):
            n = cols
        elif b.case == "long_row" and i == 0:
            n = cols
        else:
            n = _ints(1, cols, g)[0]
            if b.case == "unsorted_indices":
                n = max(n, 2)  # an order to get wrong
        out.append(sorted(perm[:n]))
    if b.case == "empty_row":
        out[_ints(1, rows - 1, g)[0] - 1] = []  # any block row but the last
    if b.case == "unsorted_indices":
        for i, blocks in enumerate(out):
            shuffled = [blocks[j] for j in permutation(len(blocks), g).tolist()]
            out[i] = shuffled if shuffled != blocks else blocks[::-1]
    return out


def to_bsr(blocks: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    counts = torch.tensor([0] + [len(r) for r in blocks], dtype=torch.int64)
    indptr = counts.cumsum(0).to(torch.int32)
    indices = torch.tensor([c for r in blocks for c in r], dtype=torch.int32)
    return indptr, indices


def generate(b: Builder) -> None:
    d = b.definition
    extra = [n for n in d.inputs if n not in KNOWN]
    if extra:
        raise b.mismatch(f"the block_sparse generator does not know input(s) {', '.join(extra)}")
    missing = [n for n in KNOWN[:5] if not b.has(n)]
    if missing:
        raise b.mismatch(f"a block_sparse definition needs input(s) {', '.join(missing)}")
    if "block_rows" not in d.const_axes or "block_cols" not in d.const_axes:
        raise b.mismatch("a block_sparse definition fixes its block shape in const axes block_rows and block_cols")
    if b.case is not None and b.case not in CASES:
        raise b.error(f"unknown case {b.case!r} (cases: {', '.join(CASES)})")
    R, C = block_shape(d)
    rows, cols = _grid(b)
    blocks = layout(b, rows, cols)
    qo_len = rows * R
    if b.case == "partial_row_block":
        qo_len = (rows - 1) * R + _ints(1, max(R - 1, 1), b.rng("partial"))[0]
    elif b.case == "single_query":
        qo_len = 1
    indptr, indices = to_bsr(blocks)
    b.put("indptr", indptr)
    b.put("indices", indices)
    b.set_dim("q", 0, qo_len)
    b.set_dim("k", 0, cols * C)
    b.set_dim("v", 0, cols * C)
    for name in ("q", "k", "v"):
        b.put_random(name)
    if b.case in SCORE_CASES:
        listed = torch.bincount(indices.long(), minlength=cols)
        top = int(torch.argmax(listed))  # the most listed column block (the first of ties)
        key_rows = torch.arange(top * C, (top + 1) * C)
        dominant = _dominant(b, [key_rows]) if b.case == "one_key_dominates" else []
        shape_scores(b, roles(d), [torch.arange(cols * C)], dominant)
    if b.has("sm_scale"):
        b.put_scalar("sm_scale", 1.0 / math.sqrt(b.dim("q", -1)))

"""Inputs of `segment_gemm` (FlashInfer's SegmentGEMMWrapper.run): x [total_rows, K], weights [W, K, N] (row-major)
or [W, N, K] (column-major), seg_indptr [batch_size + 1] int64 and, where the definition has it, weight_indices
[batch_size] int64.

Typical operands: x N(0, 1), weights N(0, 1/sqrt(K)); segment lengths uniform in 2 .. 8 (small), 32 (medium), 256
(large: 256 is the largest length bfloat16 holds exactly, see long_segment); batch_size 4 / 8 / 16 where it is var;
weight_indices a rotated permutation of W = batch_size + 1 weights (distinct, and never W[i] for segment i, so a
kernel that ignores them shows everywhere). Each case and why (docs/boundary/segment_gemm.md):

    empty_segments    segments 0, batch_size // 2 and the last have no row: a kernel that compacts the empty ones
                      away must still index weight_indices (or W) by the segment, not by its rank among the
                      non-empty ones; a tile launched for 0 rows must write nothing
    single_segment    batch_size 1 (var len_indptr, with weight_indices only), weight_indices [W - 1]: a fast path
                      that runs one segment as a plain GEMM with W[0] is wrong
    one_row_segments  every segment one row (decode: one token per LoRA request): a GEMV path for M = 1 must read
                      a column-major W as its transpose
    tile_edge         segment lengths 129, 65, 17, 128, 1, 127, 255, 33 (cycled): one row past the 128- and 64-row
                      M tiles, exact tiles and one short: a kernel that drops a segment's partial last M tile
    long_segment      segment 1 (0 if there is one) 2049 rows: 2049 is no bfloat16 (exact to 256) and no float16
                      (exact to 2048) integer, so segment bounds taken through the activation dtype (FlashInfer's
                      seg_lens.to(x) before its cumsum) come out one row short and shift every later segment
    repeated_weights  weight_indices alternate W - 1, 0, W - 1, 0 (with weight_indices only): segments that share a
                      weight are not adjacent; grouping them into one row span overwrites the segments between
    half_overflow     x's first K/2 + 1 columns +a, the rest -a, every weight +a (a a power of two with
                      a^2 K/2 > 2 * 65504): each output is exactly 2 a^2 (in float16's range), but the partial sums
                      over K pass 65504: a float16 (half) accumulator overflows to inf
"""

from __future__ import annotations

import math

import torch

from .common import Builder, normal, permutation, randint, unknown_inputs

OP_TYPES = ("segment_gemm",)
INPUTS = ("x", "weights", "seg_indptr", "weight_indices")
SEGMENTS = {"small": 4, "medium": 8, "large": 16}  # batch_size where len_indptr is var
MAX_LEN = {"small": 8, "medium": 32, "large": 256}  # typical segment lengths 2 .. MAX_LEN
CASES = ("empty_segments", "single_segment", "one_row_segments", "tile_edge", "long_segment", "repeated_weights",
         "half_overflow")
TILE_EDGE = (129, 65, 17, 128, 1, 127, 255, 33)
LONG = 2049
FP16_MAX = 65504.0


def column_major(d) -> bool:
    """weights [W, N, K]: the last axis is x's K (the API's weight_column_major=True)."""
    return d.inputs["weights"].shape[2] == d.inputs["x"].shape[1]


def _var(d, axis: str) -> bool:
    return axis not in d.const_axes


def edge_cases(definition) -> list[str]:
    d = definition
    indices = "weight_indices" in d.inputs
    var = _var(d, d.inputs["seg_indptr"].shape[0])
    return [c for c in CASES
            if (c != "single_segment" or (var and indices)) and (c != "repeated_weights" or indices)]


def half_magnitude(k: int) -> float:
    """The power of two a with a^2 * K/2 > 2 * 65504: partial sums over half of K overflow float16."""
    return 2.0 ** math.ceil(0.5 * math.log2(4 * FP16_MAX / k))


def _lengths(b: Builder, batch: int) -> list[int]:
    lens = randint(2, MAX_LEN[b.size] + 1, (batch,), b.rng("seg_lens")).tolist()
    if b.case == "empty_segments":
        for i in (0, batch // 2, batch - 1):
            lens[i] = 0
    elif b.case == "one_row_segments":
        lens = [1] * batch
    elif b.case == "tile_edge":
        lens = [TILE_EDGE[i % len(TILE_EDGE)] for i in range(batch)]
    elif b.case == "long_segment":
        lens[1 if batch > 1 else 0] = LONG
    return lens


def generate(b: Builder) -> None:
    d = b.definition
    unknown_inputs(b, INPUTS, "segment_gemm")
    missing = [n for n in INPUTS[:3] if n not in d.inputs]
    if missing:
        raise b.mismatch(f"segment_gemm needs inputs x, weights, seg_indptr (missing {', '.join(missing)})")
    if len(b.spec("x").shape or ()) != 2 or len(b.spec("weights").shape or ()) != 3:
        raise b.mismatch("x must be [total_rows, K] and weights [W, K, N] or [W, N, K]")
    k_axis = b.dim_axis("x", 1)
    if k_axis not in (b.dim_axis("weights", 1), b.dim_axis("weights", 2)):
        raise b.mismatch("weights must have x's K axis as dimension 1 (row-major) or 2 (column-major)")
    if b.case is not None and b.case not in CASES:
        raise b.error(f"unknown case {b.case!r} (cases: {', '.join(CASES)})")
    if b.case is not None and b.case not in edge_cases(d):
        raise b.error(f"case {b.case} needs weight_indices (and single_segment a var len_indptr)")
    indptr_axis, w_axis = b.dim_axis("seg_indptr", 0), b.dim_axis("weights", 0)
    indices = "weight_indices" in d.inputs
    if not _var(d, indptr_axis):
        batch = d.const_axes[indptr_axis] - 1
    elif not indices and not _var(d, w_axis):  # segment i uses W[i]: one segment per weight
        batch = d.const_axes[w_axis]
    else:
        batch = 1 if b.case == "single_segment" else b.count(SEGMENTS[b.size])
    if _var(d, w_axis):
        b.set_axis(w_axis, batch + 1 if indices else batch)
    n_weights = b.axis(w_axis)
    if n_weights < (2 if indices else batch):
        raise b.error(f"{n_weights} weights are too few for {batch} segments")

    lens = _lengths(b, batch)
    indptr = torch.zeros(batch + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int64), 0)
    b.put("seg_indptr", indptr)
    b.set_axis(b.dim_axis("x", 0), int(indptr[-1]))
    if indices:
        if b.case == "single_segment":
            wi = torch.tensor([n_weights - 1])
        elif b.case == "repeated_weights":
            wi = torch.tensor([n_weights - 1 if i % 2 == 0 else 0 for i in range(batch)])
        else:  # each weight's successor on a random cycle through all of them: distinct, and never W[i]
            cycle = permutation(n_weights, b.rng("weight_indices")).to(torch.int64)
            succ = torch.empty_like(cycle)
            succ[cycle] = torch.roll(cycle, -1)
            wi = succ[:batch]
        b.put("weight_indices", wi.to(torch.int64))

    k = b.axis(k_axis)
    xs, ws = b.shape("x"), b.shape("weights")
    b.require_bytes(2 * (math.prod(xs) + math.prod(ws)), "x and weights")
    if b.case == "half_overflow":
        a = half_magnitude(k)
        col_sign = torch.where(torch.arange(k) <= k // 2, 1.0, -1.0)
        x = (a * col_sign).expand(xs).contiguous()
        w = torch.full(ws, a)
    else:
        x = normal(xs, b.rng("x"), device=b.device)
        w = normal(ws, b.rng("weights"), scale=1.0 / math.sqrt(k), device=b.device)
    b.put("x", x.to(b.torch_dtype("x")))
    b.put("weights", w.to(b.torch_dtype("weights")))

"""Planted bugs of the `segment_gemm` family, one per boundary class of docs/boundary/segment_gemm.md and a few plain
ones: each boundary mutant is right on typical operands (segments of 2 .. 8 rows, distinct weight indices, N(0, 1)
activations) and is caught by the case its comment names; the plain ones are caught everywhere."""

from __future__ import annotations

from .mutants_model import Mutant, _m, _writes

SHRINK = "segment_gemm_lora_shrink_h4096_r16"  # column-major, bf16, weight_indices
EXPAND = "segment_gemm_lora_expand_h4096_r16"  # column-major, K = 16
ROW = "segment_gemm_lora_expand_h8192_r64_fp16"  # row-major, fp16
MOE = "segment_gemm_moe_e8_k768_n2048"  # no weight_indices: segment i uses W[i]
ODD = "segment_gemm_k200_n72_fp16"  # row-major, K = 200: a partial K tile
_LOOP = "    for i in range(len(bounds) - 1):\n"
_BOUNDS = "        start, end = bounds[i], bounds[i + 1]\n"
_PICK = "        w = weights[int(weight_indices[i])].to(torch.float32)\n"
_PICK_MOE = "        w = weights[i].to(torch.float32)\n"
_COL = "        out[start:end] = x[start:end].to(torch.float32) @ w.t()\n"
_ROW = "        out[start:end] = x[start:end].to(torch.float32) @ w\n"
_INDPTR = "    bounds = seg_indptr.tolist()\n"

MUTANTS: tuple[Mutant, ...] = (
    # empty_segments: the empty segments compacted away, the weights then indexed by rank among the non-empty ones
    _m(SHRINK, "empty-segments-compacted", "empty segments skipped, weight_indices read at the non-empty rank",
       (_LOOP, "    live = [i for i in range(len(bounds) - 1) if bounds[i + 1] > bounds[i]]\n"
               "    for j, i in enumerate(live):\n"),
       (_PICK, "        w = weights[int(weight_indices[j])].to(torch.float32)\n"), cls="boundary-structure"),
    _m(MOE, "empty-experts-compacted", "experts without tokens skipped, W taken at the non-empty rank",
       (_LOOP, "    live = [i for i in range(len(bounds) - 1) if bounds[i + 1] > bounds[i]]\n"
               "    for j, i in enumerate(live):\n"),
       (_PICK_MOE, "        w = weights[j].to(torch.float32)\n"), cls="boundary-structure"),
    # single_segment: one segment run as a plain GEMM with W[0]
    _m(SHRINK, "single-segment-first-weight", "a single segment taken as a plain GEMM with W[0]",
       (_LOOP, "    if len(bounds) == 2:\n        weight_indices = torch.zeros_like(weight_indices)\n" + _LOOP),
       cls="boundary-structure"),
    # one_row_segments: a GEMV path for one-row segments reads the column-major W as row-major (reshape, no .t())
    _m(SHRINK, "one-row-gemv-reshape", "one-row segments through a GEMV that reshapes a column-major W",
       (_COL, "        if end - start == 1:\n"
              "            out[start:end] = x[start:end].to(torch.float32) @ w.reshape(w.shape[1], w.shape[0])\n"
              "        else:\n    " + _COL), cls="boundary-structure"),
    # tile_edge: the rows past a segment's last whole 128-row tile dropped
    _m(ROW, "m-tile-tail-dropped", "a segment longer than one 128-row tile loses its partial last tile",
       (_BOUNDS, _BOUNDS + "        if end - start > 128:\n            end = start + (end - start) // 128 * 128\n"),
       cls="boundary-structure"),
    # long_segment: segment lengths through the activation dtype (FlashInfer's seg_lens.to(x)) before the cumsum
    _m(SHRINK, "seg-lens-through-dtype", "segment lengths rounded to x's dtype before the offsets are summed",
       (_INDPTR, "    lens = (seg_indptr[1:] - seg_indptr[:-1]).to(x.dtype).to(torch.int64)\n"
                 "    bounds = [0] + torch.cumsum(lens, 0).tolist()\n"), cls="boundary-structure"),
    # repeated_weights: the segments of one weight merged into one row span, first start to last end
    _m(SHRINK, "repeated-weights-merged", "segments sharing a weight merged into one span (first start, last end)",
       (_LOOP + _BOUNDS + _PICK,
        "    for u in torch.unique(weight_indices).tolist():\n"
        "        segs = [i for i in range(len(bounds) - 1) if int(weight_indices[i]) == u]\n"
        "        start, end = bounds[segs[0]], bounds[segs[-1] + 1]\n"
        "        w = weights[u].to(torch.float32)\n"), cls="boundary-structure"),
    # half_overflow: the sum over K kept in float16, 32 columns at a time
    _m(ODD, "half-accumulator", "the sum over K accumulated in float16 (32-wide K chunks)",
       (_ROW, "        acc = torch.zeros(end - start, w.shape[1], dtype=torch.float16, device=x.device)\n"
              "        for k in range(0, x.shape[1], 32):\n"
              "            part = x[start:end, k:k + 32].to(torch.float32) @ w[k:k + 32]\n"
              "            acc = (acc.to(torch.float32) + part).to(torch.float16)\n"
              "        out[start:end] = acc.to(torch.float32)\n"), cls="boundary-magnitude"),
    _m(SHRINK, "ignores-weight-indices", "weight_indices ignored: segment i uses W[i]",
       (_PICK, "        w = weights[i].to(torch.float32)\n")),
    _m(EXPAND, "column-major-reshaped", "a column-major W [N, K] reshaped to [K, N] instead of transposed",
       (_COL, "        out[start:end] = x[start:end].to(torch.float32) @ w.reshape(w.shape[1], w.shape[0])\n")),
    _m(MOE, "last-segment-dropped", "the last segment never computed (its rows stay 0)",
       (_LOOP, "    for i in range(len(bounds) - 2):\n")),
    _m(ROW, "segment-end-short", "each segment's last row left out (an inclusive end read as exclusive twice)",
       (_ROW, "        out[start:end - 1] = x[start:end - 1].to(torch.float32) @ w\n")),
    _m(ODD, "k-tail-dropped", "the sum over K stops at the last whole 64-wide tile (the 8-wide tail dropped)",
       (_ROW, "        out[start:end] = x[start:end, :192].to(torch.float32) @ w[:192]\n")),
    _writes(EXPAND, "writes-indptr", "right output, but seg_indptr is rewritten in place afterwards (lengths to 0)",
            "    return out.to(x.dtype)", "seg_indptr.zero_()", result=None),
)

"""Independent float64 ground truth for `segment_gemm`, written from the math, not from the definitions' references.

Where the references walk the segments one by one, this labels every row with its segment
(`repeat_interleave` over the segment lengths), maps the label to a weight (weight_indices, or the segment itself),
and multiplies all rows that share a weight at once, in float64: a weight used by several segments, adjacent or
not, is one product over exactly its rows. Column-major weights ([W, N, K]) are transposed as views; the output is
rounded once to its declared dtype. An empty segment labels no row; a row no segment owns (none, when
total_rows == seg_indptr[-1]) stays 0.
"""

from __future__ import annotations

import torch

from ..dtypes import torch_dtype
from .base import Adapter, Call

F64 = torch.float64
INPUTS = ("x", "weights", "seg_indptr")


def applies(definition) -> str | None:
    missing = [n for n in INPUTS if n not in definition.inputs]
    if missing:
        return f"needs inputs {', '.join(missing)}"
    if "output" not in definition.outputs:
        return "needs the output `output`"
    return None


def column_major(definition) -> bool:
    """weights [W, N, K]: the last axis is x's K."""
    return definition.inputs["weights"].shape[2] == definition.inputs["x"].shape[1]


def segment_gemm(call: Call) -> tuple:
    d, v = call.definition, call.inputs.values
    x, weights, indptr = v["x"].to(F64), v["weights"], v["seg_indptr"].to(torch.int64).cpu()
    if column_major(d):
        weights = weights.transpose(1, 2)  # [W, K, N] views
    lens = indptr[1:] - indptr[:-1]
    segment = torch.repeat_interleave(torch.arange(lens.numel()), lens)  # a segment label per owned row
    which = v["weight_indices"].to(torch.int64).cpu()[segment] if "weight_indices" in v else segment
    first = int(indptr[0])
    y = torch.zeros(x.shape[0], weights.shape[2], dtype=F64, device=x.device)
    for u in torch.unique(which).tolist():
        rows = first + torch.nonzero(which == u).flatten()
        rows = rows.to(x.device)
        y[rows] = x[rows] @ weights[u].to(F64)
    return (y.to(torch_dtype(d.outputs["output"].dtype)),)


ADAPTERS = [
    Adapter("torch", "segment_gemm", "float64 product of the rows that share a weight (repeat_interleave labels)",
            segment_gemm, applies=applies),
]

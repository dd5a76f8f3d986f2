"""FlashInfer ground truth for `topk`: `flashinfer.topk.top_k` (the dense form) and `flashinfer.top_k_varlen`
with the fused `top_k_ragged_transform` / `top_k_page_table_transform` (the varlen form).

Read in flashinfer/topk.py, flashinfer/__init__.py, the top_k_varlen module and the trace template
flashinfer/trace/templates/topk.py (github:flashinfer-ai/flashinfer, main, 2026):

* `top_k(input, k, sorted=False, deterministic=False, tie_break=0) -> (values, indices)`: input [rows, d]
  float32 / float16 / bfloat16, values of the input's dtype, indices int64 (the int32 kernel output widened);
  unsorted unless `sorted`; `tie_break` 1 / 2 prefer the smaller / larger index among boundary ties and imply
  `deterministic`. `deterministic` and `tie_break` are later keywords: a release without one is `api-missing`
  for that mode (`accepts`), never a wrong call. Exported as `flashinfer.topk.top_k` (and `flashinfer.top_k`).
* `top_k_varlen(logits, seq_lens, top_k, ..., out_indices=None, ...) -> (indices, values or None)`: int32
  window-local ids of the min(top_k, seq_len) largest of logits[r, :seq_len], -1 after them.
* `top_k_ragged_transform(input, offsets, lengths, k)` (ids + offsets[r]) and
  `top_k_page_table_transform(input, src_page_table, lengths, k)` (src_page_table[r, id]): with zero offsets
  and an identity table (each row's table arange(width)) both return the varlen ids themselves, -1 past
  min(k, length): the same selection through the fused kernels DSA's sparse attention calls.

Paths and modes. Dense: plain (sorted=False), `sorted`, `deterministic`, `tie-small` / `tie-large`
(tie_break 1 / 2), and modes.py's `plan-reuse` and `graph` (the radix kernel keeps a cached row-state buffer
across calls, so a second call and a CUDA-graph replay are paths of their own). Varlen: plain, `out` (a
preallocated out_indices filled with a sentinel: every entry must be written, the -1 padding included),
`plan-reuse`, `graph`; the `ragged` and `page-table` paths each with `plan-reuse` and `graph`.

Releases: `requires` is the gate (a release without the function is `api-missing`). `top_k` came with the radix
top-k rewrite that also moved the sampling filters onto it (0.6.0, groundtruth/flashinfer_topk.py); VERSIONS
says >= 0.6.0 from that reading, not from a tag-by-tag check. `top_k_varlen` is newer; no release bound is
claimed for it beyond `requires`. Multi-CTA radix passes over shared row states: `races`.
"""

from __future__ import annotations

import torch
from packaging.specifiers import SpecifierSet

from ..inputs.topk_select import form
from .base import Adapter, Call, GroundTruthUnavailable, accepts
from .flashinfer import PACKAGE
from .modes import GENERIC

VERSIONS = SpecifierSet(">=0.6.0")
DTYPES = frozenset({"float32", "float16", "bfloat16"})
DENSE_MODES = {"sorted": {"sorted": True}, "deterministic": {"deterministic": True},
               "tie-small": {"tie_break": 1}, "tie-large": {"tie_break": 2}}
SENTINEL = 7  # out mode: a value no output entry may keep by accident (ids are written or -1)


def only(which: str):
    def applies(d) -> str | None:
        f = form(d)
        if f is None or "top_k" not in d.const_axes:
            return "needs (input, k) or (logits, seq_lens, top_k) and a const axis top_k"
        return None if f == which else f"the {f} form, not {which}"
    return applies


def plan_dense(call: Call):
    fn = call.module.topk.top_k
    extra = DENSE_MODES.get(call.mode or "", {})
    for name in extra:
        if not accepts(fn, name):
            raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} top_k has no {name}")
    x = call.inputs.values
    inp, k = x["input"], int(x["k"])
    return lambda: fn(inp, k, **extra)


def plan_varlen(call: Call):
    fn = call.module.top_k_varlen
    x = call.inputs.values
    logits, seq_lens, k = x["logits"], x["seq_lens"], int(x["top_k"])
    if call.mode == "out":
        if not accepts(fn, "out_indices"):
            raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} top_k_varlen has no out_indices")
        out = torch.full((logits.shape[0], k), SENTINEL, dtype=torch.int32, device=logits.device)
        return lambda: fn(logits, seq_lens, k, out_indices=out)
    return lambda: fn(logits, seq_lens, k)


def plan_ragged(call: Call):
    x = call.inputs.values
    logits, seq_lens, k = x["logits"], x["seq_lens"], int(x["top_k"])
    offsets = torch.zeros(logits.shape[0], dtype=torch.int32, device=logits.device)
    fn = call.module.topk.top_k_ragged_transform
    return lambda: fn(logits, offsets, seq_lens, k)


def plan_page_table(call: Call):
    x = call.inputs.values
    logits, seq_lens, k = x["logits"], x["seq_lens"], int(x["top_k"])
    rows, width = logits.shape
    table = torch.arange(width, dtype=torch.int32, device=logits.device).expand(rows, width).contiguous()
    fn = call.module.topk.top_k_page_table_transform
    return lambda: fn(logits, table, seq_lens, k)


def finish_pair(call: Call, raw) -> tuple:
    values, indices = raw
    return values, indices


def finish_first(call: Call, raw) -> tuple:
    return (raw[0] if isinstance(raw, (tuple, list)) else raw,)


def _run(plan, finish):
    def fn(call: Call) -> tuple:
        return finish(call, plan(call)())
    return fn


def _adapter(api: str, requires: str, which: str, plan, finish, modes: tuple[str, ...], path: str = "",
             versions: SpecifierSet | None = None) -> Adapter:
    return Adapter("flashinfer", "topk", api, _run(plan, finish), package=PACKAGE,
                   versions=versions if versions is not None else SpecifierSet(), requires=(requires,),
                   applies=only(which), dtypes=DTYPES, needs_cuda=True, path=path, modes=modes, plan=plan,
                   finish=finish, races=True)


ADAPTERS = [
    _adapter("flashinfer.topk.top_k", "topk.top_k", "dense", plan_dense, finish_pair,
             tuple(DENSE_MODES) + GENERIC, versions=VERSIONS),
    _adapter("flashinfer.top_k_varlen", "top_k_varlen", "varlen", plan_varlen, finish_first, ("out",) + GENERIC),
    _adapter("flashinfer.topk.top_k_ragged_transform", "topk.top_k_ragged_transform", "varlen", plan_ragged,
             finish_first, GENERIC, path="ragged", versions=VERSIONS),
    _adapter("flashinfer.topk.top_k_page_table_transform", "topk.top_k_page_table_transform", "varlen",
             plan_page_table, finish_first, GENERIC, path="page-table", versions=VERSIONS),
]

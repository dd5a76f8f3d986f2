"""SGLang ground truth for `cascade_merge` (the two-state merge only), from sgl-kernel's
python/sgl_kernel/attention.py and csrc/attention/merge_attn_states.cu (github:sgl-project/sglang):

* `merge_state(v_a, s_a, v_b, s_b, v_merged=None, s_merged=None)`: FlashInfer's cascade kernel compiled into
  sgl_kernel; base-2 lse, as the definitions take it.
* `merge_state_v2(...)`, same signature: the kernel SGLang's FlashAttention backend merges prefix and
  suffix states with (vLLM's merge_attn_states). Its lse is NATURAL (expf / logf), as FlashAttention returns
  it, [seq_len, num_heads]; so this adapter hands it s * ln 2 and returns s_merged / ln 2 (the conversion's
  float32 rounding, 6e-8 relative, is far inside the tolerance of a 16-bit definition). It maps a +inf lse to
  -inf (not generated here) and takes head_dim a multiple of 8 in 16-bit dtypes.

Both are gated by attribute (a kernel release without the function is `api-missing`); mode `out` passes
preallocated v_merged / s_merged, as SGLang's callers do when they reuse buffers.
"""

from __future__ import annotations

import math

import torch

from .base import Adapter, Call, GroundTruthUnavailable, accepts
from .flashinfer_cascade import LSE_AND_V, v_dtype
from .sglang import HALF, KERNELS
from .torch_cascade import kind

LN2 = math.log(2.0)


def _pair(accepted: frozenset[str]):
    def check(d) -> str | None:
        if kind(d) != "pair":
            return "merges two states given as (v_a, s_a, v_b, s_b) only"
        return v_dtype(d, accepted)
    return check


def _call(call: Call, name: str, natural: bool) -> tuple:
    x = call.inputs.values
    fn = getattr(call.module, name)
    v_a, v_b = x["v_a"], x["v_b"]
    s_a, s_b = (x[n] * LN2 if natural else x[n] for n in ("s_a", "s_b"))
    extra = {}
    if call.mode == "out":
        if not accepts(fn, "v_merged"):
            raise GroundTruthUnavailable("api-missing", f"sgl_kernel {call.version} {name} has no v_merged")
        extra = {"v_merged": torch.empty_like(v_a), "s_merged": torch.empty_like(x["s_a"])}
    v, s = fn(v_a, s_a, v_b, s_b, **extra)
    return v, (s / LN2 if natural else s)


def merge_state(call: Call) -> tuple:
    return _call(call, "merge_state", natural=False)


def merge_state_v2(call: Call) -> tuple:
    return _call(call, "merge_state_v2", natural=True)


ADAPTERS = [
    Adapter("sglang", "cascade_merge", "sgl_kernel.merge_state", merge_state, package=KERNELS,
            requires=("merge_state",), applies=_pair(HALF), dtypes=LSE_AND_V, needs_cuda=True, modes=("out",)),
    Adapter("sglang", "cascade_merge", "sgl_kernel.merge_state_v2 (natural-log lse)", merge_state_v2,
            package=KERNELS, requires=("merge_state_v2",), applies=_pair(LSE_AND_V), dtypes=LSE_AND_V,
            needs_cuda=True, path="v2", modes=("out",)),
]

"""SGLang ground truth for the deterministic sampling filters: `sgl_kernel.top_k_renorm_prob`,
`top_p_renorm_prob` and `top_k_mask_logits` (the names SGLang's sampler imports).

Read in sgl-kernel/python/sgl_kernel/sampling.py (sglang main, 2026): `top_k_renorm_probs(probs, top_k)`
and `top_p_renorm_probs(probs, top_p)` with the `_prob` aliases, a Python scalar or a per-row tensor as
FlashInfer takes them (the kernels are FlashInfer's, vendored), each casting its input to float32 and
returning float32; `top_k_mask_logits(logits, top_k)` likewise where a release has it. Which sgl_kernel
releases export which name was not pinned down here, so each adapter `requires` its attribute: a release
without it is `api-missing`, never a wrong call. Modes: the definition's form, and `per-row` (a scalar
definition's value broadcast to a per-row tensor).
"""

from __future__ import annotations

import torch

from .base import Adapter, Call
from .flashinfer_topk import PER_ROW, arguments, finish, form_applies
from .sglang import KERNELS

FILTERS = (
    ("top_k_renorm", "top_k_renorm_prob", "probs", "top_k", torch.int32),
    ("top_p_renorm", "top_p_renorm_prob", "probs", "top_p", torch.float32),
    ("top_k_mask", "top_k_mask_logits", "logits", "top_k", torch.int32),
)


def call_filter(api: str, dist: str, name: str, dtype: torch.dtype):
    def fn(call: Call) -> tuple:
        values, param = arguments(call, dist, name, dtype)
        return finish(call, (getattr(call.module, api)(values, param),))
    return fn


ADAPTERS = [
    Adapter("sglang", "sampling", f"sgl_kernel.{api}", call_filter(api, dist, name, dtype), package=KERNELS,
            requires=(api,), applies=form_applies(kind, name, scalar),
            dtypes=frozenset({"float32", "float16", "bfloat16"}), needs_cuda=True,
            modes=(PER_ROW,) if scalar else ())
    for kind, api, dist, name, dtype in FILTERS for scalar in (False, True)
]

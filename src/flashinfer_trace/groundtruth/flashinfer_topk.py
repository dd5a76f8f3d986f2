"""FlashInfer ground truth for the deterministic sampling filters: `flashinfer.sampling.top_k_renorm_probs`,
`top_p_renorm_probs` and `top_k_mask_logits` (op_type `sampling`, first output a float tensor).

Read in flashinfer/sampling.py at v0.2.0, 0.3.0, 0.4.1, 0.5.3, 0.6.0, 0.6.6, 0.6.7, 0.6.18rc7 and main
(2026-08): all three exist under these names from 0.2.0 (0.1.x had `top_k_renorm_prob` / `top_p_renorm_prob`
with an `eps`, kept since as aliases), each `(x, top_k | top_p)` with a Python scalar (one value for every
row) or a per-row tensor; `top_p_renorm_probs` gains `is_deterministic=False` in 0.6.7. Before 0.6.0 every
one casts its input to float32 and returns float32; from 0.6.0 `top_k_renorm_probs` and `top_k_mask_logits`
run float32, float16 and bfloat16 natively (a radix top-k with a cached row-state buffer) and return the
input's dtype, while `top_p_renorm_probs` still computes in float32. So a float32 result is rounded to the
definition's output dtype here, once, as the reference rounds.

Call modes, each its own path: the definition's form (a scalar top_k / top_p, or a per-row tensor);
`per-row` (a scalar definition's value broadcast to a per-row tensor: the kernel's other argument);
`deterministic` (top_p, `is_deterministic=True`, api-missing before 0.6.7); `plan-reuse` and `graph`
(modes.py: a second call on new data, CUDA-graph replay; the row-state buffer outlives a call). `races`:
from 0.6.0 top-k is a multi-CTA radix select over shared row states, and top-p accumulates its histogram
with float atomics unless `is_deterministic`, so each case is run more than once.
"""

from __future__ import annotations

import torch
from packaging.specifiers import SpecifierSet

from ..dtypes import torch_dtype
from .base import Adapter, Call, GroundTruthUnavailable, accepts
from .flashinfer import PACKAGE
from .modes import GENERIC
from .torch_topk import only

VERSIONS = SpecifierSet(">=0.2.0")
DETERMINISTIC = "is_deterministic"  # top_p_renorm_probs, 0.6.7 on
PER_ROW = "per-row"
DTYPES = frozenset({"float32", "float16", "bfloat16"})
# (filter kind, API, its distribution input, its parameter input, the parameter's per-row dtype)
FILTERS = (
    ("top_k_renorm", "top_k_renorm_probs", "probs", "top_k", torch.int32),
    ("top_p_renorm", "top_p_renorm_probs", "probs", "top_p", torch.float32),
    ("top_k_mask", "top_k_mask_logits", "logits", "top_k", torch.int32),
)


def _scalar_form(d, name: str) -> bool:
    return not d.inputs[name].shape


def form_applies(kind: str, name: str, scalar: bool):
    """applies= for one filter in one parameter form (scalar or per-row definitions)."""
    base = only(kind)

    def applies(d) -> str | None:
        why = base(d)
        if why:
            return why
        if _scalar_form(d, name) != scalar:
            return f"{name} is {'per-row' if scalar else 'a scalar'}"
        return None
    return applies


def arguments(call: Call, dist: str, name: str, dtype: torch.dtype):
    """(distribution tensor, parameter as the mode passes it, keywords)."""
    x = call.inputs.values
    values, param = x[dist], x[name]
    if isinstance(param, torch.Tensor):
        param = param.to(dtype)
    elif call.mode == PER_ROW:
        param = torch.full((values.shape[0],), param, dtype=dtype, device=values.device)
    return values, param


def plan(api: str, dist: str, name: str, dtype: torch.dtype):
    def launch(call: Call):
        fn = getattr(call.module.sampling, api)
        extra = {}
        if call.mode == "deterministic":
            if not accepts(fn, DETERMINISTIC):
                raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} {api} has no {DETERMINISTIC}")
            extra[DETERMINISTIC] = True
        values, param = arguments(call, dist, name, dtype)
        return lambda: fn(values, param, **extra)
    return launch


def finish(call: Call, raw: tuple) -> tuple:
    """The result in the definition's output dtype (float32 before 0.6.0, and top_p always: rounded once)."""
    out = next(iter(call.definition.outputs.values()))
    return (raw[0].to(torch_dtype(out.dtype)),)


def call_filter(launcher):
    def fn(call: Call) -> tuple:
        return finish(call, (launcher(call)(),))
    return fn


def _adapters() -> list[Adapter]:
    out = []
    for kind, api, dist, name, dtype in FILTERS:
        launcher = plan(api, dist, name, dtype)
        extra = ("deterministic",) if kind == "top_p_renorm" else ()
        for scalar in (False, True):
            modes = ((PER_ROW,) if scalar else ()) + extra + GENERIC
            out.append(Adapter("flashinfer", "sampling", f"flashinfer.sampling.{api}", call_filter(launcher),
                               package=PACKAGE, versions=VERSIONS, requires=(f"sampling.{api}",),
                               applies=form_applies(kind, name, scalar), dtypes=DTYPES, needs_cuda=True,
                               modes=modes, plan=launcher, finish=finish, races=True))
    return out


ADAPTERS = _adapters()

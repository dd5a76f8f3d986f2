"""FlashInfer ground truth of single-request attention: `single_decode_with_kv_cache` (op type
`single_decode`) and `single_prefill_with_kv_cache` (`single_prefill`). One request, no paging, no plan():
each call is the whole launch, so the plan step of these adapters only binds the tensors and keywords (what a
CUDA graph captures, modes.py).

What the APIs offer, read from FlashInfer's `flashinfer/decode.py` and `flashinfer/prefill.py` at the
release tags (docs/ground-truth.md has the table):

* `kv_layout` "NHD" (k, v [kv_len, heads, dim], the definitions' layout) or "HND" ([heads, kv_len, dim]):
  every release. Mode `hnd` passes transposed, contiguous copies of k and v.
* `return_lse`: single_prefill in every release since 0.2.0; single_decode from 0.2.6 (`DECODE_LSE`; earlier
  ones return the output only). Neither takes an lse base: the kernels write log2-based lse, what the
  definitions declare. A definition without an `lse` output (fi_trace's) is called without it.
* decode `use_tensor_cores`: the prefill kernel with one query row, every release; its own path
  (`tensor-cores`), as for the batch decode.
* prefill `backend` "auto" / "fa2" / "fa3" (every release since 0.2.0): fa2 pinned on the plain path, mode `fa3`
  on sm90 only.
* `causal`: from the definition's name (semantics.is_causal). Sliding window, logits soft cap, RoPE and the
  fp8 scales are left at their defaults: no definition asks for them.
"""

from __future__ import annotations

from typing import Any

import torch
from packaging.specifiers import SpecifierSet

from .. import semantics as sem
from .base import Adapter, Call, GroundTruthUnavailable, accepts
from .flashinfer import HALF, PACKAGE

DECODE_LSE = SpecifierSet(">=0.2.6")  # single_decode_with_kv_cache(return_lse=...): PR #1007, first in v0.2.6
PREFILL = SpecifierSet(">=0.2.0")  # single_prefill_with_kv_cache with backend= and return_lse=
DECODE_MODES = ("hnd", "graph")
PREFILL_MODES = ("hnd", "fa3", "fa3-hnd", "graph")


def _layout(call: Call) -> tuple[str, torch.Tensor, torch.Tensor]:
    """The kv layout the mode asks for and k, v in it (HND: transposed, contiguous copies)."""
    x = call.inputs.values
    k, v = x["k"], x["v"]
    if call.mode is not None and "hnd" in call.mode.split("-"):
        return "HND", k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
    return "NHD", k, v


def _lse(call: Call, fn: Any) -> dict[str, Any]:
    if "lse" not in call.definition.outputs:
        return {}
    if not accepts(fn, "return_lse"):
        raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} {fn.__name__} has no return_lse")
    return {"return_lse": True}


def _tuple(raw: Any) -> tuple:
    return tuple(raw) if isinstance(raw, (tuple, list)) else (raw,)


def plan_decode(call: Call, *, tensor_cores: bool = False):
    x = call.inputs.values
    q = x["q"]
    fn = call.module.decode.single_decode_with_kv_cache
    layout, k, v = _layout(call)
    kw = dict(kv_layout=layout, sm_scale=sem.sm_scale(x, q.shape[-1]), **_lse(call, fn))
    if tensor_cores:
        kw["use_tensor_cores"] = True
    return lambda: fn(q, k, v, **kw)


def plan_decode_tc(call: Call):
    return plan_decode(call, tensor_cores=True)


def decode(call: Call) -> tuple:
    return _tuple(plan_decode(call)())


def decode_tc(call: Call) -> tuple:
    return _tuple(plan_decode_tc(call)())


def _device_cc(t: torch.Tensor) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(t.device) if t.device.type == "cuda" else None


def _backend(call: Call) -> str:
    """fa2 pinned ("auto" picks by arch), fa3 where the mode asks for it: Hopper only."""
    if call.mode is None or "fa3" not in call.mode.split("-"):
        return "fa2"
    q = call.inputs.values["q"]
    cc = _device_cc(q)
    if cc != (9, 0):
        raise GroundTruthUnavailable("arch-unsupported", "single_prefill_with_kv_cache(backend='fa3') needs sm90, "
                                                         f"have {f'sm{cc[0]}{cc[1]}' if cc else q.device.type}")
    return "fa3"


def plan_prefill(call: Call):
    x = call.inputs.values
    q = x["q"]
    fn = call.module.prefill.single_prefill_with_kv_cache
    layout, k, v = _layout(call)
    kw = dict(causal=sem.is_causal(call.definition), kv_layout=layout, sm_scale=sem.sm_scale(x, q.shape[-1]),
              backend=_backend(call), **_lse(call, fn))
    return lambda: fn(q, k, v, **kw)


def prefill(call: Call) -> tuple:
    return _tuple(plan_prefill(call)())


def _applies(prefill_stage: bool):
    def applies(d) -> str | None:
        missing = sem.missing_inputs(d, ("q", "k", "v"))
        if missing:
            return missing
        extra = [o for o in d.outputs if o not in ("output", "lse")]
        if extra:
            return f"declares output(s) {', '.join(extra)}; the API returns output and lse only"
        q = d.inputs["q"]
        rank = len(q.shape) if q.shape is not None else 0
        if rank != (3 if prefill_stage else 2):
            return f"q of rank {rank}; the API takes {'[qo_len, heads, dim]' if prefill_stage else '[heads, dim]'}"
        return None

    return applies


def _resolve_decode(module, version, d) -> None:
    if "lse" in d.outputs and version is not None and version not in DECODE_LSE:
        raise GroundTruthUnavailable("api-missing", f"flashinfer {version} single_decode_with_kv_cache has no "
                                                    f"return_lse (needs {DECODE_LSE})")


_COMMON = dict(package=PACKAGE, dtypes=HALF, needs_cuda=True, finish=lambda call, raw: _tuple(raw))
ADAPTERS = [
    Adapter("flashinfer", "single_decode", "flashinfer.decode.single_decode_with_kv_cache", decode,
            requires=("decode.single_decode_with_kv_cache",), applies=_applies(False), resolve=_resolve_decode,
            modes=DECODE_MODES, plan=plan_decode, races=True, **_COMMON),
    Adapter("flashinfer", "single_decode", "flashinfer.decode.single_decode_with_kv_cache(use_tensor_cores=True)",
            decode_tc, requires=("decode.single_decode_with_kv_cache",), applies=_applies(False),
            resolve=_resolve_decode, path="tensor-cores", modes=DECODE_MODES, plan=plan_decode_tc, races=True,
            **_COMMON),
    Adapter("flashinfer", "single_prefill", "flashinfer.prefill.single_prefill_with_kv_cache", prefill,
            versions=PREFILL, requires=("prefill.single_prefill_with_kv_cache",), applies=_applies(True),
            modes=PREFILL_MODES, plan=plan_prefill, races=True, **_COMMON),
]

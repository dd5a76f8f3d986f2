"""FlashInfer ground truth for `cascade_merge`: the attention partial-state merges of flashinfer.cascade.

Read from flashinfer/cascade.py and include/flashinfer/attention/cascade.cuh (github:flashinfer-ai/flashinfer):
`merge_state(v_a, s_a, v_b, s_b) -> (v_merged, s_merged)`, `merge_state_in_place(v, s, v_other, s_other,
mask=None) -> None` (writes v and s) and `merge_states(v, s) -> (v_merged, s_merged)`, v [seq_len, num_heads,
head_dim] (merge_states: [seq_len, num_states, num_heads, head_dim]) in float16 or bfloat16, s float32 base-2
lse. All three are in every release this project checks (0.5.x to 0.7.x, and long before); `mask` is checked by
signature (a release without it is `api-missing` for the masked definition). Each definition gets every call
of the same math the package offers, each its own ground-truth path:

* merge_state definitions: `merge_state` (plain), `merge_state_in_place` on clones of (v_a, s_a) with no mask
  (path `in-place`), `merge_states` on the two states stacked (path `merge-states`, the n-state kernel at n 2);
* merge_state_in_place definitions: the masked call on clones (plain), and the rows whose mask is True merged by
  an unmasked call and scattered back (path `no-mask`: the kernel without its mask branch);
* merge_states definitions: `merge_states` (plain).

Every path has `graph` too (modes.py: captured in a CUDA graph and replayed on other data, the use the in-place
mask is documented for).
"""

from __future__ import annotations

import torch

from .base import Adapter, Call, GroundTruthUnavailable, accepts
from .flashinfer import HALF, PACKAGE
from .torch_cascade import kind

PAIR_MODES = ("in-place", "merge-states")
LSE_AND_V = frozenset(HALF | {"float32"})


def _applies(want: str):
    def check(d) -> str | None:
        got = kind(d)
        if got != want:
            return f"a {want} merge, not {got or 'an unknown form'}"
        return v_dtype(d, HALF)
    return check


def v_dtype(d, accepted: frozenset[str]) -> str | None:
    """The kernels' v dtypes (the lse is float32 in every form: `dtypes` admits it, this checks v)."""
    v = next(s for n, s in d.inputs.items() if n in ("v_a", "v"))
    return None if v.dtype.value in accepted else f"v in {', '.join(sorted(accepted))} only, not {v.dtype.value}"


def plan_pair(call: Call):
    fi, x = call.module, call.inputs.values
    v_a, s_a, v_b, s_b = (x[n] for n in ("v_a", "s_a", "v_b", "s_b"))
    if call.mode == "in-place":  # v_a / s_a are the launch's own tensors here (clones: run_pair, modes.py)
        fn = _api(call, "merge_state_in_place")

        def launch():
            fn(v_a, s_a, v_b, s_b)
            return v_a, s_a
        return launch
    if call.mode == "merge-states":
        v, s = torch.stack([v_a, v_b], dim=1), torch.stack([s_a, s_b], dim=1)
        merge_states = _api(call, "merge_states")
        return lambda: merge_states(v, s)
    return lambda: fi.cascade.merge_state(v_a, s_a, v_b, s_b)


def _api(call: Call, name: str):
    fn = getattr(call.module.cascade, name, None)
    if fn is None:
        raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} has no cascade.{name}")
    return fn


def run_pair(call: Call) -> tuple:
    if call.mode == "in-place":
        call = _cloned(call, "v_a", "s_a")
    return tuple(plan_pair(call)())


def _mask_keyword(call: Call):
    fn = call.module.cascade.merge_state_in_place
    if not accepts(fn, "mask"):
        raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} merge_state_in_place has no mask")
    return fn


def plan_in_place(call: Call):
    x = call.inputs.values
    v, s, v_other, s_other = (x[n] for n in ("v", "s", "v_other", "s_other"))
    mask = x.get("mask")
    if call.mode == "no-mask":  # the merged rows through the unmasked kernel, written back into v and s
        fn = call.module.cascade.merge_state_in_place
        rows = torch.nonzero(mask).reshape(-1) if mask is not None else None

        def launch():
            if rows is None:
                fn(v, s, v_other, s_other)
                return v, s
            if rows.numel() == 0:  # nothing to merge: no launch of an empty grid
                return v, s
            sub_v, sub_s = v.index_select(0, rows), s.index_select(0, rows)
            fn(sub_v, sub_s, v_other.index_select(0, rows), s_other.index_select(0, rows))
            v.index_copy_(0, rows, sub_v)
            s.index_copy_(0, rows, sub_s)
            return v, s
        return launch
    fn = _mask_keyword(call) if mask is not None else call.module.cascade.merge_state_in_place

    def launch():
        fn(v, s, v_other, s_other, **({"mask": mask} if mask is not None else {}))
        return v, s
    return launch


def run_in_place(call: Call) -> tuple:
    return tuple(plan_in_place(_cloned(call, "v", "s"))())


def plan_multi(call: Call):
    v, s = call.inputs.values["v"], call.inputs.values["s"]
    return lambda: call.module.cascade.merge_states(v, s)


def run_multi(call: Call) -> tuple:
    return tuple(plan_multi(call)())


def _cloned(call: Call, *names: str) -> Call:
    """The call with fresh copies of the inputs a kernel writes into (the case's own stay untouched)."""
    import dataclasses

    values = dict(call.inputs.values)
    for n in names:
        values[n] = values[n].clone()
    inputs = dataclasses.replace(call.inputs, values=values)
    return dataclasses.replace(call, inputs=inputs)


_COMMON = dict(package=PACKAGE, dtypes=LSE_AND_V, needs_cuda=True, finish=lambda call, raw: tuple(raw))
ADAPTERS = [
    Adapter("flashinfer", "cascade_merge", "flashinfer.cascade.merge_state", run_pair,
            requires=("cascade.merge_state",),
            applies=_applies("pair"), modes=(*PAIR_MODES, "graph"), plan=plan_pair, **_COMMON),
    Adapter("flashinfer", "cascade_merge", "flashinfer.cascade.merge_state_in_place", run_in_place,
            requires=("cascade.merge_state_in_place",), applies=_applies("in_place"), modes=("no-mask", "graph"),
            plan=plan_in_place, **_COMMON),
    Adapter("flashinfer", "cascade_merge", "flashinfer.cascade.merge_states", run_multi,
            requires=("cascade.merge_states",), applies=_applies("multi"), modes=("graph",), plan=plan_multi,
            **_COMMON),
]

"""FlashInfer ground truth for `moe_routing`: `flashinfer.fused_moe.fused_topk_deepseek(scores, bias, n_group,
topk_group, topk, routed_scaling_factor, topk_values, topk_indices, launch_with_pdl=True,
routing_replay_out=None, *, backend="default") -> None` (also `flashinfer.dsv3_ops.fused_topk_deepseek`).

Read in flashinfer/fused_moe/fused_routing_dsv3.py and csrc/fused_moe/noAuxTcKernels.cu of the 0.6.6 and
0.7.2.post1 wheels: the kernel writes the caller's buffers in place; topk_values must have the dtype of scores
(the C++ check, in both releases: 0.6.6's docstring says "Must be float32", which its own check rejects for bf16
scores; the check is the contract followed here) and topk_indices int32; bias may be any of the three float
dtypes (the definitions keep it in scores' dtype, as the docstring asks, except that float32 logits take the
float32 bias DeepSeek-V3 stores). Limits the Python check enforces: topk <= 8; n_group > 1: num_experts / n_group
<= 32 and that times topk_group <= 128; n_group == 1: num_experts <= 384; topk_group * n_group >= topk.

Paths and modes:

* plain: the default backend, launch_with_pdl left at True, into buffers filled with a sentinel (NaN weights,
  id -7: every entry must be written); modes `no-pdl` (launch_with_pdl=False: the launch without programmatic
  dependent launch), `replay` (routing_replay_out: an int16 buffer two rows longer than the batch, sentinel -7;
  its first num_tokens rows must equal topk_indices and the two extra rows stay untouched: where either fails,
  the ids judged are the replay's, or -1, so the verdict says so), and modes.py's `plan-reuse` and `graph`
  (a CUDA-graph replay on other data);
* `cake`: backend="cake" (the Cake kernel, 0.7.2.post1): sm100 / sm103 only (its requirement lists exactly
  those), so `arch-unsupported` elsewhere.

Releases: the API is `fused_topk_deepseek` from 0.6.0 (flashinfer PR 2181, "Rename noauxtc to
fused_topk_deepseek", in v0.6.0rc1; earlier releases have no such function: `requires` makes them
`api-missing`). `routing_replay_out` and `backend` are later keywords (absent in 0.6.6, present in 0.7.2.post1):
a release without one is `api-missing` for that mode or path (`accepts`), never a wrong call. The default
backend's requirement lists sm89, 90, 100, 103, (107 from 0.7), 120, 121: min_cc sm89.
"""

from __future__ import annotations

import torch
from packaging.specifiers import SpecifierSet

from .base import Adapter, Call, GroundTruthUnavailable, accepts
from .flashinfer import PACKAGE
from .modes import GENERIC
from .torch_moe_routing import applies as truth_applies
from .torch_moe_routing import config

VERSIONS = SpecifierSet(">=0.6.0")
DTYPES = frozenset({"float32", "float16", "bfloat16"})
SENTINEL = -7
EXTRA_ROWS = 2
MODES = ("no-pdl", "replay") + GENERIC


def applies(d) -> str | None:
    why = truth_applies(d)
    if why is not None:
        return why
    n_group, topk_group, topk, _ = config(d)
    shape = d.inputs["scores"].shape or []
    experts = int(d.const_axes.get(shape[1], 0)) if len(shape) == 2 else 0
    if not experts:
        return "scores must be [num_tokens, num_experts] with a const num_experts"
    if d.outputs["topk_values"].dtype != d.inputs["scores"].dtype:
        return "topk_values must have the dtype of scores"
    if d.outputs["topk_indices"].dtype.value != "int32":
        return "topk_indices must be int32"
    if topk > 8 or topk > experts or experts % n_group:
        return f"topk {topk} must be <= 8 and <= num_experts, num_experts a multiple of n_group {n_group}"
    if topk_group > n_group or topk_group * n_group < topk:
        return (f"the API's check asks topk_group <= n_group and topk_group * n_group >= topk (here {topk_group}, "
                f"{n_group}, {topk}): n_group 1 admits topk 1 only")
    if n_group > 1 and (experts // n_group > 32 or experts // n_group * topk_group > 128):
        return "n_group > 1 needs num_experts / n_group <= 32 and that times topk_group <= 128"
    if n_group == 1 and experts > 384:
        return "n_group 1 takes at most 384 experts"
    return None


def plan(backend: str | None):
    def make(call: Call):
        fn = call.module.fused_moe.fused_topk_deepseek
        n_group, topk_group, topk, scale = config(call.definition)
        x = call.inputs.values
        scores, bias = x["scores"], x["bias"]
        tokens = scores.shape[0]
        extra: dict = {}
        if backend is not None:
            if not accepts(fn, "backend"):
                raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} fused_topk_deepseek has no "
                                                            f"backend")
            extra["backend"] = backend
        if call.mode == "no-pdl":
            extra["launch_with_pdl"] = False
        replay = None
        if call.mode == "replay":
            if not accepts(fn, "routing_replay_out"):
                raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} fused_topk_deepseek has no "
                                                            f"routing_replay_out")
            replay = torch.full((tokens + EXTRA_ROWS, topk), SENTINEL, dtype=torch.int16, device=scores.device)
            extra["routing_replay_out"] = replay
        values = torch.full((tokens, topk), float("nan"), dtype=scores.dtype, device=scores.device)
        ids = torch.full((tokens, topk), SENTINEL, dtype=torch.int32, device=scores.device)

        def launch():
            fn(scores, bias, n_group, topk_group, topk, scale, values, ids, **extra)
            return (values, ids) if replay is None else (values, ids, replay)

        return launch

    return make


def finish(call: Call, raw) -> tuple:
    """(topk_values, topk_indices); with a replay buffer, the ids it recorded where they disagree."""
    if len(raw) == 2:
        return tuple(raw)
    values, ids, replay = raw
    tokens = ids.shape[0]
    recorded = replay[:tokens].to(torch.int32)
    if not bool((replay[tokens:] == SENTINEL).all()):
        return values, torch.full_like(ids, -1)  # rows past num_tokens written: no id of it can be trusted
    return values, ids if bool((recorded == ids).all()) else recorded


def run(backend: str | None):
    make = plan(backend)

    def call_it(call: Call) -> tuple:
        return finish(call, make(call)())

    return call_it


_FI = dict(package=PACKAGE, requires=("fused_moe.fused_topk_deepseek",), applies=applies, dtypes=DTYPES,
           needs_cuda=True, versions=VERSIONS, finish=finish)
ADAPTERS = [
    Adapter("flashinfer", "moe_routing", "flashinfer.fused_moe.fused_topk_deepseek", run(None), min_cc=(8, 9),
            modes=MODES, plan=plan(None), **_FI),
    Adapter("flashinfer", "moe_routing", "flashinfer.fused_moe.fused_topk_deepseek(backend=cake)", run("cake"),
            path="cake", min_cc=(10, 0), max_cc=(10, 3), plan=plan("cake"), modes=GENERIC, **_FI),
]

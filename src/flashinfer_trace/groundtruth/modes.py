"""The generic call modes: ways a serving engine calls any planned kernel, each its own ground-truth path.

    plan-reuse   plan once with other data in the tensors, run, put the case's data into the same
                 tensors, run again: the second output must follow the new data (a kernel or wrapper
                 that keeps state from the first run, or from plan time, fails)
    graph        the same, with the launch captured in a CUDA graph: replayed on the other data, then
                 on the case's (an output that does not follow its input is a failure)

Both need the adapter's `plan` (the launch split from its setup). The other data is the case's own
values flipped along their last dimension: valid for every input (a probability row still sums to 1,
scales stay positive), and different wherever the data is not symmetric.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ..status import GroundTruthUnavailable

if TYPE_CHECKING:
    from .base import Adapter, Call

GENERIC = ("plan-reuse", "graph")


def _is_data(v: Any) -> bool:
    import torch

    return isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() >= 1 and v.shape[-1] > 1


def _other(t):
    import torch

    if t.element_size() == 1:  # fp8 codes: torch has no flip kernel for them; their bytes flip the same
        return t.view(torch.uint8).flip(-1).view(t.dtype)
    return t.flip(-1)


def _outputs(raw: Any) -> tuple:
    import torch

    raw = raw if isinstance(raw, (tuple, list)) else (raw,)
    return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in raw)


def run(adapter: Adapter, call: Call) -> tuple:
    """The adapter's kernel called in `call.mode`, one of GENERIC; the definition's outputs."""
    import torch

    mode = call.mode
    if mode not in GENERIC:
        raise ValueError(f"not a generic mode: {mode!r}")
    if adapter.plan is None:
        raise GroundTruthUnavailable("unsupported", f"{adapter.api}: no plan step to {mode} with")
    live = call.inputs.clone()  # the tensors the planned launch reads and writes
    data = {k: v.clone() for k, v in live.values.items() if _is_data(v)}
    for k, v in data.items():
        live.values[k].copy_(_other(v))
    bound = dataclasses.replace(call, inputs=live)
    launch = adapter.plan(bound)
    if mode == "plan-reuse":
        launch()
    else:
        if live.device == "cpu":
            raise GroundTruthUnavailable("no-gpu", f"{adapter.api}: a CUDA graph needs a CUDA device")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the capture (allocations, lazy init)
            launch()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                captured = launch()
        except Exception as e:  # an API that cannot be captured says so; a wrong replay is what fails
            raise GroundTruthUnavailable("unsupported", f"{adapter.api}: CUDA-graph capture failed: "
                                                        f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
                                         ) from e
        graph.replay()
    for k, v in data.items():  # the case's data, into the same storage (in-place outputs reset too)
        live.values[k].copy_(v)
    if mode == "plan-reuse":
        raw = _outputs(launch())
    else:
        graph.replay()
        raw = _outputs(captured)
        del captured, graph  # the graph's private memory pool goes back (test processes share the GPU)
        torch.cuda.empty_cache()
    return adapter.finish(bound, raw) if adapter.finish is not None else raw

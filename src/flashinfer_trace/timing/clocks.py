"""The device clocks the timers read: CUDA events around calls, replays of a captured CUDA graph, the L2 flush
before a cold-cache call, and the GPU's own SM/memory clocks (NVML, else nvidia-smi) recorded beside a timing.

Without CUPTI, why two timers: a host clock, even with a synchronize, adds launch and sync overhead, and per-call
CUDA events still include the host's dispatch gaps for small kernels (FlashInfer's run() spends tens of us in
Python). Replaying K captured calls in one CUDA graph and dividing by K isolates the kernels (warm L2: the
replays run back to back on the same buffers, nothing is flushed). For large kernels events bracketing one call
after an L2 flush measure the cold-cache case a serving step sees.

The L2 flush reads a 2x-L2 buffer (a reduction over it) rather than writing it: zeroing it, as
triton's do_bench does, leaves L2 full of dirty lines that the timed kernel then writes back. The
measurements behind both choices: docs/evidence/timing.md.

This module imports on a CPU-only machine: torch is imported inside the functions that need it.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

__all__ = ["FALLBACK_FLUSH_BYTES", "WARMUP_MAX_CALLS", "WARMUP_MS", "gpu_clocks", "require_cuda"]

WARMUP_MS = 25.0  # warm-up runs at least this long (GPU time), so clocks ramp from idle
WARMUP_MAX_CALLS = 10_000
FALLBACK_FLUSH_BYTES = 100 * 2**20  # when the device does not report its L2 size


# -- CUDA ---------------------------------------------------------------------------------------------
def require_cuda(what: str = "device timing") -> Any:
    """torch, if a CUDA device is usable; otherwise a RuntimeError that says why."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is a dependency
        raise RuntimeError(f"{what} needs torch with CUDA: {e}") from e
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a CUDA device, and torch.cuda.is_available() is False here "
                           f"(torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'})")
    return torch


def _device_index(torch: Any, device: Any = None) -> int:
    if device is None:
        return torch.cuda.current_device()
    d = torch.device(device)
    return d.index if d.index is not None else torch.cuda.current_device()


_flush_buffers: dict[int, Any] = {}


def _flush_buffer(torch: Any, index: int) -> Any:
    """A buffer of twice the device's L2 size: streaming it through L2 evicts every line the kernel's
    inputs held (see _flush_l2)."""
    buf = _flush_buffers.get(index)
    if buf is None:
        l2 = getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) or 0
        size = 2 * l2 if l2 else FALLBACK_FLUSH_BYTES
        buf = _flush_buffers[index] = torch.empty(size // 4, dtype=torch.int32, device=f"cuda:{index}")
    return buf


# -- clocks -------------------------------------------------------------------------------------------
def _nvml_clocks(index: int, bus_id: str | None) -> dict:
    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    try:
        handle = None
        if bus_id:
            try:
                handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
            except pynvml.NVMLError:
                handle = None
        if handle is None:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        out: dict[str, Any] = {
            "source": "nvml",
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        }
        for getter in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(pynvml, getter, None)
            if fn is not None:
                try:
                    out["clocks_event_reasons"] = hex(fn(handle))
                except pynvml.NVMLError:
                    pass
                break
        return out
    finally:
        pynvml.nvmlShutdown()


def _float_or_none(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _smi_clocks(index: int) -> dict:
    from ..sweep.manifest import nvidia_smi

    rows = nvidia_smi()
    if index >= len(rows):
        return {}
    row = rows[index]
    return {"source": "nvidia-smi", **{key: _float_or_none(row.get(field) or "") for key, field in (
        ("sm_clock_mhz", "clocks.sm"), ("mem_clock_mhz", "clocks.mem"), ("power_w", "power.draw"),
        ("temperature_c", "temperature.gpu"))}}


def gpu_clocks(device: Any = None) -> dict:
    """SM and memory clocks (MHz), power (W) and temperature (C) of the GPU now, via NVML
    (nvidia-ml-py) when importable, else nvidia-smi, else {}. Never raises."""
    index, bus_id = 0, None
    try:
        import torch

        if torch.cuda.is_available():
            index = _device_index(torch, device)
            props = torch.cuda.get_device_properties(index)
            if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
                bus_id = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
    except Exception:  # noqa: BLE001 - best effort
        pass
    try:
        return _nvml_clocks(index, bus_id)
    except Exception:  # noqa: BLE001 - ImportError, NVMLError, a driver without NVML
        pass
    try:
        return _smi_clocks(index)
    except Exception:  # noqa: BLE001 - no nvidia-smi, a timeout, unexpected output
        return {}


# -- events and the L2 flush ------------------------------------------------------------------------
def _warmup(torch: Any, fn: Callable, setup: Callable | None, min_calls: int, target_ms: float
            ) -> tuple[int, float]:
    """One untimed call (library initialisation, cuBLAS autotuning), then calls in doubling batches
    until at least `min_calls` calls and `target_ms` of event-timed GPU time. Returns (calls, mean
    event-timed ms per call of the batches), an upper bound of the device time (host gaps included)."""
    if setup is not None:
        setup()
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls, elapsed, batch = 1, 0.0, 1
    timed = 0
    while timed < min_calls or elapsed < target_ms:
        start.record()
        for _ in range(batch):
            if setup is not None:
                setup()
            fn()
        end.record()
        end.synchronize()
        elapsed += start.elapsed_time(end)
        timed += batch
        if calls + timed >= WARMUP_MAX_CALLS:
            break
        batch = min(batch * 2, WARMUP_MAX_CALLS - calls - timed)
    return calls + timed, elapsed / timed


def _estimate_us(torch: Any, fn: Callable, setup: Callable | None, n: int = 3) -> float:
    """Median of n single calls timed with events (after `setup`, which is outside)."""
    out = []
    for _ in range(n):
        if setup is not None:
            setup()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(out)


def _flush_l2(buf: Any, mode: str) -> None:
    """Evict L2 by streaming a 2x-L2 buffer through it. "read" (a reduction over the buffer) leaves
    clean lines, which the timed kernel evicts for free; "write" (zeroing it, as triton's do_bench
    does) leaves L2 full of dirty lines whose write-back the timed kernel then pays for: up to one
    L2 of extra HBM writes inside the timed region (docs/evidence/timing.md)."""
    if mode == "write":
        buf.zero_()
    else:
        buf.sum()


def _time_events(torch: Any, fn: Callable, setup: Callable | None, rounds: int, flush: Any,
                 flush_mode: str = "read") -> list[float]:
    """Per round: setup (restores inputs), L2 flush, start event, fn, end event; one sync at the end.

    The flush comes after setup so that the inputs setup just rewrote are evicted too (a flush
    before it would leave them in L2), and its kernel keeps the GPU busy while the host enqueues
    fn, which hides the host's launch gap from the start event as far as the flush lasts.
    """
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rounds)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rounds)]
    for i in range(rounds):
        if setup is not None:
            setup()
        if flush is not None:
            _flush_l2(flush, flush_mode)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends, strict=True)]


# -- CUDA graphs ----------------------------------------------------------------------------------------
def _capture(torch: Any, fn: Callable, calls: int) -> Any:
    """A CUDA graph of `calls` calls of fn, captured the way torch.cuda.graphs documents: warm-up
    on a side stream first, then capture (torch.cuda.graph captures on its own side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return graph


def _time_graph(torch: Any, graph: Any, calls: int, rounds: int) -> list[float]:
    for _ in range(2):  # the first replays upload the graph
        graph.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rounds)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rounds)]
    for i in range(rounds):
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 / calls for s, e in zip(starts, ends, strict=True)]


def _capture_failure(torch: Any, e: Exception) -> str:
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - the capture's error may surface here too
        pass
    return f"graph capture failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}"

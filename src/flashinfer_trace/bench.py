"""Device time of ground-truth kernels: CUDA-graph replay for small kernels, CUDA events with a cold
L2 for large ones, and closures that launch the kernel alone (plan() and copies outside).

    gt = get_ground_truth("flashinfer", d, device="cuda")
    inputs = generate_inputs(d, "medium", device="cuda")
    prepared = prepare(gt, inputs)              # fn, setup = prepared  (also .includes_setup, .note)
    t = time_device(prepared.fn, setup=prepared.setup)
    t.median_us, t.iqr_us, t.timer, t.l2_flushed

Why two timers (measured on an H100; /work/shared/research/B_matrix_timing.md, section D):
a host clock, even with a synchronize, adds 10-40 us of launch and sync overhead, and per-call CUDA
events still include the host's dispatch gaps for kernels under ~20 us (FlashInfer's run() spends
tens of us in Python). Replaying K captured calls in one CUDA graph and dividing by K isolates the
kernels (warm L2: the replays run back to back on the same buffers, nothing is flushed). For large
kernels events bracketing one call after an L2 flush measure the cold-cache case a serving step
sees. `timer="auto"`: without a setup, a probe graph of 10 calls is captured and replayed (a
device-only estimate); below GRAPH_THRESHOLD_US (50 us) the graph timer is used, above it events;
closures with a `setup` between calls always get events (a graph would replay on the data the
previous replay mutated), and so do closures that cannot be captured (`fallback_reason`).

The L2 flush reads a 2x-L2 buffer (a reduction over it) rather than writing it: zeroing it, as
triton's do_bench does, leaves L2 full of dirty lines that the timed kernel then writes back. On
the H100, with a write flush rmsnorm 32768x8192 and a ~250 us paged decode read 1.017-1.020 x
ncu's duration, with the read flush 0.985-1.006; rmsnorm 16x4096 took 6.3-26 us instead of 5.5.

Checked against Nsight Compute's gpu__time_duration (scripts/ncu-validate.py, H100 SXM, flashinfer
0.6.6, two runs): rmsnorm 32768x8192 bf16 events/ncu 1.006, FlashInfer paged decode (large case,
~250 us) 0.985-1.000, F.linear 1024x4096x4096 fp16 (graph, 47 us) 0.985; the 8192^3 bf16 GEMM
read 1.12-1.14 because the sustained loop hits the power cap (NVML reason 0x4, SM clock 1980 ->
~1550 MHz) while ncu's isolated launches run at full clock; a ~15 us paged decode reads 0.68 (cold
ncu) / 0.80 (ncu --cache-control none) with the graph timer, whose back-to-back replays hide the
per-launch ramp that ncu's serialized launches pay. `Timing.clocks_start/end` record the clocks.

This module imports on a CPU-only machine; `time_device` and `prepare` raise RuntimeError there.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .groundtruth import GroundTruth
    from .groundtruth.base import Call
    from .inputs import Inputs

__all__ = ["GRAPH_THRESHOLD_US", "PREPARERS", "Prepared", "Timing", "gpu_clocks", "prepare", "require_cuda",
           "time_device"]

GRAPH_THRESHOLD_US = 50.0  # auto: graph below this (probe-graph) estimate per call, events above
WARMUP_MS = 25.0  # warm-up runs at least this long (GPU time), so clocks ramp from idle
WARMUP_MAX_CALLS = 10_000
EVENTS_TARGET_MS = 200.0  # auto rounds for events: about this much timed GPU work
EVENTS_ROUNDS = (5, 100)  # ...within these bounds
GRAPH_REPLAY_TARGET_US = 2000.0  # calls per graph: about this much work per replay
GRAPH_CALLS = (10, 500)
GRAPH_ROUNDS = 20  # replays timed
GRAPH_PROBE_CALLS = 10  # auto: calls in the probe graph whose replay gives the device-only estimate
GRAPH_PROBE_MAX_US = 2000.0  # auto: no probe when a warm-up call takes longer than this, host gaps included
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
    from .manifest import nvidia_smi

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


# -- the timers ----------------------------------------------------------------------------------------
@dataclass
class Timing:
    """Device time of one call of a closure, in microseconds, over `rounds` samples."""

    timer: str  # "graph" | "events"
    samples_us: list[float]
    median_us: float
    q1_us: float
    q3_us: float
    iqr_us: float
    mean_us: float
    rounds: int
    calls_per_round: int  # graph: calls captured per replay (each sample is a replay / this); events: 1
    l2_flushed: bool
    fallback_reason: str | None = None
    clocks_start: dict = field(default_factory=dict)
    clocks_end: dict = field(default_factory=dict)
    warmup_calls: int = 0
    estimate_us: float | None = None  # the event-timed estimate auto chose by
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _summary(samples: list[float]) -> tuple[float, float, float, float]:
    """median, q1, q3, mean."""
    if len(samples) == 1:
        return samples[0], samples[0], samples[0], samples[0]
    q1, med, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return med, q1, q3, statistics.fmean(samples)


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
    L2 of extra HBM writes (50 MB, ~15 us on an H100) inside the timed region."""
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


def _clamp(x: float, bounds: tuple[int, int]) -> int:
    return int(min(max(x, bounds[0]), bounds[1]))


def time_device(fn: Callable[[], Any], *, setup: Callable[[], Any] | None = None, timer: str = "auto",
                warmup: int = 3, rounds: int | None = None, flush_l2: bool = True, warmup_ms: float = WARMUP_MS,
                calls_per_graph: int | None = None, flush_mode: str = "read", device: Any = None) -> Timing:
    """Device time of `fn()`, a closure that launches the kernel(s) only (plan() and other setup
    belong outside it; `setup()`, if given, runs before every call outside the timed region).

    timer: "graph" (K calls captured in one CUDA graph, replays timed with events, time / K; warm L2,
    nothing flushed), "events" (events around each call after an L2 flush; median over rounds) or
    "auto": without a setup, a probe graph of GRAPH_PROBE_CALLS calls is captured and replayed
    (device time only: per-call events would add the host's launch gaps of a Python wrapper) and
    the graph timer is used when that estimate is under GRAPH_THRESHOLD_US, events otherwise;
    with a setup, or when capture fails, events. A failed capture is recorded in `fallback_reason`.
    warmup: at least this many calls, and at least `warmup_ms` of GPU time, before anything is timed.
    rounds: samples (graph replays, or event-timed calls); None picks them from the estimate.
    flush_mode: how the events timer evicts L2, "read" (default) or "write" (see _flush_l2).
    """
    torch = require_cuda("time_device")
    if timer not in ("auto", "graph", "events"):
        raise ValueError(f"timer must be 'auto', 'graph' or 'events', not {timer!r}")
    if flush_mode not in ("read", "write"):
        raise ValueError(f"flush_mode must be 'read' or 'write', not {flush_mode!r}")
    if timer == "graph" and setup is not None:
        raise ValueError("the graph timer cannot run setup() between calls (the replays would reuse the data "
                         "the previous call mutated); use timer='events' for closures that need a setup")
    index = _device_index(torch, device)
    with torch.cuda.device(index):
        clocks_start = gpu_clocks(index)
        warm, warm_ms = _warmup(torch, fn, setup, max(1, warmup), warmup_ms)
        graph, calls, estimate, fallback = None, 1, None, None
        # A probe graph gives a device-only estimate; skip it for closures whose calls take over
        # GRAPH_PROBE_MAX_US even with host gaps (their device time may still be small, but such
        # closures are whole adapter calls, which rarely capture).
        probe = timer == "graph" or (timer == "auto" and setup is None and warm_ms * 1000.0 < GRAPH_PROBE_MAX_US)
        if probe:
            calls = calls_per_graph or GRAPH_PROBE_CALLS
            try:
                graph = _capture(torch, fn, calls)
                estimate = statistics.median(_time_graph(torch, graph, calls, 3))
            except Exception as e:  # noqa: BLE001 - any capture failure means: time it with events
                fallback, graph, calls = _capture_failure(torch, e), None, 1
        if estimate is None:
            estimate = _estimate_us(torch, fn, setup)
        chosen, note = timer, ""
        if timer == "auto":
            if setup is not None:
                chosen, note = "events", "auto: a setup between calls needs events"
            elif graph is None:
                chosen, note = "events", ("auto: capture failed" if fallback else
                                          f"auto: {warm_ms * 1000:.0f} us per call with host gaps, not probed")
            elif estimate < GRAPH_THRESHOLD_US:
                chosen, note = "graph", f"auto: graph estimate {estimate:.2f} us < {GRAPH_THRESHOLD_US:g} us"
            else:
                chosen, note = "events", f"auto: graph estimate {estimate:.1f} us >= {GRAPH_THRESHOLD_US:g} us"
        elif timer == "graph" and graph is None:
            chosen = "events"
        samples: list[float] = []
        if chosen == "graph":
            want = calls_per_graph or _clamp(GRAPH_REPLAY_TARGET_US / max(estimate, 1e-3), GRAPH_CALLS)
            if want != calls:
                del graph
                graph, calls = None, want
                try:
                    graph = _capture(torch, fn, calls)
                except Exception as e:  # noqa: BLE001
                    fallback, chosen, calls = _capture_failure(torch, e), "events", 1
            if graph is not None:
                samples = _time_graph(torch, graph, calls, rounds or GRAPH_ROUNDS)
        graph = None
        if chosen == "events":
            calls = 1
            n = rounds or _clamp(EVENTS_TARGET_MS * 1000.0 / max(estimate, 1e-3), EVENTS_ROUNDS)
            flush = _flush_buffer(torch, index) if flush_l2 else None
            samples = _time_events(torch, fn, setup, n, flush, flush_mode)
            if flush_l2:
                note += f"; L2 flushed ({flush_mode}) before each call"
        clocks_end = gpu_clocks(index)
    med, q1, q3, mean = _summary(samples)
    return Timing(timer=chosen, samples_us=samples, median_us=med, q1_us=q1, q3_us=q3, iqr_us=q3 - q1, mean_us=mean,
                  rounds=len(samples), calls_per_round=calls, l2_flushed=chosen == "events" and flush_l2,
                  fallback_reason=fallback, clocks_start=clocks_start, clocks_end=clocks_end, warmup_calls=warm,
                  estimate_us=estimate, note=note.lstrip("; "))


# -- closures that launch only the kernel ----------------------------------------------------------------
@dataclass(frozen=True)
class Prepared:
    """What to time: `fn()` launches the kernel; `setup()` (or None) restores what fn mutates.
    Unpacks as `fn, setup = prepare(...)`."""

    fn: Callable[[], Any]
    setup: Callable[[], Any] | None
    includes_setup: bool  # True: fn is the whole adapter call (plan(), allocations, conversions included)
    note: str
    timer: str = "auto"  # what time_device should use: "events" when there is a setup

    def __iter__(self):
        return iter((self.fn, self.setup))


Preparer = Callable[["Call"], tuple[Callable[[], Any], "Callable[[], Any] | None", str]]


def _workspace(torch: Any, device: Any) -> Any:
    """A workspace of the adapters' size, owned by one prepared wrapper: FlashInfer keeps its plan in
    the workspace, so two wrappers planned on one shared buffer would overwrite each other's plans."""
    from .groundtruth import flashinfer as fgt

    return torch.empty(fgt.WORKSPACE_BYTES, dtype=torch.uint8, device=device)


# The FlashInfer attention adapters expose their plan step (groundtruth/flashinfer.py plan_*): it is
# called once here, on a workspace of its own, and only the run() it returns is timed. The adapters'
# post-processing of outputs (the empty-request lse sentinel) is not a kernel and is left out.
def _planned(plan_step: Callable[..., Callable[[], Any]]):
    def prep(call: Call):
        import torch

        return plan_step(call, _workspace(torch, call.inputs.device)), None, "wrapper and plan() once, run() timed"

    return prep


def _prep_fused_add_rmsnorm(kernel: Callable[[Any], Callable]):
    """In place (input <- norm(input + residual) * w, residual <- the sum): fn runs on clones that
    setup restores from the pristine inputs before every call, outside the timed region."""

    def prep(call: Call):
        from .groundtruth import semantics as sem

        x = call.inputs.values
        op = kernel(call.module)
        eps = sem.eps(call.definition)
        h0, r0, weight = x["hidden_states"], x["residual"], x["weight"]
        h, r = h0.clone(), r0.clone()

        def setup():
            h.copy_(h0)
            r.copy_(r0)

        return (lambda: op(h, r, weight, eps=eps)), setup, "in place: setup restores the inputs (not timed)"

    return prep


def _prep_rmsnorm(kernel: Callable[[Any], Callable]):
    def prep(call: Call):
        from .groundtruth import semantics as sem

        x = call.inputs.values
        op, eps = kernel(call.module), sem.eps(call.definition)
        hs, weight = x["hidden_states"], x["weight"]
        return (lambda: op(hs, weight, eps=eps)), None, "eps read once, the kernel call timed"

    return prep


def _prep_fi_silu_and_mul(call: Call):
    op, x = call.module.activation.silu_and_mul, call.inputs.values["input"]
    return (lambda: op(x)), None, "the kernel call timed"


def _prep_sgl_silu_and_mul(call: Call):
    import torch

    op, x = call.module.silu_and_mul, call.inputs.values["input"]
    out = torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype, device=x.device)
    return (lambda: op(x, out)), None, "output allocated once, the kernel call timed"


def _prep_fi_rope(call: Call):
    from .groundtruth import semantics as sem

    x = call.inputs.values
    op = call.module.rope.apply_rope_with_cos_sin_cache
    q, k = x["query"], x["key"]
    tokens, _, head_dim = q.shape
    qf, kf = q.reshape(tokens, -1), k.reshape(tokens, -1)
    neox = sem.rope_is_neox(call.definition)
    pos, cache = x["positions"], x["cos_sin_cache"]
    return (lambda: op(pos, qf, kf, head_dim, cache, is_neox=neox)), None, "the kernel call timed"


def _prep_sgl_rope(call: Call):
    """In place on query/key: clones restored by setup before every call, outside the timed region."""
    from .groundtruth import semantics as sem

    x = call.inputs.values
    op = call.module.apply_rope_with_cos_sin_cache_inplace
    q0, k0 = x["query"], x["key"]
    q, k = q0.clone(), k0.clone()
    tokens, _, head_dim = q.shape
    qf, kf = q.view(tokens, -1), k.view(tokens, -1)
    neox = sem.rope_is_neox(call.definition)
    pos, cache = x["positions"], x["cos_sin_cache"]

    def setup():
        q.copy_(q0)
        k.copy_(k0)

    return ((lambda: op(pos, qf, kf, head_dim, cache, is_neox=neox)), setup,
            "in place: setup restores query/key (not timed)")


def _prep_direct(adapter_fn: Callable):
    """Adapters whose whole body is the kernel call (mm_bf16: a transposed view and the call)."""

    def prep(call: Call):
        return (lambda: adapter_fn(call)), None, "the adapter's body is the kernel call"

    return prep


def _preparers() -> dict[Callable, Preparer]:
    from .groundtruth import flashinfer as fgt
    from .groundtruth import sglang as sgt

    direct = {a.fn: _prep_direct(a.fn) for a in fgt.ADAPTERS if a.api.startswith("flashinfer.mm_bf16")}
    return {
        **direct,
        fgt.segment_gemm: _planned(fgt.plan_segment_gemm),
        fgt.gqa_decode: _planned(fgt.plan_gqa_decode),
        fgt.gqa_prefill_paged: _planned(fgt.plan_gqa_prefill_paged),
        fgt.gqa_prefill_ragged: _planned(fgt.plan_gqa_prefill_ragged),
        fgt.mla: _planned(fgt.plan_mla),
        fgt.fused_add_rmsnorm: _prep_fused_add_rmsnorm(lambda m: m.norm.fused_add_rmsnorm),
        fgt.rmsnorm: _prep_rmsnorm(lambda m: m.norm.rmsnorm),
        fgt.silu_and_mul: _prep_fi_silu_and_mul,
        fgt.rope: _prep_fi_rope,
        sgt.fused_add_rmsnorm: _prep_fused_add_rmsnorm(lambda m: m.fused_add_rmsnorm),
        sgt.rmsnorm: _prep_rmsnorm(lambda m: m.rmsnorm),
        sgt.silu_and_mul: _prep_sgl_silu_and_mul,
        sgt.rope: _prep_sgl_rope,
    }


# adapter function (Adapter.fn) -> preparer(call) -> (fn, setup or None, note). Adapters not here are
# timed whole (Prepared.includes_setup True).
PREPARERS: dict[Callable, Preparer] = _preparers()


def prepare(ground_truth: GroundTruth, inputs: Inputs) -> Prepared:
    """A closure to time for this ground truth on these inputs.

    The adapter runs once first (it compiles FlashInfer's JIT kernels and proves the call works;
    GroundTruthUnavailable from it propagates). Adapters with a preparer in PREPARERS get a closure
    that launches only the kernel (the attention wrappers are planned once, outside); the others
    are timed as the whole adapter call, `includes_setup=True` (for the FlashInfer samplers, one
    call per row; for the torch ground truth, the float64 conversions and Python loops too). A
    preparer that fails (API drift in another version) falls back the same way, its error in `note`.
    """
    torch = require_cuda("prepare")
    from .groundtruth.base import Call

    gt = ground_truth
    if not str(gt.device).startswith("cuda"):
        raise RuntimeError(f"prepare times CUDA kernels; this ground truth runs on {gt.device!r}")
    inputs = inputs.on(gt.device)
    call = Call(gt.definition, inputs, gt.module, gt.version, 1)
    gt.adapter.fn(call)  # JIT compile, allocate, and fail here rather than in the timer
    torch.cuda.synchronize()
    preparer = PREPARERS.get(gt.adapter.fn)
    failed = ""
    if preparer is not None:
        try:
            fn, setup, note = preparer(call)
            if setup is not None:
                setup()
            fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - fall back to the whole call, and say why
            failed = f"; preparer failed ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
        else:
            return Prepared(fn, setup, includes_setup=False, note=f"{gt.api}: {note}",
                            timer="events" if setup is not None else "auto")
    adapter_fn = gt.adapter.fn
    return Prepared(lambda: adapter_fn(call), None, includes_setup=True,
                    note=f"{gt.api}: whole adapter call timed (setup, allocations and conversions included){failed}")


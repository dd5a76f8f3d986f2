"""Device time of a closure: CUPTI kernel records where cupti-python works, else CUDA-graph replay for
small kernels and CUDA events with a cold L2 for large ones (what to time: timing/kernels.py).

    gt = get_ground_truth("flashinfer", d, device="cuda")
    inputs = generate_inputs(d, "medium", device="cuda")
    prepared = prepare(gt, inputs)              # fn, setup = prepared  (also .includes_setup, .note)
    t = time_device(prepared.fn, setup=prepared.setup)
    t.median_us, t.iqr_us, t.timer, t.l2_flushed, t.fallback_reason, t.kernels_per_call, t.kernel_names

`timer="cupti"` (what "auto" picks when it can): CUPTI's activity records (the cupti-python package,
`pip install cupti-python`, extra `cupti`) give each kernel's start and end on the GPU's clock. Per
sample: setup(), the L2 flush, a synchronize and an activity flush (their kernels are collected and
dropped), then one call of fn, a synchronize and a flush again: the kernel records that arrive are
exactly that call's, and the sample is the sum of their durations (what Nsight Compute's
gpu__time_duration sums per call). Host launch gaps are not in it, whatever the kernel's size, and
the kernel runs alone after an idle GPU with a cold L2, as under ncu. memcpy/memset records are
counted separately (`memops_per_call`, `memops_median_us`), not in the samples. `auto` falls back to
the timers below when `import cupti` fails or CUPTI refuses to trace (another CUPTI client, such as
ncu or a running torch profiler, holds it); the reason, e.g. "cupti: not installed (...)" or, under
ncu, "cupti: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39) in activity_register_callbacks", is
in `Timing.fallback_reason` and the timer used in `Timing.timer`, always.

Without CUPTI, why two timers (measured on an H100; /work/shared/research/B_matrix_timing.md, section D):
a host clock, even with a synchronize, adds 10-40 us of launch and sync overhead, and per-call CUDA
events still include the host's dispatch gaps for kernels under ~20 us (FlashInfer's run() spends
tens of us in Python). Replaying K captured calls in one CUDA graph and dividing by K isolates the
kernels (warm L2: the replays run back to back on the same buffers, nothing is flushed). For large
kernels events bracketing one call after an L2 flush measure the cold-cache case a serving step
sees. The fallback of `timer="auto"`: without a setup, a probe graph of 10 calls is captured and replayed (a
device-only estimate); below GRAPH_THRESHOLD_US (50 us) the graph timer is used, above it events;
closures with a `setup` between calls always get events (a graph would replay on the data the
previous replay mutated), and so do closures that cannot be captured (`fallback_reason`).

The L2 flush reads a 2x-L2 buffer (a reduction over it) rather than writing it: zeroing it, as
triton's do_bench does, leaves L2 full of dirty lines that the timed kernel then writes back. On
the H100, with a write flush rmsnorm 32768x8192 and a ~250 us paged decode read 1.017-1.020 x
ncu's duration, with the read flush 0.985-1.006; rmsnorm 16x4096 took 6.3-26 us instead of 5.5.

Checked against Nsight Compute's gpu__time_duration (scripts/ncu-validate.py, H100 SXM, flashinfer
0.6.6, two runs, before the CUPTI timer): rmsnorm 32768x8192 bf16 events/ncu 1.006, FlashInfer paged decode (large case,
~250 us) 0.985-1.000, F.linear 1024x4096x4096 fp16 (graph, 47 us) 0.985; the 8192^3 bf16 GEMM
read 1.12-1.14 because the sustained loop hits the power cap (NVML reason 0x4, SM clock 1980 ->
~1550 MHz) while ncu's isolated launches run at full clock; a ~15 us paged decode reads 0.68 (cold
ncu) / 0.80 (ncu --cache-control none) with the graph timer, whose back-to-back replays hide the
per-launch ramp that ncu's serialized launches pay. `Timing.clocks_start/end` record the clocks.
The CUPTI timer against ncu (`scripts/ncu-validate.py all`, H100, 2026-11-23; docs/matrix-sessions.md):
rmsnorm 32768x8192 1.011, paged decode large 0.989, 8192^3 GEMM 1.000 (its calls start on an idle
GPU, so the power cap of the sustained loops does not bite), repeat-to-repeat CV <= 0.13% above
10 us. ncu's gpu__time_duration carries ~1.3 us per kernel more than CUPTI's start-to-end (a
1-element kernel: 2.70 vs 1.38 us), so small kernels read lower than ncu: rmsnorm 16x4096 0.616,
the two-kernel medium decode 0.830 (0.962 and 0.988 with that offset added per kernel).

This module imports on a CPU-only machine; `time_device` raises RuntimeError there.
"""
from __future__ import annotations

import statistics
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["GRAPH_THRESHOLD_US", "TIMERS", "ActivityRecord", "CuptiSummary", "CuptiTracer", "CuptiUnavailable",
           "Timing", "gpu_clocks", "require_cuda", "summarize_cupti_calls", "time_device"]

TIMERS = ("auto", "cupti", "graph", "events")

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
CUPTI_ROUNDS = (10, 200)  # cupti: calls timed, from about EVENTS_TARGET_MS of GPU work, within these bounds
CUPTI_BUFFER_BYTES = 4 << 20  # one CUPTI activity buffer (a kernel record is a few hundred bytes)
KERNEL_NAMES_KEPT = 5  # cupti: distinct kernel names of a call kept in Timing.kernel_names
KERNEL_NAME_CHARS = 200  # ...each cut to this length (templated C++ names run to kilobytes)


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


# -- the timers ----------------------------------------------------------------------------------------
@dataclass
class Timing:
    """Device time of one call of a closure, in microseconds, over `rounds` samples."""

    timer: str  # "cupti" | "graph" | "events": the timer that produced the samples
    samples_us: list[float]
    median_us: float
    q1_us: float
    q3_us: float
    iqr_us: float
    mean_us: float
    rounds: int
    calls_per_round: int  # graph: calls captured per replay (each sample is a replay / this); cupti, events: 1
    l2_flushed: bool
    fallback_reason: str | None = None  # why a timer asked for (or auto's cupti) was not used; "; " between several
    clocks_start: dict = field(default_factory=dict)
    clocks_end: dict = field(default_factory=dict)
    warmup_calls: int = 0
    estimate_us: float | None = None  # the event-timed estimate auto chose by (cupti: picked the rounds)
    note: str = ""
    # cupti only (None / [] for the other timers):
    kernels_per_call: int | None = None  # kernels one call launched (the most common count over the calls)
    kernel_names: list[str] = field(default_factory=list)  # distinct kernel names of a call, launch order, first few
    span_median_us: float | None = None  # first kernel's start to last kernel's end per call (gaps included)
    memops_per_call: int | None = None  # memcpy/memset operations per call: recorded, not in the samples
    memops_median_us: float | None = None  # their summed duration per call

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


# -- CUPTI ---------------------------------------------------------------------------------------------
class CuptiUnavailable(RuntimeError):
    """CUPTI cannot trace here; str() is the reason recorded in Timing.fallback_reason ("cupti: ...")."""


@dataclass(frozen=True)
class ActivityRecord:
    """The fields of one CUPTI activity record this module reads, copied out of CUPTI's buffer inside
    the completion callback (the record objects point into a buffer that is reused after it)."""

    kind: str  # "kernel" | "memcpy" | "memset"
    name: str
    start_ns: int
    end_ns: int
    correlation_id: int = 0


def _one_line(e: BaseException, limit: int = 300) -> str:
    return " ".join(str(e).split())[:limit]


def load_cupti() -> Any:
    """The `cupti.cupti` bindings module, or CuptiUnavailable saying why not."""
    try:
        from cupti import cupti
    except ImportError as e:
        if getattr(e, "name", None) == "cupti":
            raise CuptiUnavailable("cupti: not installed (pip install cupti-python, or the extra "
                                   "flashinfer-trace-matrix[cupti])") from e
        raise CuptiUnavailable(f"cupti: import failed: {type(e).__name__}: {_one_line(e)}") from e
    except Exception as e:  # noqa: BLE001 - libcupti or the driver fails to load
        raise CuptiUnavailable(f"cupti: import failed: {type(e).__name__}: {_one_line(e)}") from e
    return cupti


def _cupti_error(cupti: Any, e: BaseException, where: str) -> str:
    """"cupti: CUPTI_ERROR_NAME (code) in where" for a cuptiError, the exception's text otherwise."""
    status = getattr(e, "status", None)
    if isinstance(status, int):
        try:
            name = f"CUPTI_{cupti.Result(status).name}"
        except Exception:  # noqa: BLE001 - a code this version's enum lacks
            name = "CUPTI_ERROR"
        return f"cupti: {name} ({status}) in {where}"
    return f"cupti: {type(e).__name__}: {_one_line(e)} in {where}"


class _Sink:
    """Where the buffer-completion callback puts records (CUPTI may call it from its own thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[ActivityRecord] = []
        self.errors: list[str] = []

    def take(self) -> tuple[list[ActivityRecord], list[str]]:
        with self.lock:
            records, errors = self.records, self.errors
            self.records, self.errors = [], []
        return records, errors


_SINK = _Sink()
# Each cupti module whose buffer callbacks are registered (once a process), held itself: an id() outlives a
# collected object and may come back for another (seen in the unit suite: a fake's callbacks never registered).
_REGISTERED: list[Any] = []


def _record_kinds(cupti: Any) -> dict[int, str]:
    kinds = cupti.ActivityKind
    out = {int(kinds.CONCURRENT_KERNEL): "kernel", int(kinds.MEMCPY): "memcpy", int(kinds.MEMSET): "memset"}
    if hasattr(kinds, "KERNEL"):
        out[int(kinds.KERNEL)] = "kernel"
    return out


def _buffer_requested() -> tuple[int, int]:
    return CUPTI_BUFFER_BYTES, 0  # bytes, max records (0: as many as fit)


def _buffer_completed_for(cupti: Any) -> Callable[[Sequence[Any]], None]:
    kinds = _record_kinds(cupti)

    def completed(activities: Sequence[Any]) -> None:
        try:
            out = []
            for a in activities:
                kind = kinds.get(int(getattr(a, "kind", -1)))
                if kind is None:
                    continue
                name = str(getattr(a, "name", "") or "") if kind == "kernel" else kind
                out.append(ActivityRecord(kind, name, int(a.start), int(a.end), int(getattr(a, "correlation_id", 0))))
            with _SINK.lock:
                _SINK.records.extend(out)
        except Exception as e:  # noqa: BLE001 - never raise into CUPTI; drain() reports it
            with _SINK.lock:
                _SINK.errors.append(f"{type(e).__name__}: {_one_line(e)}")

    return completed


class CuptiTracer:
    """Kernel (and memcpy/memset) activity records of this process, for one timing.

        with CuptiTracer() as tracer:     # CuptiUnavailable if CUPTI cannot trace here
            ...; torch.cuda.synchronize(); tracer.drain()    # records since the last drain

    The buffer callbacks are registered once per process (activity_register_callbacks); start()
    enables CONCURRENT_KERNEL (its failure is CuptiUnavailable: another CUPTI client such as ncu)
    and, where they enable, MEMCPY and MEMSET; stop() disables what start() enabled. drain() forces
    a flush (activity_flush_all(FLUSH_FORCED)): CUPTI hands every buffer to the completion callback
    before it returns. It does not synchronize: the caller does, so that the records are complete.
    """

    def __init__(self, cupti: Any | None = None) -> None:
        self.cupti = load_cupti() if cupti is None else cupti
        self.enabled: list[Any] = []
        self.not_enabled: list[str] = []

    def start(self) -> CuptiTracer:
        c = self.cupti
        if not any(r is c for r in _REGISTERED):
            try:
                c.activity_register_callbacks(_buffer_requested, _buffer_completed_for(c))
            except Exception as e:  # noqa: BLE001 - cuptiError, or a driver CUPTI cannot use
                raise CuptiUnavailable(_cupti_error(c, e, "activity_register_callbacks")) from e
            _REGISTERED.append(c)
        try:
            c.activity_enable(c.ActivityKind.CONCURRENT_KERNEL)
        except Exception as e:  # noqa: BLE001 - e.g. CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED under ncu
            raise CuptiUnavailable(_cupti_error(c, e, "activity_enable(CONCURRENT_KERNEL)")) from e
        self.enabled.append(c.ActivityKind.CONCURRENT_KERNEL)
        for name in ("MEMCPY", "MEMSET"):
            kind = getattr(c.ActivityKind, name)
            try:
                c.activity_enable(kind)
                self.enabled.append(kind)
            except Exception as e:  # noqa: BLE001 - kernels are what is timed; these are extra
                self.not_enabled.append(f"{name}: {_one_line(e, 120)}")
        try:
            self.drain()  # whatever an earlier user left behind
        except CuptiUnavailable:
            self.stop()
            raise
        return self

    def drain(self) -> list[ActivityRecord]:
        c = self.cupti
        try:
            c.activity_flush_all(int(getattr(c.ActivityFlag, "FLUSH_FORCED", 1)))
        except Exception as e:  # noqa: BLE001
            raise CuptiUnavailable(_cupti_error(c, e, "activity_flush_all")) from e
        records, errors = _SINK.take()
        if errors:
            raise CuptiUnavailable(f"cupti: reading activity records failed: {errors[0]}")
        return records

    def stop(self) -> None:
        c = self.cupti
        try:
            c.activity_flush_all(int(getattr(c.ActivityFlag, "FLUSH_FORCED", 1)))
        except Exception:  # noqa: BLE001 - stopping must not raise
            pass
        for kind in reversed(self.enabled):
            try:
                c.activity_disable(kind)
            except Exception:  # noqa: BLE001
                pass
        self.enabled = []
        _SINK.take()

    def __enter__(self) -> CuptiTracer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@dataclass
class CuptiSummary:
    """Per-call kernel time from the records each call produced (summarize_cupti_calls)."""

    samples_us: list[float]  # per counted call: the sum of its kernels' durations
    spans_us: list[float]  # per counted call: last kernel end - first kernel start
    kernels_per_call: int | None  # the most common number of kernels per counted call
    kernel_counts: tuple[int, int] | None  # (min, max) kernels per counted call
    kernel_names: list[str]
    memops_per_call: int | None
    memops_median_us: float | None
    calls: int  # calls given
    no_kernels: int  # calls without a kernel record: not counted
    incomplete: int  # calls with a kernel record lacking timestamps (start 0, or end before start): not counted

    def problems(self) -> str:
        parts = []
        if self.no_kernels:
            parts.append(f"{self.no_kernels} of {self.calls} calls had no kernel record")
        if self.incomplete:
            parts.append(f"{self.incomplete} of {self.calls} calls had a kernel record without timestamps")
        if self.kernel_counts and self.kernel_counts[0] != self.kernel_counts[1]:
            parts.append(f"kernels per call varied {self.kernel_counts[0]}-{self.kernel_counts[1]}")
        return "; ".join(parts)


def _names_in_order(kernels: list[ActivityRecord]) -> list[str]:
    names: list[str] = []
    for r in sorted(kernels, key=lambda r: (r.start_ns, r.correlation_id)):
        name = r.name[:KERNEL_NAME_CHARS]
        if name not in names:
            names.append(name)
    return names[:KERNEL_NAMES_KEPT]


def summarize_cupti_calls(calls: Sequence[Sequence[ActivityRecord]]) -> CuptiSummary:
    """One sample per call: the summed durations of the kernel records that call produced (a call's
    records are what one drain after it returned). Calls without kernels, or with a kernel record
    whose timestamps are missing, give no sample and are counted in the summary instead."""
    samples, spans, counts, memop_counts, memop_us = [], [], [], [], []
    names: list[str] = []
    no_kernels = incomplete = 0
    for records in calls:
        kernels = [r for r in records if r.kind == "kernel"]
        memops = [r for r in records if r.kind != "kernel"]
        if not kernels:
            no_kernels += 1
            continue
        if any(r.start_ns <= 0 or r.end_ns < r.start_ns for r in kernels):
            incomplete += 1
            continue
        samples.append(sum(r.end_ns - r.start_ns for r in kernels) / 1e3)
        spans.append((max(r.end_ns for r in kernels) - min(r.start_ns for r in kernels)) / 1e3)
        counts.append(len(kernels))
        memop_counts.append(len(memops))
        memop_us.append(sum(max(r.end_ns - r.start_ns, 0) for r in memops) / 1e3)
        if not names:
            names = _names_in_order(kernels)
    return CuptiSummary(
        samples_us=samples, spans_us=spans,
        kernels_per_call=Counter(counts).most_common(1)[0][0] if counts else None,
        kernel_counts=(min(counts), max(counts)) if counts else None, kernel_names=names,
        memops_per_call=Counter(memop_counts).most_common(1)[0][0] if memop_counts else None,
        memops_median_us=statistics.median(memop_us) if memop_us and any(memop_counts) else None,
        calls=len(calls), no_kernels=no_kernels, incomplete=incomplete)


def _time_cupti(torch: Any, tracer: CuptiTracer, fn: Callable, setup: Callable | None, rounds: int, flush: Any,
                flush_mode: str = "read") -> list[list[ActivityRecord]]:
    """Per round: setup, L2 flush, synchronize, drain (setup's and the flush's records, dropped), fn,
    synchronize, drain: that drain's records are the call's and nothing else's."""
    calls = []
    for _ in range(rounds):
        if setup is not None:
            setup()
        if flush is not None:
            _flush_l2(flush, flush_mode)
        torch.cuda.synchronize()
        tracer.drain()
        fn()
        torch.cuda.synchronize()
        calls.append(tracer.drain())
    return calls


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


@dataclass
class _Run:
    """What one timer produced, before the summary statistics."""

    timer: str
    samples: list[float]
    calls: int = 1
    estimate: float | None = None
    note: str = ""
    l2_flushed: bool = False
    extra: dict = field(default_factory=dict)


def _try_cupti(torch: Any, fn: Callable, setup: Callable | None, rounds: int | None, flush_l2: bool,
               flush_mode: str, index: int, reasons: list[str], tracer_factory: Callable[[], CuptiTracer] = CuptiTracer
               ) -> _Run | None:
    """The cupti timer, or None with the reason appended to `reasons` when CUPTI cannot trace here or
    produced no usable record."""
    try:
        tracer = tracer_factory()
    except CuptiUnavailable as e:
        reasons.append(str(e))
        return None
    estimate = _estimate_us(torch, fn, setup)
    n = rounds or _clamp(EVENTS_TARGET_MS * 1000.0 / max(estimate, 1e-3), CUPTI_ROUNDS)
    flush = _flush_buffer(torch, index) if flush_l2 else None
    try:
        with tracer:
            calls = _time_cupti(torch, tracer, fn, setup, n, flush, flush_mode)
    except CuptiUnavailable as e:
        reasons.append(str(e))
        return None
    summary = summarize_cupti_calls(calls)
    if not summary.samples_us:
        reasons.append(f"cupti: no usable kernel record in {summary.calls} calls ({summary.problems()})")
        return None
    note = (f"cupti: {summary.kernels_per_call} kernel(s) per call, their durations summed; setup and the L2 flush "
            f"outside, synchronized before and after each call")
    if flush_l2:
        note += f"; L2 flushed ({flush_mode}) before each call"
    if summary.problems():
        note += f"; {summary.problems()}"
        if summary.no_kernels or summary.incomplete:
            note += " (calls without complete kernel records are not counted)"
    if tracer.not_enabled:
        note += f"; not traced: {', '.join(tracer.not_enabled)}"
    return _Run("cupti", summary.samples_us, 1, estimate, note, flush_l2, extra={
        "kernels_per_call": summary.kernels_per_call, "kernel_names": summary.kernel_names,
        "span_median_us": statistics.median(summary.spans_us), "memops_per_call": summary.memops_per_call,
        "memops_median_us": summary.memops_median_us})


def _graph_or_events(torch: Any, fn: Callable, setup: Callable | None, timer: str, rounds: int | None, flush_l2: bool,
                     flush_mode: str, calls_per_graph: int | None, warm_ms: float, index: int, reasons: list[str]
                     ) -> _Run:
    """timer "graph", "events" or "auto" (the graph/events choice); a failed capture appends to `reasons`."""
    graph, calls, estimate = None, 1, None
    # A probe graph gives a device-only estimate; skip it for closures whose calls take over
    # GRAPH_PROBE_MAX_US even with host gaps (their device time may still be small, but such
    # closures are whole adapter calls, which rarely capture).
    probe = timer == "graph" or (timer == "auto" and setup is None and warm_ms * 1000.0 < GRAPH_PROBE_MAX_US)
    capture_failed = False
    if probe:
        calls = calls_per_graph or GRAPH_PROBE_CALLS
        try:
            graph = _capture(torch, fn, calls)
            estimate = statistics.median(_time_graph(torch, graph, calls, 3))
        except Exception as e:  # noqa: BLE001 - any capture failure means: time it with events
            reasons.append(_capture_failure(torch, e))
            graph, calls, capture_failed = None, 1, True
    if estimate is None:
        estimate = _estimate_us(torch, fn, setup)
    chosen, note = timer, ""
    if timer == "auto":
        if setup is not None:
            chosen, note = "events", "auto: a setup between calls needs events"
        elif graph is None:
            chosen, note = "events", ("auto: capture failed" if capture_failed else
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
                reasons.append(_capture_failure(torch, e))
                chosen, calls = "events", 1
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
    return _Run(chosen, samples, calls, estimate, note.lstrip("; "), chosen == "events" and flush_l2)


def time_device(fn: Callable[[], Any], *, setup: Callable[[], Any] | None = None, timer: str = "auto",
                warmup: int = 3, rounds: int | None = None, flush_l2: bool = True, warmup_ms: float = WARMUP_MS,
                calls_per_graph: int | None = None, flush_mode: str = "read", device: Any = None) -> Timing:
    """Device time of `fn()`, a closure that launches the kernel(s) only (plan() and other setup
    belong outside it; `setup()`, if given, runs before every call outside the timed region).

    timer: "cupti" (CUPTI kernel records of each call, summed; L2 flushed before each call; see the
    module's docstring), "graph" (K calls captured in one CUDA graph, replays timed with events,
    time / K; warm L2, nothing flushed), "events" (events around each call after an L2 flush;
    median over rounds) or "auto": cupti when cupti-python imports and CUPTI traces here;
    otherwise, without a setup, a probe graph of GRAPH_PROBE_CALLS calls is captured and replayed
    (device time only: per-call events would add the host's launch gaps of a Python wrapper) and
    the graph timer is used when that estimate is under GRAPH_THRESHOLD_US, events otherwise;
    with a setup, or when capture fails, events. "cupti" where CUPTI cannot trace falls back to
    events. Every fallback says why in `fallback_reason` ("cupti: not installed (...)",
    "cupti: CUPTI_ERROR_... in activity_enable(CONCURRENT_KERNEL)", "graph capture failed: ...").
    warmup: at least this many calls, and at least `warmup_ms` of GPU time, before anything is timed.
    rounds: samples (calls for cupti and events, graph replays); None picks them from an estimate.
    flush_mode: how cupti and events evict L2, "read" (default) or "write" (see _flush_l2).
    """
    torch = require_cuda("time_device")
    if timer not in TIMERS:
        raise ValueError(f"timer must be one of {', '.join(repr(t) for t in TIMERS)}, not {timer!r}")
    if flush_mode not in ("read", "write"):
        raise ValueError(f"flush_mode must be 'read' or 'write', not {flush_mode!r}")
    if timer == "graph" and setup is not None:
        raise ValueError("the graph timer cannot run setup() between calls (the replays would reuse the data "
                         "the previous call mutated); use timer='events' or 'cupti' for closures that need a setup")
    index = _device_index(torch, device)
    reasons: list[str] = []
    with torch.cuda.device(index):
        clocks_start = gpu_clocks(index)
        warm, warm_ms = _warmup(torch, fn, setup, max(1, warmup), warmup_ms)
        run = None
        if timer in ("auto", "cupti"):
            run = _try_cupti(torch, fn, setup, rounds, flush_l2, flush_mode, index, reasons)
        if run is None:
            run = _graph_or_events(torch, fn, setup, "events" if timer == "cupti" else timer, rounds, flush_l2,
                                   flush_mode, calls_per_graph, warm_ms, index, reasons)
            if reasons and reasons[0].startswith("cupti:"):
                run.note = "cupti not used (see fallback_reason)" + (f"; {run.note}" if run.note else "")
        clocks_end = gpu_clocks(index)
    med, q1, q3, mean = _summary(run.samples)
    return Timing(timer=run.timer, samples_us=run.samples, median_us=med, q1_us=q1, q3_us=q3, iqr_us=q3 - q1,
                  mean_us=mean, rounds=len(run.samples), calls_per_round=run.calls, l2_flushed=run.l2_flushed,
                  fallback_reason="; ".join(reasons) or None, clocks_start=clocks_start, clocks_end=clocks_end,
                  warmup_calls=warm, estimate_us=run.estimate, note=run.note, **run.extra)

"""Device time of a closure: CUPTI kernel records where cupti-python works, else CUDA-graph replay for
small kernels and CUDA events with a cold L2 for large ones (what to time: timing/kernels.py; the clocks:
timing/clocks.py; the CUPTI records: timing/cupti.py). This module chooses the timer and summarizes.

    gt = get_ground_truth("flashinfer", d, device="cuda")
    inputs = generate_inputs(d, "medium", device="cuda")
    prepared = prepare(gt, inputs)              # fn, setup = prepared  (also .includes_setup, .note)
    t = time_device(prepared.fn, setup=prepared.setup)
    t.median_us, t.iqr_us, t.timer, t.l2_flushed, t.fallback_reason, t.kernels_per_call, t.kernel_names

`auto` picks the cupti timer (timing/cupti.py) when it can, and falls back to
the timers below when `import cupti` fails or CUPTI refuses to trace (another CUPTI client, such as
ncu or a running torch profiler, holds it); the reason, e.g. "cupti: not installed (...)" or, under
ncu, "cupti: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39) in activity_register_callbacks", is
in `Timing.fallback_reason` and the timer used in `Timing.timer`, always.

The fallback of `timer="auto"` (why graph and events: timing/clocks.py): without a setup, a probe graph of 10
calls is captured and replayed (a device-only estimate); below GRAPH_THRESHOLD_US (50 us) the graph timer is
used, above it events; closures with a `setup` between calls always get events (a graph would replay on the data
the previous replay mutated), and so do closures that cannot be captured (`fallback_reason`).

`Timing.clocks_start/end` record the GPU's clocks, so a time read under a power cap can be told from one at full
clock. How the timers compare with Nsight Compute (`scripts/ncu-validate.py`): docs/evidence/timing.md.

This module imports on a CPU-only machine; `time_device` raises RuntimeError there.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .clocks import (
    WARMUP_MS,
    _capture,
    _capture_failure,
    _device_index,
    _estimate_us,
    _flush_buffer,
    _time_events,
    _time_graph,
    _warmup,
    gpu_clocks,
    require_cuda,
)
from .cupti import (
    ActivityRecord,
    CuptiSummary,
    CuptiTracer,
    CuptiUnavailable,
    _time_cupti,
    summarize_cupti_calls,
)

__all__ = ["GRAPH_THRESHOLD_US", "TIMERS", "ActivityRecord", "CuptiSummary", "CuptiTracer", "CuptiUnavailable",
           "Timing", "gpu_clocks", "require_cuda", "summarize_cupti_calls", "time_device"]

TIMERS = ("auto", "cupti", "graph", "events")

GRAPH_THRESHOLD_US = 50.0  # auto: graph below this (probe-graph) estimate per call, events above
EVENTS_TARGET_MS = 200.0  # auto rounds for events: about this much timed GPU work
EVENTS_ROUNDS = (5, 100)  # ...within these bounds
GRAPH_REPLAY_TARGET_US = 2000.0  # calls per graph: about this much work per replay
GRAPH_CALLS = (10, 500)
GRAPH_ROUNDS = 20  # replays timed
GRAPH_PROBE_CALLS = 10  # auto: calls in the probe graph whose replay gives the device-only estimate
GRAPH_PROBE_MAX_US = 2000.0  # auto: no probe when a warm-up call takes longer than this, host gaps included
CUPTI_ROUNDS = (10, 200)  # cupti: calls timed, from about EVENTS_TARGET_MS of GPU work, within these bounds


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

    timer: "cupti" (CUPTI kernel records of each call, summed; L2 flushed before each call; see
    timing/cupti.py), "graph" (K calls captured in one CUDA graph, replays timed with events,
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
    flush_mode: how cupti and events evict L2, "read" (default) or "write" (see clocks._flush_l2).
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

"""The cupti timer's machinery: CUPTI activity records of the kernels (and memcpy/memset) each call launched,
collected per call and summed (timers.time_device chooses it; this module only traces and summarizes).

`timer="cupti"` (what "auto" picks when it can): CUPTI's activity records (the cupti-python package,
`pip install cupti-python`, extra `cupti`) give each kernel's start and end on the GPU's clock. Per
sample: setup(), the L2 flush, a synchronize and an activity flush (their kernels are collected and
dropped), then one call of fn, a synchronize and a flush again: the kernel records that arrive are
exactly that call's, and the sample is the sum of their durations (what Nsight Compute's
gpu__time_duration sums per call). Host launch gaps are not in it, whatever the kernel's size, and
the kernel runs alone after an idle GPU with a cold L2, as under ncu. memcpy/memset records are
counted separately (`memops_per_call`, `memops_median_us`), not in the samples.

This module imports without cupti-python: `load_cupti` imports it when a tracer is made.
"""
from __future__ import annotations

import statistics
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .clocks import _flush_l2

__all__ = ["CUPTI_BUFFER_BYTES", "KERNEL_NAMES_KEPT", "KERNEL_NAME_CHARS", "ActivityRecord", "CuptiSummary",
           "CuptiTracer", "CuptiUnavailable", "load_cupti", "summarize_cupti_calls"]

CUPTI_BUFFER_BYTES = 4 << 20  # one CUPTI activity buffer (a kernel record is a few hundred bytes)
KERNEL_NAMES_KEPT = 5  # cupti: distinct kernel names of a call kept in Timing.kernel_names
KERNEL_NAME_CHARS = 200  # ...each cut to this length (templated C++ names run to kilobytes)


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

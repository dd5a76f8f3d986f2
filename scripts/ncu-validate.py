#!/usr/bin/env python3
"""Check flashinfer_trace.timing.timers.time_device (the cupti timer first) against Nsight Compute's kernel durations.

On a GPU node with ncu, from the repository root (PYTHONPATH=src if the package is not installed),
one command does everything (measure, profile under ncu, compare) and writes a JSON of the results:

    python scripts/ncu-validate.py all --workdir ncu-validate-out --out ncu-validate.json

(`--ncu PATH` if ncu is not on PATH; `--cases a,b` for some cases; `--repeats 5` cupti repeats.)
It prints, per case: ncu us (median per call, kernels of a call summed), the cupti timer's us (the
median of --repeats separate time_device runs), cupti/ncu, the repeat-to-repeat CV of the cupti
timer, events/ncu and graph/ncu, and a verdict: PASS when cupti is within 3% of ncu for cases
whose ncu median is >= 10 us (--tolerance, --min-us), within 10% for 2-10 us (--small-tolerance,
--floor-us), "info" below 2 us, "throttled" when the measuring run hit a power or thermal limit
(NVML clock event reasons, or the SM clock fell > 5%: ncu's isolated launches then ran at higher
clocks than the timer's loop), FAIL otherwise, and FAIL when the cupti timer could not run (its
fallback_reason is shown). Exit status 1 on any FAIL. Column "adj" (information, judged only with
--judge-adjusted):
ncu's gpu__time_duration of a kernel exceeds CUPTI's start-to-end by a fixed amount per kernel
(on an H100, 2026-11: ~1.5 us, so a 2.3 us rmsnorm reads 3.8 us in ncu and a two-kernel 13.6 us
decode 16.9 us); the launch_floor case (one 1-element kernel) measures that offset, and adj is
cupti/ncu with it added to cupti once per kernel.

The steps one by one, as `all` runs them:

    python scripts/ncu-validate.py measure --out measure.json
    ncu --target-processes all --clock-control none --nvtx --nvtx-include "regex:ncu:.*/" \
        --print-nvtx-rename kernel --metrics gpu__time_duration.sum --csv --print-units base \
        python scripts/ncu-validate.py profile > ncu.csv
    python scripts/ncu-validate.py compare ncu.csv measure.json --out results.json

and, for the graph timer (warm L2) like for like:

    ncu ...the same flags... --cache-control none python scripts/ncu-validate.py profile > ncu-warm.csv
    python scripts/ncu-validate.py compare --timer graph ncu-warm.csv measure.json

measure  times every case with time_device: the cupti timer --repeats times (each a full time_device
         run: warm-up, rounds), then auto, events and graph once each, and writes JSON. A cupti
         timer that cannot run (cupti-python missing, CUPTI held by another tool) falls back to
         events; the JSON records the timer that ran and why.
profile  runs every case's kernel(s) N times (--calls, default 20), each call inside its own NVTX
         push/pop range named ncu:<case>:<call>, and nothing else inside a range; the setup and
         warm-up calls run outside ranges, so ncu's NVTX filter leaves them out. The program prints
         nothing to stdout (ncu's CSV goes there). ncu's push/pop filter syntax separates nested
         ranges with '/' and needs a trailing one ("regex:ncu:.*/"), hence ':' in the names: a
         filter "regex:ncu/.*" with ranges ncu/<case>/<call> profiles nothing (seen with ncu
         2025.3.1: "No kernels were profiled").
compare  reads the ncu CSV (its header line is found by its "Metric Value" column; ==PROF== and
         program lines are skipped; units ns/nsecond, us/usecond, ms/msecond, s/second are
         normalised to us), sums the kernels of each call (a call may launch several), takes the
         median per case, and prints the table above for the judged --timer (default cupti).
all      measure, then ncu on profile (a child process; its CSV and log in --workdir), then compare.

Flags, and why:
* --clock-control none: ncu's default locks the SM clock to base, the timer runs at whatever clock
  the GPU boosts to; both must see the same clock policy.
* --print-nvtx-rename kernel: a kernel's name gets its push/pop range in front
  ("ncu:decode_large:3/BatchDecodeWithPagedKVCacheKernel..."), so the CSV says which case and
  call each kernel belongs to (compare also finds the tag in any other column).
* ncu's default --cache-control all flushes the caches before every kernel: a cold-L2 duration,
  the condition of the cupti and events timers (both flush L2 before each call). The graph timer
  replays back to back on a warm L2; to compare it like for like, profile again with
  --cache-control none and `compare --timer graph`.
* --print-units base: durations in ns (compare normalises any unit anyway).
* CUPTI allows one tracing client: the measuring process is not run under ncu (under ncu the cupti
  timer falls back, and says so).

Cases: launch_floor (one 1-element torch add_, the calibration above), rmsnorm 16x4096 and
32768x8192 bf16 (flashinfer.norm.rmsnorm when importable, else torch.nn.functional.rms_norm),
FlashInfer paged decode on the shipped gqa_paged_decode definition at medium (~15 us, two kernels)
and large (~290 us) size (plan() outside, run() timed: flashinfer_trace.timing.kernels.prepare), the shipped
gemm definition at large size through F.linear (fp16) and, last because it drives the GPU to its
power cap, a bf16 8192^3 torch.matmul. `--cases a,b` picks some. Runs of measure and profile must
use the same --cases.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

# gemm_8192 last: its sustained loop drives the GPU to its power cap, which would carry into the next case.
# launch_floor (one 1-element kernel) is a calibration, not judged: ncu's gpu__time_duration of a kernel
# and CUPTI's start-to-end differ by a fixed per-kernel amount, which this case measures.
CASES = ("launch_floor", "rmsnorm_small", "rmsnorm_large", "decode_medium", "decode_large", "gemm_linear_large",
         "gemm_8192")
FLOOR_CASE = "launch_floor"
METRIC = "gpu__time_duration.sum"
TAG = re.compile(r"ncu[:/]([A-Za-z0-9_.-]+)[:/](\d+)")
UNITS_TO_US = {
    "ns": 1e-3, "nsecond": 1e-3, "nanosecond": 1e-3, "nanoseconds": 1e-3,
    "us": 1.0, "usecond": 1.0, "microsecond": 1.0, "microseconds": 1.0, "µs": 1.0,
    "ms": 1e3, "msecond": 1e3, "millisecond": 1e3, "milliseconds": 1e3,
    "s": 1e6, "second": 1e6, "seconds": 1e6,
}
DECODE = "gqa_paged_decode_h32_kv8_d128_ps1"
# (name in the JSON, time_device timer, flush_mode): cupti is timed --repeats times, the others once.
# events_write (not measured unless --variants names it) flushes L2 by zeroing the buffer, which leaves
# dirty lines the timed kernel must write back; it shows the difference from the read flush.
VARIANTS = (("cupti", "cupti", "read"), ("auto", "auto", "read"), ("events", "events", "read"),
            ("graph", "graph", "read"), ("events_write", "events", "write"))
DEFAULT_VARIANTS = ("cupti", "auto", "events", "graph")
GEMM = "gemm_n4096_k4096"
# the verdict: within TOLERANCE of ncu from MIN_US, within SMALL_TOLERANCE from FLOOR_US, "info" below
TOLERANCE, MIN_US, SMALL_TOLERANCE, FLOOR_US = 0.03, 10.0, 0.10, 2.0
NCU_FLAGS = ("--target-processes", "all", "--clock-control", "none", "--nvtx", "--nvtx-include", "regex:ncu:.*/",
             "--print-nvtx-rename", "kernel", "--metrics", "gpu__time_duration.sum", "--csv", "--print-units", "base")


def _import_package():
    try:
        import flashinfer_trace  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


# -- the cases ------------------------------------------------------------------------------------------
def build_case(name: str):
    """(fn, setup, info) for one case on the GPU; raises LookupError with the reason if it cannot run."""
    import torch
    import torch.nn.functional as F

    if name == FLOOR_CASE:
        one = torch.zeros(1, device="cuda")
        return (lambda: one.add_(1.0)), None, {"api": "torch.Tensor.add_", "shape": [1], "dtype": "float32",
                                               "purpose": "per-kernel floor of each tool (calibration)"}
    if name.startswith("rmsnorm"):
        rows, hidden = (16, 4096) if name == "rmsnorm_small" else (32768, 8192)
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, generator=g)
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16, generator=g)
        try:
            from flashinfer.norm import rmsnorm

            fn, api = (lambda: rmsnorm(x, w, eps=1e-6)), "flashinfer.norm.rmsnorm"
        except Exception:  # noqa: BLE001 - not installed, or fails to import here
            fn, api = (lambda: F.rms_norm(x, (hidden,), w, 1e-6)), "torch.nn.functional.rms_norm"
        return fn, None, {"api": api, "shape": [rows, hidden], "dtype": "bfloat16",
                          "bytes": (2 * rows * hidden + hidden) * 2}
    if name.startswith("decode"):
        from flashinfer_trace.testing import GroundTruthUnavailable, generate_inputs, get_ground_truth, load_definition
        from flashinfer_trace.timing.kernels import prepare
        from flashinfer_trace.timing.roofline import work

        d = load_definition(DECODE)
        size = "medium" if name == "decode_medium" else "large"
        try:
            gt = get_ground_truth("flashinfer", d, device="cuda")
            inputs = generate_inputs(d, size, 0, device="cuda")
            prepared = prepare(gt, inputs)
        except GroundTruthUnavailable as e:
            raise LookupError(str(e)) from e
        w = work(d, inputs)
        return prepared.fn, prepared.setup, {"api": gt.api, "definition": DECODE, "size": size,
                                             "version": str(gt.version), "note": prepared.note, "bytes": w.bytes,
                                             "flops": w.flops}
    if name == "gemm_8192":
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16, generator=g)
        return (lambda: torch.matmul(a, b)), None, {"api": "torch.matmul", "shape": [8192, 8192, 8192],
                                                    "dtype": "bfloat16", "flops": 2 * 8192**3}
    if name == "gemm_linear_large":
        from flashinfer_trace.testing import generate_inputs, load_definition
        from flashinfer_trace.timing.roofline import work

        d = load_definition(GEMM)
        inputs = generate_inputs(d, "large", 0, device="cuda")
        a, b = inputs.values["A"], inputs.values["B"]
        w = work(d, inputs)
        return (lambda: F.linear(a, b)), None, {"api": "torch.nn.functional.linear", "definition": GEMM,
                                                "size": "large", "shape": [a.shape[0], b.shape[0], a.shape[1]],
                                                "dtype": str(a.dtype).replace("torch.", ""), "bytes": w.bytes,
                                                "flops": w.flops}
    raise LookupError(f"unknown case {name!r}; cases: {', '.join(CASES)}")


def _cases(text: str | None) -> list[str]:
    names = [c.strip() for c in (text or ",".join(CASES)).split(",") if c.strip()]
    bad = [c for c in names if c not in CASES]
    if bad:
        raise SystemExit(f"unknown case(s) {', '.join(bad)}; cases: {', '.join(CASES)}")
    return names


# -- measure --------------------------------------------------------------------------------------------
def _cv(values: list[float]) -> float | None:
    """Coefficient of variation (sample stdev / mean), None for fewer than two values."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None


def _timing_entry(t) -> dict:
    return {k: v for k, v in t.as_dict().items() if k != "samples_us"}


def _repeated(timings: list) -> dict:
    """One entry for --repeats runs of a timer: the first run's fields, median_us the median of the
    runs' medians, their CV, the clocks from the first start to the last end, every timer that ran."""
    entry = _timing_entry(timings[0])
    medians = [t.median_us for t in timings]
    entry.update({"median_us": statistics.median(medians), "repeat_medians_us": medians, "repeat_cv": _cv(medians),
                  "repeats": len(timings), "clocks_end": timings[-1].clocks_end,
                  "timers": sorted({t.timer for t in timings})})
    if len(entry["timers"]) > 1:  # some runs fell back: say which timer each used
        entry["timer"] = "+".join(entry["timers"])
    reasons = sorted({t.fallback_reason for t in timings if t.fallback_reason})
    entry["fallback_reason"] = "; ".join(reasons) or None
    return entry


def measure(cases: list[str], rounds: int | None, repeats: int = 5, variants: tuple[str, ...] = DEFAULT_VARIANTS
            ) -> dict:
    _import_package()
    from flashinfer_trace.timing.timers import gpu_clocks, require_cuda, time_device

    torch = require_cuda("ncu-validate measure")
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "clocks": gpu_clocks(), "repeats": repeats, "variants": list(variants), "cases": {}}
    try:
        import importlib.metadata as md

        out["cupti_python"] = md.version("cupti-python")
    except Exception:  # noqa: BLE001 - not installed: the cupti variant falls back and says why
        out["cupti_python"] = None
    for name in cases:
        try:
            fn, setup, info = build_case(name)
        except LookupError as e:
            log(f"{name}: skipped ({e})")
            out["cases"][name] = {"skipped": str(e)}
            continue
        entry = {"info": info}
        for variant, timer, flush_mode in VARIANTS:
            if variant not in variants or (timer == "graph" and setup is not None):
                continue
            n = max(1, repeats) if variant == "cupti" else 1
            timings = [time_device(fn, setup=setup, timer=timer, rounds=rounds, flush_mode=flush_mode)
                       for _ in range(n)]
            entry[variant] = _repeated(timings) if n > 1 else _timing_entry(timings[0])
            e = entry[variant]
            cv = e.get("repeat_cv")
            log(f"{name:<18} {variant:<12} -> {e['timer']:<6} median {e['median_us']:10.2f} us  iqr {e['iqr_us']:8.2f}"
                + (f"  cv {100 * cv:.2f}% over {n}" if cv is not None else "")
                + (f"  kernels {e['kernels_per_call']}" if e.get("kernels_per_call") else "")
                + (f"  ({e['fallback_reason']})" if e.get("fallback_reason") else ""))
        out["cases"][name] = entry
        del fn, setup
        torch.cuda.empty_cache()
    return out


# -- profile --------------------------------------------------------------------------------------------
def profile(cases: list[str], calls: int, warmup: int) -> None:
    _import_package()
    from flashinfer_trace.timing.timers import require_cuda

    torch = require_cuda("ncu-validate profile")
    for name in cases:
        try:
            fn, setup, _ = build_case(name)
        except LookupError as e:
            log(f"{name}: skipped ({e})")
            continue
        for _ in range(warmup):  # outside any range: not profiled
            if setup is not None:
                setup()
            fn()
        torch.cuda.synchronize()
        for i in range(calls):
            if setup is not None:
                setup()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(f"ncu:{name}:{i}")
            fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        log(f"{name}: {calls} calls in ranges ncu:{name}:0..{calls - 1}")
        del fn, setup
        torch.cuda.empty_cache()


# -- compare --------------------------------------------------------------------------------------------
def _value_us(value: str, unit: str) -> float:
    text = value.strip().replace(",", "")  # ncu may print thousands separators: "1,234.5"
    number = float(text)
    factor = UNITS_TO_US.get(unit.strip().lower())
    if factor is None:
        raise ValueError(f"unknown duration unit {unit!r}")
    return number * factor


def _ncu_kernels(text: str) -> list[tuple[str, int, float]]:
    """(case, call, duration in us) for every tagged kernel row of ncu's --csv output."""
    lines = text.splitlines()
    header_at = None
    for i, line in enumerate(lines):
        if "Metric Value" in line and "Kernel Name" in line:
            header_at = i
            break
    if header_at is None:
        raise ValueError("no ncu CSV header (a line with \"Kernel Name\" and \"Metric Value\") found")
    body = [ln for ln in lines[header_at:] if ln.startswith('"')]  # drops ==PROF== and program lines
    reader = csv.DictReader(io.StringIO("\n".join(body)))
    out = []
    untagged = 0
    for row in reader:
        if row.get("Metric Name", "").strip() != METRIC:
            continue
        tag = TAG.search(row.get("Kernel Name") or "")
        if tag is None:  # the tag may also sit in an NVTX column
            tag = next((m for v in row.values() if isinstance(v, str) for m in [TAG.search(v)] if m), None)
        if tag is None:
            untagged += 1
            continue
        out.append((tag.group(1), int(tag.group(2)), _value_us(row["Metric Value"], row.get("Metric Unit", "ns"))))
    if not out and untagged:
        raise ValueError(f"{untagged} kernel rows but none tagged ncu/<case>/<call>: profile with "
                         f"--print-nvtx-rename kernel")
    return out


def parse_ncu_csv(text: str) -> dict[str, dict[int, float]]:
    """{case: {call: summed kernel duration in us}} from ncu's --csv output."""
    out: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for case, call, us in _ncu_kernels(text):
        out[case][call] += us
    return {case: dict(calls) for case, calls in out.items()}


def ncu_kernel_counts(text: str) -> dict[str, int]:
    """{case: the most common number of kernels per call} from ncu's --csv output."""
    per_call: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for case, call, _ in _ncu_kernels(text):
        per_call[case][call] += 1
    return {case: Counter(calls.values()).most_common(1)[0][0] for case, calls in per_call.items()}


def _band(ncu_us: float, tolerance: float, min_us: float, small_tolerance: float, floor_us: float) -> float | None:
    """The tolerance that applies to a case of this ncu duration; None: below the floor, not judged."""
    if ncu_us >= min_us:
        return tolerance
    if ncu_us >= floor_us:
        return small_tolerance
    return None


def _floor_offset(ncu: dict[str, dict[int, float]], measured: dict) -> float | None:
    """ncu's median minus cupti's for the one-kernel launch_floor case, in us (None unless both ran)."""
    calls = ncu.get(FLOOR_CASE)
    cupti = measured.get("cases", {}).get(FLOOR_CASE, {}).get("cupti")
    if not calls or not cupti or cupti.get("timer") != "cupti":
        return None
    return statistics.median(calls.values()) - cupti["median_us"]


def compare(ncu: dict[str, dict[int, float]], measured: dict, *, timer: str = "cupti", tolerance: float = TOLERANCE,
            min_us: float = MIN_US, small_tolerance: float = SMALL_TOLERANCE, floor_us: float = FLOOR_US,
            ncu_kernels: dict[str, int] | None = None, judge_adjusted: bool = False) -> list[dict]:
    """One row per case: ncu median (us, kernels of a call summed) and CV over calls, each timer's
    median and ratio to ncu, the cupti repeat CV, kernels per call, and the verdict on `timer`.
    With the launch_floor case measured by both, each cupti row also gets `floor_offset_us` (ncu's
    minus cupti's duration of that one tiny kernel) and `cupti_adj_ratio`: (cupti + kernels x
    offset) / ncu, what the ratio would be if CUPTI's durations carried ncu's fixed per-kernel
    amount. The verdict is on the raw ratio (a reason mentions the adjusted one), or with
    `judge_adjusted` on the adjusted ratio where there is one."""
    rows = []
    offset = _floor_offset(ncu, measured)
    for case, entry in measured.get("cases", {}).items():
        row = {"case": case, "ncu_us": None, "ncu_calls": 0, "verdict": "missing"}
        if "skipped" in entry:
            row["verdict"] = "skipped"
            row["reason"] = entry["skipped"]
            rows.append(row)
            continue
        calls = ncu.get(case, {})
        if calls:
            row["ncu_us"] = statistics.median(calls.values())
            row["ncu_calls"] = len(calls)
            row["ncu_cv"] = _cv(list(calls.values()))
        if ncu_kernels and case in ncu_kernels:
            row["ncu_kernels"] = ncu_kernels[case]
        for t in [v[0] for v in VARIANTS]:
            if t in entry:
                row[f"{t}_us"] = entry[t]["median_us"]
                row[f"{t}_timer"] = entry[t]["timer"]
                row[f"{t}_ratio"] = entry[t]["median_us"] / row["ncu_us"] if row["ncu_us"] else None
        if "cupti" in entry:
            row["cupti_cv"] = entry["cupti"].get("repeat_cv")
            row["cupti_repeats"] = entry["cupti"].get("repeats", 1)
            row["cupti_kernels"] = entry["cupti"].get("kernels_per_call")
            row["cupti_kernel_names"] = entry["cupti"].get("kernel_names") or []
        judged = entry.get(timer)
        if judged is None or row["ncu_us"] is None:
            row["reason"] = f"{timer} not measured" if judged is None else "no ncu kernel rows for this case"
            rows.append(row)
            continue
        notes = []
        kernels = row.get("cupti_kernels") or row.get("ncu_kernels")
        if offset is not None and row.get("cupti_us") is not None and kernels:
            row["floor_offset_us"] = offset
            row["cupti_adj_ratio"] = (row["cupti_us"] + kernels * offset) / row["ncu_us"]
        if case == FLOOR_CASE:
            row["verdict"] = "calibration"
            row["reason"] = ("per-kernel offset ncu - cupti: " + (f"{offset:.2f} us" if offset is not None else "-")
                             + "; not judged")
            rows.append(row)
            continue
        if row.get("cupti_kernels") and row.get("ncu_kernels") and row["cupti_kernels"] != row["ncu_kernels"]:
            notes.append(f"kernels per call: cupti {row['cupti_kernels']}, ncu {row['ncu_kernels']}")
        band = _band(row["ncu_us"], tolerance, min_us, small_tolerance, floor_us)
        row["tolerance"] = band
        ratio = row[f"{timer}_ratio"]
        adjusted = judge_adjusted and timer == "cupti" and row.get("cupti_adj_ratio") is not None
        if adjusted:
            ratio = row["cupti_adj_ratio"]
            row["judged_on"] = "adj"
        if timer in ("cupti", "graph", "events") and judged["timer"] != timer:
            row["verdict"] = "FAIL"
            notes.insert(0, f"{timer} timer not used, {judged['timer']} ran: {judged.get('fallback_reason') or '?'}")
        elif band is None:
            row["verdict"] = "info"
            notes.insert(0, f"ncu {row['ncu_us']:.2f} us < {floor_us:g} us: not judged")
        elif abs(ratio - 1.0) <= band:
            row["verdict"] = "PASS"
        elif throttle := throttled(judged):
            row["verdict"] = "throttled"
            notes.insert(0, throttle)
        else:
            row["verdict"] = "FAIL"
            notes.insert(0, f"{timer}/ncu{' adjusted' if adjusted else ''} {ratio:.3f} outside 1 +- {band:g}")
        adj = row.get("cupti_adj_ratio")
        if adjusted:
            notes.append(f"judged on adj (raw {row['cupti_ratio']:.3f})")
        elif row["verdict"] != "PASS" and timer == "cupti" and adj is not None and band is not None:
            notes.append(f"with ncu's per-kernel offset ({offset:.2f} us x {kernels}) {adj:.3f}: "
                         + ("within" if abs(adj - 1.0) <= band else "still outside") + f" {band:g}")
        if notes:
            row["reason"] = "; ".join(notes)
        rows.append(row)
    return rows


# NVML clock event reasons that mean the GPU slowed itself down: SW power cap, HW slowdown, SW thermal,
# HW thermal, HW power brake (nvml.h nvmlClocksEventReason*).
THROTTLE_REASONS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def throttled(timing: dict) -> str | None:
    """Why a timing ran below full clocks, or None: NVML's event reasons at the end of the timing
    name a power or thermal limit, or the SM clock fell by more than 5% during it. ncu profiles
    isolated launches with idle gaps between them, so its kernels run at clocks a sustained loop
    (the timer's) may not hold: such a case compares clocks, not timers, and is not judged."""
    start, end = timing.get("clocks_start") or {}, timing.get("clocks_end") or {}
    why = []
    try:
        reasons = int(str(end.get("clocks_event_reasons", "0")), 0)
    except ValueError:
        reasons = 0
    if reasons & THROTTLE_REASONS:
        why.append(f"clock event reasons {reasons:#x}")
    sm0, sm1 = start.get("sm_clock_mhz"), end.get("sm_clock_mhz")
    if sm0 and sm1 and sm1 < 0.95 * sm0:
        why.append(f"SM clock {sm0:g} -> {sm1:g} MHz")
    return ", ".join(why) or None


def _fmt(v, spec: str) -> str:
    """format(v, spec), or "-" padded to the spec's width for a missing value."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-".rjust(int(re.match(r"\d*", spec).group() or 0))
    return format(v, spec)


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def print_table(rows: list[dict], timer: str, file=None) -> None:
    file = file or sys.stdout
    head = (f"{'case':<18} {'ncu us':>9} {'ncu cv':>7} {'k':>2} {timer + ' us':>10} {'k':>2} {timer + '/ncu':>10} "
            f"{'adj':>6} {'rep cv':>7} {'tol':>5} {'events':>7} {'graph':>7} {'auto':>7}  verdict")
    print(head, file=file)
    print("-" * len(head), file=file)
    for r in rows:
        tol = r.get("tolerance")
        print(f"{r['case']:<18} {_fmt(r['ncu_us'], '9.2f')} {_pct(r.get('ncu_cv')):>7} "
              f"{_fmt(r.get('ncu_kernels'), '2d')} {_fmt(r.get(f'{timer}_us'), '10.2f')} "
              f"{_fmt(r.get('cupti_kernels') if timer == 'cupti' else None, '2d')} "
              f"{_fmt(r.get(f'{timer}_ratio'), '10.3f')} "
              f"{_fmt(r.get('cupti_adj_ratio') if timer == 'cupti' else None, '6.3f')} "
              f"{_pct(r.get('cupti_cv') if timer == 'cupti' else None):>7} "
              f"{'-' if tol is None else format(tol, '.0%'):>5} {_fmt(r.get('events_ratio'), '7.3f')} "
              f"{_fmt(r.get('graph_ratio'), '7.3f')} {r.get('auto_timer') or '-':>7}  {r['verdict']}"
              + (f" ({r['reason']})" if r.get("reason") else ""), file=file)
    counts = Counter(r["verdict"] for r in rows)
    print(f"\n{', '.join(f'{n} {v}' for v, n in sorted(counts.items()))}.\nk: kernels per call; rep cv: CV of the "
          f"{timer} median over repeats; adj: cupti/ncu with ncu's per-kernel offset (launch_floor) added to cupti "
          f"per kernel (shown, not judged); events, graph: their ratio to ncu; auto: the timer auto chose", file=file)


def results_json(rows: list[dict], measured: dict, *, timer: str, criteria: dict, extra: dict | None = None) -> dict:
    return {"timer": timer, "criteria": criteria, "gpu": measured.get("gpu"), "torch": measured.get("torch"),
            "cuda": measured.get("cuda"), "cupti_python": measured.get("cupti_python"),
            "repeats": measured.get("repeats"), "clocks": measured.get("clocks"),
            "summary": dict(Counter(r["verdict"] for r in rows)), "rows": rows, **(extra or {})}


# -- all ----------------------------------------------------------------------------------------------------
def find_ncu(explicit: str | None) -> str:
    import glob
    import shutil

    if explicit:
        return explicit
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda-*/bin/ncu"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    raise SystemExit("ncu not found on PATH, /usr/local/cuda/bin or /opt/nvidia/nsight-compute: pass --ncu PATH")


def ncu_command(ncu: str, cases: list[str], calls: int, warmup: int, cache_control: str = "all") -> list[str]:
    return [ncu, *NCU_FLAGS, "--cache-control", cache_control, sys.executable, str(Path(__file__).resolve()),
            "profile", "--cases", ",".join(cases), "--calls", str(calls), "--warmup", str(warmup)]


def run_all(args) -> int:
    import os
    import subprocess

    cases = _cases(args.cases)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ncu = find_ncu(args.ncu)  # before the measuring, which takes minutes
    log(f"measuring {', '.join(cases)} (cupti x{args.repeats}, then auto, events, graph)")
    measured = measure(cases, args.rounds, args.repeats, tuple(args.variants.split(",")))
    (workdir / "measure.json").write_text(json.dumps(measured, indent=2) + "\n")
    cmd = ncu_command(ncu, cases, args.calls, args.warmup)
    log("profiling: " + " ".join(cmd))
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(workdir / "ncu.csv", "w") as out, open(workdir / "ncu.log", "w") as err:
        done = subprocess.run(cmd, stdout=out, stderr=err, env=env, timeout=args.ncu_timeout)
    text = (workdir / "ncu.csv").read_text(errors="replace")
    try:
        ncu_rows = parse_ncu_csv(text)
        kernels = ncu_kernel_counts(text)
    except ValueError as e:
        tail = (workdir / "ncu.log").read_text(errors="replace")[-3000:]
        log(f"ncu (exit status {done.returncode}) gave no usable CSV: {e}")
        log(f"--- {workdir / 'ncu.log'} (tail) ---\n{tail}")
        return 2
    if done.returncode != 0:
        log(f"ncu exited with status {done.returncode} (see {workdir / 'ncu.log'}); comparing what it wrote")
    return _report(ncu_rows, kernels, measured, args, extra={
        "ncu_command": cmd, "ncu_exit_status": done.returncode,
        "files": {k: str(workdir / k) for k in ("measure.json", "ncu.csv", "ncu.log")}})


def _report(ncu_rows, kernels, measured, args, extra: dict | None = None) -> int:
    criteria = {"tolerance": args.tolerance, "min_us": args.min_us, "small_tolerance": args.small_tolerance,
                "floor_us": args.floor_us}
    rows = compare(ncu_rows, measured, timer=args.timer, ncu_kernels=kernels, judge_adjusted=args.judge_adjusted,
                   **criteria)
    criteria["judged_on"] = "adj" if args.judge_adjusted else "raw ratio"
    if getattr(args, "json", False):
        print(json.dumps(rows, indent=2))
    else:
        print(f"{measured.get('gpu', '?')}, torch {measured.get('torch', '?')}, cupti-python "
              f"{measured.get('cupti_python') or 'not installed'}; judged: {args.timer} vs ncu"
              f"{' (adj)' if args.judge_adjusted else ''}, within "
              f"{args.tolerance:.0%} from {args.min_us:g} us, {args.small_tolerance:.0%} from {args.floor_us:g} us\n")
        print_table(rows, args.timer)
    if args.out:
        Path(args.out).write_text(json.dumps(results_json(rows, measured, timer=args.timer, criteria=criteria,
                                                          extra=extra), indent=2) + "\n")
        log(f"results: {args.out}")
    return 1 if any(r["verdict"] == "FAIL" for r in rows) else 0


# -- command line ----------------------------------------------------------------------------------------
def _criteria_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timer", default="cupti", choices=[v[0] for v in VARIANTS], help="the timer judged")
    p.add_argument("--tolerance", type=float, default=TOLERANCE, help="allowed |timer/ncu - 1| from --min-us")
    p.add_argument("--min-us", type=float, default=MIN_US, help="ncu median from which --tolerance applies")
    p.add_argument("--small-tolerance", type=float, default=SMALL_TOLERANCE,
                   help="allowed |timer/ncu - 1| from --floor-us to --min-us")
    p.add_argument("--floor-us", type=float, default=FLOOR_US, help="cases shorter than this are reported, not judged")
    p.add_argument("--judge-adjusted", action="store_true",
                   help="judge cupti on adj (ncu's per-kernel offset, measured by launch_floor, added) instead of "
                        "the raw ratio")
    p.add_argument("--out", default=None, help="write the results (rows, criteria, GPU) as JSON here")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ncu-validate.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="mode", required=True)
    variants = ",".join(DEFAULT_VARIANTS)
    m = sub.add_parser("measure", help="time every case with time_device; JSON to stdout or --out")
    m.add_argument("--cases", default=None, help=f"comma separated, from {', '.join(CASES)}")
    m.add_argument("--rounds", type=int, default=None, help="samples per timer (default: time_device's choice)")
    m.add_argument("--repeats", type=int, default=5, help="time_device runs of the cupti timer (for its CV)")
    m.add_argument("--variants", default=variants, help=f"from {', '.join(v[0] for v in VARIANTS)}")
    m.add_argument("--out", default=None, help="write the JSON here instead of stdout")
    pr = sub.add_parser("profile", help="run every case inside NVTX ranges ncu:<case>:<call>, for ncu")
    pr.add_argument("--cases", default=None)
    pr.add_argument("--calls", type=int, default=20)
    pr.add_argument("--warmup", type=int, default=5)
    c = sub.add_parser("compare", help="ratios timer / ncu from an ncu CSV and a measure JSON")
    c.add_argument("ncu_csv")
    c.add_argument("measure_json")
    _criteria_options(c)
    c.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    a = sub.add_parser("all", help="measure, profile under ncu, compare; table to stdout, JSON to --out")
    a.add_argument("--cases", default=None, help=f"comma separated, from {', '.join(CASES)}")
    a.add_argument("--rounds", type=int, default=None)
    a.add_argument("--repeats", type=int, default=5)
    a.add_argument("--variants", default=variants)
    a.add_argument("--calls", type=int, default=20, help="profiled calls per case")
    a.add_argument("--warmup", type=int, default=5)
    a.add_argument("--ncu", default=None, help="the ncu executable (default: PATH, then CUDA's usual places)")
    a.add_argument("--ncu-timeout", type=float, default=1800.0, help="seconds")
    a.add_argument("--workdir", default="ncu-validate-out", help="measure.json, ncu.csv and ncu.log go here")
    _criteria_options(a)
    args = p.parse_args(argv)

    if args.mode == "measure":
        unknown = set(args.variants.split(",")) - {v[0] for v in VARIANTS}
        if unknown:
            raise SystemExit(f"unknown variant(s) {', '.join(sorted(unknown))}")
        result = json.dumps(measure(_cases(args.cases), args.rounds, args.repeats, tuple(args.variants.split(","))),
                            indent=2)
        if args.out:
            Path(args.out).write_text(result + "\n")
        else:
            print(result)
        return 0
    if args.mode == "profile":
        profile(_cases(args.cases), args.calls, args.warmup)
        return 0
    if args.mode == "all":
        if args.out is None:
            args.out = str(Path(args.workdir) / "results.json")
        return run_all(args)
    text = Path(args.ncu_csv).read_text(errors="replace")
    measured = json.loads(Path(args.measure_json).read_text())
    return _report(parse_ncu_csv(text), ncu_kernel_counts(text), measured, args,
                   extra={"files": {"ncu_csv": args.ncu_csv, "measure_json": args.measure_json}})


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Check flashinfer_trace.bench.time_device against Nsight Compute's kernel durations.

On a GPU node with ncu, from the repository root (PYTHONPATH=src if the package is not installed):

    python scripts/ncu-validate.py measure --out measure.json
    ncu --target-processes all --clock-control none --nvtx --nvtx-include "regex:ncu:.*/" \
        --print-nvtx-rename kernel --metrics gpu__time_duration.sum --csv --print-units base \
        python scripts/ncu-validate.py profile > ncu.csv
    python scripts/ncu-validate.py compare ncu.csv measure.json

and, for the graph timer (warm L2) like for like:

    ncu ...the same flags... --cache-control none python scripts/ncu-validate.py profile > ncu-warm.csv
    python scripts/ncu-validate.py compare --timer graph ncu-warm.csv measure.json

measure  times every case with time_device (the auto choice, and the events and graph timers
         separately) and writes JSON.
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
         median per case, and prints timer / ncu per case and timer: PASS within --tolerance (3%)
         for cases whose ncu median is >= --min-us (10 us), "info" below (launch overhead and the
         warm-vs-cold cache state dominate there), "throttled" when the timer's run hit a power or
         thermal limit (NVML clock event reasons, or the SM clock fell > 5%: ncu's isolated
         launches then ran at higher clocks than the timer's sustained loop), FAIL otherwise; exit
         status 1 on any FAIL.

Flags, and why:
* --clock-control none: ncu's default locks the SM clock to base, the timer runs at whatever clock
  the GPU boosts to; both must see the same clock policy.
* --print-nvtx-rename kernel: a kernel's name gets its push/pop range in front
  ("ncu:decode_large:3/BatchDecodeWithPagedKVCacheKernel..."), so the CSV says which case and
  call each kernel belongs to (compare also finds the tag in any other column).
* ncu's default --cache-control all flushes the caches before every kernel: a cold-L2 duration,
  the events timer's condition. The graph timer replays back to back on a warm L2; to compare it
  like for like, profile again with --cache-control none and `compare --timer graph`.
* --print-units base: durations in ns (compare normalises any unit anyway).

Cases: rmsnorm 16x4096 and 32768x8192 bf16 (flashinfer.norm.rmsnorm when importable, else
torch.nn.functional.rms_norm), FlashInfer paged decode on the shipped gqa_paged_decode definition
at medium and large size (plan() outside, run() timed: flashinfer_trace.bench.prepare), a bf16
8192^3 torch.matmul and the shipped gemm definition at large size through F.linear (fp16).
`--cases a,b` picks some. Runs of measure and profile must use the same --cases.
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
from collections import defaultdict
from pathlib import Path

CASES = ("rmsnorm_small", "rmsnorm_large", "decode_medium", "decode_large", "gemm_8192", "gemm_linear_large")
METRIC = "gpu__time_duration.sum"
TAG = re.compile(r"ncu[:/]([A-Za-z0-9_.-]+)[:/](\d+)")
UNITS_TO_US = {
    "ns": 1e-3, "nsecond": 1e-3, "nanosecond": 1e-3, "nanoseconds": 1e-3,
    "us": 1.0, "usecond": 1.0, "microsecond": 1.0, "microseconds": 1.0, "µs": 1.0,
    "ms": 1e3, "msecond": 1e3, "millisecond": 1e3, "milliseconds": 1e3,
    "s": 1e6, "second": 1e6, "seconds": 1e6,
}
DECODE = "gqa_paged_decode_h32_kv8_d128_ps1"
# (name in the JSON, time_device timer, flush_mode): events_write flushes L2 by zeroing the buffer, which
# leaves dirty lines the timed kernel must write back; kept to show the difference from the read flush.
VARIANTS = (("auto", "auto", "read"), ("events", "events", "read"), ("events_write", "events", "write"),
            ("graph", "graph", "read"))
GEMM = "gemm_n4096_k4096"


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
        from flashinfer_trace.bench import prepare
        from flashinfer_trace.roofline import work
        from flashinfer_trace.testing import GroundTruthUnavailable, generate_inputs, get_ground_truth, load_definition

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
        from flashinfer_trace.roofline import work
        from flashinfer_trace.testing import generate_inputs, load_definition

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
def measure(cases: list[str], rounds: int | None) -> dict:
    _import_package()
    from flashinfer_trace.bench import gpu_clocks, require_cuda, time_device

    torch = require_cuda("ncu-validate measure")
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "clocks": gpu_clocks(), "cases": {}}
    for name in cases:
        try:
            fn, setup, info = build_case(name)
        except LookupError as e:
            log(f"{name}: skipped ({e})")
            out["cases"][name] = {"skipped": str(e)}
            continue
        entry = {"info": info}
        for variant, timer, flush_mode in VARIANTS:
            if timer == "graph" and setup is not None:
                continue
            t = time_device(fn, setup=setup, timer=timer, rounds=rounds, flush_mode=flush_mode)
            entry[variant] = {k: v for k, v in t.as_dict().items() if k != "samples_us"}
            log(f"{name:<18} {variant:<12} -> {t.timer:<6} median {t.median_us:10.2f} us  iqr {t.iqr_us:8.2f}"
                + (f"  ({t.fallback_reason})" if t.fallback_reason else ""))
        out["cases"][name] = entry
        del fn, setup
        torch.cuda.empty_cache()
    return out


# -- profile --------------------------------------------------------------------------------------------
def profile(cases: list[str], calls: int, warmup: int) -> None:
    _import_package()
    from flashinfer_trace.bench import require_cuda

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


def parse_ncu_csv(text: str) -> dict[str, dict[int, float]]:
    """{case: {call: summed kernel duration in us}} from ncu's --csv output."""
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
    out: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
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
        out[tag.group(1)][int(tag.group(2))] += _value_us(row["Metric Value"], row.get("Metric Unit", "ns"))
    if not out and untagged:
        raise ValueError(f"{untagged} kernel rows but none tagged ncu/<case>/<call>: profile with "
                         f"--print-nvtx-rename kernel")
    return {case: dict(calls) for case, calls in out.items()}


def compare(ncu: dict[str, dict[int, float]], measured: dict, *, timer: str = "auto", tolerance: float = 0.03,
            min_us: float = 10.0) -> list[dict]:
    """One row per case: ncu median (us, kernels of a call summed), each timer's median, ratios, verdict."""
    rows = []
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
        for t in [v[0] for v in VARIANTS]:
            if t in entry:
                row[f"{t}_us"] = entry[t]["median_us"]
                row[f"{t}_timer"] = entry[t]["timer"]
                row[f"{t}_ratio"] = entry[t]["median_us"] / row["ncu_us"] if row["ncu_us"] else None
        ratio = row.get(f"{timer}_ratio")
        if ratio is not None:
            throttle = throttled(entry[timer])
            if row["ncu_us"] < min_us:
                row["verdict"] = "info"
            elif abs(ratio - 1.0) <= tolerance:
                row["verdict"] = "PASS"
            elif throttle:
                row["verdict"], row["reason"] = "throttled", throttle
            else:
                row["verdict"] = "FAIL"
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
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def print_table(rows: list[dict], timer: str) -> None:
    print(f"{'case':<18} {'ncu us':>9} {'calls':>5} {'auto us':>9} {'timer':>6} {'auto/ncu':>8} {'events':>7} "
          f"{'ev_write':>8} {'graph':>7}  verdict ({timer} / ncu)")
    for r in rows:
        print(f"{r['case']:<18} {_fmt(r['ncu_us'], '9.2f')} {r['ncu_calls']:>5} {_fmt(r.get('auto_us'), '9.2f')} "
              f"{r.get('auto_timer') or '-':>6} {_fmt(r.get('auto_ratio'), '8.3f')} "
              f"{_fmt(r.get('events_ratio'), '7.3f')} {_fmt(r.get('events_write_ratio'), '8.3f')} "
              f"{_fmt(r.get('graph_ratio'), '7.3f')}  {r['verdict']}"
              + (f" ({r['reason']})" if "reason" in r else ""))


# -- command line ----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ncu-validate.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="mode", required=True)
    m = sub.add_parser("measure", help="time every case with time_device; JSON to stdout or --out")
    m.add_argument("--cases", default=None, help=f"comma separated, from {', '.join(CASES)}")
    m.add_argument("--rounds", type=int, default=None, help="samples per timer (default: time_device's choice)")
    m.add_argument("--out", default=None, help="write the JSON here instead of stdout")
    pr = sub.add_parser("profile", help="run every case inside NVTX ranges ncu/<case>/<call>, for ncu")
    pr.add_argument("--cases", default=None)
    pr.add_argument("--calls", type=int, default=20)
    pr.add_argument("--warmup", type=int, default=5)
    c = sub.add_parser("compare", help="ratios timer / ncu from an ncu CSV and a measure JSON")
    c.add_argument("ncu_csv")
    c.add_argument("measure_json")
    c.add_argument("--timer", default="auto", choices=[v[0] for v in VARIANTS], help="the timer judged")
    c.add_argument("--tolerance", type=float, default=0.03)
    c.add_argument("--min-us", type=float, default=10.0, help="cases shorter than this are reported, not judged")
    c.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args(argv)

    if args.mode == "measure":
        result = json.dumps(measure(_cases(args.cases), args.rounds), indent=2)
        if args.out:
            Path(args.out).write_text(result + "\n")
        else:
            print(result)
        return 0
    if args.mode == "profile":
        profile(_cases(args.cases), args.calls, args.warmup)
        return 0
    ncu = parse_ncu_csv(Path(args.ncu_csv).read_text(errors="replace"))
    measured = json.loads(Path(args.measure_json).read_text())
    rows = compare(ncu, measured, timer=args.timer, tolerance=args.tolerance, min_us=args.min_us)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows, args.timer)
    return 1 if any(r["verdict"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

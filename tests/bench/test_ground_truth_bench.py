"""Device-time benchmarks of the ground-truth kernels: every shipped definition x every source.

    pytest tests/bench --bench-size=medium --benchmark-json=bench.json      (on a GPU node)

Each test times the ground truth's kernel twice:
* with `flashinfer_trace.timing.timers.time_device` (CUPTI's kernel records where cupti-python traces; else
  CUDA-graph replay for small kernels, CUDA events after an L2 flush for large ones; the timer used,
  why auto fell back, and for cupti the kernels per call and their names are stored too): the number
  to read, stored in `benchmark.extra_info` with bytes,
  FLOPs, GB/s, TFLOP/s and the percentage of the GPU's datasheet peaks (`flashinfer_trace.timing.roofline`),
  the clocks before and after, the GPU and the ground truth's description;
* with pytest-benchmark's own pedantic host timer around `fn(); torch.cuda.synchronize()`, which is
  what `--benchmark-compare` works on. It cannot use CUDA events as its timer (it subtracts two
  host timestamps), so it includes launch and synchronize overhead (10-40 us): do not gate
  regressions of small kernels on it; compare `extra_info.median_us` instead.

Benchmarks are grouped by definition. Run them serially: pytest-benchmark disables itself under
xdist (`-n`), and two processes on one GPU disturb each other's numbers. On a machine without CUDA
every test is collected and skips with a `no-gpu:` reason; a ground truth that cannot run here
skips with its GroundTruthUnavailable reason (`not-installed: flashinfer`, `arch-unsupported: ...`; with the
session's `--bench-jit-report`, `build-timeout: ...` or `not-run: building: ...` where the prebuild did not build it).
"""

from __future__ import annotations

import gc
import time

import pytest
import torch

from flashinfer_trace.testing import (
    SOURCES,
    GroundTruthUnavailable,
    generate_inputs,
    get_ground_truth,
    iter_definitions,
    load_definition,
)
from flashinfer_trace.timing import prepare, time_device
from flashinfer_trace.timing.roofline import peak_for, rates, work

pytest.importorskip("pytest_benchmark")

pytestmark = pytest.mark.gpu

NAMES = sorted(d.name for d in iter_definitions())
HOST_SECONDS = 0.5  # pytest-benchmark host rounds: about this much time, within HOST_ROUNDS
HOST_ROUNDS = (5, 50)


@pytest.fixture(autouse=True)
def _release_gpu_memory():
    yield
    if torch.cuda.is_available():  # without CUDA every test skips before allocating; a collection costs 0.1 s
        gc.collect()
        torch.cuda.empty_cache()


def _skip_unavailable(e: GroundTruthUnavailable):
    # building: the module is the combination's `jit-` session's to build; nothing was timed, and nothing failed
    pytest.skip(reason=f"not-run: {e}" if e.kind == "building" else str(e))


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", NAMES)
def test_ground_truth(benchmark, bench_options, bench_record, bench_prebuild, name, source):
    if not torch.cuda.is_available():
        pytest.skip(reason=f"no-gpu: torch {torch.__version__} sees no CUDA device")
    if source not in bench_options["sources"]:
        pytest.skip(reason=f"deselected: --bench-sources={','.join(bench_options['sources'])}")
    d = load_definition(name)
    if source == "torch" and d.op_type == "sampling" and not bench_options["torch_sampling"]:
        pytest.skip(reason="slow: the torch sampling ground truth sorts the whole vocabulary in float64 per "
                           "call (--bench-torch-sampling to time it)")
    try:
        gt = get_ground_truth(source, d, device="cuda", prebuild=bench_prebuild)
    except GroundTruthUnavailable as e:
        _skip_unavailable(e)
    size, seed = bench_options["size"], bench_options["seed"]
    try:
        inputs = generate_inputs(d, size, seed, device="cuda")
        prepared = prepare(gt, inputs)
        fn, setup = prepared
        if setup is not None:
            setup()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        call_s = time.perf_counter() - t0
        if call_s > bench_options["max_call_s"]:
            pytest.skip(reason=f"too-slow: one call took {call_s:.2f} s > --bench-max-call-s="
                               f"{bench_options['max_call_s']:g}")
        timer = bench_options["timer"] if bench_options["timer"] != "auto" else prepared.timer
        if setup is not None and timer == "graph":
            timer = "events"  # a graph cannot restore the inputs between replays
        timing = time_device(fn, setup=setup, timer=timer, rounds=bench_options["rounds"],
                             flush_l2=bench_options["flush_l2"])
    except GroundTruthUnavailable as e:
        _skip_unavailable(e)
    except torch.cuda.OutOfMemoryError as e:
        pytest.skip(reason=f"oom: {' '.join(str(e).split())[:200]}")

    # a timer that produced no samples, or quartiles out of order, measured nothing worth storing
    assert timing.rounds > 0 and 0 < timing.q1_us <= timing.median_us <= timing.q3_us, timing.as_dict()
    gpu = torch.cuda.get_device_name()
    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0) or None
    w = work(d, inputs)
    assert w.bytes > 0 and w.flops >= 0, w.detail
    r = rates(w, timing.median_us * 1e-6, peak_for(gpu))

    def sync_setup():
        if setup is not None:
            setup()
        torch.cuda.synchronize()

    def sync_fn():
        fn()
        torch.cuda.synchronize()

    host_rounds = bench_options["host_rounds"] or int(min(max(HOST_SECONDS / max(call_s, 1e-6), HOST_ROUNDS[0]),
                                                          HOST_ROUNDS[1]))
    benchmark.group = name
    benchmark.extra_info.update({
        "definition": name, "op_type": d.op_type, "size": size, "seed": seed, "source": source,
        "ground_truth": gt.describe(), "includes_setup": prepared.includes_setup, "prepared": prepared.note,
        "gpu": gpu,
        "timer": timing.timer, "median_us": timing.median_us, "iqr_us": timing.iqr_us, "q1_us": timing.q1_us,
        "q3_us": timing.q3_us, "mean_us": timing.mean_us, "rounds": timing.rounds,
        "calls_per_round": timing.calls_per_round, "l2_flushed": timing.l2_flushed,
        "fallback_reason": timing.fallback_reason, "timer_note": timing.note,
        "kernels_per_call": timing.kernels_per_call, "kernel_names": timing.kernel_names,
        "span_median_us": timing.span_median_us, "memops_per_call": timing.memops_per_call,
        "clocks_start": timing.clocks_start, "clocks_end": timing.clocks_end,
        # bandwidth figures say something about HBM only when the bytes dwarf L2 (>= ~5x); below that,
        # and with the graph timer's warm L2 above all, read them as latency
        "bytes": w.bytes, "flops": w.flops, "l2_bytes": l2, "bytes_over_l2": w.bytes / l2 if l2 else None,
        "gb_per_s": r["gb_per_s"], "tflop_per_s": r["tflop_per_s"],
        "pct_of_peak_bandwidth": r["pct_of_peak_bandwidth"], "pct_of_peak_flops": r["pct_of_peak_flops"],
        "arithmetic_intensity": r["arithmetic_intensity"], "bound": r["bound"], "roofline_us": r["roofline_us"],
        "pct_of_roofline": r["pct_of_roofline"], "peak": r["peak"],
        "bytes_formula": w.detail.get("bytes_formula"), "flops_formula": w.detail.get("flops_formula"),
    })
    benchmark.pedantic(sync_fn, setup=sync_setup, rounds=host_rounds, iterations=1, warmup_rounds=2)
    bench_record(dict(benchmark.extra_info))

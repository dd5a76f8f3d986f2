"""Options of the ground-truth benchmarks (prefixed --bench- so they cannot clash with the reference
suite's options when both directories are collected in one run), and the GPU facts that
pytest-benchmark's machine_info lacks.

    --bench-size small|medium|large   input size tier (default medium)
    --bench-seed N                    input seed (default 0)
    --bench-sources a,b               ground-truth sources to time (default flashinfer,sglang,torch)
    --bench-timer auto|cupti|graph|events  device timer (default auto: cupti where cupti-python traces,
                                      else graph under 50 us, else events; the fallback's reason is recorded)
    --bench-rounds N                  device-timer samples (default: chosen from an estimate)
    --bench-no-flush                  events timer without the L2 flush (warm cache)
    --bench-host-rounds N             pytest-benchmark's own host-timed rounds (default: ~0.5 s worth, 5..50)
    --bench-max-call-s S              skip a ground truth whose second call takes longer (default 2.0)
    --bench-torch-sampling            also time the torch sampling ground truth (skipped by default)
    --bench-sandbox-cpu               also time the reference worker on the CPU (test_sandbox_overhead.py;
                                      its GPU cases run wherever there is a GPU)
    --bench-stream FILE               append each benchmark to FILE (JSONL, fsynced) the moment it finishes, in
                                      pytest-benchmark's JSON format: a crash, a timeout or an interrupt keeps
                                      what was measured (the bench sessions pass results/<session>/benchmark.jsonl)
    --bench-jit-report FILE           the session's JIT prebuild report (jit.jsonl): a ground truth whose module it
                                      could not build, or left to the `jit-` session (`not-run: building`), skips
                                      instead of compiling inside the test (the bench sessions pass theirs)
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest

from flashinfer_trace.timing.timers import TIMERS


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("flashinfer-trace-bench", "flashinfer-trace ground-truth benchmarks")
    g.addoption("--bench-size", default="medium", choices=("small", "medium", "large"), help="input size tier")
    g.addoption("--bench-seed", type=int, default=0, help="input seed")
    g.addoption("--bench-sources", default="flashinfer,sglang,torch", help="ground-truth sources, comma separated")
    g.addoption("--bench-timer", default="auto", choices=TIMERS, help="device timer")
    g.addoption("--bench-rounds", type=int, default=None, help="device-timer samples (default: from an estimate)")
    g.addoption("--bench-no-flush", action="store_true", help="events timer without the L2 flush")
    g.addoption("--bench-host-rounds", type=int, default=None, help="pytest-benchmark host-timed rounds")
    g.addoption("--bench-max-call-s", type=float, default=2.0,
                help="skip a ground truth whose (second) call takes longer than this many seconds")
    g.addoption("--bench-torch-sampling", action="store_true",
                help="also time the torch sampling ground truth (a float64 sort of the vocabulary per call)")
    g.addoption("--bench-sandbox-cpu", action="store_true",
                help="also time the reference worker's per-call cost on the CPU")
    g.addoption("--bench-stream", default=None, metavar="FILE", help="append each finished benchmark to FILE (JSONL)")
    g.addoption("--bench-jit-report", default=None, metavar="FILE",
                help="the JIT prebuild's report: what it could not build or deferred is skipped, not built here")


@pytest.fixture(scope="session")
def bench_options(pytestconfig: pytest.Config) -> dict:
    opt = pytestconfig.getoption
    return {
        "size": opt("--bench-size"),
        "seed": opt("--bench-seed"),
        "sources": [s.strip() for s in opt("--bench-sources").split(",") if s.strip()],
        "timer": opt("--bench-timer"),
        "rounds": opt("--bench-rounds"),
        "flush_l2": not opt("--bench-no-flush"),
        "host_rounds": opt("--bench-host-rounds"),
        "max_call_s": opt("--bench-max-call-s"),
        "torch_sampling": opt("--bench-torch-sampling"),
        "sandbox_cpu": opt("--bench-sandbox-cpu"),
    }


@pytest.fixture(scope="session")
def bench_prebuild(pytestconfig: pytest.Config):
    """The prebuild report's lookup for get_ground_truth (None without --bench-jit-report). A bench session waits
    for its whole prebuild first, so the report is final."""
    from flashinfer_trace.sweep.jit.report import JitReport

    path = pytestconfig.getoption("--bench-jit-report")
    return JitReport.load(path).outcome if path else None


_ROWS = pytest.StashKey[list]()


@pytest.fixture
def bench_record(pytestconfig: pytest.Config):
    """record(extra_info): keep a benchmark's device numbers for the terminal summary."""
    return pytestconfig.stash.setdefault(_ROWS, []).append


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    """Stream the benchmark this test measured, before the next test can crash or hang."""
    yield
    path = item.config.getoption("--bench-stream")
    fixture = getattr(item, "funcargs", {}).get("benchmark")
    stats = getattr(fixture, "stats", None)
    if path and stats is not None:
        from flashinfer_trace.sweep.results import JsonlStream

        with JsonlStream(path, append=True) as stream:
            stream.write(stats.as_dict(include_data=False))


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    rows = config.stash.get(_ROWS, [])
    if not rows:
        return
    tr = terminalreporter
    tr.section("ground-truth device times (median; % of datasheet peak)")
    tr.write_line(f"{'definition':<58} {'source':<10} {'timer':<6} {'median':>10} {'iqr':>8} {'GB/s':>8} "
                  f"{'TFLOP/s':>8} {'%BW':>6} {'%FLOP':>6} {'bound':<7} note")
    for r in rows:
        note = "incl. setup" if r.get("includes_setup") else ""
        if r.get("kernels_per_call") and r["kernels_per_call"] > 1:
            note = (note + "; " if note else "") + f"{r['kernels_per_call']} kernels"
        if r.get("fallback_reason"):
            note = (note + "; " if note else "") + fallback_summary(r["fallback_reason"])
        tr.write_line(f"{r['definition'][:58]:<58} {r['source']:<10} {r['timer']:<6} {r['median_us']:>8.2f}us "
                      f"{r['iqr_us']:>8.2f} {_num(r['gb_per_s'], '8.1f')} {_num(r['tflop_per_s'], '8.2f')} "
                      f"{_num(r['pct_of_peak_bandwidth'], '6.1f')} {_num(r['pct_of_peak_flops'], '6.1f')} "
                      f"{r['bound'] or '-':<7} {note}")


def fallback_summary(reason: str, limit: int = 80) -> str:
    """The fallback reason, short: "cupti: not installed", "graph capture failed", ..."""
    parts = []
    for part in reason.split("; "):
        part = part.split(" (", 1)[0] if part.startswith("cupti: not installed") else part
        part = "graph capture failed" if part.startswith("graph capture failed") else part
        parts.append(part)
    text = "; ".join(parts)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def gpu_facts() -> dict:
    """The GPU, driver and library versions a benchmark number depends on ({} without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    facts = {"name": props.name, "compute_capability": f"{props.major}.{props.minor}",
             "multiprocessors": props.multi_processor_count, "memory_bytes": props.total_memory,
             "l2_cache_bytes": getattr(props, "L2_cache_size", None), "torch": torch.__version__,
             "cuda_runtime": torch.version.cuda}
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            facts["driver"] = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - best effort
        pass
    for dist in ("flashinfer-python", "sglang-kernel", "sgl-kernel", "triton"):
        try:
            facts[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return facts


if importlib.util.find_spec("pytest_benchmark") is not None:

    def pytest_benchmark_update_machine_info(config, machine_info):
        try:
            machine_info["gpu"] = gpu_facts()
        except Exception as e:  # noqa: BLE001 - never fail a run over metadata
            machine_info["gpu"] = {"error": f"{type(e).__name__}: {e}"}

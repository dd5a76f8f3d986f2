"""What the confined worker costs per reference call, on the CPU and on a GPU.

    pytest tests/bench/test_sandbox_overhead.py --bench-sandbox-cpu --benchmark-group-by=group   (CPU cases too)

Each case times one reference call two ways, on the same inputs: through the confined worker
(`compile_reference`: arena copy in, request, state reset, run, copy out, checked answer) and, as the
baseline, the same restricted namespace run in this process (how references ran before the worker;
only this repository's own definitions are run that way, here). The difference of the medians is the
overhead per call. Host clocks are the right timer here: the overhead is host work (a round trip
between processes and memcpys), and a GPU case synchronizes before the clock stops.
"""

from __future__ import annotations

import pytest
import torch

from flashinfer_trace.sandbox import compile_reference
from flashinfer_trace.sandbox.namespace import compile_in_namespace
from flashinfer_trace.testing import generate_inputs, load_definition

pytest.importorskip("pytest_benchmark")

CASES = [("rmsnorm_h4096", "small"), ("rmsnorm_h4096", "medium"), ("gemm_n4096_k4096", "medium"),
         ("gqa_paged_decode_h32_kv8_d128_ps1", "medium")]


@pytest.mark.parametrize("mode", ["confined", "in-process"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize(("name", "size"), CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_reference_call(benchmark, bench_options, name, size, device, mode):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip(reason="no-gpu: torch sees no CUDA device")
    if device == "cpu" and not bench_options["sandbox_cpu"]:  # the bench sessions time GPUs
        pytest.skip(reason="opt-in: --bench-sandbox-cpu" if torch.cuda.is_available() else
                    "no-gpu: torch sees no CUDA device (--bench-sandbox-cpu times the CPU worker)")
    d = load_definition(name)
    args = generate_inputs(d, size, seed=0, device=device).args()
    if mode == "confined":
        ref = compile_reference(d.reference, definition=d.name, device=device)

        def call():
            return ref.call(args, seed=0)
    else:
        fn = compile_in_namespace(d.reference, definition=d.name)

        def call():
            torch.manual_seed(0)
            return fn(*args)

    def timed():
        out = call()
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    benchmark.group = f"{name}-{size}-{device}"
    benchmark.extra_info.update({"definition": name, "size": size, "device": device, "mode": mode,
                                 "input_bytes": sum(a.numel() * a.element_size() for a in args
                                                    if isinstance(a, torch.Tensor))})
    out = benchmark(timed)
    assert out is not None

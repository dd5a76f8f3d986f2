"""The roofline model, the device timer's CPU behaviour, the benchmark suite's collection on a CPU,
and the ncu CSV parsing of scripts/ncu-validate.py. No GPU needed."""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from flashinfer_trace.dataset import iter_definitions
from flashinfer_trace.definition import Definition
from flashinfer_trace.inputs import Inputs, generate_inputs
from flashinfer_trace.inputs.common import fixed_bytes
from flashinfer_trace.inputs.moe import route, routing_params
from flashinfer_trace.testing import load_definition
from flashinfer_trace.timing import clocks, kernels, roofline, timers
from flashinfer_trace.timing import cupti as cupti_timer
from flashinfer_trace.timing.roofline import PEAKS, Peak, Work, peak_for, rates, visible_pairs, work

ROOT = Path(__file__).resolve().parents[2]


def _definition(**fields) -> Definition:
    base = {"name": "toy", "op_type": "gemm", "axes": {}, "inputs": {}, "outputs": {},
            "reference": "def run():\n    return None\n"}
    return Definition.model_validate({**base, **fields})


# -- bytes and FLOPs -----------------------------------------------------------------------------------
def test_gemm_is_2mnk_and_every_tensor_once():
    d = _definition(name="gemm_n24_k40", op_type="gemm",
                    axes={"M": {"type": "var"}, "N": {"type": "const", "value": 24},
                          "K": {"type": "const", "value": 40}},
                    inputs={"A": {"shape": ["M", "K"], "dtype": "float16"},
                            "B": {"shape": ["N", "K"], "dtype": "float16"}},
                    outputs={"C": {"shape": ["M", "N"], "dtype": "float16"}})
    inputs = generate_inputs(d, "small", 0)
    m = inputs.axes["M"]
    w = work(d, inputs)
    assert w.flops == 2 * m * 24 * 40
    assert w.bytes == (m * 40 + 24 * 40 + m * 24) * 2
    assert w.detail["flops_formula"].startswith("2 * M * N * K = 2 * ")
    assert w.detail["bytes_read"] == {"A": m * 40 * 2, "B": 24 * 40 * 2}


def test_shipped_gemm_large_values():
    d = load_definition("gemm_n4096_k4096")
    inputs = generate_inputs(d, "small", 0)
    m = inputs.axes["M"]
    w = work(d, inputs)
    assert w.flops == 2 * m * 4096 * 4096
    assert w.bytes == (m * 4096 + 4096 * 4096 + m * 4096) * 2


@pytest.mark.parametrize("name", ["rmsnorm_h4096", "fused_add_rmsnorm_h4096", "fused_add_rmsnorm_h4096_fp16"])
def test_rmsnorm_bytes_exact(name):
    d = load_definition(name)
    inputs = generate_inputs(d, "small", 0)
    m, n = inputs.values["hidden_states"].shape
    w = work(d, inputs)
    if "residual" in d.inputs:  # read hidden + residual + weight, write output (+ residual_out where declared)
        assert w.bytes == (3 + ("residual_out" in d.outputs)) * m * n * 2 + n * 2
        assert w.flops == 5 * m * n
    else:  # read x, write y, read w: (2 * M * N + N) * 2 for bf16
        assert w.bytes == 2 * m * n * 2 + n * 2
        assert w.flops == 4 * m * n


def test_paged_decode_counts_only_referenced_pages():
    d = load_definition("gqa_paged_decode_h32_kv8_d128_ps1")
    inputs = generate_inputs(d, "small", 0)
    x = inputs.values
    indptr = x["kv_indptr"].tolist()
    batch, pages_total = len(indptr) - 1, x["k_cache"].shape[0]
    tokens = sum(indptr[b + 1] - indptr[b] for b in range(batch))  # page_size 1: a page is a token
    assert tokens < pages_total  # the generator allocates spare pages: they must not count
    per_token = 8 * 128 * 2  # kv heads * head_dim * bf16
    expected = (
        batch * 32 * 128 * 2  # q
        + 2 * tokens * per_token  # k and v, referenced tokens only
        + (batch + 1) * 4 + tokens * 4  # kv_indptr, kv_indices (int32)
        + batch * 32 * 128 * 2 + batch * 32 * 4  # output (bf16), lse (float32)
    )
    w = work(d, inputs)
    assert w.bytes == expected
    assert w.detail["kv_tokens_read"] == tokens
    assert w.detail["bytes_read"]["k_cache"] == tokens * per_token
    assert w.flops == 4 * 32 * 128 * tokens  # decode: one query sees every key of its request


def test_paged_cache_with_page_size_and_last_page_len():
    """Tokens from pages: (pages - 1) * page_size + last_page_len per request, empty requests 0."""
    d = _definition(name="gqa_paged_decode_h2_kv1_d4_ps4", op_type="gqa_paged", tags=["stage:decode"],
                    axes={"batch_size": {"type": "var"}, "num_pages": {"type": "var"},
                          "len_indptr": {"type": "var"}, "num_kv_indices": {"type": "var"},
                          "num_qo_heads": {"type": "const", "value": 2}, "num_kv_heads": {"type": "const", "value": 1},
                          "head_dim": {"type": "const", "value": 4}, "page_size": {"type": "const", "value": 4}},
                    inputs={"q": {"shape": ["batch_size", "num_qo_heads", "head_dim"], "dtype": "bfloat16"},
                            "k_cache": {"shape": ["num_pages", "page_size", "num_kv_heads", "head_dim"],
                                        "dtype": "bfloat16"},
                            "v_cache": {"shape": ["num_pages", "page_size", "num_kv_heads", "head_dim"],
                                        "dtype": "bfloat16"},
                            "kv_indptr": {"shape": ["len_indptr"], "dtype": "int32"},
                            "kv_indices": {"shape": ["num_kv_indices"], "dtype": "int32"},
                            "kv_last_page_len": {"shape": ["batch_size"], "dtype": "int32"},
                            "sm_scale": {"shape": None, "dtype": "float32"}},
                    outputs={"output": {"shape": ["batch_size", "num_qo_heads", "head_dim"], "dtype": "bfloat16"}})
    values = {"q": torch.zeros(3, 2, 4, dtype=torch.bfloat16),
              "k_cache": torch.zeros(10, 4, 1, 4, dtype=torch.bfloat16),
              "v_cache": torch.zeros(10, 4, 1, 4, dtype=torch.bfloat16),
              "kv_indptr": torch.tensor([0, 2, 2, 5], dtype=torch.int32),
              "kv_indices": torch.tensor([3, 1, 0, 7, 9], dtype=torch.int32),
              "kv_last_page_len": torch.tensor([1, 0, 4], dtype=torch.int32), "sm_scale": 0.5}
    axes = {"batch_size": 3, "num_pages": 10, "len_indptr": 4, "num_kv_indices": 5, "num_qo_heads": 2,
            "num_kv_heads": 1, "head_dim": 4, "page_size": 4}
    w = work(d, Inputs(d.name, "small", 0, None, values, axes))
    tokens = (1 * 4 + 1) + 0 + (2 * 4 + 4)  # 5 + 0 + 12
    assert w.detail["kv_tokens_read"] == tokens
    assert w.detail["bytes_read"]["k_cache"] == tokens * 1 * 4 * 2
    assert w.detail["kv_lens"] == [5, 0, 12]
    assert w.flops == 2 * 2 * tokens * (4 + 4)


def _brute_force_pairs(qo: int, kv: int, causal: bool) -> int:
    return sum(1 for i in range(qo) for j in range(kv) if not causal or j <= kv - qo + i)


@pytest.mark.parametrize("qo,kv", [(0, 5), (1, 1), (1, 7), (3, 3), (4, 9), (9, 4), (17, 33), (5, 0)])
@pytest.mark.parametrize("causal", [True, False])
def test_visible_pairs_matches_brute_force(qo, kv, causal):
    assert visible_pairs(qo, kv, causal) == _brute_force_pairs(qo, kv, causal)


@pytest.mark.parametrize("name", ["gqa_paged_prefill_causal_h32_kv8_d128_ps1",
                                  "gqa_ragged_prefill_causal_h32_kv8_d128"])
def test_causal_prefill_flops_by_brute_force(name):
    d = load_definition(name)
    inputs = generate_inputs(d, "small", 0)
    qo = inputs.values["qo_indptr"].tolist()
    kv = inputs.values["kv_indptr"].tolist()
    pairs = sum(_brute_force_pairs(qo[b + 1] - qo[b], kv[b + 1] - kv[b], True) for b in range(len(qo) - 1))
    w = work(d, inputs)
    assert w.detail["causal"] is True
    assert w.detail["visible_pairs"] == pairs
    assert w.flops == 4 * 32 * 128 * pairs
    assert pairs < sum((qo[b + 1] - qo[b]) * (kv[b + 1] - kv[b]) for b in range(len(qo) - 1))


def test_mla_decode_flops_and_cache_bytes():
    d = load_definition("mla_paged_decode_h16_ckv512_kpe64_ps1")
    inputs = generate_inputs(d, "small", 0)
    tokens = int(inputs.values["kv_indptr"][-1])
    w = work(d, inputs)
    assert w.flops == 2 * 16 * tokens * (512 + 64) + 2 * 16 * tokens * 512
    assert w.detail["bytes_read"]["ckv_cache"] == tokens * 512 * 2
    assert w.detail["bytes_read"]["kpe_cache"] == tokens * 64 * 2


def _small_moe() -> Definition:
    d = load_definition("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048")
    data = d.as_dict
    axes = dict(data["axes"])
    for k, v in {"num_experts": 32, "num_local_experts": 8, "hidden_size": 256, "intermediate_size": 128,
                 "gemm1_out_size": 256, "num_hidden_blocks": 2, "num_intermediate_blocks": 1,
                 "num_gemm1_out_blocks": 2}.items():
        axes[k] = {**axes[k], "value": v}
    return Definition.model_validate({**data, "name": "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e8_h256_i128",
                                      "axes": axes})


@pytest.mark.parametrize("case", [None, "no_local_tokens"])
def test_moe_counts_only_experts_that_receive_tokens(case):
    d = _small_moe()
    inputs = generate_inputs(d, "medium", 0, case=case)
    x = inputs.values
    offset, local = x["local_expert_offset"], 8
    # an independent routing (the input generator's float32 one) decides which local experts are hit
    ids = route(x["routing_logits"], x["routing_bias"], routing_params(d))
    hits = [e - offset for e in ids.flatten().tolist() if offset <= e < offset + local]
    active = len(set(hits))
    w = work(d, inputs)
    assert w.detail["moe_active_local_experts"] == active
    assert w.detail["moe_routed_pairs"] == len(hits)
    if case is None:
        assert 0 < active < local
    else:
        assert active == 0
    per_expert = {"gemm1_weights": 256 * 256, "gemm2_weights": 256 * 128,  # fp8: 1 byte
                  "gemm1_weights_scale": 2 * 2 * 4, "gemm2_weights_scale": 2 * 1 * 4}
    for name, nbytes in per_expert.items():
        assert w.detail["bytes_read"][name] == active * nbytes
    t = inputs.axes["seq_len"]
    others = t * 32 * 4 + 32 * 2 + t * 256 + 2 * t * 4  # logits f32, bias bf16, hidden fp8, hidden scale
    assert w.bytes == others + active * sum(per_expert.values()) + t * 256 * 2  # + bf16 output
    assert w.flops == len(hits) * (2 * 256 * 256 + 2 * 128 * 256)


MODEL_INPUT_BYTES = 64 << 20  # the formulas are per family: shapes past this add time, not coverage


def test_every_shipped_definition_has_a_model():
    """Every op type and stage of the shipped definitions: each definition whose fixed-size inputs
    are below 64 MiB, and the smallest of every (op type, stage) pair beside them."""
    defs = sorted(iter_definitions(), key=fixed_bytes)
    smallest = {}
    for d in defs:
        smallest.setdefault((d.op_type, tuple(d.tag_values("stage"))), d.name)
    chosen = [d for d in defs if d.op_type != "moe" and (fixed_bytes(d) < MODEL_INPUT_BYTES
                                                           or d.name in smallest.values())]
    assert {d.op_type for d in chosen} | {"moe"} == {d.op_type for d in defs}
    for d in [*chosen, _small_moe()]:
        w = work(d, generate_inputs(d, "small", 0))
        assert w.bytes > 0 and w.flops > 0, d.name
        assert "flops_formula" in w.detail and "bytes_formula" in w.detail


def test_fp8_and_fp4_element_sizes():
    assert roofline.element_bytes("float8_e4m3fn") == 1
    assert roofline.element_bytes("bfloat16") == 2
    assert roofline.element_bytes("int64") == 8
    assert roofline.element_bytes("float4_e2m1") == 0.5


# -- peaks and rates -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,bw,flops", [
    ("NVIDIA H100 80GB HBM3", 3.35e12, 989.4e12),
    ("NVIDIA H100 PCIe", 2.0e12, 756e12),
    ("NVIDIA H200", 4.8e12, 989.4e12),
    ("NVIDIA A100-SXM4-80GB", 2.039e12, 312e12),
    ("NVIDIA A100 80GB PCIe", 1.935e12, 312e12),
    ("NVIDIA B200", 8.0e12, 2250e12),
    ("NVIDIA L40S", 0.864e12, 362e12),
])
def test_peak_for(name, bw, flops):
    p = peak_for(name)
    assert p is not None and p.hbm_bytes_per_s == bw and p.bf16_flops_per_s == flops


def test_peak_for_unknown():
    assert peak_for("Tesla T4") is None
    assert peak_for("") is None and peak_for(None) is None
    assert PEAKS["H100 80GB HBM3"].ridge_point == pytest.approx(989.4e12 / 3.35e12)


def test_rates_arithmetic():
    peak = Peak("test", 2.0e12, 100e12)  # ridge point 50 FLOP/B
    w = Work(bytes=1_000_000_000, flops=10_000_000_000)  # 10 FLOP/B: memory bound
    r = rates(w, 1e-3, peak)
    assert r["gb_per_s"] == pytest.approx(1000.0)
    assert r["tflop_per_s"] == pytest.approx(10.0)
    assert r["pct_of_peak_bandwidth"] == pytest.approx(50.0)
    assert r["pct_of_peak_flops"] == pytest.approx(10.0)
    assert r["arithmetic_intensity"] == pytest.approx(10.0)
    assert r["ridge_point"] == pytest.approx(50.0)
    assert r["bound"] == "memory"
    assert r["roofline_us"] == pytest.approx(500.0)  # 1 GB at 2 TB/s
    assert r["pct_of_roofline"] == pytest.approx(50.0)
    compute = rates(Work(bytes=1_000_000, flops=100_000_000_000), 2e-3, peak)  # 1e5 FLOP/B
    assert compute["bound"] == "compute"
    assert compute["pct_of_peak_flops"] == pytest.approx(50.0)
    bare = rates(w, 1e-3)
    assert bare["gb_per_s"] == pytest.approx(1000.0) and bare["bound"] is None and bare["pct_of_peak_bandwidth"] is None
    with pytest.raises(ValueError):
        rates(w, 0.0, peak)


# -- bench.py on a CPU -------------------------------------------------------------------------------------
@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_time_device_needs_cuda(no_cuda):
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        timers.time_device(lambda: None)


def test_prepare_needs_cuda(no_cuda):
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        kernels.prepare(None, None)


def test_bench_imports_without_cuda():
    code = ("import flashinfer_trace.timing as t; "
            "print(len(t.kernels.PREPARERS), sorted(t.timers.Timing.__dataclass_fields__)[:3])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode == 0, res.stderr


def test_preparers_cover_the_attention_wrappers_in_place_norm_and_samplers():
    from flashinfer_trace.groundtruth import flashinfer as fgt
    from flashinfer_trace.groundtruth import flashinfer_gemma_norm as fgemma
    from flashinfer_trace.groundtruth import sglang as sgt
    from flashinfer_trace.groundtruth import sglang_gemma_norm as sgemma

    for fn in (fgt.gqa_decode, fgt.gqa_prefill_paged, fgt.gqa_prefill_ragged, fgt.mla, fgt.fused_add_rmsnorm,
               sgt.fused_add_rmsnorm, fgt.sampling, sgt.sampling, fgemma.run, fgemma.run_fused, sgemma.gemma_rmsnorm,
               sgemma.gemma_fused_add_rmsnorm):
        assert fn in kernels.PREPARERS


def test_prepared_unpacks_as_fn_and_setup():
    p = kernels.Prepared(fn=print, setup=None, includes_setup=True, note="x")
    fn, setup = p
    assert fn is print and setup is None


def test_gpu_clocks_never_raises_and_parses_nvidia_smi(monkeypatch):
    assert isinstance(timers.gpu_clocks(), dict)

    def no_nvml(index, bus_id):
        raise ImportError("no pynvml")

    class Done:  # nvidia-smi's CSV, in manifest.SMI_FIELDS order (the query bench reads through)
        stdout = "NVIDIA H100 80GB HBM3, 9.0, 580.159.04, 1980, 2619, 1980, 372.15, 700.00, [N/A], P0, 0x0\n"

    from flashinfer_trace.sweep import manifest

    monkeypatch.setattr(clocks, "_nvml_clocks", no_nvml)
    monkeypatch.setattr(manifest.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(manifest.subprocess, "run", lambda *a, **k: Done())
    assert timers.gpu_clocks() == {"source": "nvidia-smi", "sm_clock_mhz": 1980.0, "mem_clock_mhz": 2619.0,
                                  "power_w": 372.15, "temperature_c": None}

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(manifest.subprocess, "run", missing)
    assert timers.gpu_clocks() == {}


def test_timing_summary_quartiles():
    med, q1, q3, mean = timers._summary([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (med, q1, q3, mean) == (3.0, 2.0, 4.0, 3.0)
    assert timers._summary([7.0]) == (7.0, 7.0, 7.0, 7.0)


# -- the cupti timer on a CPU: fake records, a fake cupti module ---------------------------------------------
def _rec(start, end, name="k", kind="kernel", corr=0):
    return timers.ActivityRecord(kind, name, start, end, corr)


def test_summarize_sums_each_calls_kernels_and_counts_memops_apart():
    calls = [
        [_rec(1_000, 3_000, "gemm", corr=1), _rec(3_500, 4_500, "reduce", corr=2),
         _rec(500, 900, "memset", kind="memset")],
        [_rec(10_000, 12_200, "gemm"), _rec(12_300, 13_100, "reduce")],
        [_rec(20_000, 22_000, "gemm"), _rec(22_100, 23_000, "reduce")],
    ]
    s = timers.summarize_cupti_calls(calls)
    assert s.samples_us == pytest.approx([3.0, 3.0, 2.9])  # durations summed, the gap between kernels not
    assert s.spans_us == pytest.approx([3.5, 3.1, 3.0])  # first start to last end
    assert s.kernels_per_call == 2 and s.kernel_counts == (2, 2)
    assert s.kernel_names == ["gemm", "reduce"]
    assert s.memops_per_call == 0 and s.memops_median_us == pytest.approx(0.0)  # 1 of 3 calls had a memset
    assert s.calls == 3 and s.no_kernels == 0 and s.incomplete == 0 and s.problems() == ""


def test_summarize_drops_calls_without_kernels_or_timestamps_and_says_so():
    calls = [
        [_rec(1_000, 2_000, "a")],
        [_rec(0, 0, "a")],  # a record CUPTI had not completed: no timestamps
        [_rec(5_000, 4_000, "a")],  # end before start: not a duration
        [_rec(100, 400, "memcpy", kind="memcpy")],  # no kernel at all
        [_rec(7_000, 8_500, "a"), _rec(8_600, 9_000, "b")],
    ]
    s = timers.summarize_cupti_calls(calls)
    assert s.samples_us == pytest.approx([1.0, 1.9])
    assert s.no_kernels == 1 and s.incomplete == 2
    assert s.kernel_counts == (1, 2)
    assert s.problems() == ("1 of 5 calls had no kernel record; 2 of 5 calls had a kernel record without "
                            "timestamps; kernels per call varied 1-2")
    empty = timers.summarize_cupti_calls([[], []])
    assert empty.samples_us == [] and empty.kernels_per_call is None and empty.no_kernels == 2


def test_summarize_keeps_a_few_distinct_names_in_launch_order_cut_short():
    long = "void flashinfer::BatchDecodeWithPagedKVCacheKernel<" + "x" * 1000 + ">"
    kernels = [_rec(100 * (i + 1), 100 * (i + 1) + 50, name) for i, name in
               enumerate(["b", "a", "b", long, "c", "d", "e", "f"])]
    s = timers.summarize_cupti_calls([list(reversed(kernels))])  # CUPTI's order need not be launch order
    assert s.kernel_names[:3] == ["b", "a", long[:cupti_timer.KERNEL_NAME_CHARS]]
    assert len(s.kernel_names) == cupti_timer.KERNEL_NAMES_KEPT and s.kernels_per_call == 8


class _Kind(enum.IntEnum):
    MEMCPY = 1
    MEMSET = 2
    KERNEL = 3
    CONCURRENT_KERNEL = 10
    RUNTIME = 5


class _Flag(enum.IntEnum):
    FLUSH_FORCED = 1


class _Result(enum.IntEnum):
    SUCCESS = 0
    ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39


class _CuptiError(Exception):
    def __init__(self, status):
        super().__init__(f"{_Result(status).name} ({status})")
        self.status = status


class FakeCupti:
    """What CuptiTracer uses of cupti.cupti: records 'launched' with launch() reach the registered
    completion callback at the next activity_flush_all, as attribute objects like CUPTI's."""

    ActivityKind, ActivityFlag, Result, cuptiError = _Kind, _Flag, _Result, _CuptiError

    def __init__(self, refuse=None, memcpy_fails=False):
        self.refuse, self.memcpy_fails = refuse, memcpy_fails
        self.enabled, self.pending, self.callbacks, self.flushes = set(), [], None, []
        self.clock = 1_000

    def activity_register_callbacks(self, requested, completed):
        assert requested() == (cupti_timer.CUPTI_BUFFER_BYTES, 0)
        self.callbacks = (requested, completed)

    def activity_enable(self, kind):
        if self.refuse is not None and kind == _Kind.CONCURRENT_KERNEL:
            raise _CuptiError(self.refuse)
        if self.memcpy_fails and kind == _Kind.MEMCPY:
            raise _CuptiError(39)
        self.enabled.add(kind)

    def activity_disable(self, kind):
        self.enabled.discard(kind)

    def launch(self, name, us, kind=_Kind.CONCURRENT_KERNEL):
        if kind in self.enabled:
            end = self.clock + int(us * 1000)
            self.pending.append(types.SimpleNamespace(kind=int(kind), name=name, start=self.clock, end=end,
                                                      correlation_id=len(self.pending)))
        self.clock += int(us * 1000) + 500

    def activity_flush_all(self, flag):
        self.flushes.append(flag)
        batch, self.pending = self.pending, []
        batch.append(types.SimpleNamespace(kind=int(_Kind.RUNTIME), start=1, end=2, correlation_id=0))  # ignored
        self.callbacks[1](batch)


def test_tracer_collects_kernel_and_memop_records_and_disables_what_it_enabled():
    c = FakeCupti()
    with timers.CuptiTracer(c) as tracer:
        assert c.enabled == {_Kind.CONCURRENT_KERNEL, _Kind.MEMCPY, _Kind.MEMSET}
        c.launch("gemm", 2.5)
        c.launch("memcpy", 1.0, kind=_Kind.MEMCPY)
        records = tracer.drain()
        assert [(r.kind, r.name) for r in records] == [("kernel", "gemm"), ("memcpy", "memcpy")]
        assert records[0].end_ns - records[0].start_ns == 2500
        assert tracer.drain() == []
    assert c.enabled == set() and set(c.flushes) == {int(_Flag.FLUSH_FORCED)}


def test_tracer_refused_by_another_cupti_client_names_the_error():
    c = FakeCupti(refuse=39)
    with pytest.raises(timers.CuptiUnavailable) as e:
        timers.CuptiTracer(c).start()
    assert str(e.value) == ("cupti: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39) in "
                            "activity_enable(CONCURRENT_KERNEL)")
    partial = FakeCupti(memcpy_fails=True)
    tracer = timers.CuptiTracer(partial).start()  # kernels trace; a refused MEMCPY is only noted
    assert tracer.not_enabled and tracer.not_enabled[0].startswith("MEMCPY: ERROR_MULTIPLE_SUBSCRIBERS")
    tracer.stop()


def test_cupti_not_installed_is_a_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupti", None)  # `from cupti import cupti` raises ImportError
    with pytest.raises(timers.CuptiUnavailable, match=r"^cupti: not installed \(pip install cupti-python"):
        cupti_timer.load_cupti()


class _Gpu:
    """A fake device whose 'kernels' are records in a FakeCupti."""

    def __init__(self, cupti):
        self.cupti = cupti
        self.cuda = types.SimpleNamespace(synchronize=lambda: None, current_device=lambda: 0,
                                          device=lambda index: contextlib.nullcontext())

    def flush_buffer(self):
        return types.SimpleNamespace(sum=lambda: self.cupti.launch("l2_flush_reduce", 30.0))


def test_time_cupti_keeps_only_each_calls_own_kernels():
    c = FakeCupti()
    gpu = _Gpu(c)
    durations = iter([5.0, 6.0, 7.0])

    def fn():
        c.launch("attention", next(durations))
        c.launch("merge_states", 1.0)

    with timers.CuptiTracer(c) as tracer:
        calls = cupti_timer._time_cupti(gpu, tracer, fn, lambda: c.launch("setup_copy", 2.0), 3, gpu.flush_buffer())
    assert [[r.name for r in call] for call in calls] == [["attention", "merge_states"]] * 3
    assert timers.summarize_cupti_calls(calls).samples_us == pytest.approx([6.0, 7.0, 8.0])


@pytest.fixture
def fake_gpu(monkeypatch):
    """time_device on a fake device: no warm-up or clocks; the graph/events path stubbed to say what
    it was asked; cupti from whatever FakeCupti the test installs as `load_cupti`."""
    asked = []

    def graph_or_events(torch, fn, setup, timer, *args):
        asked.append(timer)
        return timers._Run("graph" if timer == "auto" and setup is None else "events", [4.0, 5.0, 6.0], note="stub")

    gpu = _Gpu(FakeCupti())
    monkeypatch.setattr(timers, "require_cuda", lambda what: gpu)
    monkeypatch.setattr(timers, "gpu_clocks", lambda index=None: {})
    monkeypatch.setattr(timers, "_warmup", lambda torch, fn, setup, n, ms: (n, 0.01))
    monkeypatch.setattr(timers, "_estimate_us", lambda torch, fn, setup, n=3: 50.0)
    monkeypatch.setattr(timers, "_flush_buffer", lambda torch, index: gpu.flush_buffer())
    monkeypatch.setattr(timers, "_graph_or_events", graph_or_events)
    return gpu, asked


def test_auto_without_cupti_falls_back_and_records_why(fake_gpu, monkeypatch):
    gpu, asked = fake_gpu
    monkeypatch.setitem(sys.modules, "cupti", None)
    t = timers.time_device(lambda: None, timer="auto")
    assert asked == ["auto"] and t.timer == "graph"
    assert t.fallback_reason.startswith("cupti: not installed")
    assert t.note == "cupti not used (see fallback_reason); stub" and t.kernels_per_call is None
    t = timers.time_device(lambda: None, setup=lambda: None, timer="cupti")  # asked for cupti: events instead
    assert asked[-1] == "events" and t.timer == "events" and t.fallback_reason.startswith("cupti: not installed")
    t = timers.time_device(lambda: None, timer="events")  # cupti is not tried for the other timers
    assert asked[-1] == "events" and t.fallback_reason is None


def test_auto_under_another_cupti_client_falls_back(fake_gpu, monkeypatch):
    gpu, asked = fake_gpu
    monkeypatch.setattr(cupti_timer, "load_cupti", lambda: FakeCupti(refuse=39))
    t = timers.time_device(lambda: None)
    assert asked == ["auto"] and t.timer == "graph"
    assert t.fallback_reason == ("cupti: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39) in "
                                 "activity_enable(CONCURRENT_KERNEL)")


def test_auto_prefers_cupti_and_records_kernels(fake_gpu, monkeypatch):
    gpu, asked = fake_gpu
    c = gpu.cupti
    monkeypatch.setattr(cupti_timer, "load_cupti", lambda: c)
    durations = iter(float(9 + i % 3) for i in range(1000))

    def fn():
        c.launch("decode_kernel", next(durations))
        c.launch("merge_kernel", 1.0)
        c.launch("memset", 0.5, kind=_Kind.MEMSET)

    t = timers.time_device(fn, setup=lambda: c.launch("restore_inputs", 3.0), rounds=9)
    assert asked == [] and t.timer == "cupti" and t.fallback_reason is None
    assert t.rounds == 9 and t.samples_us == pytest.approx([10.0, 11.0, 12.0] * 3)  # setup and flush not in
    assert t.median_us == pytest.approx(11.0) and t.calls_per_round == 1 and t.l2_flushed
    assert t.kernels_per_call == 2 and t.kernel_names == ["decode_kernel", "merge_kernel"]
    assert t.memops_per_call == 1 and t.memops_median_us == pytest.approx(0.5)
    assert t.span_median_us == pytest.approx(11.5)  # 0.5 us gap between the two kernels
    assert "L2 flushed (read)" in t.note and c.enabled == set()
    assert t.as_dict()["timer"] == "cupti"  # what the benchmarks store


def test_cupti_without_kernel_records_falls_back(fake_gpu, monkeypatch):
    gpu, asked = fake_gpu
    c = gpu.cupti
    monkeypatch.setattr(cupti_timer, "load_cupti", lambda: c)
    t = timers.time_device(lambda: c.launch("copy", 1.0, kind=_Kind.MEMCPY), rounds=4, timer="cupti")
    assert asked == ["events"] and t.timer == "events"
    assert t.fallback_reason == "cupti: no usable kernel record in 4 calls (4 of 4 calls had no kernel record)"


def test_unknown_timer_is_refused(fake_gpu):
    with pytest.raises(ValueError, match="'cupti'"):
        timers.time_device(lambda: None, timer="cuda")


# -- the cupti timer on a GPU ---------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no-gpu: the cupti timer needs a CUDA device")
def test_cupti_timer_on_the_gpu_counts_kernels_and_agrees_with_events():
    pytest.importorskip("cupti", reason="not-installed: cupti-python")
    try:
        timers.CuptiTracer().start().stop()
    except timers.CuptiUnavailable as e:  # e.g. run under ncu or nsys, which hold CUPTI
        pytest.skip(reason=f"cupti-unavailable: {e}")
    x = torch.zeros(64 * 2**20, device="cuda")  # 256 MB: ~150 us a pass on an H100, far above launch gaps
    y = torch.zeros(2**20, device="cuda")

    one = timers.time_device(lambda: x.add_(1.0), timer="cupti", rounds=30)
    assert one.timer == "cupti" and one.fallback_reason is None, one.note
    assert one.kernels_per_call == 1 and one.rounds == 30 and one.l2_flushed
    assert one.kernel_names and "elementwise" in one.kernel_names[0]  # at::native::vectorized_elementwise_kernel
    assert one.span_median_us == pytest.approx(one.median_us)  # one kernel: span and sum agree

    two = timers.time_device(lambda: (x.add_(1.0), y.mul_(0.5)), timer="cupti", rounds=30)
    assert two.kernels_per_call == 2 and two.median_us > one.median_us

    # setup's kernels and the L2 flush are outside each call's records
    restored = timers.time_device(lambda: x.add_(1.0), setup=lambda: y.zero_(), timer="cupti", rounds=30)
    assert restored.kernels_per_call == 1

    events = timers.time_device(lambda: x.add_(1.0), timer="events", rounds=30)
    assert 0.8 < one.median_us / events.median_us < 1.25, (one.median_us, events.median_us)
    assert timers.time_device(lambda: x.add_(1.0), rounds=10).timer == "cupti"  # auto prefers it


# -- the sampling preparers: one call on the whole batch ---------------------------------------------------
def _sampling_call(name: str, module):
    from flashinfer_trace.groundtruth.base import Call

    d = load_definition(name)
    inputs = generate_inputs(d, "small", 0)
    return Call(d, inputs, module, None, draws=1000)


def _fake_sampler(calls: list):
    def top_k_top_p_sampling_from_probs(probs, top_k, top_p, indices=None, deterministic=True, generator=None,
                                        check_nan=False, filter_apply_order="top_p_first"):
        calls.append({"args": (probs, top_k, top_p), "deterministic": deterministic, "generator": generator,
                      "filter_apply_order": filter_apply_order})
        return torch.zeros(probs.shape[0], dtype=torch.int32)

    def top_k_sampling_from_probs(probs, top_k, indices=None, deterministic=True, generator=None, check_nan=False):
        calls.append({"args": (probs, top_k), "deterministic": deterministic, "generator": generator})
        return torch.zeros(probs.shape[0], dtype=torch.int32)

    return top_k_top_p_sampling_from_probs, top_k_sampling_from_probs


def test_flashinfer_sampling_preparer_times_one_call_on_the_whole_batch():
    calls: list = []
    both, top_k = _fake_sampler(calls)
    module = types.SimpleNamespace(sampling=types.SimpleNamespace(top_k_top_p_sampling_from_probs=both,
                                                                  top_k_sampling_from_probs=top_k))
    call = _sampling_call("top_k_top_p_sampling_from_probs_v32000", module)
    x = call.inputs.values
    fn, setup, note = kernels._prep_fi_sampling(call)
    assert setup is None and calls == []
    fn()
    assert len(calls) == 1  # one launch for every row, not the adapter's call per row
    got = calls[0]
    assert got["args"][0] is x["probs"] and got["args"][1] is x["top_k"] and got["args"][2] is x["top_p"]
    assert x["probs"].shape[0] > 1 and got["deterministic"] is True
    assert isinstance(got["generator"], torch.Generator) and got["filter_apply_order"] == "top_k_first"
    assert "top_k_top_p_sampling_from_probs" in note and "whole batch" in note
    fn()
    assert len(calls) == 2 and calls[1]["generator"] is got["generator"]  # one generator, advancing

    single = _sampling_call("top_k_sampling_from_probs_v32000", module)
    fn, _, _ = kernels._prep_fi_sampling(single)
    fn()
    assert len(calls[-1]["args"]) == 2 and calls[-1]["args"][1] is single.inputs.values["top_k"]


def test_sglang_sampling_preparer_fills_a_missing_filter_like_the_adapter():
    calls: list = []
    both, _ = _fake_sampler(calls)
    module = types.SimpleNamespace(top_k_top_p_sampling_from_probs=both)
    call = _sampling_call("top_p_sampling_from_probs_v32000", module)
    fn, setup, _ = kernels._prep_sgl_sampling(call)
    fn()
    probs, k, p = calls[0]["args"]
    batch, vocab = call.inputs.values["probs"].shape
    assert len(calls) == 1 and probs is call.inputs.values["probs"] and p is call.inputs.values["top_p"]
    assert k.tolist() == [vocab] * batch and k.dtype == torch.int32  # top_k disabled: the whole vocabulary
    assert calls[0]["deterministic"] is True and isinstance(calls[0]["generator"], torch.Generator)


# -- the benchmark suite on a CPU ----------------------------------------------------------------------------
def test_benchmark_suite_collects_and_skips_without_gpu():
    n = len(iter_definitions()) * 3 + 16  # + test_sandbox_overhead.py: 4 cases x 2 modes x 2 devices
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/bench"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    summary = [ln for ln in out.splitlines() if " in " in ln and "skipped" in ln][-1]
    assert summary.startswith(f"{n} skipped"), summary  # nothing passed, failed or errored
    assert "error" not in summary and "failed" not in summary and "passed" not in summary, summary
    skips = [ln for ln in out.splitlines() if ln.startswith("SKIPPED")]
    assert skips and all("no-gpu:" in ln for ln in skips), skips


# -- scripts/ncu-validate.py compare -----------------------------------------------------------------------------
def _ncu_validate():
    spec = importlib.util.spec_from_file_location("ncu_validate", ROOT / "scripts" / "ncu-validate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _row(i: int, kernel: str, unit: str, value: str, metric: str = "gpu__time_duration.sum") -> str:
    return (f'"{i}","4242","python3","127.0.0.1","{kernel}","1","7","(256, 1, 1)","(132, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"')


def _fake_ncu_csv() -> str:
    lines = ["==PROF== Connected to process 4242 (/usr/bin/python3)",
             "rmsnorm_large: 3 calls in ranges",  # a program line: skipped
             HEADER]
    i = 0
    for call, us in enumerate(["360.00", "362.50", "1,000.00"]):  # median 362.5 (thousands separator parsed)
        lines.append(_row(i, f"ncu:rmsnorm_large:{call}", "usecond", us))
        i += 1
    for call in range(3):  # two kernels per call: 6000 + 4000 ns = 10 us
        lines.append(_row(i, f"ncu:decode_large:{call}", "nsecond", "6,000"))
        lines.append(_row(i + 1, f"ncu:decode_large:{call}", "nsecond", "4000"))
        lines.append(_row(i + 1, f"ncu:decode_large:{call}", "", "99", metric="sm__cycles_elapsed.avg"))
        i += 2
    lines.append(_row(i, "ncu/gemm_8192/0", "msecond", "1.6"))  # the tag may also use slashes
    lines.append(_row(i, "ncu:gemm_linear_large:0/nvjet_sm90_hsh_128x256", "usecond", "48.0"))
    lines.append(_row(i + 1, "void at::native::elementwise_kernel<...>", "nsecond", "1234"))  # untagged: ignored
    lines.append("==PROF== Disconnected from process 4242")
    return "\n".join(lines) + "\n"


def _measure_json() -> dict:
    def t(us, timer="events", **more):
        return {"median_us": us, "timer": timer, **more}

    return {"gpu": "fake", "torch": "2.11.0+cu130", "cupti_python": "13.0.1", "repeats": 3, "cases": {
        "rmsnorm_large": {"cupti": t(365.0, "cupti", repeat_cv=0.004, repeats=3, kernels_per_call=1),
                          "auto": t(370.0), "events": t(370.0), "graph": t(355.0, "graph")},
        "decode_large": {"cupti": t(10.5, "cupti", repeat_cv=0.01, repeats=3, kernels_per_call=1),
                         "auto": t(10.2), "events": t(10.2), "graph": t(9.0, "graph")},
        "gemm_8192": {"cupti": t(1700.0, "cupti"), "auto": t(1700.0), "events": t(1700.0)},
        "gemm_linear_large": {"cupti": {**t(51.0, "cupti"), "clocks_start": {"sm_clock_mhz": 1980},
                                        "clocks_end": {"sm_clock_mhz": 1980, "clocks_event_reasons": "0x4"}},
                              "auto": {**t(51.0), "clocks_start": {"sm_clock_mhz": 1980},
                                       "clocks_end": {"sm_clock_mhz": 1980, "clocks_event_reasons": "0x4"}}},
        "rmsnorm_small": {"cupti": t(3.0, "cupti"), "auto": t(3.0, "graph")},
        "decode_medium": {"skipped": "not-installed: flashinfer"},
    }}


def test_ncu_compare_parses_and_computes_ratios():
    nv = _ncu_validate()
    parsed = nv.parse_ncu_csv(_fake_ncu_csv())
    assert parsed["rmsnorm_large"] == {0: pytest.approx(360.0), 1: pytest.approx(362.5), 2: pytest.approx(1000.0)}
    assert parsed["decode_large"] == {c: pytest.approx(10.0) for c in range(3)}
    assert parsed["gemm_8192"] == {0: pytest.approx(1600.0)}
    assert nv.ncu_kernel_counts(_fake_ncu_csv())["decode_large"] == 2
    rows = {r["case"]: r for r in nv.compare(parsed, _measure_json(), timer="auto")}
    rl = rows["rmsnorm_large"]
    assert rl["ncu_us"] == pytest.approx(362.5) and rl["ncu_calls"] == 3
    assert rl["auto_ratio"] == pytest.approx(370.0 / 362.5) and rl["verdict"] == "PASS"  # 2.1% off
    assert rl["graph_ratio"] == pytest.approx(355.0 / 362.5)
    assert rows["decode_large"]["auto_ratio"] == pytest.approx(1.02) and rows["decode_large"]["verdict"] == "PASS"
    assert rows["gemm_8192"]["auto_ratio"] == pytest.approx(1700 / 1600) and rows["gemm_8192"]["verdict"] == "FAIL"
    assert rows["gemm_linear_large"]["verdict"] == "throttled"  # 6% off, but the GPU hit its power cap
    assert "0x4" in rows["gemm_linear_large"]["reason"]
    assert rows["rmsnorm_small"]["verdict"] == "missing"  # measured, but no ncu rows
    assert rows["decode_medium"]["verdict"] == "skipped"
    strict = {r["case"]: r for r in nv.compare(parsed, _measure_json(), timer="auto", tolerance=0.01)}
    assert strict["rmsnorm_large"]["verdict"] == "FAIL"
    graph = {r["case"]: r for r in nv.compare(parsed, _measure_json(), timer="graph")}
    assert graph["decode_large"]["verdict"] == "FAIL" and graph["rmsnorm_large"]["verdict"] == "PASS"


def test_ncu_compare_judges_cupti_by_duration_band():
    nv = _ncu_validate()
    parsed = nv.parse_ncu_csv(_fake_ncu_csv())
    kernels = nv.ncu_kernel_counts(_fake_ncu_csv())
    rows = {r["case"]: r for r in nv.compare(parsed, _measure_json(), ncu_kernels=kernels)}  # timer="cupti"
    rl = rows["rmsnorm_large"]
    assert rl["cupti_ratio"] == pytest.approx(365.0 / 362.5) and rl["verdict"] == "PASS" and rl["tolerance"] == 0.03
    assert rl["cupti_cv"] == 0.004 and rl["cupti_kernels"] == 1 and rl["ncu_cv"] > 0.5  # ncu: 360, 362.5, 1000
    dl = rows["decode_large"]  # ncu 10 us exactly: the 3% band; cupti 5% off
    assert dl["verdict"] == "FAIL" and "cupti/ncu 1.050 outside 1 +- 0.03" in dl["reason"]
    assert "kernels per call: cupti 1, ncu 2" in dl["reason"]
    wide = {r["case"]: r for r in nv.compare(parsed, _measure_json(), min_us=20)}  # 10 us now in the 10% band
    assert wide["decode_large"]["verdict"] == "PASS" and wide["decode_large"]["tolerance"] == 0.10
    floor = {r["case"]: r for r in nv.compare(parsed, _measure_json(), min_us=20, floor_us=15)}
    assert floor["decode_large"]["verdict"] == "info"  # under the floor: reported, not judged
    measured = _measure_json()
    measured["cases"]["rmsnorm_large"]["cupti"] = {"median_us": 370.0, "timer": "events",
                                                   "fallback_reason": "cupti: not installed (pip install ...)"}
    fell_back = {r["case"]: r for r in nv.compare(parsed, measured)}["rmsnorm_large"]
    assert fell_back["verdict"] == "FAIL" and "cupti timer not used, events ran: cupti: not installed" in \
        fell_back["reason"]


def test_ncu_compare_reports_the_per_kernel_floor_offset_without_judging_by_it():
    nv = _ncu_validate()
    ncu = {"launch_floor": {0: 2.5, 1: 2.5, 2: 2.5}, "decode_medium": {0: 17.0, 1: 16.9, 2: 17.1}}
    measured = {"cases": {
        "launch_floor": {"cupti": {"median_us": 1.0, "timer": "cupti", "kernels_per_call": 1}},
        "decode_medium": {"cupti": {"median_us": 13.6, "timer": "cupti", "kernels_per_call": 2}},
    }}
    rows = {r["case"]: r for r in nv.compare(ncu, measured)}
    assert rows["launch_floor"]["verdict"] == "calibration" and "1.50 us" in rows["launch_floor"]["reason"]
    dm = rows["decode_medium"]
    assert dm["verdict"] == "FAIL" and dm["cupti_ratio"] == pytest.approx(0.8)  # judged on the raw ratio
    assert dm["floor_offset_us"] == pytest.approx(1.5) and dm["cupti_adj_ratio"] == pytest.approx(16.6 / 17.0)
    assert "with ncu's per-kernel offset (1.50 us x 2) 0.976: within 0.03" in dm["reason"]
    adjusted = {r["case"]: r for r in nv.compare(ncu, measured, judge_adjusted=True)}["decode_medium"]
    assert adjusted["verdict"] == "PASS" and adjusted["judged_on"] == "adj" and "raw 0.800" in adjusted["reason"]
    measured["cases"]["launch_floor"]["cupti"]["timer"] = "events"  # no cupti floor: no offset
    assert "cupti_adj_ratio" not in {r["case"]: r for r in nv.compare(ncu, measured)}["decode_medium"]


def test_throttle_detection():
    nv = _ncu_validate()
    assert nv.throttled({}) is None
    assert nv.throttled({"clocks_start": {"sm_clock_mhz": 1980}, "clocks_end": {"sm_clock_mhz": 1970,
                                                                               "clocks_event_reasons": "0x0"}}) is None
    assert nv.throttled({"clocks_start": {"sm_clock_mhz": 1980}, "clocks_end": {"sm_clock_mhz": 1500}}) == \
        "SM clock 1980 -> 1500 MHz"
    assert nv.throttled({"clocks_end": {"clocks_event_reasons": "0x1"}}) is None  # idle is not throttling


def test_ncu_csv_without_tags_or_header_is_an_error():
    nv = _ncu_validate()
    with pytest.raises(ValueError, match="header"):
        nv.parse_ncu_csv("==PROF== nothing profiled\n")
    with pytest.raises(ValueError, match="print-nvtx-rename"):
        nv.parse_ncu_csv(HEADER + "\n" + _row(0, "void kernel<float>()", "nsecond", "10") + "\n")
    with pytest.raises(ValueError, match="unit"):
        nv._value_us("1.0", "furlong")
    assert nv._value_us("2", "second") == 2e6 and math.isclose(nv._value_us("1,500", "ns"), 1.5)


def test_ncu_validate_cli(tmp_path):
    import json

    csv_path, measure_path, out = tmp_path / "ncu.csv", tmp_path / "measure.json", tmp_path / "results.json"
    csv_path.write_text(_fake_ncu_csv())
    measured = _measure_json()
    for timer in ("cupti", "auto"):
        measured["cases"]["gemm_8192"][timer]["median_us"] = 1610.0  # within 3%: no FAIL left
    measured["cases"]["decode_large"]["cupti"]["median_us"] = 10.2
    measure_path.write_text(json.dumps(measured))
    script = str(ROOT / "scripts" / "ncu-validate.py")
    res = subprocess.run([sys.executable, script, "compare", str(csv_path), str(measure_path), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "rmsnorm_large" in res.stdout and "PASS" in res.stdout and "cupti/ncu" in res.stdout
    saved = json.loads(out.read_text())
    assert saved["timer"] == "cupti" and saved["criteria"] == {"tolerance": 0.03, "min_us": 10.0,
                                                               "small_tolerance": 0.10, "floor_us": 2.0,
                                                               "judged_on": "raw ratio"}
    assert {r["case"]: r["verdict"] for r in saved["rows"]}["decode_large"] == "PASS"
    assert saved["summary"]["PASS"] == 3 and saved["cupti_python"] == "13.0.1"
    res = subprocess.run([sys.executable, script, "compare", "--json", "--tolerance", "0.001", str(csv_path),
                          str(measure_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert {r["case"]: r["verdict"] for r in json.loads(res.stdout)}["rmsnorm_large"] == "FAIL"
    helped = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert helped.returncode == 0 and "ncu-validate.py all" in helped.stdout


def test_ncu_validate_all_runs_ncu_on_the_profile_mode():
    nv = _ncu_validate()
    cmd = nv.ncu_command("/opt/ncu", ["decode_medium", "rmsnorm_large"], 20, 5)
    assert cmd[0] == "/opt/ncu" and "--clock-control" in cmd and cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--nvtx-include") + 1] == "regex:ncu:.*/" and "--print-nvtx-rename" in cmd
    assert cmd[cmd.index("--cache-control") + 1] == "all"  # cold caches: the cupti timer's condition
    i = cmd.index(sys.executable)
    assert cmd[i + 1].endswith("ncu-validate.py") and cmd[i + 2:] == [
        "profile", "--cases", "decode_medium,rmsnorm_large", "--calls", "20", "--warmup", "5"]
    assert "decode_medium" in nv.CASES
    assert nv._cv([1.0]) is None and nv._cv([9.0, 11.0]) == pytest.approx(math.sqrt(2) / 10)


def test_a_merge_counts_each_state_s_weight_and_share_and_an_append_its_slots_arithmetic():
    pair = load_definition("merge_state_h32_d128")
    x = generate_inputs(pair, "small", 0)
    seq, heads, dim = x.values["v_a"].shape
    assert roofline.work(pair, x).flops == 2 * seq * heads * (2 * dim + 3)
    multi = load_definition("merge_states_h32_d128")
    y = generate_inputs(multi, "small", 0)
    seq, states, heads, dim = y.values["v"].shape
    assert roofline.work(multi, y).flops == states * seq * heads * (2 * dim + 3)
    append = load_definition("append_paged_kv_cache_kv8_d128_ps16")
    z = generate_inputs(append, "small", 0)
    assert roofline.work(append, z).flops == 4 * z.values["append_key"].shape[0]
    mask = load_definition("top_k_mask_logits_v32000_bf16")  # a filter over logits, not probabilities
    w = generate_inputs(mask, "small", 0)
    assert roofline.work(mask, w).flops == 3 * w.values["logits"].numel()


def test_a_layernorm_counts_seven_operations_per_element():
    d = load_definition("layernorm_h768")
    x = generate_inputs(d, "small", 0)
    assert roofline.work(d, x).flops == 7 * x.values["hidden_states"].numel()


def test_a_gemma_norm_counts_its_scale_once_per_channel_and_the_in_place_residual_both_ways():
    d, f = load_definition("gemma_rmsnorm_h4608"), load_definition("gemma_fused_add_rmsnorm_h4608")
    x, y = generate_inputs(d, "small", 0), generate_inputs(f, "small", 0)
    m, n = x.values["hidden_states"].shape
    assert roofline.work(d, x).flops == 4 * m * n + n and roofline.work(d, x).bytes == (2 * m * n + n) * 2
    assert roofline.work(f, y).flops == 5 * m * n + n
    assert roofline.work(f, y).bytes == (4 * m * n + n) * 2  # hidden, residual, weight read; output, residual written


def test_a_min_p_filter_counts_like_the_others_and_a_logits_sampler_adds_its_softmax():
    min_p = load_definition("min_p_sampling_from_probs_v128256")
    x = generate_inputs(min_p, "small", 0)
    assert roofline.work(min_p, x).flops == 3 * x.values["probs"].numel()
    both = load_definition("top_k_top_p_sampling_from_logits_v151936")
    y = generate_inputs(both, "small", 0)
    assert roofline.work(both, y).flops == 7 * y.values["logits"].numel()  # 1 + 2 * 2 filters + exp and sum
    plain = load_definition("sampling_from_logits_v128256")
    z = generate_inputs(plain, "small", 0)
    assert roofline.work(plain, z).flops == 3 * z.values["logits"].numel()


def test_the_min_p_and_logits_samplers_are_timed_as_one_call_on_the_whole_batch():
    from flashinfer_trace.groundtruth import flashinfer_samplers as fsm

    calls: list = []

    def min_p_sampling_from_probs(probs, min_p, indices=None, deterministic=True, generator=None, check_nan=False):
        calls.append((probs, min_p, deterministic, generator))
        return torch.zeros(probs.shape[0], dtype=torch.int32)

    module = types.SimpleNamespace(sampling=types.SimpleNamespace(min_p_sampling_from_probs=min_p_sampling_from_probs))
    call = _sampling_call("min_p_sampling_from_probs_v151936", module)  # one min_p for every row: a Python float
    adapter = next(a for a in fsm.ADAPTERS if a.api.endswith("min_p_sampling_from_probs") and a.applies(call.definition)
                   is None)
    fn, setup, note = kernels.PREPARERS[adapter.fn](call)
    fn()
    fn()
    probs, min_p, deterministic, generator = calls[0]
    assert setup is None and len(calls) == 2 and probs is call.inputs.values["probs"] and probs.shape[0] > 1
    assert isinstance(min_p, float) and deterministic is True and calls[1][3] is generator
    assert "whole batch" in note
    assert all(a.fn in kernels.PREPARERS for a in fsm.ADAPTERS)


def test_a_top_k_counts_one_compare_per_ranked_entry():
    d = load_definition("top_k_v2048_k2048")
    x = generate_inputs(d, "small", 0)
    assert roofline.work(d, x).flops == x.values["input"].numel()
    v = load_definition("top_k_varlen_n8192_k1024_bf16")
    y = generate_inputs(v, "small", 0, case="short_rows")
    assert roofline.work(v, y).flops == sum(min(int(n), 8192) for n in y.values["seq_lens"].tolist())


def test_a_bmm_fp8_counts_two_operations_per_multiply_add_over_the_batch():
    d = load_definition("bmm_fp8_b16_k144_n80")
    x = generate_inputs(d, "small", 0)
    b, m, k = x.values["A"].shape
    assert roofline.work(d, x).flops == 2 * b * m * 80 * k
    bf = load_definition("bmm_bf16_b128_k512_n128")
    y = generate_inputs(bf, "small", 0)
    assert roofline.work(bf, y).flops == 2 * 128 * y.values["A"].shape[1] * 128 * 512


def test_block_sparse_flops_count_the_listed_pairs_with_a_short_last_block_row():
    """40 queries in block rows of 16 (16, 16, 8), listing 2, 0 and 1 column blocks of 16 keys: 16*2*16 + 8*1*16 = 640
    pairs, each 2 * heads * (128 + 128) FLOPs; the moe_routing model counts every expert of every token."""
    d = load_definition("block_sparse_r16_c16_h28_kv4_d128")
    bf16, i32 = torch.bfloat16, torch.int32
    values = {"q": torch.zeros(40, 28, 128, dtype=bf16), "k": torch.zeros(48, 4, 128, dtype=bf16),
              "v": torch.zeros(48, 4, 128, dtype=bf16), "indptr": torch.tensor([0, 2, 2, 3], dtype=i32),
              "indices": torch.tensor([0, 2, 1], dtype=i32), "sm_scale": 128 ** -0.5}
    axes = {"qo_len": 40, "kv_len": 48, "num_qo_heads": 28, "num_kv_heads": 4, "head_dim": 128, "block_rows": 16,
            "block_cols": 16, "len_indptr": 4, "nnz": 3}
    w = roofline.work(d, Inputs(d.name, "small", 0, None, values, axes))
    assert w.detail["visible_pairs"] == 640 and w.flops == 2 * 28 * 640 * 256
    r = load_definition("fused_topk_deepseek_e256_k8")
    x = generate_inputs(r, "small", 0)
    tokens = x.axes["num_tokens"]
    assert roofline.work(r, x).flops == tokens * (5 * 256 + 2 * 8 + 3 * 8)


def test_pod_and_cascade_attention_flops_count_each_half_and_each_level():
    """POD: a causal prefill of 3 queries over 5 keys (3 + 4 + 5 = 12 pairs) and two decode requests over 2 pages
    (16 + 4 tokens) and 1 page (16): 48 pairs. Cascade: a shared level of 20 tokens seen by 4 queries unmasked (80), and
    each request's own level, 2 queries over 3 and 1 over 1 key, causal (2 + 3 + 1 = 6): 86 pairs."""
    bf16, i32 = torch.bfloat16, torch.int32
    pod = load_definition("pod_h32_kv8_d128_ps16")
    values = {"q_p": torch.zeros(3, 32, 128, dtype=bf16), "k_p": torch.zeros(5, 8, 128, dtype=bf16),
              "v_p": torch.zeros(5, 8, 128, dtype=bf16), "q_d": torch.zeros(2, 32, 128, dtype=bf16),
              "k_cache": torch.zeros(3, 16, 8, 128, dtype=bf16), "v_cache": torch.zeros(3, 16, 8, 128, dtype=bf16),
              "kv_indptr": torch.tensor([0, 2, 3], dtype=i32), "kv_indices": torch.tensor([0, 1, 2], dtype=i32),
              "kv_last_page_len": torch.tensor([4, 16], dtype=i32), "sm_scale": 128 ** -0.5}
    axes = {"qo_len": 3, "kv_len": 5, "batch_size": 2, "num_pages": 3, "len_indptr": 3, "num_kv_indices": 3,
            "num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128, "page_size": 16}
    w = roofline.work(pod, Inputs(pod.name, "small", 0, None, values, axes))
    assert (w.detail["prefill_pairs"], w.detail["decode_pairs"]) == (12, 36) and w.flops == 2 * 32 * 48 * 2 * 128
    cas = load_definition("cascade_attention_l2_causal_h32_kv8_d128_ps16")
    values = {"q": torch.zeros(4, 32, 128, dtype=bf16), "k_cache": torch.zeros(4, 16, 8, 128, dtype=bf16),
              "v_cache": torch.zeros(4, 16, 8, 128, dtype=bf16),
              "qo_indptr_0": torch.tensor([0, 4], dtype=i32), "kv_indptr_0": torch.tensor([0, 2], dtype=i32),
              "kv_indices_0": torch.tensor([0, 1], dtype=i32), "kv_last_page_len_0": torch.tensor([4], dtype=i32),
              "qo_indptr_1": torch.tensor([0, 2, 3, 4], dtype=i32),
              "kv_indptr_1": torch.tensor([0, 1, 2, 2], dtype=i32), "kv_indices_1": torch.tensor([2, 3], dtype=i32),
              "kv_last_page_len_1": torch.tensor([3, 1, 0], dtype=i32), "sm_scale": 128 ** -0.5}
    axes = {"num_qo": 4, "num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128, "num_pages": 4, "page_size": 16,
            "len_indptr_0": 2, "nnz_pages_0": 2, "num_segments_0": 1, "len_indptr_1": 4, "nnz_pages_1": 2,
            "num_segments_1": 3}
    w = roofline.work(cas, Inputs(cas.name, "small", 0, None, values, axes))
    assert w.detail["visible_pairs"] == 80 + 6 and w.flops == 2 * 32 * 86 * 2 * 128


def test_an_mhc_post_counts_nine_operations_per_output_element():
    d = load_definition("mhc_post_hc4_h4096")
    x = generate_inputs(d, "small", 0)
    assert roofline.work(d, x).flops == 9 * x.values["residual"].numel()


def test_chain_speculative_sampling_counts_the_stop_row_and_is_timed_as_one_call():
    from flashinfer_trace.groundtruth import flashinfer_speculative as fspec

    d = load_definition("chain_speculative_sampling_v32000")
    x = generate_inputs(d, "small", 0)
    batch, n, vocab = x.values["draft_probs"].shape
    w = roofline.work(d, x)
    assert w.flops == batch * (2 * n + 6 * vocab)
    # one draft row and one target row per request, the ids and the three outputs
    assert w.bytes == 4 * batch * vocab * 2 + 4 * batch * n + 4 * batch * (n + 1) + 2 * 4 * batch
    calls: list = []

    def chain_speculative_sampling(draft_probs, draft_token_ids, target_probs, maybe_output_accepted_token_num=None,
                                   maybe_output_emitted_draft_token_num=None, deterministic=True, generator=None):
        calls.append((draft_probs, deterministic, generator))
        return torch.zeros(draft_probs.shape[0], n + 1, dtype=torch.int32), None, None

    sampling = types.SimpleNamespace(chain_speculative_sampling=chain_speculative_sampling)
    module = types.SimpleNamespace(sampling=sampling)
    call = _sampling_call("chain_speculative_sampling_v32000", module)
    fn, setup, note = kernels.PREPARERS[fspec.run](call)
    fn()
    fn()
    assert setup is None and len(calls) == 2 and calls[0][0] is call.inputs.values["draft_probs"]
    assert calls[0][1] is True and calls[1][2] is calls[0][2] and "whole batch" in note


def test_a_block_scaled_fp8_gemm_counts_two_operations_per_multiply_add():
    d = load_definition("fp8_blockscale_gemm_sm90_n320_k384")
    x = generate_inputs(d, "small", 0)
    assert roofline.work(d, x).flops == 2 * x.values["input"].shape[0] * 320 * 384


def test_a_gemm_bf16_counts_two_operations_per_multiply_add_in_every_form():
    for name, act in (("gemm_bf16_n72_k200", "A"), ("tinygemm_bf16_n128_k2880", "input"),
                      ("router_gemm_m16_k6144_n256", "mat_a")):
        d = load_definition(name)
        x = generate_inputs(d, "small", 0)
        m, k = x.values[act].shape
        n = d.const_axes["N"]
        assert roofline.work(d, x).flops == 2 * m * n * k

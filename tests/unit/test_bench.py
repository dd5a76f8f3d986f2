"""The roofline model, the device timer's CPU behaviour, the benchmark suite's collection on a CPU,
and the ncu CSV parsing of scripts/ncu-validate.py. No GPU needed."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashinfer_trace import bench, roofline
from flashinfer_trace.dataset import iter_definitions
from flashinfer_trace.definition import Definition
from flashinfer_trace.inputs import Inputs, generate_inputs
from flashinfer_trace.inputs.moe import route, routing_params
from flashinfer_trace.roofline import PEAKS, Peak, Work, peak_for, rates, visible_pairs, work
from flashinfer_trace.testing import load_definition

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


@pytest.mark.parametrize("name", ["rmsnorm_h4096", "fused_add_rmsnorm_h4096"])
def test_rmsnorm_bytes_exact(name):
    d = load_definition(name)
    inputs = generate_inputs(d, "small", 0)
    m, n = inputs.values["hidden_states"].shape
    w = work(d, inputs)
    if "residual" in d.inputs:  # read hidden + residual + weight, write output + residual_out
        assert w.bytes == 4 * m * n * 2 + n * 2
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


def test_every_shipped_definition_has_a_model():
    for d in iter_definitions():
        w = work(d, generate_inputs(d, "small", 0)) if d.op_type != "moe" else work(_small_moe(), generate_inputs(
            _small_moe(), "small", 0))
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
        bench.time_device(lambda: None)


def test_prepare_needs_cuda(no_cuda):
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        bench.prepare(None, None)


def test_bench_imports_without_cuda():
    code = "import flashinfer_trace.bench as b; print(len(b.PREPARERS), sorted(b.Timing.__dataclass_fields__)[:3])"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode == 0, res.stderr


def test_preparers_cover_the_attention_wrappers_and_in_place_norm():
    from flashinfer_trace.groundtruth import flashinfer as fgt
    from flashinfer_trace.groundtruth import sglang as sgt

    for fn in (fgt.gqa_decode, fgt.gqa_prefill_paged, fgt.gqa_prefill_ragged, fgt.mla, fgt.fused_add_rmsnorm,
               sgt.fused_add_rmsnorm):
        assert fn in bench.PREPARERS
    assert fgt.sampling not in bench.PREPARERS  # timed whole, includes_setup


def test_prepared_unpacks_as_fn_and_setup():
    p = bench.Prepared(fn=print, setup=None, includes_setup=True, note="x")
    fn, setup = p
    assert fn is print and setup is None


def test_gpu_clocks_never_raises_and_parses_nvidia_smi(monkeypatch):
    assert isinstance(bench.gpu_clocks(), dict)

    def no_nvml(index, bus_id):
        raise ImportError("no pynvml")

    class Done:  # nvidia-smi's CSV, in manifest.SMI_FIELDS order (the query bench reads through)
        stdout = "NVIDIA H100 80GB HBM3, 9.0, 580.159.04, 1980, 2619, 1980, 372.15, 700.00, [N/A], P0, 0x0\n"

    from flashinfer_trace import manifest

    monkeypatch.setattr(bench, "_nvml_clocks", no_nvml)
    monkeypatch.setattr(manifest.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(manifest.subprocess, "run", lambda *a, **k: Done())
    assert bench.gpu_clocks() == {"source": "nvidia-smi", "sm_clock_mhz": 1980.0, "mem_clock_mhz": 2619.0,
                                  "power_w": 372.15, "temperature_c": None}

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(manifest.subprocess, "run", missing)
    assert bench.gpu_clocks() == {}


def test_timing_summary_quartiles():
    med, q1, q3, mean = bench._summary([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (med, q1, q3, mean) == (3.0, 2.0, 4.0, 3.0)
    assert bench._summary([7.0]) == (7.0, 7.0, 7.0, 7.0)


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
    def t(us, timer="events"):
        return {"median_us": us, "timer": timer}

    return {"gpu": "fake", "cases": {
        "rmsnorm_large": {"auto": t(370.0), "events": t(370.0), "graph": t(355.0, "graph")},
        "decode_large": {"auto": t(10.2), "events": t(10.2), "graph": t(9.0, "graph")},
        "gemm_8192": {"auto": t(1700.0), "events": t(1700.0)},
        "gemm_linear_large": {"auto": {**t(51.0), "clocks_start": {"sm_clock_mhz": 1980},
                                       "clocks_end": {"sm_clock_mhz": 1980, "clocks_event_reasons": "0x4"}}},
        "rmsnorm_small": {"auto": t(3.0, "graph")},
        "decode_medium": {"skipped": "not-installed: flashinfer"},
    }}


def test_ncu_compare_parses_and_computes_ratios():
    nv = _ncu_validate()
    parsed = nv.parse_ncu_csv(_fake_ncu_csv())
    assert parsed["rmsnorm_large"] == {0: pytest.approx(360.0), 1: pytest.approx(362.5), 2: pytest.approx(1000.0)}
    assert parsed["decode_large"] == {c: pytest.approx(10.0) for c in range(3)}
    assert parsed["gemm_8192"] == {0: pytest.approx(1600.0)}
    rows = {r["case"]: r for r in nv.compare(parsed, _measure_json())}
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
    strict = {r["case"]: r for r in nv.compare(parsed, _measure_json(), tolerance=0.01)}
    assert strict["rmsnorm_large"]["verdict"] == "FAIL"
    assert {r["case"]: r for r in nv.compare(parsed, _measure_json(), min_us=20)}["decode_large"]["verdict"] == "info"
    graph = {r["case"]: r for r in nv.compare(parsed, _measure_json(), timer="graph")}
    assert graph["decode_large"]["verdict"] == "FAIL" and graph["rmsnorm_large"]["verdict"] == "PASS"


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

    csv_path, measure_path = tmp_path / "ncu.csv", tmp_path / "measure.json"
    csv_path.write_text(_fake_ncu_csv())
    measured = _measure_json()
    measured["cases"]["gemm_8192"]["auto"]["median_us"] = 1610.0  # within 3%: no FAIL left
    measure_path.write_text(json.dumps(measured))
    script = str(ROOT / "scripts" / "ncu-validate.py")
    res = subprocess.run([sys.executable, script, "compare", str(csv_path), str(measure_path)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "rmsnorm_large" in res.stdout and "PASS" in res.stdout
    res = subprocess.run([sys.executable, script, "compare", "--json", "--tolerance", "0.001", str(csv_path),
                          str(measure_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert {r["case"]: r["verdict"] for r in json.loads(res.stdout)}["rmsnorm_large"] == "FAIL"
    helped = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert helped.returncode == 0 and "ncu --target-processes all" in helped.stdout

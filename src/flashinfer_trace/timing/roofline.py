"""Bytes moved and FLOPs done by one call of a definition, and where a measured time sits against
the GPU's roofline. Pure Python over the definition and the generated inputs (their shapes, and
the index tensors' values); no GPU needed.

    w = work(definition, inputs)                       # Work(bytes, flops, detail)
    r = rates(w, seconds, peak_for(torch.cuda.get_device_name()))
    r["gb_per_s"], r["pct_of_peak_bandwidth"], r["bound"]

The byte count is the least traffic a kernel needs (MIN bytes, the usual roofline convention):

* every tensor input is read once and every output written once, numel * element size, the
  dtypes being the definition's (`flashinfer_trace.dtypes.torch_dtype`; fp8 = 1 byte, the packed
  float4 = half a byte per element). Python scalars (shape null) are kernel arguments: 0 bytes;
* except paged KV caches (inputs named k_cache, v_cache, ckv_cache, kpe_cache): only the tokens
  the requests reference are read, tokens = sum over requests of their kv length (from kv_indptr,
  the page size and the last page's fill) and bytes = tokens * bytes per token of that cache
  (numel * element size / (pages * page_size)). A page shared by two requests counts twice;
  the spare pages the generator allocates count not at all;
* and MoE expert weights (gemm1_weights, gemm2_weights and their `_scale`s): only the local
  experts that receive at least one token under the definition's DeepSeek-V3 routing
  (`groundtruth.torch_ref.route`, by the routing `semantics.moe_routing` names) are read.

FLOPs: `flops.py` (a model per op_type, the formulas there).

Every formula used, with its numbers, is in `Work.detail`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .flops import (
    CHAIN_INPUTS,
    DSA_CACHES,
    PAGED_CACHES,
    _dsa_slots_read,
    _ints,
    _kv_lengths,
    _mamba_rows,
    _moe_active_experts,
    _numel,
    _xqa_keys,
    flops,
    visible_pairs,
)

if TYPE_CHECKING:
    from ..definition import Definition, TensorSpec
    from ..inputs import Inputs

__all__ = ["PEAKS", "Peak", "Work", "element_bytes", "peak_for", "rates", "visible_pairs", "work"]

CHAIN_ROWS = ("draft_probs", "target_probs")  # read at the stop's row only
FP4_PAGED = ("paged_k_cache", "paged_v_cache", "k_scales", "v_scales", "output_k", "output_v")
MOE_WEIGHTS = ("gemm1_weights", "gemm2_weights", "gemm1_weights_scale", "gemm2_weights_scale")


@dataclass(frozen=True)
class Work:
    """What one call must do: bytes through device memory (reads + writes) and FLOPs."""

    bytes: int
    flops: int
    detail: dict = field(default_factory=dict)

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte."""
        return self.flops / self.bytes if self.bytes else math.inf

    def as_dict(self) -> dict:
        return {"bytes": self.bytes, "flops": self.flops, "arithmetic_intensity": self.intensity,
                "detail": self.detail}


# -- sizes ----------------------------------------------------------------------------------------
def element_bytes(dtype: Any) -> float:
    """Bytes per element of a format dtype (a DType or its name): torch's itemsize, except the
    packed float4, which holds two elements per byte."""
    from ..dtypes import DType, torch_dtype

    name = DType(dtype).value
    if name == "float4_e2m1":
        return 0.5
    return torch_dtype(name).itemsize


def _tensor_bytes(spec: TensorSpec, axes: Mapping[str, int]) -> int:
    return math.ceil(_numel(spec, axes) * element_bytes(spec.dtype))


def _bytes(definition: Definition, inputs: Inputs, detail: dict) -> int:
    axes, values = inputs.axes, inputs.values
    reads: dict[str, int] = {}
    notes: list[str] = []
    kv_tokens = None
    moe = None
    for name, spec in definition.inputs.items():
        if spec.shape is None:
            continue  # a Python scalar: a kernel argument
        full = _tensor_bytes(spec, axes)
        if name in PAGED_CACHES and "kv_indptr" in values:
            if kv_tokens is None:
                kv_tokens = sum(_kv_lengths(definition, values))
            paged = len(spec.shape) > 1 and spec.shape[1] == "page_size"
            slots = int(axes[spec.shape[0]]) * (int(axes[spec.shape[1]]) if paged else 1)
            per_token = full / slots if slots else 0.0
            reads[name] = math.ceil(kv_tokens * per_token)
            notes.append(f"{name}: {kv_tokens} referenced tokens * {per_token:g} B/token "
                         f"(of {slots} token slots, {full} B allocated)")
        elif definition.op_type == "trtllm_paged" and name in PAGED_CACHES and "seq_lens" in values:
            tokens = sum(_ints(values["seq_lens"]))
            slots = int(axes["num_pages"]) * int(axes["page_size"])
            reads[name] = math.ceil(tokens * (full / slots if slots else 0.0))
            detail["kv_tokens_read"] = tokens
            notes.append(f"{name}: {tokens} tokens of seq_lens read (of {slots} token slots)")
        elif definition.op_type == "xqa" and name in PAGED_CACHES and "seq_lens" in values:
            slots = int(axes[spec.shape[0]]) * int(axes[spec.shape[1]])
            tokens = sum(_xqa_keys(definition, values))
            reads[name] = math.ceil(tokens * (full / slots if slots else 0.0))
            notes.append(f"{name}: {tokens} keys read (within seq_lens and the window), of {slots} token slots")
        elif definition.op_type == "mamba_ssu" and name == "state" and spec.shape:
            live, rows = _mamba_rows(values, int(axes[spec.shape[0]]))
            reads[name] = full * live // rows if rows else 0
            detail["mamba_live_rows"] = live
            notes.append(f"{name}: the {live} rows live requests name, of {rows} (read, and written back once)")
        elif definition.op_type == "dsa_paged" and name in DSA_CACHES and spec.shape and name in values:
            slots = int(axes[spec.shape[0]]) * int(axes[spec.shape[1]])
            used = _dsa_slots_read(values)
            reads[name] = full * used // slots if slots else 0
            notes.append(f"{name}: {used} token slots read (selected / within seq_lens), of {slots}")
        elif definition.op_type == "dequantize_fp4" and name in FP4_PAGED and "seq_lens" in values:
            slots = int(axes["num_pages"]) * int(axes["page_size"])
            tokens = int(values["seq_lens"].long().sum())
            if name.startswith("output"):  # written in place, never read: the written rows count as writes
                reads[name] = 0
                notes.append(f"{name}: not read (the rows of {tokens} tokens written)")
            else:
                reads[name] = math.ceil(tokens * (full / slots if slots else 0.0))
                notes.append(f"{name}: {tokens} tokens' rows read (of {slots} token slots)")
        elif name in MOE_WEIGHTS and ("routing_logits" in values or "topk_ids" in values):
            num_local = int(axes[spec.shape[0]])
            if moe is None:
                moe = _moe_active_experts(definition, values, num_local)
                detail["moe_active_local_experts"], detail["moe_routed_pairs"] = moe[0], moe[1]
                detail["moe_routing"] = moe[2]
            active = moe[0]
            reads[name] = full * active // num_local if num_local else 0
            notes.append(f"{name}: {active} of {num_local} local experts receive tokens")
        elif definition.op_type == "sampling" and name in CHAIN_ROWS and CHAIN_INPUTS <= set(definition.inputs):
            per_request = int(axes[spec.shape[1]])
            reads[name] = full // per_request if per_request else 0
            notes.append(f"{name}: the row at the stop, 1 of {per_request} per request")
        else:
            reads[name] = full
    writes = {name: _tensor_bytes(spec, axes) for name, spec in definition.outputs.items() if spec.shape is not None}
    if definition.op_type == "dequantize_fp4" and "seq_lens" in values:  # the rows of the requests' tokens only
        tokens = int(values["seq_lens"].long().sum())
        for name, spec in definition.outputs.items():
            rows = int(axes[spec.shape[0]]) * int(axes[spec.shape[1]])
            writes[name] = writes[name] * tokens // rows if rows else 0
    if definition.op_type == "mamba_ssu" and "state" in reads:  # the updated state: the live rows only
        cache_shape = definition.inputs["state"].shape
        for name, spec in definition.outputs.items():
            if spec.shape == cache_shape:
                writes[name] = reads["state"]
    detail["bytes_read"] = reads
    detail["bytes_written"] = writes
    if kv_tokens is not None:
        detail["kv_tokens_read"] = kv_tokens
    detail["bytes_formula"] = ("sum(numel * element size) over tensor inputs read once and outputs written "
                               "once" + ("; " + "; ".join(notes) if notes else ""))
    return sum(reads.values()) + sum(writes.values())


# -- flops --------------------------------------------------------------------------------------------
def work(definition: Definition, inputs: Inputs) -> Work:
    """Bytes and FLOPs of one call of `definition` on `inputs` (see the module docstring)."""
    detail: dict[str, Any] = {"op_type": definition.op_type}
    nbytes = _bytes(definition, inputs, detail)
    return Work(bytes=int(nbytes), flops=flops(definition, inputs, detail), detail=detail)


# -- peaks ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Peak:
    """A GPU's datasheet ceilings: HBM bandwidth and dense (no sparsity) bf16 tensor throughput."""

    name: str
    hbm_bytes_per_s: float
    bf16_flops_per_s: float

    @property
    def ridge_point(self) -> float:
        """FLOP per byte at which a kernel stops being memory bound."""
        return self.bf16_flops_per_s / self.hbm_bytes_per_s


# Matched as substrings of torch.cuda.get_device_name() (case-insensitive, '-'/'_' read as spaces),
# first match wins, so the specific names come before the general ones. Sources:
#  - H100 SXM 3.35 TB/s and 989.4 TFLOP/s dense bf16 (1979 with sparsity), H200 4.8 TB/s with the same
#    tensor cores: /work/shared/research/B_matrix_timing.md (section D, after glennklockwood.com's
#    H100 page) and NVIDIA's H100 / H200 Tensor Core GPU datasheets;
#  - H100 PCIe 2.0 TB/s / 756 TFLOP/s, H100 NVL 3.9 TB/s / 835 TFLOP/s, H200 NVL 4.8 TB/s / 835 TFLOP/s:
#    NVIDIA H100 / H200 datasheets (dense = half the sparsity figure);
#  - A100 80GB SXM 2.039 TB/s, A100 80GB PCIe 1.935 TB/s, 312 TFLOP/s: NVIDIA A100 datasheet;
#  - B200 8.0 TB/s / 2250 TFLOP/s dense bf16: NVIDIA DGX B200 / HGX B200 datasheet (per GPU);
#  - L40S 0.864 TB/s / 362 TFLOP/s: NVIDIA L40S datasheet.
# Datasheet rates are upper bounds: a device-to-device copy reaches ~90% of the HBM figure and
# cuBLAS ~70-80% of the tensor figure on an H100 (the research note's measurements).
PEAKS: dict[str, Peak] = {p.name: p for p in (
    Peak("H100 PCIe", 2.0e12, 756e12),
    Peak("H100 NVL", 3.9e12, 835e12),
    Peak("H100 80GB HBM3", 3.35e12, 989.4e12),  # H100 SXM5
    Peak("H100 SXM", 3.35e12, 989.4e12),
    Peak("H200 NVL", 4.8e12, 835e12),
    Peak("H200", 4.8e12, 989.4e12),
    Peak("A100 80GB PCIe", 1.935e12, 312e12),
    Peak("A100 SXM4 80GB", 2.039e12, 312e12),
    Peak("A100 80GB", 2.039e12, 312e12),
    Peak("B200", 8.0e12, 2250e12),
    Peak("L40S", 0.864e12, 362e12),
)}


def _norm(name: str) -> str:
    return " ".join(name.lower().replace("-", " ").replace("_", " ").split())


def peak_for(name: str | None) -> Peak | None:
    """The datasheet peaks of a GPU by its name (torch.cuda.get_device_name()), None if unknown."""
    if not name:
        return None
    have = _norm(name)
    for key, peak in PEAKS.items():
        if _norm(key) in have:
            return peak
    return None


# -- rates ---------------------------------------------------------------------------------------------
def rates(work: Work, seconds: float, peak: Peak | None = None) -> dict:
    """Achieved bandwidth and throughput of `work` done in `seconds`, and, given the GPU's peaks,
    how close that is to them: percentages of each peak, which one bounds the kernel (its
    arithmetic intensity against the ridge point) and the roofline floor time."""
    if not seconds or seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    intensity = work.intensity
    out: dict[str, Any] = {
        "seconds": seconds,
        "us": seconds * 1e6,
        "bytes": work.bytes,
        "flops": work.flops,
        "gb_per_s": work.bytes / seconds / 1e9,
        "tflop_per_s": work.flops / seconds / 1e12,
        "arithmetic_intensity": intensity if math.isfinite(intensity) else None,
        "peak": None,
        "pct_of_peak_bandwidth": None,
        "pct_of_peak_flops": None,
        "ridge_point": None,
        "bound": None,
        "roofline_us": None,
        "pct_of_roofline": None,
    }
    if peak is None:
        return out
    floor = max(work.bytes / peak.hbm_bytes_per_s, work.flops / peak.bf16_flops_per_s)
    out.update(
        peak={"name": peak.name, "hbm_bytes_per_s": peak.hbm_bytes_per_s, "bf16_flops_per_s": peak.bf16_flops_per_s},
        pct_of_peak_bandwidth=100.0 * work.bytes / seconds / peak.hbm_bytes_per_s,
        pct_of_peak_flops=100.0 * work.flops / seconds / peak.bf16_flops_per_s,
        ridge_point=peak.ridge_point,
        bound="compute" if intensity >= peak.ridge_point else "memory",
        roofline_us=floor * 1e6,
        pct_of_roofline=100.0 * floor / seconds,
    )
    return out

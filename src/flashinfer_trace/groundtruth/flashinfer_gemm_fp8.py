"""FlashInfer ground truth for `gemm_fp8`: `flashinfer.gemm.fp8_blockscale_gemm_sm90(input, weight, input_scale=None,
weight_scale=None, out=None, out_dtype=None) -> Tensor`, the fp8 block-scale GEMM FlashInfer runs on Hopper.

Read from flashinfer/gemm/gemm_base.py, csrc/fp8_blockscale_gemm_sm90_binding.cu, the TensorRT-LLM kernels under
csrc/nv_internal/.../fp8_blockscale_gemm/ and tests/gemm/test_fp8_blockscale_gemm.py (github:flashinfer-ai/flashinfer):

* arch: the Python entry raises "fp8_blockscale_gemm_sm90 is only supported on SM90 (Hopper) architecture" unless
  `_match_sm_version(input.device, ["90", "90a"])`: sm90 exactly. FlashInfer's other fp8 GEMMs that its trace files
  under `gemm_fp8` do not run there: `gemm_fp8_nt_groupwise` (cutlass sm100 / 103 / 107 / 120 / 121, trtllm sm100 /
  103 / 107, cutile sm100+), `mm_fp8` (trtllm-gen low latency, Blackwell).
* contract: input [M, K] and weight [N, K] float8_e4m3fn (W8A8; bf16 operands are the API's other modes, quantised
  inside: not this op's); K % 128 == 0 and N % 64 == 0 (ValueError otherwise); weight_scale float32 [ceil(N/128),
  K/128] (per block) or [N, K/128] (per token); input_scale float32, its shape unchecked: the kernel reads it through
  a TMA descriptor as M-major [K/128, M] with M's leading dimension padded to 4 (the test builds exactly that view),
  so the adapter copies the definition's [M, K/128] into such a buffer inside the launch; out, when given, [M, N]
  bf16 (the fp8 x fp8 runner writes bf16 only: a float16 output is refused here as `unsupported`).
* the kernel: M >= 32 DeepGEMM's normal kernel, M < 32 its swapAB kernel (both JIT-compiled at the first call of a
  shape); with TRTLLM_DG_ENABLED=0 (read at every call) the older CUTLASS-style kernel instead.

Paths (each on sm90 only, >= 0.6.0, where the function first appears: v0.6.0rc1; v0.5.3 lacks it):

* plain: the returned tensor; modes `out` (a NaN-filled bf16 buffer given as out=) and `graph` (modes.py: a
  CUDA-graph replay on other data; the input_scale copy is part of the captured launch);
* `per-token-weight-scale`: the 128x128 block scales spread to the API's other documented granularity, [N, K/128]
  (one per weight row per K block): the same values, so the same output is due;
* `legacy-kernel`: TRTLLM_DG_ENABLED=0 around the call: the non-DeepGEMM kernel.
"""

from __future__ import annotations

import os

import torch
from packaging.specifiers import SpecifierSet

from .base import Adapter, Call
from .flashinfer import PACKAGE
from .torch_gemm_fp8 import BLOCK, INPUTS

VERSIONS = SpecifierSet(">=0.6.0")
SM90 = (9, 0)
SCALE_ALIGN = 4  # the kernel's TMA descriptor pads input_scale's M to a multiple of 4 floats (16 bytes)
DG_ENV = "TRTLLM_DG_ENABLED"


def applies(d) -> str | None:
    missing = [n for n in INPUTS if n not in d.inputs]
    if missing:
        return f"needs inputs {', '.join(missing)}"
    if any(len(d.inputs[n].shape or ()) != 2 for n in INPUTS):
        return "input, weight and their scales must be 2-D"
    if {d.inputs["input"].dtype.value, d.inputs["weight"].dtype.value} != {"float8_e4m3fn"}:
        return "input and weight float8_e4m3fn only (W8A8)"
    outs = list(d.outputs.values())
    if len(outs) != 1 or outs[0].dtype is None or outs[0].dtype.value != "bfloat16":
        return "one bfloat16 output only (the fp8 x fp8 runner writes bf16)"
    axes = d.const_axes
    k, n = axes.get(d.inputs["input"].shape[1]), axes.get(d.inputs["weight"].shape[0])
    if k is not None and k % BLOCK:
        return f"K = {k} is no multiple of 128 (the API refuses it)"
    if n is not None and n % 64:
        return f"N = {n} is no multiple of 64 (the API refuses it)"
    return None


def m_major_buffer(scale: torch.Tensor) -> torch.Tensor:
    """Where a [M, K/128] scale grid goes for the kernel: a [K/128, M] view of a buffer whose rows are padded to 4."""
    m, kb = scale.shape
    return torch.zeros(kb, -(-m // SCALE_ALIGN) * SCALE_ALIGN, dtype=torch.float32, device=scale.device)[:, :m]


def per_token(weight_scale: torch.Tensor, n: int) -> torch.Tensor:
    """[ceil(N/128), K/128] block scales spread to [N, K/128], one row per weight row."""
    return weight_scale.repeat_interleave(BLOCK, dim=0)[:n].contiguous()


def plan(path: str = ""):
    def make(call: Call):
        x = call.inputs.values
        fn = call.module.gemm.fp8_blockscale_gemm_sm90
        a, w, sa, sw = (x[n] for n in INPUTS)
        extra = {}
        if call.mode == "out":
            extra["out"] = torch.full((a.shape[0], w.shape[0]), float("nan"), dtype=torch.bfloat16, device=a.device)
        sa_view = m_major_buffer(sa)

        def launch():
            sa_view.copy_(sa.t())  # inside the launch: a captured graph follows new scales
            scales_w = per_token(sw, w.shape[0]) if path == "per-token-weight-scale" else sw
            if path != "legacy-kernel":
                return fn(a, w, sa_view, scales_w, **extra)
            before = os.environ.get(DG_ENV)
            os.environ[DG_ENV] = "0"
            try:
                return fn(a, w, sa_view, scales_w, **extra)
            finally:
                if before is None:
                    del os.environ[DG_ENV]
                else:
                    os.environ[DG_ENV] = before

        return launch

    return make


def run(path: str = ""):
    make = plan(path)
    return lambda call: (make(call)(),)


_FI = dict(package=PACKAGE, requires=("gemm.fp8_blockscale_gemm_sm90",), applies=applies,
           dtypes=frozenset({"float8_e4m3fn", "float32"}), needs_cuda=True, versions=VERSIONS, min_cc=SM90,
           max_cc=SM90)
API = "flashinfer.gemm.fp8_blockscale_gemm_sm90"
ADAPTERS = [
    Adapter("flashinfer", "gemm_fp8", API, run(), modes=("out", "graph"), plan=plan(),
            finish=lambda call, raw: tuple(raw), **_FI),
    Adapter("flashinfer", "gemm_fp8", f"{API}(weight_scale per token)", run("per-token-weight-scale"),
            path="per-token-weight-scale", **_FI),
    Adapter("flashinfer", "gemm_fp8", f"{API}({DG_ENV}=0)", run("legacy-kernel"), path="legacy-kernel", **_FI),
]

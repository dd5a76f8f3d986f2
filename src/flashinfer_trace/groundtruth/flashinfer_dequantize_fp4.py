"""FlashInfer ground truth for `dequantize_fp4`: `flashinfer.quantization.nvfp4_kv_dequantize_paged(paged_kv_cache,
kv_cache_sf, block_tables, seq_lens, k_scale, v_scale, output_k, output_v, kv_layout="NHD")` (also exported as
`flashinfer.nvfp4_kv_dequantize_paged`). It writes in place and returns None; the adapter hands it clones of the
case's sentinel-filled outputs and returns them, so the comparison sees every row (one written past a request's
length shows as much as one left unwritten).

Read from the 0.6.15 and 0.7.2.post1 wheels (flashinfer/quantization/fp4_quantization.py,
flashinfer/data/csrc/fp4_kv_dequantization.cu) and the 0.6.14 one (absent there):
* introduced in 0.6.15 (0.6.14's fp4_quantization.py has nvfp4_kv_dequantize, the unpaged one, but not the paged);
  before it `api-missing`;
* paged_kv_cache / kv_cache_sf: a (k, v) tuple of 4-D tensors or one 5-D tensor [pages, 2, ...] (split on dim 1,
  as the attention APIs take caches), NHD [pages, page_size, heads, d/2] or HND [pages, heads, page_size, d/2]; the
  scales the same with d/16, dtype float8_e4m3fn or uint8 (the binding takes both); the kernel reads them through
  their strides (last dim contiguous);
* block_tables int32 or int64, seq_lens int32, k_scale / v_scale float32 with one element (a 0-d tensor is one);
  output_k / output_v contiguous float16 or bfloat16 [batch, max_seq_len, heads, d];
* the kernel: value = E2M1[nibble] * float(e4m3 scale) * global in float32, `__float22bfloat162_rn` /
  `__float22half2_rn` to the output; low nibble first; rows t >= seq_lens[b] and pages outside [0, num_pages)
  skipped;
* arch: `@supported_compute_capability([80, 86, 89, 90, 100, 103, 110, 120, 121])` in 0.6.15 (107 added in 0.7.0),
  docstring "Requires SM80+"; the JIT module is built for majors 8-12: sm80+.

Paths (call modes): the plain call passes the (k, v) tuples in the definition's layout with float8 scales and the
int32 table; `stacked` one 5-D tensor each for the cache and the scales; `other-kv-layout` the caches and scales
transposed to the other layout (HND for an NHD definition and back) with kv_layout to match, so both index paths
run on every definition; `int64-table` the block table as int64 (the kernel's other IdType); `uint8-scales` the
scale bytes as uint8; `graph` the plain call captured in a CUDA graph (modes.py: replayed on the scales and outputs
flipped, then on the case's).
"""

from __future__ import annotations

import torch
from packaging.specifiers import SpecifierSet

from .base import Adapter, Call
from .flashinfer import PACKAGE
from .torch_dequantize_fp4 import applies, hnd

API = "flashinfer.quantization.nvfp4_kv_dequantize_paged"
MODES = ("stacked", "other-kv-layout", "int64-table", "uint8-scales")
DTYPES = frozenset({"float8_e4m3fn", "float32", "bfloat16", "float16"})
VERSIONS = SpecifierSet(">=0.6.15")


def _other(t: torch.Tensor) -> torch.Tensor:
    """NHD <-> HND: dims 1 and 2 swapped, made contiguous (the layout a cache of the other kind has)."""
    return t.transpose(1, 2).contiguous()


def arguments(call: Call, outputs: tuple[torch.Tensor, torch.Tensor]) -> tuple[tuple, dict]:
    """(positional, keyword) arguments of the call on the path `call.mode` names, writing into `outputs`."""
    x, mode = call.inputs.values, call.mode or ""
    layout_hnd = hnd(call.definition)
    caches = [x["paged_k_cache"], x["paged_v_cache"]]
    scales = [x["k_scales"], x["v_scales"]]
    if mode == "other-kv-layout":
        caches, scales = [_other(t) for t in caches], [_other(t) for t in scales]
        layout_hnd = not layout_hnd
    if mode == "uint8-scales":
        scales = [t.view(torch.uint8) for t in scales]
    if mode == "stacked":
        cache, sf = torch.stack(caches, dim=1), torch.stack(scales, dim=1)
    else:
        cache, sf = tuple(caches), tuple(scales)
    table = x["block_tables"].to(torch.int64) if mode == "int64-table" else x["block_tables"]
    args = (cache, sf, table, x["seq_lens"], x["k_scale"], x["v_scale"], *outputs)
    return args, {"kv_layout": "HND" if layout_hnd else "NHD"}


def dequantize(call: Call) -> tuple:
    x = call.inputs.values
    outputs = (x["output_k"].clone(), x["output_v"].clone())
    args, kwargs = arguments(call, outputs)
    call.module.quantization.nvfp4_kv_dequantize_paged(*args, **kwargs)
    return outputs


def plan(call: Call):
    """The plain call on the call's own tensors (what a CUDA graph captures): a launch returning the outputs."""
    x = call.inputs.values
    outputs = (x["output_k"], x["output_v"])
    args, kwargs = arguments(call, outputs)
    fn = call.module.quantization.nvfp4_kv_dequantize_paged

    def launch():
        fn(*args, **kwargs)
        return outputs

    return launch


ADAPTERS = [
    Adapter("flashinfer", "dequantize_fp4", API, dequantize, package=PACKAGE, versions=VERSIONS,
            requires=("quantization.nvfp4_kv_dequantize_paged",), applies=applies, dtypes=DTYPES, needs_cuda=True,
            min_cc=(8, 0), modes=(*MODES, "graph"), plan=plan),
]

"""FlashInfer ground truth of `xqa`: GQA decode over a paged cache through FlashInfer's XQA kernels.

    flashinfer.decode.xqa_batch_decode_with_kv_cache(query, kv_cache, workspace_buffer, block_tables, seq_lens,
        max_seq_len, bmm1_scale=1.0, bmm2_scale=1.0, window_left=-1, out=None, sinks=None, kv_layout="NHD",
        enable_pdl=None, q_len_per_req=1, o_scale=1.0, ...) -> out
    flashinfer.xqa.xqa(q [batch, 1, heads, d], k_cache, v_cache, page_table, seq_lens [batch, 1] uint32, output,
        workspace_buffer, semaphores, num_kv_heads, page_size, sinks=None [kv_heads, group], q_scale=1.0,
        kv_scale=1.0, sliding_win_size=0, kv_layout="NHD", sm_count=None, enable_pdl=None, rcp_out_scale=1.0, ...)

Read in flashinfer/xqa.py and decode.py of the 0.5.3, 0.6.6 and 0.7.2.post1 wheels and at the release tags:
* `xqa_batch_decode_with_kv_cache` first in v0.5.0 (absent from v0.5.0rc1-rc3 and v0.4.1); it maps its scales to
  the kernel's as kv_scale = bmm2_scale * o_scale, q_scale = bmm1_scale / kv_scale * sqrt(head_dim) (the kernel
  scores q . k * q_scale * kv_scale / sqrt(head_dim) and multiplies the output by kv_scale * rcp_out_scale),
  window_left -> sliding_win_size = window_left + 1, sinks reshaped to [kv_heads, group]. kv_cache: a (k, v) tuple
  or one [pages, 2, ...] tensor (unbound on dim 1), NHD or HND. 0.5.0 / 0.5.1 pass kv_scale as a tensor, later
  releases as a float;
* `xqa.xqa` with this signature from v0.5.0 (v0.3.0-v0.4.1 had another, positional and SM90 only; v0.5.0rc1 had
  no kv_layout); kv_scale a 1-element float32 tensor in 0.5.0 / 0.5.1 (Optional[Tensor]), a float in 0.5.2,
  either from 0.5.3;
* arch: `xqa.py` raises unless the device's major is 9, 10 or 12 (0.7.2.post1 `xqa.py:402`, 0.6.6 `:291`,
  0.5.3 `:266`); the JIT module is built for majors 9, 10, 12 (`jit/xqa.py`). sm90 runs the Hopper GMMA kernel for
  an fp8 cache (`run_sm90_fp8_mha`, head_dim <= 256), the generic one otherwise. So min_cc (9, 0), and an sm11x
  GPU is refused by the API (its message names the archs: an `exception` there, not a wrong result);
* `xqa_mla` (and `xqa_batch_decode_with_kv_cache_mla`) raise unless SM120 (`xqa.py:633`): no definition here.

Paths: plain (the tuple, out= a NaN-filled buffer), `stacked` (one [pages, 2, page_size, kv, d] tensor), `hnd`
(the caches transposed to [pages, kv, page_size, d], kv_layout="HND"), `xqa-raw` (flashinfer.xqa.xqa itself with
the scales mapped as the wrapper maps them, seq_lens as uint32, semaphores and scratch from one zeroed workspace)
and the generic `graph` (modes.py: the plain launch captured and replayed on other data, then on the case's).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .base import Adapter, Call, keywords
from .flashinfer import PACKAGE, workspace
from .torch_xqa import applies

VERSIONS = SpecifierSet(">=0.5.0")  # both APIs in this form
MODES = ("stacked", "hnd", "xqa-raw")
DTYPES = frozenset({"bfloat16", "float16", "float8_e4m3fn", "float32"})  # q / output half, cache also fp8; sinks
SEMAPHORE_BYTES = 8 << 20  # the wrapper's own split of its workspace: semaphores first, then scratch


def _buffer(call: Call) -> torch.Tensor:
    return workspace(call.inputs.values["query"].device, zeroed=True)  # "must be initialized to 0"


def _window(x: dict) -> int:
    w = x.get("window_left")
    return -1 if w is None else int(w)


def _caches(call: Call) -> tuple[Any, str]:
    x, mode = call.inputs.values, call.mode or ""
    kc, vc = x["k_cache"], x["v_cache"]
    if mode == "stacked":
        return torch.stack([kc, vc], dim=1), "NHD"
    if mode == "hnd":
        return (kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()), "HND"
    return (kc, vc), "NHD"


def plan(call: Call, buffer: torch.Tensor | None = None):
    """The call on the case's tensors, split from its setup: a launch returning the output (what a graph captures)."""
    if (call.mode or "") == "xqa-raw":
        return plan_raw(call, buffer)
    fi, x = call.module, call.inputs.values
    q = x["query"]
    fn = fi.decode.xqa_batch_decode_with_kv_cache
    cache, layout = _caches(call)
    out = torch.full_like(q, math.nan)
    buf = _buffer(call) if buffer is None else buffer
    extra = keywords(fn, window_left=_window(x), out=out, sinks=x.get("sinks"), kv_layout=layout)
    args = (q, cache, buf, x["block_tables"], x["seq_lens"], int(x["max_seq_len"]), float(x["bmm1_scale"]),
            float(x["bmm2_scale"]))

    def launch():
        return fn(*args, **extra)

    return launch


def raw_scales(call: Call) -> tuple[float, float]:
    """(q_scale, kv_scale) as the wrapper derives them (o_scale 1): the kernel's own scale convention."""
    x = call.inputs.values
    kv = float(x["bmm2_scale"])
    return float(x["bmm1_scale"]) / kv * math.sqrt(x["query"].shape[-1]), kv


def plan_raw(call: Call, buffer: torch.Tensor | None = None):
    fi, x = call.module, call.inputs.values
    q, kc, vc = x["query"], x["k_cache"], x["v_cache"]
    buf = (_buffer(call) if buffer is None else buffer).view(torch.uint8)
    semaphores, scratch = buf[:SEMAPHORE_BYTES].view(torch.uint32), buf[SEMAPHORE_BYTES:]
    q_scale, kv_scale = raw_scales(call)
    old = call.version is not None and call.version < Version("0.5.2")  # kv_scale: a tensor there
    kv_arg: Any = torch.tensor([kv_scale], dtype=torch.float32, device=q.device) if old else kv_scale
    sinks = x.get("sinks")
    out = torch.full_like(q, math.nan)
    window = _window(x)
    fn = fi.xqa.xqa
    extra = keywords(fn, sinks=None if sinks is None else sinks.reshape(kc.shape[2], -1), q_scale=q_scale,
                     kv_scale=kv_arg, sliding_win_size=window + 1 if window >= 0 else 0, kv_layout="NHD")
    lens = x["seq_lens"].to(torch.uint32).unsqueeze(1)
    args = (q.unsqueeze(1), kc, vc, x["block_tables"], lens, out.unsqueeze(1), scratch, semaphores, kc.shape[2],
            kc.shape[1])

    def launch():
        fn(*args, **extra)
        return out

    return launch


def run(call: Call) -> tuple:
    return (plan(call)(),)


def finish(call: Call, raw: Any) -> tuple:
    return (raw[0] if isinstance(raw, (tuple, list)) else raw,)


ADAPTERS = [
    Adapter("flashinfer", "xqa", "flashinfer.decode.xqa_batch_decode_with_kv_cache", run, package=PACKAGE,
            versions=VERSIONS, requires=("decode.xqa_batch_decode_with_kv_cache", "xqa.xqa"), applies=applies,
            dtypes=DTYPES, needs_cuda=True, min_cc=(9, 0), modes=(*MODES, "graph"), plan=plan, finish=finish,
            races=True),
]

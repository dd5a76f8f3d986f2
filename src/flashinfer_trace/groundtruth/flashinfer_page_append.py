"""FlashInfer ground truth for `page_append`: `flashinfer.page.append_paged_kv_cache` (k/v caches) and
`flashinfer.page.append_paged_mla_kv_cache` (MLA latent + rope key caches). Both write in place; the adapters
write into clones of the case's caches and return them, so the comparison sees the whole cache after the
call (a slot written that no token names shows as much as a slot left unwritten).

Releases (read in flashinfer/page.py and csrc/page.cu at v0.1.6, v0.2.0, v0.2.4, v0.4.1, v0.5.3, v0.6.0,
v0.6.6 and the 0.7 line's main branch):
* `append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices,
  kv_indptr, kv_last_page_len, kv_layout="NHD")` from 0.2.0 (0.1.x took an append_indptr instead of
  batch_indices/positions: api-missing there). paged_kv_cache is a (k, v) tuple of 4-D tensors or one 5-D
  tensor [pages, 2, ...], NHD [.., page_size, heads, dim] or HND [.., heads, page_size, dim]. The kernel
  reads the appended rows as the cache's element type (no conversion: the definitions give both one dtype)
  and dispatches float16, bfloat16, float8_e4m3fn and float8_e5m2 (0.4.1 on).
* `append_paged_mla_kv_cache(append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache,
  kv_indices, kv_indptr, kv_last_page_len)` from 0.2.4; ckv 512 and kpe 64 only (the kernel checks).
* `get_batch_indices_positions(append_indptr, seq_lens, nnz)` from 0.2.0 (a Triton kernel), with the
  preallocated outputs `batch_indices=` / `positions=` from 0.6.0; `get_seq_lens(kv_indptr,
  kv_last_page_len, page_size)` beside it.

Paths (call modes) of the k/v adapter: the plain call passes the (k, v) tuple in NHD; `single-tensor` one
5-D NHD tensor; `hnd` the tuple transposed to HND (kv_layout="HND"), `hnd-single-tensor` the 5-D HND tensor;
`fi-positions` takes batch_indices/positions from FlashInfer's get_batch_indices_positions (from the append
indptr and get_seq_lens: what an engine calls) instead of the case's, `fi-positions-out` the same into
preallocated tensors; `graph` captures the plain call in a CUDA graph (modes.py; float16/bfloat16 caches:
its stand-in data is the case's flipped, and torch has no flip for float8). The MLA adapter has the plain
call, `fi-positions`, `fi-positions-out` and `graph`. A case whose tokens are not grouped by request in
request order (`shuffled_tokens`) has no append indptr: `unsupported` on the fi-positions paths.
"""

from __future__ import annotations

import torch
from packaging.specifiers import SpecifierSet

from .base import Adapter, Call, GroundTruthUnavailable, accepts
from .flashinfer import PACKAGE
from .torch_page_append import KV, MLA, form

CACHE_DTYPES = frozenset({"bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"})
MLA_DIMS = (512, 64)  # (ckv, kpe): the only widths append_paged_mla_kv_cache's kernel is built for
POSITION_MODES = ("fi-positions", "fi-positions-out")
KV_MODES = ("single-tensor", "hnd", "hnd-single-tensor", *POSITION_MODES)
MLA_MODES = POSITION_MODES
HALF = frozenset({"bfloat16", "float16"})


def _fp8(d) -> bool:
    return any(s.dtype is not None and s.dtype.value.startswith("float8") for s in d.inputs.values())


def kv_applies(fp8: bool):
    """The k/v adapter for half caches (every mode) or fp8 ones (no `graph`: modes.py's stand-in data is the
    case's flipped, and torch has no flip for float8)."""
    def applies(d) -> str | None:
        if form(d) != KV:
            return "takes append_key/append_value and k_cache/v_cache"
        return None if _fp8(d) == fp8 else f"{'fp8' if fp8 else 'float16/bfloat16'} caches only"

    return applies


def mla_applies(d) -> str | None:
    if form(d) != MLA:
        return "takes append_ckv/append_kpe and ckv_cache/kpe_cache"
    dims = (d.inputs["ckv_cache"].shape[-1], d.inputs["kpe_cache"].shape[-1])
    widths = tuple(int(d.const_axes.get(a, -1)) for a in dims)
    if widths != MLA_DIMS:
        return f"the MLA append kernel takes ckv 512 and kpe 64, not {widths}"
    return "no fp8 MLA definition here (no graph path for one)" if _fp8(d) else None


def token_indices(call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch_indices, positions): the case's, or on the fi-positions paths FlashInfer's own from the append
    indptr (tokens per request) and the sequence lengths."""
    x = call.inputs.values
    if call.mode not in POSITION_MODES:
        return x["batch_indices"], x["positions"]
    page = call.module.page
    for name in ("get_batch_indices_positions", "get_seq_lens"):
        if not hasattr(page, name):
            raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} has no page.{name}")
    fn = page.get_batch_indices_positions
    if call.mode == "fi-positions-out" and not (accepts(fn, "batch_indices") and accepts(fn, "positions")):
        raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} get_batch_indices_positions has no "
                                                    "preallocated batch_indices/positions")
    requests = x["batch_indices"].to(torch.int64)
    if requests.numel() > 1 and bool((requests[1:] < requests[:-1]).any()):
        raise GroundTruthUnavailable("unsupported", "tokens not grouped by request in request order: no append "
                                                    "indptr describes them")
    batch = x["kv_last_page_len"].shape[0]
    counts = torch.bincount(requests, minlength=batch)
    append_indptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)
    page_size = x[form(call.definition)[2]].shape[1]
    seq_lens = page.get_seq_lens(x["kv_indptr"], x["kv_last_page_len"], page_size)
    nnz = int(requests.numel())
    if call.mode == "fi-positions":
        return fn(append_indptr, seq_lens, nnz)
    device = requests.device
    out_b = torch.full((nnz,), -7, dtype=torch.int32, device=device)
    out_p = torch.full((nnz,), -7, dtype=torch.int32, device=device)
    fn(append_indptr, seq_lens, nnz, batch_indices=out_b, positions=out_p)
    return out_b, out_p  # what the preallocated tensors hold, whatever the call returned


def _to_layout(cache: torch.Tensor, hnd: bool) -> torch.Tensor:
    return cache.transpose(1, 2).contiguous() if hnd else cache.clone()


def append_kv(call: Call) -> tuple:
    """Both caches after the call, NHD, on the path `call.mode` names."""
    fi, x, mode = call.module, call.inputs.values, call.mode or ""
    hnd = mode.startswith("hnd")
    k, v = _to_layout(x["k_cache"], hnd), _to_layout(x["v_cache"], hnd)
    single = mode.endswith("single-tensor")
    cache = torch.stack([k, v], dim=1) if single else (k, v)
    batch_indices, positions = token_indices(call)
    fi.page.append_paged_kv_cache(x["append_key"], x["append_value"], batch_indices, positions, cache,
                                  x["kv_indices"], x["kv_indptr"], x["kv_last_page_len"],
                                  kv_layout="HND" if hnd else "NHD")
    k, v = (cache[:, 0], cache[:, 1]) if single else cache
    return tuple(t.transpose(1, 2).contiguous() if hnd else t for t in (k, v))


def append_mla(call: Call) -> tuple:
    fi, x = call.module, call.inputs.values
    ckv, kpe = x["ckv_cache"].clone(), x["kpe_cache"].clone()
    batch_indices, positions = token_indices(call)
    fi.page.append_paged_mla_kv_cache(x["append_ckv"], x["append_kpe"], batch_indices, positions, ckv, kpe,
                                      x["kv_indices"], x["kv_indptr"], x["kv_last_page_len"])
    return ckv, kpe


def plan(call: Call):
    """The plain call on the call's own caches (what a CUDA graph captures): a launch returning them."""
    fi, x = call.module, call.inputs.values
    rows, other, first, second = form(call.definition)
    if first == "k_cache":
        def launch():
            fi.page.append_paged_kv_cache(x[rows], x[other], x["batch_indices"], x["positions"], (x[first], x[second]),
                                          x["kv_indices"], x["kv_indptr"], x["kv_last_page_len"], kv_layout="NHD")
            return x[first], x[second]
    else:
        def launch():
            fi.page.append_paged_mla_kv_cache(x[rows], x[other], x["batch_indices"], x["positions"], x[first],
                                              x[second], x["kv_indices"], x["kv_indptr"], x["kv_last_page_len"])
            return x[first], x[second]
    return launch


_KV = dict(package=PACKAGE, versions=SpecifierSet(">=0.2.0"), requires=("page.append_paged_kv_cache",),
           needs_cuda=True, plan=plan)
ADAPTERS = [
    Adapter("flashinfer", "page_append", "flashinfer.page.append_paged_kv_cache", append_kv, applies=kv_applies(False),
            dtypes=HALF, modes=(*KV_MODES, "graph"), **_KV),
    Adapter("flashinfer", "page_append", "flashinfer.page.append_paged_kv_cache(fp8 cache)", append_kv,
            applies=kv_applies(True), dtypes=CACHE_DTYPES, modes=KV_MODES, **_KV),
    Adapter("flashinfer", "page_append", "flashinfer.page.append_paged_mla_kv_cache", append_mla, package=PACKAGE,
            versions=SpecifierSet(">=0.2.4"), requires=("page.append_paged_mla_kv_cache",), applies=mla_applies,
            dtypes=HALF, needs_cuda=True, modes=(*MLA_MODES, "graph"), plan=plan),
]

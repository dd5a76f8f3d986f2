"""Values across the worker boundary: tensors through shared memory, everything else as JSON.

Tensors never go through the pipe. Each CPU worker has an arena of its own, a memfd sized for its
call and sealed before the worker gets it (`HostArena`: it can neither shrink the file under the
parent's mapping nor grow it), closed when the worker ends; a GPU worker shares its device's CUDA
buffer, sent by CUDA IPC and zeroed by the parent before each new worker sees it. A call copies its
input tensors into the arena (a memcpy, device to device on a GPU), the worker runs the reference on
views of it and copies its output tensors behind them; the parent clones them out.

Only the parent->worker direction uses pickle (the CUDA IPC handle, at start). What comes back is
JSON that `decode` checks like any untrusted input: dtype names from a fixed table, shapes of bounded
non-negative ints, offsets and sizes inside the arena, bounded depth, counts and string lengths.
"""

from __future__ import annotations

import errno
import fcntl
import math
import mmap
import os
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["ALIGN", "Arenas", "HostArena", "ProtocolError", "decode", "encode", "tensor_bytes"]

ALIGN = 256
MAX_DEPTH = 32
MAX_NODES = 100_000
MAX_STR = 1 << 20
MAX_DIMS = 16
_DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "int64", "int32", "int16", "int8",
                "uint8", "uint16", "uint32", "uint64", "bool", "complex64", "complex128")
DTYPES: dict[str, torch.dtype] = {n: getattr(torch, n) for n in _DTYPE_NAMES if isinstance(getattr(torch, n, None),
                                                                                           torch.dtype)}
_DTYPE_NAME = {v: k for k, v in DTYPES.items()}


class ProtocolError(ValueError):
    """A message from the worker that is not a valid answer."""


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class HostArena:
    """One worker's CPU arena: a memfd sized once, then sealed, closed when the worker ends.

    Sealed against growth, shrinking and further seals (F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) before
    any worker holds it: a worker that shrinks it would fault the parent's mapping with SIGBUS, one that
    grows it (ftruncate, posix_fallocate to 1 TiB) would make it unusable. Its own per worker, so no
    reference ever maps what another wrote (a fresh memfd reads as zeros): a call that needs more gets a
    new worker with a larger arena. OSError (or ValueError) when it cannot be sized or mapped."""

    SEALS = fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL

    def __init__(self, size: int) -> None:
        page = mmap.PAGESIZE
        self.size = max(page, (int(size) + page - 1) // page * page)
        self.fd = os.memfd_create("flashinfer-trace-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, self.size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, self.SEALS)
            if fcntl.fcntl(self.fd, fcntl.F_GET_SEALS) & self.SEALS != self.SEALS or os.fstat(self.fd).st_size != \
                    self.size:
                raise OSError(errno.EPERM, "the arena's memfd did not take its seals")
            self.map: mmap.mmap | None = mmap.mmap(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise
        self.tensor = torch.frombuffer(self.map, dtype=torch.uint8)

    def release(self, keep: int = 64 << 20) -> None:
        """Give the pages past the first `keep` bytes back to the system (a 1 GB MoE weight would
        otherwise stay resident twice); the mapping stays, the next call faults them in again."""
        if self.map is not None and self.size > keep:
            try:
                self.map.madvise(mmap.MADV_REMOVE, keep, self.size - keep)
            except (AttributeError, OSError, ValueError):
                pass

    def close(self) -> None:
        """Drop the parent's mapping and descriptor; the memory goes with the last user (the worker's
        mapping dies with it; outputs were cloned out)."""
        self.tensor = torch.empty(0, dtype=torch.uint8)
        self.map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def map_host_arena(fd: int) -> torch.Tensor:
    """The worker's view of its CPU arena, all of it (sealed: its size cannot change)."""
    return torch.frombuffer(mmap.mmap(fd, os.fstat(fd).st_size), dtype=torch.uint8)


@dataclass
class Arenas:
    """The byte buffers a call lays its tensors into, per device kind, with a cursor each."""

    buffers: dict[str, torch.Tensor]  # "cpu" -> uint8 tensor, "cuda" -> uint8 tensor on the worker's GPU
    cursor: dict[str, int] = field(default_factory=dict)

    def place(self, kind: str, nbytes: int) -> int:
        off = self.cursor.get(kind, 0)
        self.cursor[kind] = _align(off + nbytes)
        return off

    def view(self, kind: str, off: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        return self.buffers[kind][off:off + nbytes].view(dtype).view(shape)


def _kind(t: torch.Tensor) -> str:
    if t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"a tensor on {t.device} cannot cross the worker boundary")
    return t.device.type


def needed(value: Any, start: dict[str, int] | None = None) -> dict[str, int]:
    """Bytes per device kind that `encode` will lay out for value, after `start`."""
    need = dict(start or {})
    for t in _tensors(value):
        kind = _kind(t)
        need[kind] = _align(need.get(kind, 0) + tensor_bytes(t))
    return need


def _tensors(value: Any):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def encode(value: Any, arenas: Arenas, depth: int = 0) -> Any:
    """A JSON-able description of value; its tensors are copied into the arenas (which must be large
    enough: see `needed`)."""
    if depth > MAX_DEPTH:
        raise TypeError("value nested too deeply to cross the worker boundary")
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"t": "py", "v": value}
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.dtype not in _DTYPE_NAME or t.is_sparse or t.is_quantized:
            raise TypeError(f"a {t.dtype} tensor ({t.layout}) cannot cross the worker boundary")
        kind = _kind(t)
        off = arenas.place(kind, tensor_bytes(t))
        if t.numel():
            arenas.view(kind, off, t.dtype, list(t.shape)).copy_(t)
        return {"t": "tensor", "dev": kind, "dtype": _DTYPE_NAME[t.dtype], "shape": list(t.shape), "off": off}
    if isinstance(value, torch.Size):
        return {"t": "seq", "kind": "tuple", "v": [encode(int(v), arenas, depth + 1) for v in value]}
    if isinstance(value, (list, tuple)):
        kind = "list" if isinstance(value, list) else "tuple"
        return {"t": "seq", "kind": kind, "v": [encode(v, arenas, depth + 1) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"t": "dict", "v": [[k, encode(v, arenas, depth + 1)] for k, v in value.items()]}
    if isinstance(value, torch.dtype) and value in _DTYPE_NAME:
        return {"t": "dtype", "v": _DTYPE_NAME[value]}
    raise TypeError(f"a value of type {type(value).__name__} cannot cross the worker boundary")


@dataclass
class _Budget:
    nodes: int = 0


def decode(spec: Any, arenas: Arenas, *, clone: bool, limits: dict[str, int] | None = None,
           depth: int = 0, budget: _Budget | None = None) -> Any:
    """The value `encode` described. `clone`: copy tensors out of the arena (the parent) or view it
    (the worker). `limits`: bytes per arena kind that tensors must lie within. Raises ProtocolError."""
    budget = budget or _Budget()
    budget.nodes += 1
    if depth > MAX_DEPTH or budget.nodes > MAX_NODES:
        raise ProtocolError("value too deep or too large")
    if not isinstance(spec, dict) or not isinstance(spec.get("t"), str):
        raise ProtocolError(f"not a value description: {str(spec)[:80]!r}")
    t = spec["t"]
    if t == "py":
        v = spec.get("v")
        if v is not None and type(v) not in (bool, int, float, str):
            raise ProtocolError(f"not a plain value: {type(v).__name__}")
        if type(v) is str and len(v) > MAX_STR:
            raise ProtocolError("string too long")
        return v
    if t == "tensor":
        return _decode_tensor(spec, arenas, clone=clone, limits=limits)
    if t == "seq":
        items = spec.get("v")
        if not isinstance(items, list) or spec.get("kind") not in ("list", "tuple"):
            raise ProtocolError("malformed sequence")
        out = [decode(s, arenas, clone=clone, limits=limits, depth=depth + 1, budget=budget) for s in items]
        return out if spec["kind"] == "list" else tuple(out)
    if t == "dict":
        pairs = spec.get("v")
        if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
                                                  for p in pairs):
            raise ProtocolError("malformed dict")
        return {k: decode(s, arenas, clone=clone, limits=limits, depth=depth + 1, budget=budget) for k, s in pairs}
    if t == "dtype":
        if spec.get("v") not in DTYPES:
            raise ProtocolError(f"unknown dtype {str(spec.get('v'))[:40]!r}")
        return DTYPES[spec["v"]]
    raise ProtocolError(f"unknown value kind {t[:40]!r}")


def _decode_tensor(spec: dict, arenas: Arenas, *, clone: bool, limits: dict[str, int] | None) -> torch.Tensor:
    kind, dtype, shape, off = spec.get("dev"), spec.get("dtype"), spec.get("shape"), spec.get("off")
    if kind not in arenas.buffers:
        raise ProtocolError(f"tensor on an unknown arena {str(kind)[:20]!r}")
    if dtype not in DTYPES:
        raise ProtocolError(f"unknown dtype {str(dtype)[:40]!r}")
    if not (isinstance(shape, list) and len(shape) <= MAX_DIMS
            and all(type(s) is int and 0 <= s < 2**62 for s in shape)):
        raise ProtocolError("malformed shape")
    if type(off) is not int or off < 0 or off % ALIGN:
        raise ProtocolError("malformed offset")
    nbytes = math.prod(shape) * DTYPES[dtype].itemsize
    end = (limits or {}).get(kind, arenas.buffers[kind].numel())
    if off + nbytes > min(end, arenas.buffers[kind].numel()):
        raise ProtocolError(f"tensor of {nbytes} bytes at {off} lies outside the arena")
    view = arenas.view(kind, off, DTYPES[dtype], shape)
    return view.clone() if clone else view

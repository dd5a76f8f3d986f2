"""Shared machinery of the input generators: seeded streams, random tensors, and the checks every
generated case passes before anyone sees it.

Reproducibility is the point of this module. A case is named by (seed, definition, size, case) and
must come out bit-identical on every call and every machine, whatever device it is moved to, so:

* every tensor is made on the CPU from its own `torch.Generator`, seeded from a SHA-256 of the case
  key plus a stream tag (never Python's salted `hash()`, never the global RNG); adding an input or
  reordering the code of one generator does not shift the data of the others;
* randomness comes only from integer draws (`random_`, `randint`, `randperm`: serial Mersenne
  Twister, the same bits on every CPU), turned into floats with exact or IEEE-rounded operations.
  `torch.randn` is avoided on purpose: its CPU kernel has a vectorised AVX2 path and a scalar path
  that give different bits (checked with ATEN_CPU_CAPABILITY=default vs avx2 on torch 2.13), so the
  same seed would give different inputs on different hosts.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import torch

from ..constraints import ConstraintError, check_all
from ..dtypes import DType, torch_dtype

if TYPE_CHECKING:
    from ..definition import Definition, TensorSpec

SIZES = ("small", "medium", "large")


class InputGenerationError(ValueError):
    """Inputs could not be generated for a definition; the message names the definition and why."""

    def __init__(self, message: str, *, definition: str | None = None):
        super().__init__(f"{definition}: {message}" if definition else message)
        self.definition = definition


class UnsupportedOpType(InputGenerationError):
    """No generator knows the definition's op_type (callers such as `run --all` skip these)."""


# -- the result -------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Inputs:
    """One generated case: the values to call `run(*inputs.args())` with, and every axis's value."""

    definition: str
    size: str
    seed: int
    case: str | None
    values: dict[str, Any]  # input name -> tensor or Python scalar, in the definition's input order
    axes: dict[str, int] = field(default_factory=dict)  # every axis (const and var) -> its value

    def args(self) -> list[Any]:
        return list(self.values.values())

    def clone(self) -> Inputs:
        """A copy with every tensor cloned, for kernels that write into their inputs."""
        return self._map(lambda t: t.clone())

    def to(self, device: str | torch.device) -> Inputs:
        return self._map(lambda t: t.to(device))

    @property
    def device(self) -> str:
        """Where the tensors are: "cpu", "cuda" (the default CUDA device) or "cuda:N"."""
        for v in self.values.values():
            if isinstance(v, torch.Tensor):
                return "cuda" if v.device.type == "cuda" and v.device.index in (None, 0) else str(v.device)
        return "cpu"

    def on(self, device: str) -> Inputs:
        """These inputs on `device`: themselves when already there, else moved copies."""
        return self if self.device == device else self.to(device)

    def _map(self, fn) -> Inputs:
        values = {k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in self.values.items()}
        return Inputs(self.definition, self.size, self.seed, self.case, values, dict(self.axes))

    def __repr__(self) -> str:
        parts = []
        for k, v in self.values.items():
            if isinstance(v, torch.Tensor):
                parts.append(f"{k}={tuple(v.shape)}:{str(v.dtype).replace('torch.', '')}")
            else:
                parts.append(f"{k}={v!r}")
        return (f"Inputs({self.definition}, size={self.size}, seed={self.seed}, case={self.case}, "
                + ", ".join(parts) + ")")


# -- seeded streams ---------------------------------------------------------------------------------
def stream_seed(*parts: Any) -> int:
    """A 63-bit seed from the parts' reprs, stable across processes, platforms and Python versions."""
    text = "\x1f".join(repr(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def generator(*parts: Any) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(stream_seed(*parts))


def _numel(shape: Sequence[int]) -> int:
    return math.prod(int(s) for s in shape)


_BLOCK_WORDS = 1 << 21  # 16 MiB: above this, random words are drawn in blocks on several threads


def random_words64(n: int, gen: torch.Generator) -> torch.Tensor:
    """n uniform 64-bit words: the cheapest source of random bits torch has on the CPU.

    The Mersenne Twister is serial (~100 ms per 100 MB), so a large request is cut into fixed
    16 MiB blocks, each with its own generator seeded from one draw of `gen` and the block's
    index, filled on a thread pool (torch releases the GIL). The blocks, not the threads,
    decide the bits: any thread count gives the same words.
    """
    out = torch.empty(n, dtype=torch.int64)
    if n <= _BLOCK_WORDS:
        return out.random_(-(2**63), None, generator=gen)
    base = int(torch.randint(0, 2**62, (1,), generator=gen))
    starts = range(0, n, _BLOCK_WORDS)

    def fill(i: int) -> None:
        block = out[starts[i]:starts[i] + _BLOCK_WORDS]
        block.random_(-(2**63), None, generator=generator("block", base, i))

    workers = max(1, min(torch.get_num_threads(), len(starts)))
    if workers == 1:
        for i in range(len(starts)):
            fill(i)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(fill, range(len(starts))))
    return out


def random_words32(n: int, gen: torch.Generator) -> torch.Tensor:
    """n uniform 32-bit words (int32), cut from 64-bit draws."""
    return random_words64((n + 1) // 2, gen).view(torch.int32)[:n]


def uniform(shape: Sequence[int], gen: torch.Generator) -> torch.Tensor:
    """float32 uniform on [0, 1) with 24 random bits each: exact integer-to-float steps only."""
    w = random_words32(_numel(shape), gen)
    return ((w >> 8) & 0xFFFFFF).to(torch.float32).mul_(2.0**-24).reshape(tuple(shape))


def randint(low: int, high: int, shape: Sequence[int], gen: torch.Generator,
            dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Integers uniform on [low, high)."""
    if high <= low:
        raise ValueError(f"empty range [{low}, {high})")
    return torch.randint(low, high, tuple(shape), generator=gen, dtype=torch.int64).to(dtype)


_BITS = 16
_BINS = 1 << _BITS
_TAIL = 3.2e-5  # Phi(-4): the tables span +-4 sigma, enough tail for test data


@cache
def _inv_cdf_edges() -> torch.Tensor:
    """Inverse normal CDF at 65537 evenly spaced probabilities (float64, exactly antisymmetric)."""
    nd = NormalDist()
    half = [nd.inv_cdf(_TAIL + (1 - 2 * _TAIL) * j / _BINS) for j in range(_BINS // 2)]
    return torch.tensor(half + [0.0] + [-x for x in reversed(half)], dtype=torch.float64)


@cache
def _interp_tables() -> tuple[torch.Tensor, torch.Tensor]:
    edges = _inv_cdf_edges()
    return edges[:-1].to(torch.float32), (edges[1:] - edges[:-1]).to(torch.float32)


@cache
def _bin_midpoints() -> torch.Tensor:
    edges = _inv_cdf_edges()
    return ((edges[:-1] + edges[1:]) / 2).to(torch.float32)


_CHUNK = 1 << 24  # elements per step: bounds temporary memory; a multiple of 4, so draws line up


def random_indices16(n: int, gen: torch.Generator) -> torch.Tensor:
    """n uniform integers in [0, 65536) as int32, four per 64-bit draw."""
    return random_words64((n + 3) // 4, gen).view(torch.uint16)[:n].to(torch.int32)


def normal(shape: Sequence[int], gen: torch.Generator, *, scale: float = 1.0, mean: float = 0.0,
           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard-normal-like samples * scale + mean, as dtype, via an inverse-CDF table.

    16-bit types: 16 random bits pick one of 65536 equiprobable bins and the bin's midpoint,
    already scaled and cast, is gathered (one gather per element, several times faster than
    the float path, and bf16 cannot tell the bins apart anyway). float32/64: 32 bits, the low 16 placing
    the value linearly inside its bin, so ties (which make top-k routing ambiguous) are as rare
    as with randn. Tails are cut at 4 sigma. Only gathers and single IEEE operations, so the
    bits do not depend on the CPU (unlike `torch.randn`).
    """
    n = _numel(shape)
    out = torch.empty(n, dtype=dtype)
    if dtype in (torch.float32, torch.float64):
        base, step = _interp_tables()
        for start in range(0, n, _CHUNK):
            m = min(_CHUNK, n - start)
            w = random_words32(m, gen)
            idx = (w >> _BITS) & (_BINS - 1)
            frac = (w & (_BINS - 1)).to(torch.float32).mul_(2.0**-_BITS)
            # two roundings, never an FMA, so every CPU computes the same bits
            x = torch.index_select(base, 0, idx) + torch.index_select(step, 0, idx) * frac
            if scale != 1.0:
                x.mul_(scale)
            if mean != 0.0:
                x.add_(mean)
            out[start:start + m] = x
    else:
        table = _bin_midpoints() * scale
        if mean != 0.0:
            table = table + mean
        table = table.to(dtype)
        for start in range(0, n, _CHUNK):
            m = min(_CHUNK, n - start)
            torch.index_select(table, 0, random_indices16(m, gen), out=out[start:start + m])
    return out.reshape(tuple(shape))


def log_uniform(shape: Sequence[int], gen: torch.Generator, lo_log2: float, hi_log2: float) -> torch.Tensor:
    """float32 2**U(lo, hi): positive values spread evenly over a range of binades (scales)."""
    u = uniform(shape, gen).to(torch.float64)
    return torch.exp2(u * (hi_log2 - lo_log2) + lo_log2).to(torch.float32)


def _signed64(mask: int) -> int:
    return mask - (1 << 64) if mask >= 1 << 63 else mask


# Byte masks that turn random bytes into finite fp8 codes of modest magnitude: the sign and low bits
# stay random, the exponent field is forced into 4 binades. No NaN/inf code (e4m3fn: 0x7F/0xFF) can
# come out, and every value is in [0.125, 1.875] in magnitude, so block scales set the real size.
_FP8_MASKS = {
    torch.float8_e4m3fn: (0x9F, 0x20),  # s 01xx mmm: exponent field 4..7, |x| in [2^-3, 1.875]
    torch.float8_e5m2: (0x8F, 0x30),  # s 011xx mm: exponent field 12..15, |x| in [2^-3, 1.75]
}
FP8_CODE_RMS = 0.845  # root mean square of the e4m3 codes above (uniform over their 32 magnitudes)


def random_fp8(shape: Sequence[int], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random fp8 tensor straight from random bytes: ~1 s per GB, no float round trip."""
    and_mask, or_mask = _FP8_MASKS[dtype]
    n = _numel(shape)
    words = random_words64((n + 7) // 8, gen)
    words.bitwise_and_(_signed64(int.from_bytes(bytes([and_mask]) * 8, "little")))
    words.bitwise_or_(_signed64(int.from_bytes(bytes([or_mask]) * 8, "little")))
    flat = words.view(torch.uint8)[:n]
    if flat.numel() != words.numel() * 8:
        flat = flat.clone()  # drop the few padding bytes
    return flat.view(dtype).reshape(tuple(shape))


def random_tensor(shape: Sequence[int], dtype: DType | str | torch.dtype, gen: torch.Generator, *,
                  scale: float = 1.0, mean: float = 0.0, low: int | None = None,
                  high: int | None = None) -> torch.Tensor:
    """A random tensor of a format dtype: floats normal*scale+mean, fp8 via the byte path, ints
    uniform on [low, high) (required: no default range is right for indices), bools fair coins."""
    tdtype = dtype if isinstance(dtype, torch.dtype) else torch_dtype(dtype)
    if tdtype in _FP8_MASKS:
        return random_fp8(shape, tdtype, gen)
    if tdtype == torch.bool:
        return randint(0, 2, shape, gen).bool()
    if tdtype.is_floating_point:
        return normal(shape, gen, scale=scale, mean=mean, dtype=tdtype)
    if tdtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        if low is None or high is None:
            raise ValueError(f"an integer tensor needs an explicit range, got low={low} high={high}")
        return randint(low, high, shape, gen, dtype=tdtype)
    raise ValueError(f"no random generator for dtype {tdtype}")


# -- building one case ------------------------------------------------------------------------------
_INT_DTYPES = {DType.int8, DType.int16, DType.int32, DType.int64}


class Builder:
    """What a family generator fills in: axis values and input values, with checks as it goes.

    `put` binds the var axes of an input's shape from the tensor given, so structural tensors
    (indptr, indices) bind their axes by being generated; `shape` reads an input's shape from the
    axes bound so far. `finish` checks everything against the definition and its constraints.
    """

    def __init__(self, definition: Definition, size: str, seed: int, case: str | None):
        self.definition = definition
        self.size = size
        self.seed = seed
        self.case = case
        self.axes: dict[str, int] = dict(definition.const_axes)
        self.values: dict[str, Any] = {}

    # -- errors and randomness
    def error(self, message: str) -> InputGenerationError:
        return InputGenerationError(message, definition=self.definition.name)

    def rng(self, tag: str) -> torch.Generator:
        """The generator of one named stream of this case."""
        return generator("flashinfer-trace-inputs/v1", self.seed, self.definition.name, self.size,
                         self.case, tag)

    # -- reading the definition
    def has(self, name: str) -> bool:
        return name in self.definition.inputs

    def spec(self, name: str) -> TensorSpec:
        try:
            return self.definition.inputs[name]
        except KeyError:
            raise self.error(f"has no input {name!r}") from None

    def torch_dtype(self, name: str) -> torch.dtype:
        return torch_dtype(self.spec(name).dtype)

    def dim_axis(self, name: str, i: int) -> str:
        shape = self.spec(name).shape
        if not shape or not -len(shape) <= i < len(shape):
            raise self.error(f"input {name!r} has shape {shape}, expected a dimension {i}")
        return shape[i]

    def axis(self, name: str) -> int:
        if name not in self.axes:
            raise self.error(f"axis {name!r} has no value yet (the generator cannot derive it)")
        return self.axes[name]

    def dim(self, name: str, i: int) -> int:
        """The value of dimension i of an input, from the axes bound so far."""
        return self.axis(self.dim_axis(name, i))

    def shape(self, name: str) -> tuple[int, ...]:
        spec = self.spec(name)
        if spec.shape is None:
            raise self.error(f"input {name!r} is a scalar, not a tensor")
        return tuple(self.axis(a) for a in spec.shape)

    # -- writing
    def set_axis(self, name: str, value: int) -> None:
        if name not in self.definition.axes:
            raise self.error(f"axis {name!r} is not declared")
        value = int(value)
        if name in self.axes and self.axes[name] != value:
            kind = "const" if name in self.definition.const_axes else "var"
            raise self.error(f"{kind} axis {name!r} is {self.axes[name]}, but the generator needs {value}")
        self.axes[name] = value

    def set_dim(self, name: str, i: int, value: int) -> None:
        """Bind the axis of dimension i of an input (a const axis must already agree)."""
        self.set_axis(self.dim_axis(name, i), value)

    def put(self, name: str, value: Any) -> None:
        """Record an input value; a tensor's shape binds (or must match) the axes of its spec."""
        spec = self.spec(name)
        if isinstance(value, torch.Tensor) and spec.shape is not None:
            if value.dim() != len(spec.shape):
                raise self.error(f"input {name!r}: generated {value.dim()}-d tensor, spec is {spec.shape}")
            for axis, n in zip(spec.shape, value.shape, strict=True):
                self.set_axis(axis, n)
        self.values[name] = value

    def put_random(self, name: str, *, scale: float = 1.0, mean: float = 0.0, low: int | None = None,
                   high: int | None = None, tag: str | None = None) -> torch.Tensor:
        """A random tensor of the input's shape (axes must be bound) and dtype, on its own stream."""
        t = random_tensor(self.shape(name), self.spec(name).dtype, self.rng(tag or name), scale=scale,
                          mean=mean, low=low, high=high)
        self.put(name, t)
        return t

    def put_scalar(self, name: str, value: float | int | bool) -> None:
        """A Python scalar (shape null) or 0-d tensor (shape []), rounded to the spec's dtype."""
        spec = self.spec(name)
        if spec.shape not in (None, []):
            raise self.error(f"input {name!r} has shape {spec.shape}, expected a scalar")
        t = torch.tensor(value, dtype=torch_dtype(spec.dtype))
        self.put(name, t.item() if spec.shape is None else t)

    # -- the checks
    def finish(self) -> Inputs:
        d = self.definition
        missing = [n for n in d.inputs if n not in self.values]
        if missing:
            raise self.error(f"no value generated for input(s) {', '.join(missing)}")
        for name, spec in d.inputs.items():
            self._check_value(name, spec, self.values[name])
        unbound = [a for a in d.axes if a not in self.axes]
        if unbound:
            raise self.error(f"axis value(s) not determined: {', '.join(unbound)}")
        axes = {a: self.axes[a] for a in d.axes}
        values = {n: self.values[n] for n in d.inputs}
        try:
            check_all(d.constraints, {**axes, **values}, definition=d.name)
        except ConstraintError as e:
            raise InputGenerationError(str(e)) from None
        return Inputs(d.name, self.size, self.seed, self.case, values, axes)

    def _check_value(self, name: str, spec: TensorSpec, value: Any) -> None:
        if spec.shape is None:
            if spec.dtype == DType.bool:
                ok = isinstance(value, bool)
            elif spec.dtype in _INT_DTYPES:
                ok = isinstance(value, int) and not isinstance(value, bool)
            else:
                ok = isinstance(value, float)
            if not ok:
                raise self.error(f"input {name!r}: expected a Python {spec.dtype.value} scalar, "
                                 f"got {type(value).__name__}")
            return
        if not isinstance(value, torch.Tensor):
            raise self.error(f"input {name!r}: expected a tensor, got {type(value).__name__}")
        want = tuple(self.axis(a) for a in spec.shape)
        if tuple(value.shape) != want:
            raise self.error(f"input {name!r}: shape {tuple(value.shape)}, expected {want} {spec.shape}")
        if value.dtype != torch_dtype(spec.dtype):
            raise self.error(f"input {name!r}: dtype {value.dtype}, expected {spec.dtype.value}")
        if value.is_floating_point() and value.dtype not in _FP8_MASKS and value.numel():
            if not bool(torch.isfinite(value).all()):
                raise self.error(f"input {name!r}: generated non-finite values")


# -- helpers shared by the simple families ----------------------------------------------------------
def float_tensor_inputs(b: Builder) -> list[str]:
    return [n for n, s in b.definition.inputs.items() if s.shape is not None and s.dtype.is_float]


def bind_rows(b: Builder, names: Sequence[str], rows: int) -> None:
    """Give the leading dimension of each named input (tokens, batch) the value `rows`.

    A const leading axis is left alone: the definition fixed it, and `put` will check it.
    """
    for name in names:
        axis = b.dim_axis(name, 0)
        if axis not in b.definition.const_axes:
            b.set_axis(axis, rows)


def unknown_inputs(b: Builder, known: Sequence[str], family: str) -> None:
    """Fail loudly on inputs a family does not know how to make (a guess would test nothing)."""
    extra = [n for n in b.definition.inputs if n not in known]
    if extra:
        raise b.error(f"the {family} generator does not know input(s) {', '.join(extra)} "
                      f"(it knows {', '.join(known)})")

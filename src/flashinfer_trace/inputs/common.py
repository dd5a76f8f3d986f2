"""Shared machinery of the input generators: seeded streams, random tensors, and the checks every
generated case passes before anyone sees it.

Reproducibility is the point of this module. A case is named by (seed, definition, size, case) and
must come out bit-identical on every call, every machine and every device, because a failure found
on a GPU is replayed on a CPU (and the other way round) from those four values alone. And the
tensors are made where they are used: a 1 GB lm_head weight for a GPU is drawn on the GPU, never
built on the CPU first and copied. So:

* every tensor draws from its own named stream, keyed by a SHA-256 of the case key plus a stream
  tag (never Python's salted `hash()`, never a global RNG); adding an input or reordering the code
  of one generator does not shift the data of the others;
* the streams are counter-based (SplitMix64: word i of a stream is a bijective integer mix of
  key + (i + 1) * GAMMA), computed with int64 tensor ops only (add, multiply, xor, and, shift), which
  are exact and identical on a CPU and in CUDA; `mix64` is the plain-Python definition. Any word can
  be computed on its own, so a large tensor is filled on its device in fixed-size chunks (a bounded
  amount of temporary memory), and the chunking never changes which word feeds which element;
* words become values only through steps that are exact or correctly rounded, one torch op at a
  time: bit masks, int-to-float conversion of integers below 2^24, multiplication by powers of two,
  single float32 adds and multiplies, and gathers from tables made on the CPU (the normal
  distribution is an inverse-CDF table). No transcendental function and no reduction runs on the
  device (their last bits differ between CPU and GPU), and no `torch.randn`/`rand`/`randperm`
  (device-specific algorithms; `torch.randn`'s CPU kernel even gives different bits with and
  without AVX2). A permutation is an argsort of distinct random keys;
* the few values that need transcendental functions or reductions (rope's cos/sin cache, the
  sampling probabilities' softmax) are small and made on the CPU, then copied.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
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


def fixed_bytes(definition: Definition) -> int:
    """Bytes of the inputs whose every dimension is a const axis (weights, caches of a fixed size):
    what any size tier allocates at least. A public MoE with 384 local experts has 17 GB of them."""
    from ..dtypes import torch_dtype

    consts, total = definition.const_axes, 0
    for spec in definition.inputs.values():
        if spec.shape and spec.dtype is not None and all(a in consts for a in spec.shape):
            itemsize = torch.empty(0, dtype=torch_dtype(spec.dtype)).element_size()
            total += math.prod(consts[a] for a in spec.shape) * itemsize
    return total


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
    # fi_trace: inputs the reference's entry point does not take (Definition.reference_ignored): generated,
    # in `values`, but not among args()
    ignored: tuple[str, ...] = ()
    # where the values came from: our family generator, or an fi_trace definition's own `init`
    # ("fi_trace init", inputs/fitrace_init.py; check results record it)
    source: str = "generator"

    def args(self) -> list[Any]:
        return [v for k, v in self.values.items() if k not in self.ignored]

    def clone(self) -> Inputs:
        """A copy with every tensor cloned, for kernels that write into their inputs."""
        return self._map(lambda t: t.clone())

    def to(self, device: str | torch.device, *, copy: bool = False) -> Inputs:
        """These inputs on `device` (tensors already there are shared unless `copy`)."""
        return self._map(lambda t: t.to(device, copy=copy))

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
        return Inputs(self.definition, self.size, self.seed, self.case, values, dict(self.axes), self.ignored,
                      self.source)

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


_M64 = (1 << 64) - 1


def _i64(x: int) -> int:
    """A 64-bit pattern as the signed int64 that holds it in a tensor."""
    x &= _M64
    return x - (1 << 64) if x >> 63 else x


# SplitMix64 (Steele, Lea & Flood, 2014): word i of the stream with key k is mix(k + (i + 1) * GAMMA),
# mix being Stafford's "Mix13" finaliser, a bijection of 64-bit words. Two keys give the same words
# only where their counters differ by (k1 - k2) / GAMMA mod 2^64, a random 64-bit distance: streams of
# SHA-256 keys do not overlap within any tensor that fits in memory.
_GAMMA = 0x9E3779B97F4A7C15
_MIX = ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None))  # xorshift, then multiply


def mix64(key: int, counter: int) -> int:
    """Word `counter` of the stream `key` in plain Python integers: the definition that
    `counter_words` computes with tensors (the unit tests hold the two together)."""
    z = (key + (counter + 1) * _GAMMA) & _M64
    for shift, mult in _MIX:
        z ^= z >> shift
        if mult is not None:
            z = (z * mult) & _M64
    return z


_RAMPS: dict[torch.device, torch.Tensor] = {}
_RAMP_KEPT = 1 << 22  # words: the longest ramp kept per device (one CUDA chunk, 32 MiB)


def _gamma_ramp(n: int, device: torch.device) -> torch.Tensor:
    """i * GAMMA mod 2^64 for i < n (int64), kept per device: a chunk's counters then take one add."""
    ramp = _RAMPS.get(device)
    if ramp is None or ramp.numel() < n:
        ramp = torch.arange(n, dtype=torch.int64, device=device).mul_(_i64(_GAMMA))
        if n <= _RAMP_KEPT:
            _RAMPS[device] = ramp
    return ramp[:n]


def counter_words(key: int, start: int, n: int, device: torch.device | str = "cpu", *,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Words start .. start+n-1 of the stream `key` (the bits of `mix64`, as int64), made on `device`
    (or written into `out`, n contiguous int64 elements).

    Integer adds, multiplies, xors, ands and shifts only, each exact: an int64 multiply keeps the
    low 64 bits of the product (two's-complement wrap-around, on a CPU and in CUDA alike), which is
    the unsigned product mod 2^64; `>>` on int64 is arithmetic, so every shift is masked into a
    logical one.
    """
    z = torch.empty(n, dtype=torch.int64, device=device) if out is None else out
    torch.add(_gamma_ramp(n, z.device), _i64(key + (start + 1) * _GAMMA), out=z)  # key + (start+1+i)*GAMMA
    t = torch.empty_like(z)
    for shift, mult in _MIX:
        torch.bitwise_right_shift(z, shift, out=t)
        z.bitwise_xor_(t.bitwise_and_((1 << (64 - shift)) - 1))
        if mult is not None:
            z.mul_(_i64(mult))
    return z


class Stream:
    """A named random stream: consecutive draws take consecutive words of one SplitMix64 sequence.

    Like a `torch.Generator` it has a position, so a stream used for several draws gives each its
    own words; unlike one, any word can be computed on its own, on any device, so a tensor is made
    where it is used, in chunks, with the same bits everywhere.
    """

    __slots__ = ("key", "position")

    def __init__(self, key: int, position: int = 0):
        self.key = int(key) & _M64
        self.position = int(position)

    def take(self, n_words: int) -> int:
        """Reserve the next n_words words; returns the counter of the first."""
        start = self.position
        self.position += int(n_words)
        return start

    def __repr__(self) -> str:
        return f"Stream(key={self.key:#018x}, position={self.position})"


def stream(*parts: Any) -> Stream:
    return Stream(stream_seed(*parts))


def _numel(shape: Sequence[int]) -> int:
    return math.prod(int(s) for s in shape)


# Words per step of a chunked draw: bounds the temporaries (a few int64/int32 tensors of a chunk,
# whatever the size of the output: a 1 GB bf16 weight is 512 M elements) and keeps them in cache on a
# CPU. Chunks only decide how the work is cut, never which word feeds which element.
CHUNK_WORDS = {"cpu": 1 << 16, "cuda": 1 << 22}
_DEFAULT_CHUNK_WORDS = 1 << 20


def _device(device: torch.device | str | None) -> torch.device:
    return torch.device("cpu" if device is None else device)


def _chunks(s: Stream, n_words: int, device: torch.device):
    """(index of the chunk's first word in the draw, its counter, its word count) for the next n_words
    words of `s`, a chunk at a time."""
    first = s.take(n_words)
    step = max(1, CHUNK_WORDS.get(device.type, _DEFAULT_CHUNK_WORDS))
    for w0 in range(0, n_words, step):
        yield w0, first + w0, min(step, n_words - w0)


def _fill(out: torch.Tensor, per_word: int, s: Stream, convert) -> torch.Tensor:
    """Fill the contiguous 1-d `out` from the next ceil(n / per_word) words of `s`: element e comes from
    word e // per_word, so `convert(words, dst)` writes dst (the elements of those words, in order)."""
    n = out.numel()
    for w0, counter, m in _chunks(s, -(-n // per_word), out.device):
        convert(counter_words(s.key, counter, m, out.device), out[w0 * per_word:min(n, (w0 + m) * per_word)])
    return out


def random_words(n: int, s: Stream, device: torch.device | str | None = None) -> torch.Tensor:
    """n uniform 64-bit words (int64), one per element."""
    out = torch.empty(n, dtype=torch.int64, device=_device(device))
    for w0, counter, m in _chunks(s, n, out.device):
        counter_words(s.key, counter, m, out=out[w0:w0 + m])
    return out


def _words32(w: torch.Tensor, k: int) -> torch.Tensor:
    """The first k 32-bit halves of int64 words, low half first (as int32 bit patterns)."""
    return w.view(torch.int32)[:k]


def _indices16(w: torch.Tensor, k: int) -> torch.Tensor:
    """The first k 16-bit quarters of int64 words, lowest first, as int32 in [0, 65536)."""
    return w.view(torch.int16)[:k].to(torch.int32).bitwise_and_(0xFFFF)


def uniform(shape: Sequence[int], s: Stream, device: torch.device | str | None = None) -> torch.Tensor:
    """float32 uniform on [0, 1) with 24 random bits each, two per word: exact integer-to-float steps."""

    def convert(w, dst):
        bits = _words32(w, dst.numel()) >> 8
        torch.mul(bits.bitwise_and_(0xFFFFFF).to(torch.float32), 2.0**-24, out=dst)

    out = torch.empty(_numel(shape), dtype=torch.float32, device=_device(device))
    return _fill(out, 2, s, convert).reshape(tuple(shape))


def randint(low: int, high: int, shape: Sequence[int], s: Stream, dtype: torch.dtype = torch.int64,
            device: torch.device | str | None = None) -> torch.Tensor:
    """Integers uniform on [low, high): 63 random bits mod the range, one word each (the modulo
    bias, below range / 2^63, is far below anything a test could see)."""
    if high <= low:
        raise ValueError(f"empty range [{low}, {high})")
    span = high - low
    if span > 2**62:
        raise ValueError(f"range [{low}, {high}) is too wide")

    def convert(w, dst):
        dst.copy_(w.bitwise_and_((1 << 63) - 1).remainder_(span).add_(low))

    out = torch.empty(_numel(shape), dtype=torch.int64, device=_device(device))
    return _fill(out, 1, s, convert).reshape(tuple(shape)).to(dtype)


def permutation(n: int, s: Stream, rows: int | None = None,
                device: torch.device | str | None = None) -> torch.Tensor:
    """A uniformly random permutation of range(n) (int64), or `rows` independent ones [rows, n].

    Each element gets a random key whose low bits are its own index, so no two keys tie and any
    correct sort, on any device, gives the same order.
    """
    dev = _device(device)
    r = 1 if rows is None else rows
    bits = max(1, (n - 1).bit_length())
    keys = random_words(r * n, s, dev).view(r, n)
    keys.bitwise_and_(((1 << 63) - 1) & ~((1 << bits) - 1))  # non-negative, low bits cleared
    keys.bitwise_or_(torch.arange(n, dtype=torch.int64, device=dev))
    order = torch.argsort(keys, dim=-1, stable=True)
    return order[0] if rows is None else order


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


def _f32(x: float) -> float:
    """x rounded to float32: a scalar every device then uses as it is."""
    return torch.tensor(float(x), dtype=torch.float32).item()


def normal(shape: Sequence[int], s: Stream, *, scale: float = 1.0, mean: float = 0.0,
           dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """Standard-normal-like samples * scale + mean, as dtype, via an inverse-CDF table.

    16-bit types: 16 random bits (four per word) pick one of 65536 equiprobable bins and the bin's
    midpoint, already scaled and cast (on the CPU, then copied), is gathered: one gather per
    element, and bf16 cannot tell the bins apart anyway. float32/64: 32 bits (two per word), the low
    16 placing the value linearly inside its bin, so ties (which make top-k routing ambiguous) are
    as rare as with randn. Tails are cut at 4 sigma. Only gathers and single IEEE operations, each
    a separate op (never fused into an FMA), so the bits do not depend on the device.
    """
    dev = _device(device)
    n = _numel(shape)
    if dtype in (torch.float32, torch.float64):
        base, step = (t.to(dev) for t in _interp_tables())
        scale32, mean32 = _f32(scale), _f32(mean)

        def convert(w, dst):
            bits = _words32(w, dst.numel())
            idx = (bits >> _BITS).bitwise_and_(_BINS - 1)
            frac = (bits & (_BINS - 1)).to(torch.float32).mul_(2.0**-_BITS)
            x = torch.index_select(base, 0, idx)
            x.add_(torch.index_select(step, 0, idx).mul_(frac))  # two roundings: step * frac, then +
            if scale32 != 1.0:
                x.mul_(scale32)
            if mean32 != 0.0:
                x.add_(mean32)
            dst.copy_(x)

        out = _fill(torch.empty(n, dtype=torch.float32, device=dev), 2, s, convert).to(dtype)
    else:
        table = _bin_midpoints() * scale
        if mean != 0.0:
            table = table + mean
        table = table.to(dtype).to(dev)
        out = _fill(torch.empty(n, dtype=dtype, device=dev), 4, s,
                    lambda w, dst: torch.index_select(table, 0, _indices16(w, dst.numel()), out=dst))
    return out.reshape(tuple(shape))


@cache
def _exp2_table(lo_log2: float, hi_log2: float) -> torch.Tensor:
    """2 ** (midpoint of each of 65536 equal steps of [lo, hi)), float32, from Python's own pow."""
    width = (hi_log2 - lo_log2) / _BINS
    return torch.tensor([2.0 ** (lo_log2 + (j + 0.5) * width) for j in range(_BINS)], dtype=torch.float32)


def log_uniform(shape: Sequence[int], s: Stream, lo_log2: float, hi_log2: float,
                device: torch.device | str | None = None) -> torch.Tensor:
    """float32 2**U(lo, hi): positive values spread evenly over a range of binades (scales), on
    65536 levels (a table gather, so no exp2 of the device's own)."""
    dev = _device(device)
    table = _exp2_table(float(lo_log2), float(hi_log2)).to(dev)
    out = torch.empty(_numel(shape), dtype=torch.float32, device=dev)
    return _fill(out, 4, s, lambda w, dst: torch.index_select(table, 0, _indices16(w, dst.numel()), out=dst)
                 ).reshape(tuple(shape))


# Byte masks that turn random bytes into finite fp8 codes of modest magnitude: the sign and low bits
# stay random, the exponent field is forced into 4 binades. No NaN/inf code (e4m3fn: 0x7F/0xFF) can
# come out, and every value is in [0.125, 1.875] in magnitude, so block scales set the real size.
_FP8_MASKS = {
    torch.float8_e4m3fn: (0x9F, 0x20),  # s 01xx mmm: exponent field 4..7, |x| in [2^-3, 1.875]
    torch.float8_e5m2: (0x8F, 0x30),  # s 011xx mm: exponent field 12..15, |x| in [2^-3, 1.75]
}
FP8_CODE_RMS = 0.845  # root mean square of the e4m3 codes above (uniform over their 32 magnitudes)


def random_fp8(shape: Sequence[int], dtype: torch.dtype, s: Stream,
               device: torch.device | str | None = None) -> torch.Tensor:
    """Random fp8 tensor straight from random bytes (eight per word, lowest first), masked into
    finite codes: no float round trip."""
    and_mask, or_mask = (_i64(int.from_bytes(bytes([m]) * 8, "little")) for m in _FP8_MASKS[dtype])
    n = _numel(shape)
    words = torch.empty(-(-n // 8), dtype=torch.int64, device=_device(device))
    for w0, counter, m in _chunks(s, words.numel(), words.device):  # the words are the bytes: no copy
        counter_words(s.key, counter, m, out=words[w0:w0 + m]).bitwise_and_(and_mask).bitwise_or_(or_mask)
    flat = words.view(torch.uint8)[:n]
    if flat.numel() != words.numel() * 8:
        flat = flat.clone()  # drop the few padding bytes
    return flat.view(dtype).reshape(tuple(shape))


def random_tensor(shape: Sequence[int], dtype: DType | str | torch.dtype, s: Stream, *,
                  scale: float = 1.0, mean: float = 0.0, low: int | None = None,
                  high: int | None = None, device: torch.device | str | None = None) -> torch.Tensor:
    """A random tensor of a format dtype, made on `device`: floats normal*scale+mean, fp8 via the
    byte path, ints uniform on [low, high) (required: no default range is right for indices),
    bools fair coins."""
    tdtype = dtype if isinstance(dtype, torch.dtype) else torch_dtype(dtype)
    if tdtype in _FP8_MASKS:
        return random_fp8(shape, tdtype, s, device=device)
    if tdtype == torch.bool:
        return randint(0, 2, shape, s, device=device).bool()
    if tdtype.is_floating_point:
        return normal(shape, s, scale=scale, mean=mean, dtype=tdtype, device=device)
    if tdtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        if low is None or high is None:
            raise ValueError(f"an integer tensor needs an explicit range, got low={low} high={high}")
        return randint(low, high, shape, s, dtype=tdtype, device=device)
    raise ValueError(f"no random generator for dtype {tdtype}")


# -- building one case ------------------------------------------------------------------------------
_INT_DTYPES = {DType.int8, DType.int16, DType.int32, DType.int64}


class Builder:
    """What a family generator fills in: axis values and input values, with checks as it goes.

    `put` binds the var axes of an input's shape from the tensor given, so structural tensors
    (indptr, indices) bind their axes by being generated; `shape` reads an input's shape from the
    axes bound so far. `finish` checks everything against the definition and its constraints.

    `device` is where the inputs are made: `put_random` draws there directly, and `put` moves a
    tensor made elsewhere (small structural ones are made on the CPU) there.
    """

    def __init__(self, definition: Definition, size: str, seed: int, case: str | None,
                 device: torch.device | str = "cpu"):
        self.definition = definition
        self.size = size
        self.seed = seed
        self.case = case
        self.device = torch.device(device)
        self.axes: dict[str, int] = dict(definition.const_axes)
        self.values: dict[str, Any] = {}

    # -- errors and randomness
    def error(self, message: str) -> InputGenerationError:
        return InputGenerationError(message, definition=self.definition.name)

    def rng(self, tag: str) -> Stream:
        """One named random stream of this case."""
        return stream("flashinfer-trace-inputs/v2", self.seed, self.definition.name, self.size, self.case, tag)

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
        """Record an input value, a tensor on this builder's device; a tensor's shape binds (or
        must match) the axes of its spec."""
        spec = self.spec(name)
        if isinstance(value, torch.Tensor):
            if spec.shape is not None:
                if value.dim() != len(spec.shape):
                    raise self.error(f"input {name!r}: generated {value.dim()}-d tensor, spec is {spec.shape}")
                for axis, n in zip(spec.shape, value.shape, strict=True):
                    self.set_axis(axis, n)
            value = value.to(self.device)
        self.values[name] = value

    def put_random(self, name: str, *, scale: float = 1.0, mean: float = 0.0, low: int | None = None,
                   high: int | None = None, tag: str | None = None) -> torch.Tensor:
        """A random tensor of the input's shape (axes must be bound) and dtype, on its own stream,
        made on the builder's device."""
        t = random_tensor(self.shape(name), self.spec(name).dtype, self.rng(tag or name), scale=scale,
                          mean=mean, low=low, high=high, device=self.device)
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
        unused = set(d.unused_axes) | self._unsized_axes()  # fi_trace: declared var axes nothing sizes need no value
        unbound = [a for a in d.axes if a not in self.axes and a not in unused]
        if unbound:
            raise self.error(f"axis value(s) not determined: {', '.join(unbound)}")
        axes = {a: self.axes[a] for a in d.axes if a in self.axes}
        ignored = d.reference_ignored
        # args() in the order run() takes them; inputs the reference ignores last (kept, never passed)
        values = {n: self.values[n] for n in [*d.run_parameters, *ignored]}
        try:
            check_all(d.constraints, {**axes, **values}, definition=d.name)
        except ConstraintError as e:
            raise InputGenerationError(str(e)) from None
        return Inputs(d.name, self.size, self.seed, self.case, values, axes, tuple(ignored))

    def _unsized_axes(self) -> set[str]:
        """Var axes that may stay without a value (a subclass's say; none here)."""
        return set()

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
            if not _all_finite(value):
                raise self.error(f"input {name!r}: generated non-finite values")


_CHECK_CHUNK = 1 << 24  # elements: isfinite makes temporaries 2.5x a bf16 tensor's size; bound them


def _all_finite(t: torch.Tensor) -> bool:
    """No NaN or infinity in t, checked where t is, a chunk at a time, with one sync at the end."""
    flat = t.reshape(-1)
    ok = torch.ones((), dtype=torch.bool, device=t.device)
    for start in range(0, flat.numel(), _CHECK_CHUNK):
        ok &= torch.isfinite(flat[start:start + _CHECK_CHUNK]).all()
    return bool(ok)


# -- helpers shared by the simple families ----------------------------------------------------------
def float_tensor_inputs(b: Builder) -> list[str]:
    return [n for n, s in b.definition.inputs.items()
            if s.shape is not None and s.dtype is not None and s.dtype.is_float]


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

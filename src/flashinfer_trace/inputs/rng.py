"""The counter-based random streams of the input generators, and the random tensors drawn from them with the same
bits on every device (common.py re-exports every name, for the generators that import them from there).

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
from functools import cache, lru_cache
from statistics import NormalDist
from typing import Any

import torch

from ..dtypes import DType, torch_dtype


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


def _midpoint_table(scale: float, mean: float, dtype: torch.dtype) -> torch.Tensor:
    """The 16-bit path's table of bin midpoints * scale + mean as dtype, on the CPU (read only): made once per
    (scale, mean, dtype), since every tensor of a case asks for one and the test suites make ~10^5."""
    if type(scale) not in (int, float) or type(mean) not in (int, float):
        return _make_midpoint_table(scale, mean, dtype)
    return _cached_midpoint_table(scale, mean, dtype)


def _make_midpoint_table(scale: float, mean: float, dtype: torch.dtype) -> torch.Tensor:
    table = _bin_midpoints() * scale
    if mean != 0.0:
        table = table + mean
    return table.to(dtype)


_cached_midpoint_table = lru_cache(maxsize=256)(_make_midpoint_table)


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
        table = _midpoint_table(scale, mean, dtype).to(dev)
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

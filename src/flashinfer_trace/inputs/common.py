"""Shared machinery of the input generators: the case builder and the checks every generated case passes
before anyone sees it (the seeded streams and random tensors: rng.py, re-exported here).

Reproducibility is the point of this module. A case is named by (seed, definition, size, case) and
must come out bit-identical on every call, every machine and every device, because a failure found
on a GPU is replayed on a CPU (and the other way round) from those four values alone. And the
tensors are made where they are used: a 1 GB lm_head weight for a GPU is drawn on the GPU, never
built on the CPU first and copied. So:

* every tensor draws from its own named stream (`Builder.rng`), keyed by a SHA-256 of the case key plus a
  stream tag (never Python's salted `hash()`, never a global RNG); adding an input or reordering the code
  of one generator does not shift the data of the others;
* the streams, and the values drawn from them, are the same bits on a CPU and in CUDA: rng.py says how.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..constraints import ConstraintError, check_all
from ..dtypes import DType, torch_dtype
from .rng import (  # noqa: F401 - re-exported: the generators and the tests import these from common
    _FP8_MASKS,
    CHUNK_WORDS,
    FP8_CODE_RMS,
    Stream,
    counter_words,
    log_uniform,
    mix64,
    normal,
    permutation,
    randint,
    random_fp8,
    random_tensor,
    random_words,
    stream,
    stream_seed,
    uniform,
)

if TYPE_CHECKING:
    from ..definition import Definition, TensorSpec

SIZES = ("small", "medium", "large")


class InputGenerationError(ValueError):
    """Inputs could not be generated for a definition; the message names the definition and why."""

    def __init__(self, message: str, *, definition: str | None = None):
        super().__init__(f"{definition}: {message}" if definition else message)
        self.definition = definition


class GeneratorMismatch(InputGenerationError):
    """The family generator does not fit this definition: inputs it does not know, other names or layouts
    than its own, a string argument. Its inputs then come from its fi_trace `init` or its declaration. A
    generator that fits but whose case breaks the definition (a constraint, a const axis) is no mismatch:
    that stays a loud InputGenerationError, since one of the two is wrong."""


class UnsupportedOpType(GeneratorMismatch):
    """No generator knows the definition's op_type (callers such as `run --all` skip these)."""


class EdgeCaseUnavailable(InputGenerationError):
    """An edge case is its family generator's, and that generator does not fit this definition (other input
    names): the definition's random cases come from its init or its declaration, its edge cases cannot be made.
    A `no-generator` skip, not an error."""


class CaseTooLarge(InputGenerationError):
    """The case needs more memory than the device has (an index past 2**31 needs a tensor that large):
    a `too-large` skip with the bytes it needs, not an error."""


# A check holds the inputs, the reference's float32 copies and the torch ground truth's float64 ones
# (an fp8 weight grows 8x there) at once: about this many times the inputs' bytes at the peak.
MEMORY_FACTOR = 12
# What is left of a CPU's available memory for the check's tensors: Python, torch, the workers' own pages and
# whatever else starts meanwhile take the rest. At 0.9 an fp8 MoE estimated at 19.7 GiB was planned (so at least
# 21.9 GiB were available) and its worker was killed for memory on this 23 GB machine.
CPU_MEMORY_SHARE = 0.8


def memory_budget(device: str | torch.device) -> int:
    """Bytes the checks may use: the GPU's memory on CUDA; on the CPU a share of what the kernel says is
    available now (MemAvailable), not the RAM installed: other processes' pages are not ours to count."""
    import os

    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).total_memory
    available = _mem_available()
    if available is None:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(available * CPU_MEMORY_SHARE)


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_bytes(definition: Definition) -> int:
    """The check's peak memory for the fixed-size inputs, per element: the input, the worker's arena
    copy and the mutation check's copy (3 x its itemsize), the reference's float32 (4) and the ground
    truth's float64 (8). An fp8 weight costs 15x its bytes, a bf16 one 9x, a float32 one 8x: a flat
    factor under-counts fp8 (a check over an fp8 MoE was killed for memory at 12x)."""
    return sum(n * (3 * itemsize + 12) for n, itemsize in _fixed_elements(definition))


def too_large(d: Definition, budget: int) -> str | None:
    """Why a definition cannot be checked in this much memory, or None."""
    peak = peak_bytes(d)
    if peak <= budget:
        return None
    return (f"its fixed-size inputs alone are {fixed_bytes(d) / 2**30:.1f} GiB; with the worker's copy and the "
            f"reference's float32 and the ground truth's float64 ones that is ~{peak / 2**30:.0f} GiB, more than "
            f"the {budget / 2**30:.0f} GiB this check may use")


def fixed_bytes(definition: Definition) -> int:
    """Bytes of the inputs whose every dimension is a const axis (weights, caches of a fixed size):
    what any size tier allocates at least. A public MoE with 384 local experts has 17 GB of them."""
    return sum(n * itemsize for n, itemsize in _fixed_elements(definition))


def _fixed_elements(definition: Definition) -> list[tuple[int, int]]:
    """(elements, itemsize) of each input whose every dimension is a const axis."""
    from ..dtypes import torch_dtype

    consts, out = definition.const_axes, []
    for spec in definition.inputs.values():
        if spec.shape and spec.dtype is not None and all(a in consts for a in spec.shape):
            itemsize = torch.empty(0, dtype=torch_dtype(spec.dtype)).element_size()
            out.append((math.prod(consts[a] for a in spec.shape), itemsize))
    return out


# -- fresh sizes -------------------------------------------------------------------------------------
def fresh_count(n: int, g: Stream, most: int | None = None) -> int:
    """An odd count in [max(n + 1, 9), max(2 n + 1, 13)] that is no power of two, a prime where the range holds
    one (half the draws): past every small table (1-8), off the tiles' powers of two, at most about twice the
    tier's size (the memory plan's reach). `most` caps it (an API's largest count; then 9 and up where it can)."""
    lo, hi = max(n + 1, 9), max(2 * n + 1, 13)
    if most is not None:
        lo, hi = min(lo, max(most - 1, 1)), min(hi, most)
    odd = [v for v in range(lo | 1, hi + 1, 2) if v & (v - 1)] or [hi]
    primes = [v for v in odd if all(v % p for p in range(3, int(v ** 0.5) + 1, 2))]
    pool = primes if primes and randint(0, 2, (1,), g).item() == 0 else odd
    return pool[int(randint(0, len(pool), (1,), g).item())]


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
    # inputs made large for their offsets and read at a few rows (large_offsets' caches): the memory planner
    # counts them as copied, not as widened (budget/plan.py)
    sparse: tuple[str, ...] = ()

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
                      self.source, self.sparse)

    def __repr__(self) -> str:
        parts = []
        for k, v in self.values.items():
            if isinstance(v, torch.Tensor):
                parts.append(f"{k}={tuple(v.shape)}:{str(v.dtype).replace('torch.', '')}")
            else:
                parts.append(f"{k}={v!r}")
        return (f"Inputs({self.definition}, size={self.size}, seed={self.seed}, case={self.case}, "
                + ", ".join(parts) + ")")


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
                 device: torch.device | str = "cpu", memory: int | None = None,
                 reserve: Callable[[int, str], None] | None = None, fresh: bool = False):
        self.definition = definition
        # a run's fresh seed: its typical counts (rows, tokens, requests) are drawn afresh too (count())
        self.fresh = fresh
        self.memory = memory  # bytes this case may use (the device's budget); None: all of the device's memory
        # asked before a large tensor is made (the device's memory budget: budget/guard.py); it may raise to have
        # the case generated again once the memory is there
        self.reserve = reserve
        self.sparse: set[str] = set()
        # inputs where -inf is a value of the contract (cascade_merge's lse of an empty partial state): NaN and
        # +inf stay errors there, -inf is allowed
        self.neg_inf: set[str] = set()
        self.size = size
        self.seed = seed
        self.case = case
        self.device = torch.device(device)
        self.axes: dict[str, int] = dict(definition.const_axes)
        self.values: dict[str, Any] = {}

    # -- errors and randomness
    def error(self, message: str) -> InputGenerationError:
        return InputGenerationError(message, definition=self.definition.name)

    def mismatch(self, message: str) -> GeneratorMismatch:
        return GeneratorMismatch(message, definition=self.definition.name)

    def require_bytes(self, nbytes: int, what: str, *, factor: int = MEMORY_FACTOR) -> None:
        """Raise CaseTooLarge unless `factor` times `nbytes` fit this device (a case whose point is a
        large tensor: `what` says which). `factor` 1 where only the tensor itself has to fit (the
        ground truth and reference read it without widening it)."""
        budget = self.memory if self.memory is not None else memory_budget(self.device)
        if nbytes * factor > budget:
            raise CaseTooLarge(f"{what} needs {nbytes / 2**30:.1f} GiB (x{factor} for the check's copies), more "
                               f"than the {budget / 2**30:.0f} GiB of {self.device.type} memory this check may use",
                               definition=self.definition.name)
        if self.reserve is not None:
            self.reserve(nbytes, what)

    def rng(self, tag: str) -> Stream:
        """One named random stream of this case."""
        return stream("flashinfer-trace-inputs/v2", self.seed, self.definition.name, self.size, self.case, tag)

    def count(self, n: int, tag: str = "count", *, most: int | None = None) -> int:
        """A typical count of the case (rows, tokens, requests): the size tier's `n` for the fixed seeds; for a
        run's fresh seed a size no tier lists, drawn from that seed (replayable with it), so a reference right
        only at the suite's sizes fails (fresh_count; `most`: the API's limit)."""
        return fresh_count(n, self.rng(f"fresh-{tag}"), most) if self.fresh else n

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
        if name not in self.definition.axes and name not in self.definition.literal_dims:  # fi_trace's "1"
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
        return Inputs(d.name, self.size, self.seed, self.case, values, axes, tuple(ignored),
                      sparse=tuple(n for n in values if n in self.sparse))

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
        # fp8 codes are drawn finite; every fp4 (e2m1) code is finite, and torch has no isfinite for them
        if value.is_floating_point() and value.dtype not in _FP8_MASKS and value.dtype != _FP4 and value.numel():
            if name in self.neg_inf:
                value = torch.where(value == -math.inf, 0.0, value)
            if not _all_finite(value):
                raise self.error(f"input {name!r}: generated non-finite values")


_FP4 = getattr(torch, "float4_e2m1fn_x2", None)
_CHECK_CHUNK = 1 << 24  # elements: isfinite makes temporaries 2.5x a bf16 tensor's size; bound them


def _all_finite(t: torch.Tensor) -> bool:
    """No NaN or infinity in t, checked where t is, a chunk at a time, with one sync at the end. Through each
    chunk's min and max (aminmax propagates NaN, and an infinity is an extreme): one pass without a temporary,
    where isfinite(...).all() made three (~9x slower on a CPU, bf16 inputs of a GEMM's weights the most)."""
    flat = t.reshape(-1)
    ok = torch.ones((), dtype=torch.bool, device=t.device)
    for start in range(0, flat.numel(), _CHECK_CHUNK):
        chunk = flat[start:start + _CHECK_CHUNK]
        if chunk.dtype in _MINMAX_DTYPES:
            lo, hi = torch.aminmax(chunk)
            ok &= torch.isfinite(lo) & torch.isfinite(hi)
        else:  # float8_e8m0fnu (MX scales): no aminmax
            ok &= torch.isfinite(chunk).all()
    return bool(ok)


_MINMAX_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


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
        raise b.mismatch(f"the {family} generator does not know input(s) {', '.join(extra)} "
                      f"(it knows {', '.join(known)})")

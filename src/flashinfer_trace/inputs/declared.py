"""Inputs from a definition's declaration alone: its axes, constraints, shapes, dtypes and input names.

The structured family generators (attention.py, moe.py, ...) know what an op's inputs mean; they refuse a
definition whose op type or input names they do not know. Definitions from the wild (pull requests,
other projects, FlashInfer's own traces) are often such: a softmax, an embedding, a MoE whose inputs are
named otherwise. This generator makes valid inputs for any of them from what the file declares, so the
checks that need no meaning still run (shapes, dtypes, determinism, the torch ground truth where one
applies). The rules, per dtype and per name pattern, are the table in docs/definitions.md; in short:

1. Axes. Const axes (and literal dims) as declared. Var axes, one at a time in declaration order: an
   equality constraint with one unknown axis is solved for it (`len_indptr == batch_size + 1`,
   `K_packed == K // 2`); else the first value of the size tier's ladder (`AXIS_LADDER`) that every
   axis-only constraint naming it holds for (`M % 16 == 0`, `num_v_heads % num_q_heads == 0`). Axes an
   indptr's last entry must equal (`total_q == qo_indptr[-1].item()`) come from the indptr; axes an index
   must stay below (`kv_indices.max().item() < num_pages`) are chosen last, as the number of indices plus
   spare rows (so pages are distinct and some are never read).
2. Values, by name first, then by dtype: indptrs monotone from 0 to their total (all indptrs over one
   batch share the per-segment lengths, so `qo_len <= kv_len` holds), indices in range of what they
   index (distinct where the range allows), lengths in [1, max], scales positive and log-uniform,
   `probs` rows summing to 1, `eps` small, workspaces zero; floats normal, fp8 / fp4 / e8m0 as valid
   codes, ints small and non-negative, bools fair coins. A scalar named like an axis gets the axis's
   value; one the reference gives a literal default gets that default.
3. Every case passes the usual checks (shapes, dtypes, finiteness, every constraint: `Builder.finish`);
   one that cannot satisfy a constraint is an InputGenerationError naming it, never a silent guess.

Reproducible like the other generators: every tensor draws from its own `Builder.rng` stream, the same
bits on every device. There are no edge cases: those need to know what an input means.
"""

from __future__ import annotations

import ast
import math
from typing import TYPE_CHECKING, Any

import torch

from ..constraints import Constraint
from ..dtypes import DType, torch_dtype
from .common import InputGenerationError, Inputs, log_uniform, normal, permutation, randint, random_fp8
from .declared_plan import (
    _INDEX_SUFFIXES,
    _INT,
    Plan,
    _value,
    is_index,
    is_indptr,
    is_length,
    is_probs,
    is_scale,
    is_zeroed,
    plan,
)
from .fitrace_init import _InitBuilder, reference_defaults

if TYPE_CHECKING:
    from ..definition import Definition, TensorSpec

__all__ = ["AXIS_LADDER", "DECLARED_SOURCE", "SEGMENT_MAX", "generate_declared"]

DECLARED_SOURCE = "declared"  # Inputs.source of cases made here
# A free var axis takes the first of these its constraints allow (the tier's usual value first).
AXIS_LADDER = {
    "small": (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    "medium": (64, 128, 256, 512, 1024, 2048, 4096),
    "large": (1024, 2048, 4096, 8192, 16384),
}
# Per-segment lengths of an indptr (and of `*_lens` tensors): uniform on [1, this].
SEGMENT_MAX = {"small": 8, "medium": 32, "large": 256}
EPS = 1e-6
SCALE_LOG2 = (-3.0, 1.0)  # `*scale*` floats: log-uniform on [1/8, 2]
E8M0_CODES = (124, 131)  # MX block scales: 2^-3 .. 2^3
E4M3_SCALE_BYTES = (0x30, 0x48)  # positive e4m3 codes with exponent field 6..8: 0.5 .. 3.75
_DISTINCT_MAX = 1 << 20  # a permutation of a larger range costs too much; draw with replacement there

_SM_SCALES = ("sm_scale", "softmax_scale", "scale_softmax", "scale")
# a word in an index's name -> words of the axis it indexes, where nothing else says (first match wins)
_POINTS_AT = {"expert": ("expert",), "topk": ("expert", "vocab"), "token": ("vocab",), "input_ids": ("vocab",),
              "pos": ("position", "max_seq"), "page": ("page",), "block": ("page", "block"),
              "state": ("pool", "cache_size", "slot"), "slot": ("slot", "pool"), "batch": ("batch",)}
_QUERIES = ("q", "query", "q_nope")


class DeclaredBuilder(_InitBuilder):
    """The usual checks, with fi_trace's absent optional inputs (None) and string arguments, and var axes
    only outputs have (the reference sizes those): fitrace_init's builder, whose rules are the same."""


def generate_declared(d: Definition, size: str, seed: int, *, device: torch.device) -> Inputs:
    """One case of `d` from its declaration alone (Inputs.source "declared")."""
    b = DeclaredBuilder(d, size, seed, None, device=device)
    p = plan(d)
    absent = {n for n, spec in d.inputs.items() if spec.is_absent}
    for c in p.constraints:
        if c.names & absent:  # fi_trace traced the call without it: no case can give it a value
            raise InputGenerationError(
                f"the declared generator: constraint {c.text!r} reads input(s) {', '.join(sorted(c.names & absent))}, "
                'which the file marks absent (dtype "unknown"): no value can satisfy it', definition=d.name)
    try:
        bind_axes(b, p)
        defaults = reference_defaults(d)
        tensors_first = sorted(d.inputs.items(), key=lambda item: item[1].shape is None)  # `max_*` reads lengths
        for name, spec in tensors_first:
            b.put(name, _make(b, p, name, spec, defaults))
        inputs = b.finish()
    except InputGenerationError as e:
        raise InputGenerationError(f"the declared generator: {_without_name(e, d.name)}", definition=d.name) from e
    except (ValueError, RuntimeError, IndexError, KeyError, TypeError, ZeroDivisionError, OverflowError) as e:
        raise InputGenerationError(f"the declared generator failed: {type(e).__name__}: {e}",
                                   definition=d.name) from e
    return Inputs(inputs.definition, inputs.size, inputs.seed, None, inputs.values, inputs.axes, inputs.ignored,
                  source=DECLARED_SOURCE)


def _without_name(e: InputGenerationError, name: str) -> str:
    text = str(e)
    return text[len(name) + 2:] if text.startswith(f"{name}: ") else text


# -- axes --------------------------------------------------------------------------------------------
def bind_axes(b: DeclaredBuilder, p: Plan) -> None:
    """Give every var axis an input's shape or a constraint names a value (see the module docstring)."""
    d = b.definition
    present = {n: s for n, s in d.inputs.items() if not s.is_absent and s.shape is not None}
    named = set().union(*(c.names for c in p.constraints)) if p.constraints else set()
    needed = {a for s in present.values() for a in s.shape} | (named & set(d.axes))
    free = [a for a in d.var_axes if a in needed]
    indptrs = [n for n, s in present.items() if is_indptr(n, s)]
    totals = {ip: p.totals.get(ip) or _guessed_total(d, ip) for ip in indptrs}
    p.ranges = index_axes(d, p)
    deferred = ({t for t in totals.values() if t} | {a for axes in p.ranges.values() for a in axes}
                | defined_axes(d, p))
    drawn: set[str] = set()
    while True:
        if _derive(b, p):
            continue
        ready = [ip for ip in indptrs if ip not in drawn and present[ip].shape[0] in b.axes]
        if ready:
            _draw_indptrs(b, p, [ip for ip in ready if present[ip].shape[0] == present[ready[0]].shape[0]],
                          totals, drawn)
            continue
        todo = [a for a in free if a not in b.axes]
        if not todo:
            return
        pick = next((a for a in todo if a not in deferred), todo[0])
        b.axes[pick] = _choose(b, p, pick, present)


def _names(expr: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}


def index_axes(d: Definition, p: Plan) -> dict[str, set[str]]:
    """Index input -> the var axes its range depends on (its constraint's upper bound, else what it
    indexes): those axes are chosen after the index's own shape, so they can hold every index once."""
    out: dict[str, set[str]] = {}
    for name, spec in d.inputs.items():
        if spec.is_absent or not is_index(name, spec):
            continue
        if name in p.upper:
            axes = {a for expr, _ in p.upper[name] for a in _names(expr) if a in d.var_axes}
        else:
            axis = _indexed_axis(d, name)
            axes = {axis} if axis in d.var_axes else set()
        if axes:
            out[name] = axes
    return out


def defined_axes(d: Definition, p: Plan) -> set[str]:
    """Var axes an equality defines from other axes (`K_div_block_size == K // block_size`,
    `len_indptr == batch_size + 1`): bound after those, by solving it, rather than from the ladder."""
    out = set()
    for c in _axis_only(p, d):
        body = c.tree.body
        if isinstance(body, ast.Compare) and len(body.ops) == 1 and isinstance(body.ops[0], ast.Eq):
            for side, other in ((body.left, body.comparators[0]), (body.comparators[0], body.left)):
                if isinstance(side, ast.Name) and side.id in d.var_axes and _names(other) - {side.id}:
                    out.add(side.id)
    return out


def _axis_only(p: Plan, d: Definition) -> list[Constraint]:
    return [c for c in p.constraints if c.names <= set(d.axes)]


def _holds(c: Constraint, env: dict[str, Any]) -> bool:
    try:
        return bool(c.evaluate(env))
    except Exception:  # noqa: BLE001 - a constraint that does not evaluate on these values does not hold
        return False


def _derive(b: DeclaredBuilder, p: Plan) -> bool:
    """Solve one equality constraint with a single unknown var axis; True if one was."""
    d = b.definition
    for c in _axis_only(p, d):
        body = c.tree.body
        if not (isinstance(body, ast.Compare) and len(body.ops) == 1 and isinstance(body.ops[0], ast.Eq)):
            continue
        unknown = [n for n in c.names if n not in b.axes]
        if len(unknown) != 1 or unknown[0] not in d.var_axes:
            continue
        x = unknown[0]
        root = _solve(c, x, dict(b.axes))
        completed = [k for k in _axis_only(p, d) if x in k.names and k.names <= set(b.axes) | {x}]
        if root is not None and all(_holds(k, {**b.axes, x: root}) for k in completed):
            b.axes[x] = root
            return True
    return False


def _solve(c: Constraint, x: str, env: dict[str, Any]) -> int | None:
    """The smallest integer x >= 0 for which `L == R` holds, where L - R is monotone in x (sums, products
    by positive constants, floor divisions): a bisection, so `K_packed == K // 2` solves for K too.
    Where 0 and 1 both hold (`n == n * 1`), 1."""
    from ..constraints import _eval

    body = c.tree.body

    def gap(v: int):
        env[x] = v
        return _eval(body.left, env) - _eval(body.comparators[0], env)

    try:
        g0 = gap(0)
        if g0 == 0:  # `zero == 0`; but `n % 4 == 0` has other roots: there the ladder chooses
            if gap(1) == 0:
                return 1
            return 0 if (gap(1) > 0) == (gap(1 << 20) > 0) and gap(1 << 20) != 0 else None
        lo, hi = 0, 1 << 40
        g = gap(hi)
        if g != 0 and (g > 0) == (g0 > 0):
            return None  # no sign change: no root in range
        while hi - lo > 1:  # gap(lo) on g0's side of 0, gap(hi) at 0 or past it
            mid = (lo + hi) // 2
            g = gap(mid)
            if g == 0 or (g > 0) != (g0 > 0):
                hi = mid
            else:
                lo = mid
        return hi if gap(hi) == 0 else None
    except Exception:  # noqa: BLE001 - an expression that does not evaluate on integers solves nothing
        return None


def _choose(b: DeclaredBuilder, p: Plan, axis: str, present: dict[str, TensorSpec]) -> int:
    """A free var axis's value: where it bounds an index input, that input's count plus spare rows;
    else the tier's ladder; the first that every axis-only constraint it completes holds for."""
    d = b.definition
    checks = [c for c in _axis_only(p, d) if axis in c.names and c.names <= set(b.axes) | {axis}]
    candidates = list(AXIS_LADDER[b.size])
    for name, axes in p.ranges.items():
        spec = present.get(name)
        if spec is None or axes != {axis}:
            continue
        if all(a in b.axes for a in spec.shape):
            count = math.prod(b.axes[a] for a in spec.shape)
            candidates.insert(0, count + max(2, count // 4))
    for v in candidates:
        if all(_holds(c, {**b.axes, axis: v}) for c in checks):
            return v
    return candidates[0]  # nothing fits: the final check names the constraint


def _guessed_total(d: Definition, indptr: str) -> str | None:
    """The axis an indptr without a `AX == ip[-1]` constraint sums to: the leading axis of the input it
    offsets into (`kv_indptr` -> `kv_indices`, `qo_indptr` -> `q`), else of the first float tensor."""
    prefix = indptr.replace("indptr", "").strip("_")
    for tag in ("cu_seqlens", "cu_seq_lens", "cum_seq_lens"):
        prefix = prefix.replace(tag, "").strip("_")
    names = [f"{prefix}_indices"] if prefix else []
    if prefix in ("qo", "q"):
        names += list(_QUERIES)
    if prefix in ("kv", "k"):
        names += ["k", "key"]
    floats = [n for n, s in d.inputs.items() if s.shape and s.dtype is not None and s.dtype.is_float]
    for n in [*names, *floats]:
        spec = d.inputs.get(n)
        if spec is not None and not spec.is_absent and spec.shape and spec.shape[0] in d.var_axes:
            return spec.shape[0]
    return None


def _draw_indptrs(b: DeclaredBuilder, p: Plan, group: list[str], totals: dict[str, str | None],
                  drawn: set[str]) -> None:
    """The indptrs over one batch: one draw of per-segment lengths, shared by all of them (scaled to a
    total already bound), so cross-indptr constraints such as qo_len <= kv_len hold."""
    n = b.axes[b.definition.inputs[group[0]].shape[0]] - 1
    if n < 0:
        raise b.error(f"indptr {group[0]!r} has length 0: it needs at least one entry")
    base = randint(1, SEGMENT_MAX[b.size] + 1, (n,), b.rng(f"segments:{group[0]}")).tolist()
    for ip in group:
        total = totals.get(ip)
        if total is not None and total in b.axes:
            lengths = _partition(b.axes[total], base)
        else:
            lengths = list(base)
            if total is not None:
                b.axes[total] = sum(lengths)
        p.segment_lengths += lengths
        offsets = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
        p.made[ip] = offsets.to(b.torch_dtype(ip))
        drawn.add(ip)


def _partition(total: int, base: list[int]) -> list[int]:
    """`total` split over len(base) segments in base's proportions, each >= 1 where total allows."""
    n = len(base)
    if n == 0:
        return []
    if total < n:
        return [1] * total + [0] * (n - total)
    rest, weight = total - n, sum(base)
    lengths = [1 + rest * w // weight for w in base]
    lengths[-1] += total - sum(lengths)
    return lengths


# -- values ------------------------------------------------------------------------------------------
def _make(b: DeclaredBuilder, p: Plan, name: str, spec: TensorSpec, defaults: dict[str, Any]) -> Any:
    if spec.is_absent:
        return None
    if spec.is_string:
        value = defaults.get(name, defaults.get(spec.param) if spec.param else None)
        if not isinstance(value, str):
            raise b.error(f"input {name!r} is a string argument and the reference gives it no literal default: "
                          "no value is known for it")
        return value
    if spec.shape is None:
        return _scalar(b, p, name, spec, defaults)
    if spec.shape == []:
        return torch.tensor(_scalar(b, p, name, spec, defaults), dtype=torch_dtype(spec.dtype))
    if name in p.made:
        return p.made[name]
    return _tensor(b, p, name, spec)


def _scalar(b: DeclaredBuilder, p: Plan, name: str, spec: TensorSpec, defaults: dict[str, Any]) -> Any:
    """Scalars: an axis's value (same name), the reference's literal default, then the name rules."""
    kind = spec.dtype
    value: Any
    if name in b.axes:
        value = b.axes[name]
    elif isinstance(defaults.get(name), (bool, int, float)):
        value = defaults[name]
    elif kind == DType.bool:
        value = False
    elif name == "eps" or name.endswith("_eps") or name == "epsilon":
        value = EPS
    elif name in _SM_SCALES and (dim := _query_dim(b)):
        value = 1.0 / math.sqrt(dim)
    elif is_scale(name):
        value = float(log_uniform((1,), b.rng(name), *SCALE_LOG2)[0])
    elif "top_p" in name:
        value = 0.9
    elif "min_p" in name:
        value = 0.1
    elif "theta" in name:
        value = 1e4
    elif "offset" in name:
        value = 0
    elif name.startswith("max_") and kind in _INT:
        value = max(p.segment_lengths) if p.segment_lengths else SEGMENT_MAX[b.size]
    elif name in ("top_k", "topk", "k") and kind in _INT:
        value = min(8, AXIS_LADDER[b.size][0])
    else:
        value = 1
    if kind == DType.bool:
        return bool(value)
    if kind in _INT:
        return int(value)
    return float(value)


def _query_dim(b: DeclaredBuilder) -> int | None:
    """The last dimension of the query input (`q`, `query`), for a softmax scale of 1/sqrt(D)."""
    for q in _QUERIES:
        spec = b.definition.inputs.get(q)
        if spec is not None and spec.shape and spec.shape[-1] in b.axes:
            return b.axes[spec.shape[-1]]
    return None


def _tensor(b: DeclaredBuilder, p: Plan, name: str, spec: TensorSpec) -> torch.Tensor:
    shape, kind, dtype = b.shape(name), spec.dtype, b.torch_dtype(name)
    s = b.rng(name)
    if is_zeroed(name):
        return torch.zeros(shape, dtype=dtype, device=b.device)
    if kind in _INT:
        if is_index(name, spec):
            lo, hi = _index_range(b, p, name)
            return _indices(shape, lo, hi, s, b.device).to(dtype)
        if is_length(name, spec):
            lo, hi = _length_range(b, p, name)
            t = randint(lo, hi + 1, shape, s, device=b.device)
            p.segment_lengths += t.flatten().tolist()[:4096]
            return t.to(dtype)
        if is_scale(name):  # packed e4m3 scale bytes (uint8, or four per int32)
            return _scale_bytes(shape, dtype, s, b.device)
        if "mask" in name:
            return randint(0, 2, shape, s, device=b.device).to(dtype)
        if kind == DType.uint8:  # packed fp4 pairs or raw bytes: every byte is valid
            return randint(0, 256, shape, s, device=b.device).to(dtype)
        if kind == DType.int8:
            return randint(-128, 128, shape, s, device=b.device).to(dtype)
        lo, hi = _within(b, p, name, 0, AXIS_LADDER[b.size][0])
        return randint(lo, hi, shape, s, device=b.device).to(dtype)
    if kind == DType.bool:
        return randint(0, 2, shape, s, device=b.device).bool()
    if kind == DType.float4_e2m1:  # two e2m1 codes a byte; all 16 codes are finite
        return randint(0, 256, shape, s, dtype=torch.uint8, device=b.device).view(dtype)
    if kind == DType.float8_e8m0fnu:  # power-of-two exponents; 255 (NaN) never drawn
        return randint(*E8M0_CODES, shape, s, dtype=torch.uint8, device=b.device).view(dtype)
    if kind in (DType.float8_e4m3fn, DType.float8_e5m2):
        t = random_fp8(shape, dtype, s, device=b.device)
        if is_scale(name):  # positive codes: clear the sign bit
            t = t.view(torch.uint8).bitwise_and(0x7F).view(dtype)
        return t
    if is_scale(name):
        return log_uniform(shape, s, *SCALE_LOG2, device=b.device).to(dtype)
    if is_probs(name) and shape and shape[-1] > 0:
        logits = normal(shape, s, dtype=torch.float32, device=b.device).to(torch.float64)
        return torch.softmax(logits, dim=-1).to(dtype)
    if "cos_sin" in name and len(shape) == 2 and shape[1] % 2 == 0:
        return _cos_sin(shape, dtype, b.device)
    return normal(shape, s, dtype=dtype, device=b.device)


def _bounds(b: DeclaredBuilder, p: Plan, name: str) -> tuple[int | None, int | None]:
    """[lo, hi) from the input's constraint bounds on bound axes (None where they say nothing). A
    negative lower bound is a sentinel such as -1 for padding: it is allowed, never drawn."""
    lo = hi = None
    env = dict(b.axes)
    for expr, plus in p.lower.get(name, []):
        v = _value(expr, env)
        if v is not None:
            lo = max(v + plus, 0) if lo is None else max(lo, v + plus)
    for expr, inclusive in p.upper.get(name, []):
        v = _value(expr, env)
        if v is not None:
            hi = v + inclusive if hi is None else min(hi, v + inclusive)
    return lo, hi


def _within(b: DeclaredBuilder, p: Plan, name: str, lo: int, hi: int) -> tuple[int, int]:
    """[lo, hi) replaced by what the constraints say, where they say it (never empty)."""
    c_lo, c_hi = _bounds(b, p, name)
    lo = lo if c_lo is None else c_lo
    hi = hi if c_hi is None else c_hi
    return lo, max(hi, lo + 1)


def _index_range(b: DeclaredBuilder, p: Plan, name: str) -> tuple[int, int]:
    """[lo, hi) of an index: the constraint's bounds, else the size of what it indexes (the leading axis of
    the input its name prefixes: `kv_indices` -> `kv_cache`, `state_indices` -> `state`; a table of
    pages -> a `*cache*` input), else an axis its name points at (experts, vocabulary, positions, pages,
    state pool), else the tier's first ladder value."""
    axis = _indexed_axis(b.definition, name)
    hi = b.axes.get(axis, AXIS_LADDER[b.size][0]) if axis else AXIS_LADDER[b.size][0]
    return _within(b, p, name, 0, max(1, hi))


def _indexed_axis(d: Definition, name: str) -> str | None:
    prefix = name
    for suffix in _INDEX_SUFFIXES:
        if prefix.endswith(suffix):
            prefix = prefix[: -len(suffix)]
            break
    others = [(n, s) for n, s in d.inputs.items() if n != name and not s.is_absent and s.shape
              and not (is_index(n, s) or is_indptr(n, s) or is_length(n, s))]
    others.sort(key=lambda item: not (item[1].dtype is not None and item[1].dtype.is_float))  # floats first
    if prefix and prefix != name:
        for n, s in others:
            if n == prefix or n.startswith(prefix + "_"):
                return s.shape[0]
    if any(w in name for w in ("table", "page", "block", "kv")):
        for n, s in others:
            if "cache" in n:
                return s.shape[0]
    for word, axis_words in _POINTS_AT.items():
        if word in name:
            for a in d.axes:
                if any(w in a for w in axis_words) and a != "page_size":
                    return a
    return None


def _length_range(b: DeclaredBuilder, p: Plan, name: str) -> tuple[int, int]:
    """[1, max] inclusive: `*last_page_len*` up to the page size; else the constraint's bound or the tier's
    segment maximum."""
    hi = SEGMENT_MAX[b.size]
    if "last_page_len" in name and "page_size" in b.axes:
        hi = b.axes["page_size"]
    lo, hi_excl = _within(b, p, name, 1, hi + 1)
    return max(lo, 1), max(hi_excl - 1, lo, 1)


def _indices(shape: tuple[int, ...], lo: int, hi: int, s, device) -> torch.Tensor:
    """Integers in [lo, hi): distinct over the whole tensor where the range allows, else distinct within
    each row (top-k expert choices), else drawn with replacement."""
    span, n = hi - lo, math.prod(shape)
    if n == 0:
        return torch.zeros(shape, dtype=torch.int64, device=device)
    if span <= _DISTINCT_MAX and n <= span:
        return (permutation(span, s, device=device)[:n] + lo).reshape(shape)
    last = shape[-1] if shape else 1
    if span <= _DISTINCT_MAX and len(shape) >= 2 and last <= span and n // last <= 4096:
        return (permutation(span, s, rows=n // last, device=device)[:, :last] + lo).reshape(shape)
    return randint(lo, hi, shape, s, device=device)


def _scale_bytes(shape: tuple[int, ...], dtype: torch.dtype, s, device) -> torch.Tensor:
    """Positive e4m3 codes as bytes: a uint8 tensor of them, or wider integers packing several."""
    width = torch.empty(0, dtype=dtype).element_size()
    raw = randint(*E4M3_SCALE_BYTES, (*shape, width), s, dtype=torch.uint8, device=device)
    return raw.view(dtype).reshape(shape) if width > 1 else raw.reshape(shape)


def _cos_sin(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """A RoPE cache as models build it: row p is cos(p f_i) | sin(p f_i), f_i = 1e4^(-2i/D) (float64)."""
    rows, dim = shape
    half = dim // 2
    freqs = 1.0 / 1e4 ** (torch.arange(half, dtype=torch.float64) * 2 / dim)
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * freqs[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype).to(device)

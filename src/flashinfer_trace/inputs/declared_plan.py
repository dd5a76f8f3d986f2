"""What a definition's declaration says before the declared generator draws anything (declared.py): its
constraints read into a Plan (indptr totals, index bounds), and what its inputs' names say they hold (offsets,
indices, lengths, scales, probabilities, buffers to zero)."""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..constraints import Constraint, parse
from ..dtypes import DType

if TYPE_CHECKING:
    from ..definition import Definition, TensorSpec

_INT = (DType.int8, DType.int16, DType.int32, DType.int64, DType.uint8, DType.uint32)
_INDEX_SUFFIXES = ("_indices", "_ids", "_idx", "_index", "_table", "_tables", "_mapping")
_INDEX_NAMES = ("indices", "ids", "positions", "pos_ids", "block_table", "block_tables", "page_table",
                "slot_mapping")
_LENGTH_NAMES = ("seq_lens", "lengths", "lens")
_ZERO_WORDS = ("workspace", "buffer", "semaphore")


# -- what the constraints say ------------------------------------------------------------------------
@dataclass
class Plan:
    """What the constraints tell the generator before it draws anything."""

    constraints: list[Constraint]
    totals: dict[str, str] = field(default_factory=dict)  # indptr input -> the axis its last entry equals
    lower: dict[str, list[tuple[ast.expr, int]]] = field(default_factory=dict)  # input -> (expr, +0/+1)
    upper: dict[str, list[tuple[ast.expr, int]]] = field(default_factory=dict)  # input -> (expr, exclusive 0/+1)
    made: dict[str, torch.Tensor] = field(default_factory=dict)  # indptrs drawn while binding axes
    ranges: dict[str, set[str]] = field(default_factory=dict)  # index input -> the var axes bounding it
    segment_lengths: list[int] = field(default_factory=list)  # every segment drawn: `max_*` scalars read it


def _reduced(node: ast.expr, method: str) -> str | None:
    """The input name of `NAME.method()` or `NAME.method().item()`, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "item":
        node = node.func.value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method
            and not node.args and isinstance(node.func.value, ast.Name)):
        return node.func.value.id
    return None


def _last_entry(node: ast.expr) -> str | None:
    """The input name of `NAME[-1]` or `NAME[-1].item()`, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "item":
        node = node.func.value
    if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
            and isinstance(node.slice, ast.UnaryOp) and isinstance(node.slice.op, ast.USub)
            and isinstance(node.slice.operand, ast.Constant) and node.slice.operand.value == 1):
        return node.value.id
    return None


_FLIP = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE, ast.Eq: ast.Eq}


def plan(d: Definition) -> Plan:
    """Parse the constraints: indptr totals (`AX == ip[-1].item()`) and value bounds
    (`x.max().item() < E`, `x.min().item() >= E`, either way round, anywhere in the expression); and
    the relations axis names state (`name_relations`), used to bind axes only."""
    parsed = []
    for text in [*d.constraints, *name_relations(d)]:
        try:
            parsed.append(parse(text))
        except ValueError:
            continue  # validate reports it; the final check names it
    p = Plan(parsed)
    for c in parsed:
        for node in ast.walk(c.tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            for left, op, right in zip(sides, node.ops, sides[1:], strict=False):
                _record(p, d, left, type(op), right)
                if type(op) in _FLIP:
                    _record(p, d, right, _FLIP[type(op)], left)
    return p


def name_relations(d: Definition) -> list[str]:
    """What an axis's name says of it (fi_trace's implicit axes): `A_div_B` is A // B with B dividing A
    (`K_div_block_size`, `hidden_div_2`), `A_plus_1` / `A_plus_one` is A + 1; A and B axes or integers."""
    def known(x: str) -> bool:
        return x in d.axes or x in d.literal_dims or (x.isdigit() and int(x) > 0)

    out = []
    for axis in d.axes:
        if "_div_" in axis:
            a, _, b = axis.partition("_div_")
            if known(a) and known(b):
                out += [f"{axis} == {a} // {b}", f"{a} % {b} == 0"]
        for suffix in ("_plus_1", "_plus_one"):
            base = axis[: -len(suffix)]
            if axis.endswith(suffix) and known(base):
                out.append(f"{axis} == {base} + 1")
    return out


def _record(p: Plan, d: Definition, left: ast.expr, op: type, right: ast.expr) -> None:
    if op is ast.Eq and isinstance(right, ast.Name) and right.id in d.axes and (ip := _last_entry(left)):
        p.totals.setdefault(ip, right.id)
    if (name := _reduced(left, "max")) and op in (ast.Lt, ast.LtE):
        p.upper.setdefault(name, []).append((right, 0 if op is ast.Lt else 1))
    if (name := _reduced(left, "min")) and op in (ast.Gt, ast.GtE):
        p.lower.setdefault(name, []).append((right, 1 if op is ast.Gt else 0))


def _value(expr: ast.expr, env: dict[str, Any]) -> int | None:
    """An integer bound from an expression over bound axes, else None."""
    from ..constraints import _eval

    try:
        v = _eval(expr, env)
    except Exception:  # noqa: BLE001 - names a tensor or an unbound axis: no bound from it yet
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return math.floor(v)


# -- kinds of input, by name -------------------------------------------------------------------------
def _int_tensor(spec: TensorSpec) -> bool:
    return spec.shape is not None and spec.dtype in _INT


def is_indptr(name: str, spec: TensorSpec) -> bool:
    """CSR offsets: `*indptr*`, `cu_seqlens*`, `cum_seq_lens*` (1-d integers)."""
    return (_int_tensor(spec) and len(spec.shape) == 1
            and ("indptr" in name or name.startswith(("cu_seqlens", "cu_seq_lens", "cum_seq_lens"))))


def is_index(name: str, spec: TensorSpec) -> bool:
    """Indices into something: `*_indices`, `*_ids`, `*idx*`, `positions`, block / page tables."""
    return _int_tensor(spec) and (name in _INDEX_NAMES or name.endswith(_INDEX_SUFFIXES) or "idx" in name)


def is_length(name: str, spec: TensorSpec) -> bool:
    """Per-request lengths: `seq_lens`, `*_lens`, `*_len`, `lengths` (integers >= 1)."""
    return _int_tensor(spec) and (name in _LENGTH_NAMES or name.endswith(("_lens", "_len", "_lengths")))


def is_scale(name: str) -> bool:
    """Scale factors: `*scale*` and block scale factors `*_sf`, `sf_*`, `*_sf_*` (positive)."""
    return "scale" in name or name == "sf" or name.endswith("_sf") or name.startswith("sf_") or "_sf_" in name


def is_probs(name: str) -> bool:
    return name == "probs" or name.endswith("_probs")


def is_zeroed(name: str) -> bool:
    """Scratch space the op may use as it likes: workspaces, buffers, semaphores start at zero."""
    return any(w in name for w in _ZERO_WORDS)


# -- the builder -------------------------------------------------------------------------------------

"""Constants of a reference read from its AST, never by running it: `EPS = 1e-5` -> {"EPS": 1e-05}.

The drift report (fitrace/drift.py) reads hard-coded parameters (EPS, TOP_K, ...) here to compare two
definitions; ground truths never do (they would agree with the reference they judge: semantics.py). It runs
in the parent process, so every operator is bounded: a value that would exceed MAX_INT_BITS / MAX_STR_CHARS /
MAX_TUPLE_ITEMS is "not a constant", decided before it is computed (doubling a string or an int sixty times,
or `10 ** 10 ** 10`, costs nothing).
"""

from __future__ import annotations

import ast
import math

from .static import parse

__all__ = ["MAX_INT_BITS", "MAX_STR_CHARS", "MAX_TUPLE_ITEMS", "reference_constants"]

MAX_INT_BITS = 4096
MAX_STR_CHARS = 4096
MAX_TUPLE_ITEMS = 256  # items counted through nesting: `T = (T, T)` repeated stays small
MAX_DEPTH = 50

_NOT_CONSTANT = object()


def _is_number(v: object) -> bool:
    return type(v) in (int, float)


def _bits(v: int | float) -> int:
    return abs(v).bit_length() if type(v) is int else 0


def _items(v: object) -> int:
    return sum(1 + _items(x) for x in v) if type(v) is tuple else 0


def _fits(v: object) -> bool:
    if type(v) is int:
        return v.bit_length() <= MAX_INT_BITS
    if type(v) is float:
        return True
    if type(v) is str:
        return len(v) <= MAX_STR_CHARS
    if type(v) is tuple:
        return _items(v) <= MAX_TUPLE_ITEMS
    return type(v) is bool


def _arith(op: ast.operator, a: object, b: object) -> object:
    """a <op> b for numbers (str + str too), or _NOT_CONSTANT when the result could be too large."""
    if isinstance(op, ast.Add) and type(a) is str and type(b) is str:
        return a + b if len(a) + len(b) <= MAX_STR_CHARS else _NOT_CONSTANT
    if not (_is_number(a) and _is_number(b)):
        return _NOT_CONSTANT
    if isinstance(op, ast.Mult) and _bits(a) + _bits(b) > MAX_INT_BITS:
        return _NOT_CONSTANT
    if isinstance(op, ast.Pow):
        if type(b) is int and abs(b) > MAX_INT_BITS:
            return _NOT_CONSTANT
        if type(a) is int and type(b) is int and max(_bits(a), 1) * abs(b) > MAX_INT_BITS:
            return _NOT_CONSTANT
        if type(a) is float or type(b) is float:
            try:  # float powers overflow to an exception, never to memory
                v = float(a) ** float(b)
            except (ArithmeticError, ValueError):
                return _NOT_CONSTANT
            return v if _is_number(v) and math.isfinite(v) else _NOT_CONSTANT
    ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b, ast.Div: lambda: a / b,
           ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b, ast.Pow: lambda: a ** b}
    if type(op) not in ops:
        return _NOT_CONSTANT
    try:
        v = ops[type(op)]()
    except (ArithmeticError, ValueError):
        return _NOT_CONSTANT
    return v if _is_number(v) and _fits(v) else _NOT_CONSTANT  # (-8) ** 0.5 is complex


def _literal(node: ast.AST, known: dict[str, object], depth: int = 0) -> object:
    """The value of a constant expression, or _NOT_CONSTANT."""
    if depth > MAX_DEPTH:
        return _NOT_CONSTANT
    if isinstance(node, ast.Constant):
        v = node.value
        return v if type(v) in (int, float, str, bool) and _fits(v) else _NOT_CONSTANT
    if isinstance(node, ast.Name):
        return known.get(node.id, _NOT_CONSTANT)
    if isinstance(node, ast.Tuple):
        if len(node.elts) > MAX_TUPLE_ITEMS:
            return _NOT_CONSTANT
        items = tuple(_literal(e, known, depth + 1) for e in node.elts)
        if any(i is _NOT_CONSTANT for i in items) or not _fits(items):
            return _NOT_CONSTANT
        return items
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _literal(node.operand, known, depth + 1)
        return (-v if isinstance(node.op, ast.USub) else v) if _is_number(v) else _NOT_CONSTANT
    if isinstance(node, ast.BinOp):
        a = _literal(node.left, known, depth + 1)
        if a is _NOT_CONSTANT:
            return _NOT_CONSTANT
        b = _literal(node.right, known, depth + 1)
        return _NOT_CONSTANT if b is _NOT_CONSTANT else _arith(node.op, a, b)
    return _NOT_CONSTANT


def _bound_names(stmt: ast.stmt) -> set[str]:
    """Names a top-level statement (re)binds, conservatively (a later rebinding voids a constant)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).partition(".")[0] for a in stmt.names}
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}


def reference_constants(code: str, entry: str = "run") -> dict[str, object]:
    """`NAME = <constant expression>` assignments at the top level, then in the straight-line body of
    the entry function (the public dataset writes `EPS = 1e-6` inside `run`), e.g. {"EPS": 1e-5}.
    Never executes code.

    Accepted: int, float, str, bool, tuples of these, unary +/-, + - * / // % ** on numbers (1/128,
    2**-7), str + str, and names of constants found earlier, each within the bounds above. Anything
    else, or a later rebinding (in a loop or a branch too), leaves the name out. Returns {} for
    non-str or unparsable input.
    """
    if not isinstance(code, str):
        return {}
    try:
        tree = parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    constants = _assigned(tree.body, {})
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    entries = [n for n in functions if n.name == entry]
    if not entries and entry == "run" and functions:
        # FlashInfer fi_trace: no run(); the reference is the last top-level function (its helpers are
        # inlined before it), `EPS = 1e-6` inside `_rmsnorm_reference` (sandbox.entry.entry_point)
        entries = functions[-1:]
    if entries:
        params = {a.arg for a in ast.walk(entries[-1].args) if isinstance(a, ast.arg)}
        local = _assigned(entries[-1].body, {k: v for k, v in constants.items() if k not in params})
        constants = {**{k: v for k, v in constants.items() if k not in params}, **local}
    return constants


def literal_epsilon(code: str) -> float | None:
    """An epsilon written as a literal in a norm, `rsqrt(x.pow(2).mean(-1) + 1e-6)`: the one number
    in (0, 1e-2) added to an expression with a mean, a variance or a power. None when there is none
    or more than one distinct such number."""
    try:
        tree = parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None

    def small(n: ast.AST) -> float | None:
        v = _literal(n, {}) if isinstance(n, (ast.Constant, ast.UnaryOp, ast.BinOp)) else _NOT_CONSTANT
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e-2 else None

    def statistic(n: ast.AST) -> bool:
        return any((isinstance(m, ast.Attribute) and m.attr in ("mean", "var", "pow", "square"))
                   or (isinstance(m, ast.BinOp) and isinstance(m.op, ast.Pow)) for m in ast.walk(n))

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            for a, b in ((node.left, node.right), (node.right, node.left)):
                v = small(b)
                if v is not None and statistic(a):
                    found.add(v)
    return found.pop() if len(found) == 1 else None


def _assigned(body: list[ast.stmt], constants: dict[str, object]) -> dict[str, object]:
    constants = dict(constants)
    for stmt in body:
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets, value_node = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value_node = [stmt.target], stmt.value
        if targets and all(isinstance(t, ast.Name) for t in targets):
            try:
                value = _literal(value_node, constants)
            except RecursionError:
                value = _NOT_CONSTANT
            for t in targets:
                if value is _NOT_CONSTANT:
                    constants.pop(t.id, None)
                else:
                    constants[t.id] = value
        else:
            for name in _bound_names(stmt):
                constants.pop(name, None)
    return constants

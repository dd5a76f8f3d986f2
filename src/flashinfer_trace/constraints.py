"""Constraint expressions: parsed, checked and evaluated without `eval`.

Constraints come from untrusted definition files and refer to tensor *values*
(`num_kv_indices == kv_indptr[-1].item()`), so they are interpreted over a tiny AST subset:
arithmetic, comparisons, boolean logic, subscripts, a few pure functions and tensor methods.
Everything is bounded: the text's length, the tree's size and depth before anything walks it
recursively, and integer powers and products while evaluating (`2 ** 10 ** 10` is an error, not a hang).
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any

FUNCTIONS = {"len": len, "min": min, "max": max, "abs": abs, "int": int, "float": float}
METHODS = frozenset({"item", "max", "min", "sum", "numel", "size", "dim", "all", "any", "tolist"})
ATTRIBUTES = frozenset({"shape", "ndim"})

_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: lambda a, b: _mul(a, b), ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: lambda a, b: _pow(a, b),
}
_CMPOPS = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}


MAX_CHARS = 4096  # published constraints are one short line
MAX_NODES = 512
MAX_DEPTH = 32
MAX_INT_BITS = 1 << 16


class ConstraintError(ValueError):
    pass


def _pow(a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int and (abs(b) > MAX_INT_BITS or max(abs(a).bit_length(), 1) * b > MAX_INT_BITS):
        raise ConstraintError(f"{a} ** {b} is too large to evaluate")
    return operator.pow(a, b)


def _mul(a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int and a.bit_length() + b.bit_length() > MAX_INT_BITS:
        raise ConstraintError("a product too large to evaluate")
    return operator.mul(a, b)


@dataclass(frozen=True)
class Constraint:
    text: str
    tree: ast.Expression

    @property
    def names(self) -> set[str]:
        """Axis and input names the expression reads (function names excluded)."""
        called = {
            n.func.id for n in ast.walk(self.tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        return {n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name)} - called

    def evaluate(self, env: dict[str, Any]) -> Any:
        return _eval(self.tree.body, env)


def parse(text: str) -> Constraint:
    """Parse one constraint; ConstraintError says what is not allowed and where."""
    if not isinstance(text, str):
        raise ConstraintError(f"a constraint must be a string, got {type(text).__name__}")
    if len(text) > MAX_CHARS:
        raise ConstraintError(f"is {len(text)} characters long; a constraint may have at most {MAX_CHARS}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ConstraintError(f"does not parse: {e.msg} (column {e.offset})") from None
    except (ValueError, RecursionError, MemoryError) as e:  # NUL bytes, lone surrogates, absurd nesting
        raise ConstraintError(f"cannot be parsed ({type(e).__name__})") from None
    _check_size(tree)
    for node in ast.walk(tree):
        _check_node(node)
    return Constraint(text, tree)


def _check_size(tree: ast.AST) -> None:
    """Bound the tree before anything recursive (evaluation) walks it; iterative itself."""
    stack, count = [(tree, 0)], 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH:
            raise ConstraintError(f"is nested more than {MAX_DEPTH} levels deep")
        if count > MAX_NODES:
            raise ConstraintError(f"has more than {MAX_NODES} syntax nodes")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _check_node(node: ast.AST) -> None:
    allowed = (
        ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Name,
        ast.Load, ast.Constant, ast.Subscript, ast.Slice, ast.Call, ast.Attribute, ast.Tuple,
        *_BINOPS, *_CMPOPS, *_UNARY,
    )
    if not isinstance(node, allowed):
        raise ConstraintError(f"{type(node).__name__} is not allowed in a constraint")
    if isinstance(node, ast.Name) and node.id.startswith("_"):
        raise ConstraintError(f"name {node.id!r} is not allowed")
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, bool)):
        raise ConstraintError(f"constant {node.value!r} is not allowed")
    if isinstance(node, ast.Attribute):
        # `x.shape` / `x.item()`; a method is checked where it is called.
        if node.attr not in ATTRIBUTES | METHODS:
            raise ConstraintError(f"attribute {node.attr!r} is not allowed")
    if isinstance(node, ast.Call):
        if node.keywords:
            raise ConstraintError("keyword arguments are not allowed")
        func = node.func
        if isinstance(func, ast.Name):
            if func.id not in FUNCTIONS:
                raise ConstraintError(f"function {func.id!r} is not allowed")
        elif not (isinstance(func, ast.Attribute) and func.attr in METHODS):
            raise ConstraintError("only len/min/max/abs/int/float and tensor methods may be called")


def _eval(node: ast.AST, env: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ConstraintError(f"unknown name {node.id!r}")
        return env[node.id]
    if isinstance(node, ast.BoolOp):
        values = (_eval(v, env) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.BinOp):
        return _BINOPS[type(node.op)](_eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, env))
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = _eval(comp, env)
            if not bool(_CMPOPS[type(op)](left, right)):
                return False
            left = right
        return True
    if isinstance(node, ast.Subscript):
        return _eval(node.value, env)[_eval(node.slice, env)]
    if isinstance(node, ast.Slice):
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if p is None else _eval(p, env) for p in parts))
    if isinstance(node, ast.Tuple):
        return tuple(_eval(e, env) for e in node.elts)
    if isinstance(node, ast.Attribute):
        return getattr(_eval(node.value, env), node.attr)
    if isinstance(node, ast.Call):
        args = [_eval(a, env) for a in node.args]
        if isinstance(node.func, ast.Name):
            return FUNCTIONS[node.func.id](*args)
        return getattr(_eval(node.func.value, env), node.func.attr)(*args)
    raise ConstraintError(f"{type(node).__name__} is not allowed in a constraint")


def check_all(constraints: list[str], env: dict[str, Any], *, definition: str) -> None:
    """Evaluate every constraint; raise naming each one that does not hold."""
    failed = []
    for text in constraints:
        try:
            ok = bool(parse(text).evaluate(env))
        except ConstraintError as e:
            raise ConstraintError(f"{definition}: constraint {text!r}: {e}") from None
        except Exception as e:  # a value error inside a tensor method is still a failed constraint
            failed.append(f"{text!r} raised {type(e).__name__}: {e}")
            continue
        if not ok:
            failed.append(f"{text!r} does not hold")
    if failed:
        raise ConstraintError(f"{definition}: generated inputs violate constraints: " + "; ".join(failed))

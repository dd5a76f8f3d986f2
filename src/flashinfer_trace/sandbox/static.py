"""The first, fast line: a static AST allowlist over a reference's source, with line numbers.

It refuses what a reference has no business doing: importing beyond `ALLOWED_MODULES`, dangerous
builtins, any `_`-prefixed attribute (the road to `__globals__`, `__subclasses__`, frames), file,
process, compiler and tracing APIs by attribute name (`compile`, `cond`, `type`, `storage_type`, ...),
attribute assignment, classes, `global`, async, arbitrary decorators. `validate` reports these for
every file without running anything.

A list of names cannot close every reflective gadget inside torch (new ones come with each release),
so this is not the boundary: references run in a confined worker process (`confine.py`, `pool.py`).
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass

__all__ = ["ALLOWED_MODULES", "FUTURE_FEATURES", "SAFE_BUILTIN_NAMES", "TORCH_NN_NAMES", "TYPING_NAMES",
           "Violation", "attribute_problem", "check_reference", "parse"]

# Pure-math modules a reference may import (or reach by attribute: `torch.nn.functional`).
ALLOWED_MODULES: frozenset[str] = frozenset({
    "math", "typing",
    "torch", "torch.nn", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special",
})

# `from __future__ import annotations` (FlashInfer's fi_trace starts every reference with it) only: it makes
# annotations strings that are never evaluated. No other feature, and never `import __future__`.
FUTURE_FEATURES: frozenset[str] = frozenset({"annotations"})

# `typing` re-exports sys, types, operator, ...; `get_type_hints` evals strings unchecked. Annotations only.
TYPING_NAMES: frozenset[str] = frozenset({
    "Any", "Callable", "Dict", "Final", "FrozenSet", "Generator", "Iterable", "Iterator", "List",
    "Literal", "Mapping", "Optional", "Sequence", "Set", "TYPE_CHECKING", "Tuple", "Type", "Union", "cast",
})

_PROCESS_MODULES = frozenset({
    "os", "sys", "subprocess", "socket", "pathlib", "importlib", "builtins", "shutil", "ctypes",
    "pickle", "marshal", "io", "signal", "threading", "multiprocessing",
})

# Builtins a reference may neither name nor bind (parameters excepted: their value is the caller's).
FORBIDDEN_NAMES: frozenset[str] = _PROCESS_MODULES | {
    "open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "getattr", "setattr",
    "delattr", "hasattr", "breakpoint", "input", "help", "memoryview", "type", "object", "super",
    "classmethod", "staticmethod", "property", "format", "dir", "id", "exit", "quit", "copyright",
    "credits", "license", "bytearray",
}

# Attribute names refused on any object: files, processes, compilers, serialization, frames,
# reflection, global torch state. `.numpy()` is refused too: an ndarray has `tofile`/`dump`/`ctypes`,
# and references must stay in torch (numpy cannot read CUDA tensors anyway).
FORBIDDEN_ATTRIBUTES: frozenset[str] = _PROCESS_MODULES | {
    "inspect", "types", "gc", "glob", "platform", "tempfile", "operator", "functools", "np",
    "load", "loads", "save", "from_file", "frombuffer", "tofile", "dump", "dumps", "numpy",
    "hub", "utils", "ops", "classes", "library", "jit", "package", "onnx", "export", "distributed",
    "backends", "compile", "compiler", "fx", "cudart", "get_file_path", "get_device_module",
    "prepare_multiprocessing_environment", "use_deterministic_algorithms", "share_memory",
    "share_memory_", "format", "format_map", "mro", "system", "popen", "environ", "getenv", "putenv",
    "f_globals", "f_locals", "f_builtins", "f_back", "f_code", "f_trace", "gi_frame", "gi_code",
    "cr_frame", "cr_code", "ag_frame", "ag_code", "tb_frame", "tb_next", "co_code",
    "obj",  # AttributeError.obj: the real module when torch code fails a lookup on one
    # Reflective gadgets found by trying: `Tensor.type("a.b")` and `storage_type()(1).type("a.b")` import
    # any module by name; `cond` / `while_loop` / `scan` reach dynamo (which writes a cache directory).
    "type", "storage_type", "cond", "while_loop", "scan", "associative_scan",
}

# `torch.nn` is reachable for `torch.nn.functional` only: its Module containers are string-keyed getattrs
# (`ParameterDict()["compile"]` is `Module.compile`, which hands an FX graph to a backend of our choosing).
TORCH_NN_NAMES: frozenset[str] = frozenset({"functional"})

SAFE_BUILTIN_NAMES = frozenset({
    "abs", "all", "any", "bool", "callable", "chr", "complex", "dict", "divmod", "enumerate", "filter",
    "float", "frozenset", "hash", "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max",
    "min", "next", "ord", "pow", "range", "repr", "reversed", "round", "set", "slice", "sorted", "str",
    "sum", "tuple", "zip",
    "Exception", "ArithmeticError", "AssertionError", "AttributeError", "IndexError", "KeyError",
    "LookupError", "NotImplementedError", "OverflowError", "RuntimeError", "StopIteration", "TypeError",
    "ValueError", "ZeroDivisionError",
})

_ALLOWED_TEXT = ", ".join(sorted(ALLOWED_MODULES))
_TYPING_TEXT = ", ".join(sorted(TYPING_NAMES))
_DECORATORS = frozenset({"no_grad", "inference_mode"})


@dataclass(frozen=True)
class Violation:
    line: int | None
    message: str


def attribute_problem(attr: str) -> str | None:
    """Why `obj.<attr>` is refused, for any obj (the static check cannot know types)."""
    if attr.startswith("_"):
        return f"attribute {attr!r} is private ('_' names lead to interpreter internals)"
    if attr in FORBIDDEN_ATTRIBUTES:
        return f"attribute {attr!r} is not allowed (file, process, compiler or interpreter access)"
    if attr.startswith("register"):
        return f"attribute {attr!r} is not allowed (hooks run code later, outside the reference)"
    if attr.startswith("set_") and attr != "set_grad_enabled":
        return f"attribute {attr!r} is not allowed (changes global state other code depends on)"
    if attr.lower().endswith("storage"):
        return f"attribute {attr!r} is not allowed (raw storages can map files)"
    return None


_SPAN = ("lineno", "col_offset", "end_lineno", "end_col_offset")


class _Checker(ast.NodeVisitor):
    """Collects every violation; `params` lets a function use a parameter called e.g. `input`."""

    def __init__(self, tree: ast.Module) -> None:
        self.found: list[tuple[tuple[int, ...], Violation]] = []  # (source span, violation)
        self.params: list[set[str]] = []
        self.imported: set[str] = set()  # every name an import binds: may not be rebound
        self.torch_names: set[str] = set()  # names bound to the torch module
        self.typing_names: set[str] = set()
        self.decorator_names: set[str] = set()  # `from torch import no_grad [as x]`
        self.nn_names: set[str] = set()  # names bound to torch.nn
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    bound = a.asname or a.name.partition(".")[0]
                    self.imported.add(bound)
                    root = a.name if a.asname else a.name.partition(".")[0]
                    if root in ("torch", "typing"):
                        (self.torch_names if root == "torch" else self.typing_names).add(bound)
                    elif root == "torch.nn":
                        self.nn_names.add(bound)
            elif isinstance(node, ast.ImportFrom):
                for a in node.names:
                    self.imported.add(a.asname or a.name)
                    if node.module == "torch" and a.name in _DECORATORS:
                        self.decorator_names.add(a.asname or a.name)
                    elif node.module == "torch" and a.name == "nn":
                        self.nn_names.add(a.asname or a.name)

    def is_torch_nn(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.nn_names
        return (isinstance(node, ast.Attribute) and node.attr == "nn" and isinstance(node.value, ast.Name)
                and node.value.id in self.torch_names)

    def add(self, node: ast.AST, message: str) -> None:
        line = getattr(node, "lineno", None)
        span = tuple(getattr(node, k, None) or 0 for k in _SPAN)
        self.found.append((span, Violation(line, message)))  # sorted by span: inner nodes first

    def bind(self, node: ast.AST, name: str, *, is_import: bool = False) -> None:
        """Check a name being bound (assigned, defined, imported as, caught as)."""
        if name.startswith("__") or (is_import and name.startswith("_")):
            self.add(node, f"name {name!r} is not allowed ('_' names lead to interpreter internals)")
        elif name in FORBIDDEN_NAMES and not any(name in p for p in self.params):
            self.add(node, f"name {name!r} may not be bound (it shadows a forbidden builtin or module)")
        elif not is_import and name in self.imported:
            self.add(node, f"rebinding the imported name {name!r} is not allowed")
        elif not self.params and name in SAFE_BUILTIN_NAMES:
            self.add(node, f"rebinding the builtin {name!r} at module level is not allowed")

    # -- imports -------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name not in ALLOWED_MODULES:
                self.add(node, f"import of {a.name!r} is not allowed (allowed: {_ALLOWED_TEXT})")
            else:
                self.bind(node, a.asname or a.name.partition(".")[0], is_import=True)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.add(node, "relative imports are not allowed")
            return
        if node.module == "__future__":
            bad = [a.name for a in node.names if a.name not in FUTURE_FEATURES or a.asname]
            if bad:
                self.add(node, f"from __future__ import {', '.join(bad)} is not allowed "
                               "(only 'from __future__ import annotations')")
            return
        if node.module not in ALLOWED_MODULES:
            self.add(node, f"import from {node.module!r} is not allowed (allowed: {_ALLOWED_TEXT})")
            return
        for a in node.names:
            if a.name == "*":
                self.add(node, f"'from {node.module} import *' is not allowed")
                continue
            problem = attribute_problem(a.name)
            if problem:
                self.add(node, f"import of {node.module}.{a.name}: {problem}")
            elif node.module == "typing" and a.name not in TYPING_NAMES:
                self.add(node, f"typing.{a.name} is not allowed (references may use: {_TYPING_TEXT})")
            elif node.module == "torch.nn" and a.name not in TORCH_NN_NAMES:
                self.add(node, f"torch.nn.{a.name} is not allowed (references may use torch.nn.functional only)")
            else:
                self.bind(node, a.asname or a.name, is_import=True)

    # -- names and attributes ------------------------------------------------------------------
    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            if node.id.startswith("__"):
                self.add(node, f"name {node.id!r} is not allowed ('_' names lead to interpreter internals)")
            elif node.id in FORBIDDEN_NAMES and not any(node.id in p for p in self.params):
                self.add(node, f"name {node.id!r} is not allowed")
        else:
            self.bind(node, node.id)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        problem = attribute_problem(node.attr)
        if node.attr == "type" and isinstance(node.value, ast.Attribute) and node.value.attr == "device":
            problem = None  # `x.device.type` is a plain string; Tensor.type("a.b") is the gadget
        if problem:
            self.add(node, problem)
        elif not isinstance(node.ctx, ast.Load):
            self.add(node, f"assigning or deleting attribute {node.attr!r} is not allowed "
                           "(references may not modify modules or shared objects)")
        elif (isinstance(node.value, ast.Name) and node.value.id in self.typing_names
              and node.attr not in TYPING_NAMES):
            self.add(node, f"typing.{node.attr} is not allowed")
        elif self.is_torch_nn(node.value) and node.attr not in TORCH_NN_NAMES:
            self.add(node, f"torch.nn.{node.attr} is not allowed (references may use torch.nn.functional only)")
        self.generic_visit(node)

    # -- functions -----------------------------------------------------------------------------
    def _decorator_ok(self, d: ast.expr) -> bool:
        if isinstance(d, ast.Call):
            if d.args or d.keywords:
                return False
            d = d.func
        if isinstance(d, ast.Attribute):
            return isinstance(d.value, ast.Name) and d.value.id in self.torch_names and d.attr in _DECORATORS
        return isinstance(d, ast.Name) and d.id in self.decorator_names

    def _function(self, node: ast.FunctionDef | ast.Lambda, body: list[ast.AST]) -> None:
        args = node.args
        every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
        for a in every:
            if a.arg.startswith("__"):
                self.add(a, f"parameter name {a.arg!r} is not allowed")
            if a.annotation is not None:
                self.visit(a.annotation)
        for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
            self.visit(default)  # evaluated at definition time, in the enclosing scope
        self.params.append({a.arg for a in every})
        for child in body:
            self.visit(child)
        self.params.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.bind(node, node.name)
        for d in node.decorator_list:
            if not self._decorator_ok(d):
                self.add(d, "only @torch.no_grad() and @torch.inference_mode() decorators are allowed")
            self.visit(d)
        if node.returns is not None:
            self.visit(node.returns)
        self._function(node, node.body)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._function(node, [node.body])

    # -- refused constructs --------------------------------------------------------------------
    def _refuse(self, node: ast.AST, what: str) -> None:
        self.add(node, f"{what} are not allowed in a reference")
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._refuse(node, "class definitions")

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._refuse(node, "async functions")

    def visit_Await(self, node: ast.Await) -> None:
        self._refuse(node, "await expressions")

    def visit_AsyncFor(self, node: ast.AsyncFor) -> None:
        self._refuse(node, "async for loops")

    def visit_AsyncWith(self, node: ast.AsyncWith) -> None:
        self._refuse(node, "async with blocks")

    def visit_Global(self, node: ast.Global) -> None:
        self._refuse(node, "global statements")

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self._refuse(node, "nonlocal statements")

    def visit_comprehension(self, node: ast.comprehension) -> None:
        if node.is_async:
            self.add(node.target, "async comprehensions are not allowed in a reference")
        self.generic_visit(node)

    # -- other bindings ------------------------------------------------------------------------
    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.bind(node, node.name)
        self.generic_visit(node)

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for attr in node.kwd_attrs:  # `case int(__class__=c)` is a getattr by string
            problem = attribute_problem(attr)
            if problem:
                self.add(node, problem)
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self.bind(node, node.name)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self.bind(node, node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self.bind(node, node.rest)
        self.generic_visit(node)


MAX_SOURCE_CHARS = 1 << 20  # published references are a few KB; a 10 MB one is an attack on the parser


def parse(code: str) -> ast.Module:
    """ast.parse, bounded: ValueError for text over MAX_SOURCE_CHARS."""
    if len(code) > MAX_SOURCE_CHARS:
        raise ValueError(f"{len(code)} characters, more than the {MAX_SOURCE_CHARS} allowed")
    with warnings.catch_warnings():  # invalid escapes etc. are the author's business, not ours
        warnings.simplefilter("ignore")
        return ast.parse(code)


def check_reference(code: str) -> list[Violation]:
    """All policy violations in the source (syntax error -> one Violation with its line). Never raises."""
    if not isinstance(code, str):
        return [Violation(None, f"must be a str, got {type(code).__name__}")]
    try:
        tree = parse(code)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(tree, "<reference>", "exec", dont_inherit=True)  # 'return' outside function etc.
    except SyntaxError as e:
        return [Violation(e.lineno, f"is not valid Python: {e.msg}")]
    except (ValueError, RecursionError, MemoryError) as e:  # NUL bytes, surrogates, absurd nesting
        return [Violation(None, f"cannot be parsed: {type(e).__name__}: {e}")]
    checker = _Checker(tree)
    try:
        checker.visit(tree)
    except RecursionError:
        return [Violation(None, "is too deeply nested to check")]
    return list(dict.fromkeys(v for _, v in sorted(checker.found, key=lambda f: f[0])))

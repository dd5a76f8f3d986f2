"""Compile the untrusted `reference` source of a definition into a callable, safely.

Definition files come from anywhere, and their `reference` is Python we must run to get ground
truth. Two layers keep it to "plain PyTorch math" (the threat model is in docs/sandbox.md):

1. A static AST check (`check_reference`) that refuses, with line numbers, everything a reference
   has no business doing: importing beyond `ALLOWED_MODULES`, dangerous builtins, any `_`-prefixed
   attribute (the road to `__globals__`, `__subclasses__`, frames), file/process/compiler APIs by
   attribute name, attribute assignment, classes, `global`, async, arbitrary decorators.
2. A restricted runtime (`compile_reference`): a fresh namespace per compile whose builtins hold only
   harmless functions, and whose modules are *views* that refuse submodules outside the allowlist
   (torch, `F` and `typing` expose `os`, `sys`, `builtins`, `importlib`, `np`, ... as plain
   attributes) and TorchScript internals re-exported on `torch` (e.g. `torch.PyTorchFileWriter`).

Neither layer bounds CPU, memory or time: callers run references under timeouts / in subprocesses.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "ALLOWED_MODULES",
    "SandboxError",
    "Violation",
    "check_reference",
    "compile_reference",
    "reference_constants",
]

# Pure-math modules a reference may import (or reach by attribute: `torch.nn.functional`).
ALLOWED_MODULES: frozenset[str] = frozenset({
    "math", "typing",
    "torch", "torch.nn", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special",
})

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
}

_SAFE_BUILTIN_NAMES = frozenset({
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
# `torch` re-exports ~150 `torch._C` objects (TorchScript compiler, file readers/writers, fork/wait);
# the runtime view refuses those except these plain value types and queries.
_TORCH_C_ALLOWED = frozenset({
    "Size", "device", "dtype", "finfo", "iinfo", "layout", "memory_format", "qscheme", "Generator",
    "OutOfMemoryError", "get_default_dtype", "get_num_threads", "is_grad_enabled",
    "is_inference_mode_enabled",
})


class SandboxError(ValueError):
    """A reference that may not (or cannot) be compiled; names the definition and, when known, the line."""

    def __init__(self, definition: str, line: int | None, message: str) -> None:
        self.definition, self.line, self.message = definition, line, message
        where = f"reference line {line}: " if line is not None else "reference "
        super().__init__(f"{definition}: {where}{message}")

    def __reduce__(self):  # survive pickling across worker processes
        return (type(self), (self.definition, self.line, self.message))


@dataclass(frozen=True)
class Violation:
    line: int | None
    message: str


def _attribute_problem(attr: str) -> str | None:
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
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    bound = a.asname or a.name.partition(".")[0]
                    self.imported.add(bound)
                    root = a.name if a.asname else a.name.partition(".")[0]
                    if root in ("torch", "typing"):
                        (self.torch_names if root == "torch" else self.typing_names).add(bound)
            elif isinstance(node, ast.ImportFrom):
                for a in node.names:
                    self.imported.add(a.asname or a.name)
                    if node.module == "torch" and a.name in _DECORATORS:
                        self.decorator_names.add(a.asname or a.name)

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
        elif not self.params and name in _SAFE_BUILTIN_NAMES:
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
        if node.module not in ALLOWED_MODULES:
            self.add(node, f"import from {node.module!r} is not allowed (allowed: {_ALLOWED_TEXT})")
            return
        for a in node.names:
            if a.name == "*":
                self.add(node, f"'from {node.module} import *' is not allowed")
                continue
            problem = _attribute_problem(a.name)
            if problem:
                self.add(node, f"import of {node.module}.{a.name}: {problem}")
            elif node.module == "typing" and a.name not in TYPING_NAMES:
                self.add(node, f"typing.{a.name} is not allowed (references may use: {_TYPING_TEXT})")
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
        problem = _attribute_problem(node.attr)
        if problem:
            self.add(node, problem)
        elif not isinstance(node.ctx, ast.Load):
            self.add(node, f"assigning or deleting attribute {node.attr!r} is not allowed "
                           "(references may not modify modules or shared objects)")
        elif (isinstance(node.value, ast.Name) and node.value.id in self.typing_names
              and node.attr not in TYPING_NAMES):
            self.add(node, f"typing.{node.attr} is not allowed")
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
            problem = _attribute_problem(attr)
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


def _parse(code: str) -> ast.Module:
    with warnings.catch_warnings():  # invalid escapes etc. are the author's business, not ours
        warnings.simplefilter("ignore")
        return ast.parse(code)


def check_reference(code: str) -> list[Violation]:
    """All policy violations in the source (syntax error -> one Violation with its line). Never raises."""
    if not isinstance(code, str):
        return [Violation(None, f"must be a str, got {type(code).__name__}")]
    try:
        tree = _parse(code)
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


# -- runtime -------------------------------------------------------------------------------------

class _Modules:
    """The module views and guarded `__import__` of ONE compiled reference (nothing is shared)."""

    def __init__(self) -> None:
        self.views: dict[str, types.ModuleType] = {}

    def view(self, name: str) -> types.ModuleType:
        if name not in self.views:
            self.views[name] = _make_view(importlib.import_module(name), self)
        return self.views[name]

    def import_(self, name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002 - __import__'s signature
        if level != 0 or not isinstance(name, str) or name not in ALLOWED_MODULES:
            raise ImportError(f"import of {name!r} is not allowed in a reference")
        # Real semantics: `import a.b.c [as x]` gets the top package and walks attributes (IMPORT_FROM);
        # `from a.b import c` gets a.b itself.
        return self.view(name if fromlist else name.partition(".")[0])


def _make_view(real: types.ModuleType, modules: _Modules) -> types.ModuleType:
    """A stand-in for `real` that resolves attributes lazily and refuses the dangerous ones.

    Its `__name__` is not in sys.modules, so `from torch import utils` cannot fall back to the real
    submodule, and assignments to it (statically refused anyway) would never reach the real module.
    """
    qualname = real.__name__

    def refuse(attr: str, why: str) -> AttributeError:
        return AttributeError(f"{qualname}.{attr} is not available to references ({why})")

    def __getattr__(self, attr: str):
        problem = _attribute_problem(attr)
        if problem:
            raise refuse(attr, problem)
        try:
            value = getattr(real, attr)
        except AttributeError:
            raise AttributeError(f"module {qualname!r} has no attribute {attr!r}") from None
        if isinstance(value, types.ModuleType):
            if value.__name__ not in ALLOWED_MODULES:
                raise refuse(attr, "module outside the allowlist")
            value = modules.view(value.__name__)
        elif qualname == "typing" and attr not in TYPING_NAMES:
            raise refuse(attr, "only annotation helpers are available")
        elif (qualname == "torch" and callable(value) and attr not in _TORCH_C_ALLOWED
              and getattr(real._C, attr, None) is value):
            raise refuse(attr, "TorchScript / interpreter internals")
        self.__dict__[attr] = value  # cache: later lookups are plain dict hits
        return value

    cls = type("ReferenceModule", (types.ModuleType,), {"__getattr__": __getattr__})
    return cls(f"<reference view of {qualname}>")


def _traceback_line(tb: types.TracebackType | None, filename: str) -> int | None:
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def compile_reference(code: str, *, definition: str = "<reference>", entry: str = "run") -> Callable:
    """Check, then execute the module body in a fresh restricted namespace; return its `entry` function.

    Raises SandboxError (the first violation, with definition and line) on any violation, when `entry`
    is missing or not a function, or when executing the module body raises.
    """
    if not isinstance(code, str):
        raise SandboxError(definition, None, f"must be a str, got {type(code).__name__}")
    violations = check_reference(code)
    if violations:
        raise SandboxError(definition, violations[0].line, violations[0].message)
    filename = f"<reference {definition}>"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code_object = compile(_parse(code), filename, "exec", dont_inherit=True)
    modules = _Modules()
    safe_builtins = {name: getattr(builtins, name) for name in _SAFE_BUILTIN_NAMES}
    safe_builtins["__import__"] = modules.import_
    namespace = {"__builtins__": safe_builtins, "__name__": "flashinfer_trace_reference"}
    try:
        exec(code_object, namespace)
    except Exception as e:
        text = str(e) if len(str(e)) <= 500 else str(e)[:500] + "..."
        raise SandboxError(definition, _traceback_line(e.__traceback__, filename),
                           f"raised {type(e).__name__} while executing its module body: {text}") from e
    fn = namespace.get(entry)
    if not isinstance(fn, types.FunctionType):
        got = "" if fn is None else f" ({entry} is not a function but {type(fn).__name__})"
        raise SandboxError(definition, None, f"defines no function {entry}(){got}")
    return fn


# -- constants -----------------------------------------------------------------------------------

_NOT_CONSTANT = object()
_ARITHMETIC = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a ** b,
}


def _is_number(v: object) -> bool:
    return type(v) in (int, float)


def _literal(node: ast.AST, known: dict[str, object], depth: int = 0) -> object:
    """The value of a constant expression, or _NOT_CONSTANT. Sizes are bounded: no `"a" * 10**9`."""
    if depth > 50:
        return _NOT_CONSTANT
    if isinstance(node, ast.Constant):
        return node.value if type(node.value) in (int, float, str, bool) else _NOT_CONSTANT
    if isinstance(node, ast.Name):
        return known.get(node.id, _NOT_CONSTANT)
    if isinstance(node, ast.Tuple):
        items = tuple(_literal(e, known, depth + 1) for e in node.elts)
        return _NOT_CONSTANT if any(i is _NOT_CONSTANT for i in items) else items
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _literal(node.operand, known, depth + 1)
        return (-v if isinstance(node.op, ast.USub) else v) if _is_number(v) else _NOT_CONSTANT
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        a, b = _literal(node.left, known, depth + 1), _literal(node.right, known, depth + 1)
        if isinstance(node.op, ast.Add) and type(a) is str and type(b) is str:
            return a + b
        if not (_is_number(a) and _is_number(b)):
            return _NOT_CONSTANT
        if isinstance(node.op, ast.Pow) and type(a) is int and type(b) is int and (
                abs(b) > 4096 or abs(a).bit_length() * abs(b) > 65536):
            return _NOT_CONSTANT
        try:
            v = _ARITHMETIC[type(node.op)](a, b)
        except (ArithmeticError, ValueError):
            return _NOT_CONSTANT
        return v if _is_number(v) else _NOT_CONSTANT  # (-8) ** 0.5 is complex
    return _NOT_CONSTANT


def _bound_names(stmt: ast.stmt) -> set[str]:
    """Names a top-level statement (re)binds, conservatively (a later rebinding voids a constant)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).partition(".")[0] for a in stmt.names}
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}


def reference_constants(code: str) -> dict[str, object]:
    """Top-level `NAME = <constant expression>` assignments, e.g. {"EPS": 1e-5}. Never executes code.

    Ground-truth adapters read hard-coded parameters (EPS, TOP_K, ...) from here. Accepted: int, float,
    str, bool, tuples of these, unary +/-, + - * / // % ** on numbers (1/128, 2**-7), str + str, and
    names of constants found earlier. Anything else, or a later rebinding, leaves the name out.
    Returns {} for non-str or unparsable input.
    """
    if not isinstance(code, str):
        return {}
    try:
        tree = _parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    constants: dict[str, object] = {}
    for stmt in tree.body:
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

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
import inspect
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ALLOWED_MODULES", "FUTURE_FEATURES", "SAFE_BUILTIN_NAMES", "TORCH_NN_NAMES", "TYPING_NAMES", "Entry",
           "UNEVALUATED", "Violation", "attribute_problem", "check_reference", "entry_point", "entry_signature",
           "parse", "undefined_names"]

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


def run_parameters(code: str, entry: str = "run") -> list[str] | None:
    """The plain positional parameters of the last top-level `def <entry>`; None when there is no such
    function, it takes *args / **kwargs / keyword-only / positional-only ones, or the code does not parse."""
    try:
        tree = parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry]
    if not defs:
        return None
    a = defs[-1].args
    if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs:
        return None
    return [p.arg for p in a.args]


class _Unevaluated:
    """A parameter's default as `entry_signature` gives it: the expression stays unevaluated in the parent
    (only the worker runs a reference's code); the worker's function applies the real default."""

    def __repr__(self) -> str:
        return "<default>"


UNEVALUATED = _Unevaluated()


def entry_signature(code: str, entry: str = "run") -> inspect.Signature | None:
    """The parameter list of the top-level `def <entry>` in `code`, read from the AST (never run): names,
    kinds (positional-only, keyword-only, *args, **kwargs) and which have a default (UNEVALUATED), so a
    caller can bind arguments exactly as calling the function would. None when the code does not parse,
    or `entry` is bound other than by top-level `def`s (an assignment, an import, a nested definition):
    then which function the name ends up as is not readable statically."""
    try:
        tree = parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    top = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry]
    for node in ast.walk(tree):
        binds = (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == entry
                 or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == entry
                 and node not in top
                 or isinstance(node, ast.alias) and (node.asname or node.name.partition(".")[0]) == entry
                 or isinstance(node, (ast.Global, ast.Nonlocal)) and entry in node.names
                 or isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name == entry
                 or isinstance(node, ast.MatchMapping) and node.rest == entry)
        if binds:
            return None
    if not top:
        return None
    a = top[-1].args
    kind = inspect.Parameter
    positional = [(p, kind.POSITIONAL_ONLY) for p in a.posonlyargs] + [(p, kind.POSITIONAL_OR_KEYWORD) for p in a.args]
    first_default = len(positional) - len(a.defaults)
    params = [kind(p.arg, k, default=UNEVALUATED if i >= first_default else kind.empty)
              for i, (p, k) in enumerate(positional)]
    if a.vararg:
        params.append(kind(a.vararg.arg, kind.VAR_POSITIONAL))
    params += [kind(p.arg, kind.KEYWORD_ONLY, default=kind.empty if d is None else UNEVALUATED)
               for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    if a.kwarg:
        params.append(kind(a.kwarg.arg, kind.VAR_KEYWORD))
    try:
        return inspect.Signature(params)
    except ValueError:  # not reachable for code that parses; never a crash of the caller
        return None


@dataclass(frozen=True)
class Entry:
    """The function a reference is called through: `name`, or None and `problem` saying why none is.

    For an fi_trace entry point (`by_name`), `keywords` maps each input it takes to the keyword it is
    passed as (its own name, or its documented `param`), and `ignored` lists the inputs it does not
    take: call-site parameters of the API that the reference ignores (never passed to it)."""

    name: str | None
    problem: str | None = None
    by_name: bool = False  # the inputs are passed by keyword (an fi_trace entry point), not by position
    keywords: tuple[tuple[str, str], ...] = ()  # (input, keyword) in input order; only when by_name
    ignored: tuple[str, ...] = ()
    renamed: tuple[tuple[str, str], ...] = ()  # (input, parameter) bound by position (rule 4)

    @property
    def mapped(self) -> list[tuple[str, str]]:
        """(input, keyword) pairs where the keyword is the input's `param`, not its name."""
        return [(i, k) for i, k in self.keywords if i != k]


def _keywords(fn: ast.FunctionDef, inputs: list[str], params: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """({input: keyword it is passed as}, inputs it cannot take). An input is taken by a parameter of its
    own name; else by one named as its documented `param` (that no other input takes by name); else by
    `**kwargs` under its own name."""
    a = fn.args
    by_name = {p.arg for p in a.args + a.kwonlyargs}
    taken: dict[str, str] = {}
    unaccepted: list[str] = []
    for n in inputs:
        alias = params.get(n)
        if n in by_name:
            taken[n] = n
        elif alias is not None and alias in by_name and alias not in inputs:
            taken[n] = alias
        elif a.kwarg is not None:
            taken[n] = n
        else:
            unaccepted.append(n)
    return taken, unaccepted


def _accepts(fn: ast.FunctionDef, inputs: list[str],
             params: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """(inputs it cannot take by name, its required parameters that no input is passed as)."""
    a = fn.args
    taken, unaccepted = _keywords(fn, inputs, params or {})
    positional = a.posonlyargs + a.args
    required = [p.arg for p in positional[:len(positional) - len(a.defaults)]]
    required += [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None]
    posonly = {p.arg for p in a.posonlyargs}
    passed = set(taken.values())
    missing = [p for p in required if p not in passed or p in posonly]
    return unaccepted, missing


def entry_point(code: str, inputs: list[str], params: dict[str, str] | None = None,
                optional: Iterable[str] = ()) -> Entry:
    """The reference's entry point, parsed (never run). The rule (docs/definitions.md):

    1. a top-level `run`, called with the inputs by position (the public format);
    2. else the one top-level function that takes every input by name (a parameter of that name, one
       named as the input's documented `param`, or `**kwargs`) and requires nothing else: FlashInfer's
       fi_trace names its reference after the template (`_rmsnorm_reference`) and inlines helper
       functions before it; it is called by keyword;
    3. else the last top-level function, if it requires nothing that is not an input, takes at least one
       input, and every input it does not take is `optional`: those are call-site parameters of the API
       that the reference ignores (`ignored`; never passed to it; validate notes them);
    4. else the last one, if its positional parameters line up one to one with the inputs, and the only one
       it requires that is no input is its first, while no parameter takes the first input
       (`_gemma_rmsnorm_reference(input, weight)` for inputs `hidden_states`, `weight`): the template
       renamed the API's first parameter and the reference kept its name (`renamed`; noted);
    5. else none, and `problem` says why (no function, several candidates, or what the last one lacks).
    `params`: input name -> its `param` field (the API parameter it is passed as), where it has one;
    `optional`: the inputs marked `"optional": true` (only those may be ignored).
    """
    params = params or {}
    optional = set(optional)
    try:
        tree = parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return Entry(None, "the reference does not parse")
    defs: dict[str, ast.FunctionDef] = {}
    for n in tree.body:
        if isinstance(n, ast.FunctionDef):
            defs.pop(n.name, None)
            defs[n.name] = n  # the last definition of a name wins, and keeps its place last
    if "run" in defs:
        return Entry("run")
    if not defs:
        return Entry(None, "the reference defines no top-level function (expected run(), or one function "
                           "taking the inputs by name)")

    def entry(name: str, renamed: dict[str, str] | None = None) -> Entry:
        taken, unaccepted = _keywords(defs[name], inputs, {**params, **(renamed or {})})
        return Entry(name, by_name=True, keywords=tuple(taken.items()), ignored=tuple(unaccepted),
                     renamed=tuple((renamed or {}).items()))

    fits = [name for name, fn in defs.items() if _accepts(fn, inputs, params) == ([], [])]
    if len(fits) == 1:
        return entry(fits[0])
    if fits and fits[-1] == list(defs)[-1]:
        # fi_trace inlines the reference's helpers before it ("# ----- reference -----"): the last wins
        return entry(fits[-1])
    if fits:
        return Entry(None, f"no run(), and {len(fits)} top-level functions take the inputs by name "
                           f"({', '.join(fits)}): which one is the reference is ambiguous")
    last = list(defs.values())[-1]
    unaccepted, missing = _accepts(last, inputs, params)
    if not missing and len(unaccepted) < len(inputs) and set(unaccepted) <= optional:
        return entry(last.name)  # rule 3: the inputs it does not take are ignored call-site parameters
    renamed = _renamed(last, inputs, params, missing)
    if renamed:
        unaccepted, missing = _accepts(last, inputs, {**params, **renamed})
        if not missing and set(unaccepted) <= optional:
            return entry(last.name, renamed)  # rule 4: a parameter renamed in place
    why = "; ".join(x for x in (
        f"it has no parameter for input(s) {', '.join(unaccepted)}" + _optional_hint(unaccepted, optional)
        if unaccepted else "",
        f"it requires {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not an input"
        + _param_hint(missing, inputs, params) if missing else "") if x)
    return Entry(None, f"no run(), and no top-level function takes the inputs by name; the last one, "
                       f"{last.name}(), does not fit: {why}")


def _renamed(fn: ast.FunctionDef, inputs: list[str], params: dict[str, str], missing: list[str]) -> dict[str, str]:
    """{first input: first parameter} where the first parameter is the one required parameter no input is
    passed as, the first input is taken by no parameter, and the positional parameters line up one to one
    with the inputs; else {}. Only the first: a template names the API's `input` after what it holds
    (`hidden_states`); anywhere else a position is too weak a reason (a `return_lse` is no `workspace`)."""
    positional = [p.arg for p in fn.args.args]
    if (fn.args.posonlyargs or len(positional) != len(inputs) or missing != positional[:1]
            or inputs[0] in set(positional) | {p.arg for p in fn.args.kwonlyargs} | set(params.values())
            or inputs[0] in params):
        return {}
    return {inputs[0]: positional[0]}


def _optional_hint(unaccepted: list[str], optional: set[str]) -> str:
    required = [n for n in unaccepted if n not in optional]
    if not required:
        return ""
    return f" ({', '.join(required)} not marked \"optional\", so not an ignorable call-site parameter)"


def _param_hint(missing: list[str], inputs: list[str], params: dict[str, str]) -> str:
    """Why a required parameter is no input: say so where no input documents it as its `param`."""
    if any(params.get(i) in missing for i in inputs):
        return ""  # an input names it as its param but another input takes that name (reported above)
    return " (nor any input's \"param\"), and it has no default"


def _annotations(fn: ast.FunctionDef) -> list[ast.expr]:
    a = fn.args
    found = [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
             if x is not None and x.annotation is not None]
    return found + ([fn.returns] if fn.returns is not None else [])


def _loads(node: ast.AST, skip: set[int]) -> list[ast.Name]:
    """Names read under `node`, leaving out the subtrees in `skip` (by id)."""
    out: list[ast.Name] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in skip:
            continue
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            out.append(n)
        stack.extend(ast.iter_child_nodes(n))
    return out


def undefined_names(code: str, entry: str | None) -> list[tuple[str, str]]:
    """(function, name) for each name that a function reachable from `entry` (None: every top-level
    function) reads but that nothing binds:
    no parameter or assignment of its own, no top-level definition or import, no builtin. Such a reference
    raises NameError when called (fi_trace leaves some helpers out of the file it writes). Annotations count
    only where they are evaluated (no `from __future__ import annotations`)."""
    import builtins

    try:
        tree = parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    lazy = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in tree.body)
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    module = set(dir(builtins))
    for n in tree.body:
        if isinstance(n, ast.FunctionDef):
            module.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            module.update((a.asname or a.name).split(".")[0] for a in n.names)
        else:
            module.update(x.id for x in ast.walk(n) if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Store))
    found: list[tuple[str, str]] = []
    todo = [entry] if entry is not None else list(defs)[::-1]
    seen = set(todo)
    while todo:
        fn = defs.get(todo.pop())
        if fn is None:
            continue
        own: set[str] = set()  # everything bound anywhere inside it (nested functions included): lenient
        skip: set[int] = {id(x) for x in _annotations(fn)} if lazy else set()
        for x in ast.walk(fn):
            if isinstance(x, ast.arg):
                own.add(x.arg)
            elif isinstance(x, ast.Name) and isinstance(x.ctx, (ast.Store, ast.Del)):
                own.add(x.id)
            elif isinstance(x, ast.FunctionDef) and x is not fn:
                own.add(x.name)
                if lazy:
                    skip.update(id(y) for y in _annotations(x))
            elif isinstance(x, ast.Import | ast.ImportFrom):
                own.update((a.asname or a.name).split(".")[0] for a in x.names)
            elif isinstance(x, ast.ExceptHandler) and x.name:
                own.add(x.name)
            elif isinstance(x, ast.AnnAssign) and lazy:
                skip.add(id(x.annotation))
        for name in _loads(fn, skip):
            if name.id in own:
                continue
            if name.id in defs and name.id not in seen:
                seen.add(name.id)
                todo.append(name.id)
            elif name.id not in module and (fn.name, name.id) not in found:
                found.append((fn.name, name.id))
    return found


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

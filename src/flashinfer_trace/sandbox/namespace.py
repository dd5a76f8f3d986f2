"""The restricted runtime a reference's module body and `run` execute in, inside the worker.

A fresh namespace per compile whose builtins hold only harmless functions, and whose modules are
*views* that refuse submodules outside the allowlist (torch, `F` and `typing` expose `os`, `sys`,
`builtins`, `importlib`, `np`, ... as plain attributes), TorchScript internals re-exported on `torch`
(e.g. `torch.PyTorchFileWriter`), and everything on `torch.nn` but `functional`. It backs up the static
check where names cannot tell; the boundary itself is the worker process (`confine.py`).
"""

from __future__ import annotations

import builtins
import importlib
import sys
import types
import warnings
from collections.abc import Callable

from .errors import SandboxError
from .static import (
    ALLOWED_MODULES,
    FUTURE_FEATURES,
    SAFE_BUILTIN_NAMES,
    TORCH_NN_NAMES,
    TYPING_NAMES,
    attribute_problem,
    check_reference,
    parse,
)

__all__ = ["compile_in_namespace", "source_name", "traceback_line"]

# `torch` re-exports ~150 `torch._C` objects (TorchScript compiler, file readers/writers, fork/wait);
# the runtime view refuses those except these plain value types and queries.
_TORCH_C_ALLOWED = frozenset({
    "Size", "device", "dtype", "finfo", "iinfo", "layout", "memory_format", "qscheme", "Generator",
    "OutOfMemoryError", "get_default_dtype", "get_num_threads", "is_grad_enabled",
    "is_inference_mode_enabled", "is_autocast_enabled",
})


class _Modules:
    """The module views and guarded `__import__` of ONE compiled reference (nothing is shared)."""

    def __init__(self) -> None:
        self.views: dict[str, types.ModuleType] = {}

    def view(self, name: str) -> types.ModuleType:
        if name not in self.views:
            self.views[name] = _make_view(importlib.import_module(name), self)
        return self.views[name]

    def import_(self, name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002 - __import__'s signature
        if (name == "__future__" and level == 0 and isinstance(fromlist, tuple) and fromlist
                and set(fromlist) <= FUTURE_FEATURES):
            return self.view(name)  # `from __future__ import annotations` executes this import too
        if (level == 0 and type(fromlist) is list and fromlist in ([], ["__doc__"]) and isinstance(name, str)
                and name.partition(".")[0] == "torch" and name in sys.modules):
            # torch's C++ imports its own modules through the caller's `__import__` (PyImport_Import passes a
            # list as fromlist, [] or ["__doc__"] by Python version; an import statement a tuple or None):
            # `torch.tensor([..])` in a reference asks for torch.storage this way. It gets torch's real module.
            return sys.modules[name]
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
        problem = attribute_problem(attr)
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
        elif qualname == "torch.nn" and attr not in TORCH_NN_NAMES:
            raise refuse(attr, "torch.nn offers references torch.nn.functional only")
        elif (qualname == "torch" and callable(value) and attr not in _TORCH_C_ALLOWED
              and getattr(real._C, attr, None) is value):
            raise refuse(attr, "TorchScript / interpreter internals")
        self.__dict__[attr] = value  # cache: later lookups are plain dict hits
        return value

    cls = type("ReferenceModule", (types.ModuleType,), {"__getattr__": __getattr__})
    return cls(f"<reference view of {qualname}>")


def source_name(definition: str) -> str:
    return f"<reference {definition}>"


def traceback_line(tb: types.TracebackType | None, filename: str) -> int | None:
    """The last line of the reference (not torch's) that a traceback passes through."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def compile_in_namespace(code: str, *, definition: str = "<reference>", entry: str = "run") -> Callable:
    """Check, then execute the module body in a fresh restricted namespace; return its `entry` function.

    Raises SandboxError (the first violation, with definition and line) on any violation, when `entry`
    is missing or not a function, or when executing the module body raises.
    """
    if not isinstance(code, str):
        raise SandboxError(definition, None, f"must be a str, got {type(code).__name__}")
    violations = check_reference(code)
    if violations:
        raise SandboxError(definition, violations[0].line, violations[0].message)
    filename = source_name(definition)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code_object = compile(parse(code), filename, "exec", dont_inherit=True)
    modules = _Modules()
    safe_builtins = {name: getattr(builtins, name) for name in SAFE_BUILTIN_NAMES}
    safe_builtins["__import__"] = modules.import_
    namespace = {"__builtins__": safe_builtins, "__name__": "flashinfer_trace_reference"}
    try:
        exec(code_object, namespace)
    except Exception as e:
        text = str(e) if len(str(e)) <= 500 else str(e)[:500] + "..."
        raise SandboxError(definition, traceback_line(e.__traceback__, filename),
                           f"raised {type(e).__name__} while executing its module body: {text}") from e
    fn = namespace.get(entry)
    if not isinstance(fn, types.FunctionType):
        got = "" if fn is None else f" ({entry} is not a function but {type(fn).__name__})"
        raise SandboxError(definition, None, f"defines no function {entry}(){got}")
    return fn

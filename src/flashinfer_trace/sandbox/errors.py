"""What can go wrong with an untrusted reference, as exceptions that name the definition.

`SandboxError` (a ValueError): the reference may not, or cannot, be compiled (a policy violation, a
syntax error, a module body that raises). `ReferenceFailure` (a RuntimeError): it compiled, but a call
did not give a result: it raised, ran out of time, memory or CPU time, or killed its worker. Each
carries a `kind` the results and the matrix can group by.
"""

from __future__ import annotations

import builtins

__all__ = ["ConfinementUnavailable", "ReferenceFailure", "SandboxError", "reference_raised"]


class SandboxError(ValueError):
    """A reference that may not (or cannot) be compiled; names the definition and, when known, the line."""

    def __init__(self, definition: str, line: int | None, message: str) -> None:
        self.definition, self.line, self.message = definition, line, message
        where = f"reference line {line}: " if line is not None else "reference "
        super().__init__(f"{definition}: {where}{message}")

    def __reduce__(self):  # survive pickling across worker processes
        return (type(self), (self.definition, self.line, self.message))


class ConfinementUnavailable(SandboxError):
    """This machine cannot confine the worker (a mechanism is missing) and the user did not allow
    running untrusted references without it."""

    def __init__(self, definition: str, message: str) -> None:
        super().__init__(definition, None, message)
        self.args = (f"{definition}: {message}",)

    def __str__(self) -> str:
        return self.args[0]

    def __reduce__(self):
        return (type(self), (self.definition, self.message))


class ReferenceFailure(RuntimeError):
    """A call of a compiled reference gave no result.

    kind: "raised" (the reference raised; `remote_type` names the exception), "timeout", "crash"
    (the worker died: `detail` names the signal), "memory", "cpu-time", "protocol" (the worker
    answered something that is not a valid result).
    """

    def __init__(self, definition: str, kind: str, detail: str, *, line: int | None = None,
                 remote_type: str | None = None) -> None:
        self.definition, self.kind, self.detail, self.line, self.remote_type = (
            definition, kind, detail, line, remote_type)
        where = f" (reference line {line})" if line is not None else ""
        super().__init__(f"{definition}: {kind}: {detail}{where}")

    def __reduce__(self):
        return (_rebuild_failure, (self.definition, self.kind, self.detail, self.line, self.remote_type))


def _rebuild_failure(definition, kind, detail, line, remote_type):
    if kind == "raised" and remote_type:
        return reference_raised(definition, remote_type, detail, line)
    return ReferenceFailure(definition, kind, detail, line=line, remote_type=remote_type)


# Exceptions a reference raises on purpose (`assert x.dim() == 2`, `raise ValueError(...)`) come back
# as a ReferenceFailure that is also the builtin they were, so `except ValueError` keeps working.
_MIRRORED = frozenset({
    "ArithmeticError", "AssertionError", "AttributeError", "IndexError", "KeyError", "LookupError",
    "NotImplementedError", "OverflowError", "RuntimeError", "StopIteration", "TypeError", "ValueError",
    "ZeroDivisionError", "NameError", "MemoryError", "RecursionError", "UnboundLocalError",
})
_mirror_classes: dict[str, type] = {}


def reference_raised(definition: str, remote_type: str, message: str, line: int | None) -> ReferenceFailure:
    """The exception to raise for a reference that raised `remote_type` with `message` in its worker."""
    detail = f"{remote_type}: {message}"
    if remote_type not in _MIRRORED:
        return ReferenceFailure(definition, "raised", detail, line=line, remote_type=remote_type)
    cls = _mirror_classes.get(remote_type)
    if cls is None:
        base = getattr(builtins, remote_type)
        bases = (ReferenceFailure,) if base is RuntimeError else (ReferenceFailure, base)
        cls = _mirror_classes[remote_type] = type(f"Reference{remote_type}", bases, {"__module__": __name__})
    return cls(definition, "raised", detail, line=line, remote_type=remote_type)

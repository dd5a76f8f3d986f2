"""Running untrusted references: a static check first, then a confined worker process.

    check_reference(code)            -> [Violation(line, message), ...]; never raises, runs nothing
    run = compile_reference(code, definition="rmsnorm_h4096")   # SandboxError on any violation
    run(x, w)                        # runs in the worker; ReferenceFailure on timeout / crash / raise
    run(hidden_states=x, weight=w)   # by keyword too, bound against run()'s parameters as Python would
    reference_constants(code)        -> {"EPS": 1e-05}; parses only, never executes

The data flow: `static` (AST allowlist) -> `pool` (parent: workers, arenas, timeouts) -> `worker`
(child: `confine`, then `namespace` runs the code) -> `transport` (tensors by shared memory, the rest
as checked JSON). The threat model is docs/sandbox.md.
"""

from .constants import reference_constants
from .errors import ConfinementUnavailable, ReferenceFailure, SandboxError
from .pool import ConfinedReference, Settings, compile_reference, configure, settings, shutdown, status
from .static import ALLOWED_MODULES, Violation, check_reference

__all__ = [
    "ALLOWED_MODULES",
    "ConfinedReference",
    "ConfinementUnavailable",
    "ReferenceFailure",
    "SandboxError",
    "Settings",
    "Violation",
    "check_reference",
    "compile_reference",
    "configure",
    "reference_constants",
    "settings",
    "shutdown",
    "status",
]

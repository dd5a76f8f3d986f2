"""A definition's reference, run: compiled once per (name, code) in a confined worker (docs/sandbox.md),
called on generated inputs, its outputs checked for count, shape and dtype against the definition.

Below the verdict and the engine: it knows definitions, inputs and the sandbox, nothing above them.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from .definition import Definition
from .sandbox import ConfinedReference, compile_reference

if TYPE_CHECKING:
    from .inputs import Inputs

_compiled: dict[tuple[str, str], ConfinedReference] = {}


def reference_function(definition: Definition, device: str | None = None) -> ConfinedReference:
    """The definition's `run`, compiled once per (name, source) in a confined worker."""
    entry = definition.reference_entry  # `run`, or an fi_trace reference's function, called by keyword
    # the keyword each argument is passed as: the input's name, or its documented `param`
    names = definition.reference_keywords if definition.reference_by_name else None
    key = (definition.name, hashlib.sha256(f"{entry}\0{names}\0{definition.reference}".encode()).hexdigest())
    fn = _compiled.get(key)
    if fn is None:
        fn = _compiled[key] = compile_reference(definition.reference, definition=definition.name, device=device,
                                                entry=entry, names=names)
    return fn


def run_reference(definition: Definition, inputs: Inputs, *, seed: int | None = None) -> tuple:
    """Run a definition's reference on generated inputs in its confined worker; always a tuple, in
    output order.

    The worker's torch RNG is seeded with `seed` (0 when None) before the call, and its other global
    state reset, so sampling references replay exactly. Inputs reach it by shared memory, not copies
    through a pipe; a reference that writes into its inputs writes into the caller's tensors too, so
    it shows up in the determinism check. Raises SandboxError or ReferenceFailure (timeout, crash, ...).
    """
    in_place = definition.in_place_outputs
    run = reference_function(definition, device=inputs.device)
    args = inputs.args()
    if in_place:  # the reference writes these: into copies, never into the caller's inputs
        order = definition.run_parameters
        args = [a.clone() if n in in_place and hasattr(a, "clone") else a for n, a in zip(order, args, strict=True)]
    out = run.call(args, seed=seed)
    out = out if isinstance(out, tuple) else (out,)
    if not in_place:
        return out
    # an in-place input the reference ignores keeps its generated value
    return _with_in_place(definition, out, {**inputs.values, **dict(zip(definition.run_parameters, args, strict=True))})


def _with_in_place(definition: Definition, out: tuple, args: dict) -> tuple:
    """fi_trace's in-place outputs (listed as input and output) are the input's value after the call.
    A reference that returns every output is taken as it is; one that returns only the others gets the
    in-place ones filled in, in output order; any other count is left for output_problems to report."""
    in_place = definition.in_place_outputs
    if len(out) == len(definition.outputs) or len(out) != len(definition.outputs) - len(in_place):
        return out
    returned = iter(out)
    return tuple(args[n] if n in in_place else next(returned) for n in definition.outputs)


def expected_shapes(definition: Definition, inputs: Inputs) -> list[list[int | None] | None]:
    """Each output's shape from the definition's axes as bound by these inputs (None: a scalar). A dimension
    no input binds is None: an axis only an output has, which the reference sizes (fi_trace's scale counts)."""
    return [None if s.shape is None else [inputs.axes.get(a) for a in s.shape] for s in definition.outputs.values()]


def shape_fits(got: list[int] | None, want: list[int | None] | None) -> bool:
    """`got` is `want`, where a None dimension of `want` (sized by the reference) takes any size."""
    if got is None or want is None:
        return got is want
    return len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want, strict=True))


def expected_dtypes(definition: Definition) -> list[str]:
    """Each output's dtype as torch names it (a scalar output: its Python type's name)."""
    from .dtypes import torch_dtype

    out = []
    for s in definition.outputs.values():
        if s.shape is None:
            out.append("float" if s.dtype.is_float else "bool" if s.dtype.value == "bool" else "int")
        else:
            out.append(str(torch_dtype(s.dtype)).replace("torch.", ""))
    return out


def output_shapes(outputs: tuple) -> list[list[int] | None]:
    return [list(o.shape) if getattr(o, "shape", None) is not None else None for o in outputs]


def output_dtypes(outputs: tuple) -> list[str]:
    return [str(getattr(o, "dtype", type(o).__name__)).replace("torch.", "") for o in outputs]


def output_problems(definition: Definition, inputs: Inputs, outputs: tuple) -> list[str]:
    """Count, shape and dtype of a reference's outputs against the definition; empty when all match."""
    if len(outputs) != len(definition.outputs):
        return [f"returned {len(outputs)} output(s), the definition declares {len(definition.outputs)}"]
    problems = []
    specs = zip(definition.outputs, expected_shapes(definition, inputs), expected_dtypes(definition),
                output_shapes(outputs), output_dtypes(outputs), strict=True)
    for name, shape, dtype, got_shape, got_dtype in specs:
        if not shape_fits(got_shape, shape):
            problems.append(f"{name}: shape {got_shape}, expected {shape}")
        if got_dtype != dtype:
            problems.append(f"{name}: dtype {got_dtype}, expected {dtype}")
    return problems

"""The public testing API: what reference tests (ours and anyone's) are written against."""

from __future__ import annotations

from .dataset import iter_definitions, load_definition
from .definition import Definition
from .inputs import SIZES, Inputs, edge_cases, generate_inputs
from .sandbox import SandboxError, compile_reference

__all__ = [
    "Definition",
    "Inputs",
    "SIZES",
    "SandboxError",
    "compile_reference",
    "edge_cases",
    "generate_inputs",
    "iter_definitions",
    "load_definition",
    "output_problems",
    "run_reference",
]


def run_reference(definition: Definition, inputs: Inputs) -> tuple:
    """Run a definition's reference on generated inputs; always a tuple, in output order."""
    run = compile_reference(definition.reference, definition=definition.name)
    out = run(*inputs.args())
    return out if isinstance(out, tuple) else (out,)


def output_problems(definition: Definition, inputs: Inputs, outputs: tuple) -> list[str]:
    """Count, shape and dtype of a reference's outputs against the definition; empty when all match."""
    from .dtypes import torch_dtype

    specs = definition.outputs
    if len(outputs) != len(specs):
        return [f"returned {len(outputs)} output(s), the definition declares {len(specs)}"]
    problems = []
    for (name, spec), value in zip(specs.items(), outputs, strict=True):
        shape = getattr(value, "shape", None)
        if spec.shape is None:
            if shape is not None:
                problems.append(f"{name}: expected a Python scalar, got a tensor")
            continue
        want = tuple(inputs.axes[a] for a in spec.shape)
        if shape is None or tuple(shape) != want:
            problems.append(f"{name}: shape {None if shape is None else tuple(shape)}, expected {want}")
        if getattr(value, "dtype", None) != torch_dtype(spec.dtype):
            problems.append(f"{name}: dtype {getattr(value, 'dtype', type(value).__name__)}, "
                            f"expected {spec.dtype.value}")
    return problems

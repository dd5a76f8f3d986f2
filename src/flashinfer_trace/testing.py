"""The public testing API: what reference tests (ours and anyone's) are written against.

    d = load_definition("rmsnorm_h4096")
    inputs = generate_inputs(d, "medium", seed=0, device="cuda")
    expected = get_ground_truth("flashinfer", d)(inputs)      # or GroundTruthUnavailable: skip
    assert_close(run_reference(d, inputs), expected, tolerance=tolerance_for(d))
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager

from .compare import DiffReport, Mismatch, Tolerance, assert_close, compare_outputs, diff, tolerance_for
from .compare_samples import SampleReport, SamplingMismatch, SamplingSettings
from .compare_samples import assert_samples_match as _assert_samples_match
from .dataset import iter_definitions, load_definition
from .definition import Definition
from .errormodel import compare_with_model, error_scales
from .groundtruth import SOURCES, GroundTruth, GroundTruthUnavailable, get_ground_truth, ground_truths
from .inputs import SIZES, Inputs, edge_cases
from .inputs import generate_inputs as _generate_inputs
from .sandbox import ConfinedReference, ReferenceFailure, SandboxError, compile_reference

__all__ = [
    "SIZES",
    "SOURCES",
    "Definition",
    "DiffReport",
    "GroundTruth",
    "GroundTruthUnavailable",
    "Inputs",
    "Mismatch",
    "ReferenceFailure",
    "SampleReport",
    "SamplingMismatch",
    "SamplingSettings",
    "SandboxError",
    "Tolerance",
    "assert_close",
    "assert_matches",
    "assert_samples_match",
    "compare_outputs",
    "compile_reference",
    "diff",
    "edge_cases",
    "error_scales",
    "expected_dtypes",
    "expected_shapes",
    "generate_inputs",
    "get_ground_truth",
    "ground_truths",
    "is_sampler",
    "iter_definitions",
    "load_definition",
    "output_problems",
    "reference_function",
    "run_reference",
    "shape_fits",
    "tolerance_for",
]

_compiled: dict[tuple[str, str], ConfinedReference] = {}

# Where a test's time goes, by phase (inputs, reference, ground_truth, compare), in seconds: the
# pytest plugin records it per test as `phases`. On the H100 a reference test took 0.4-0.6 s even
# for an rmsnorm, ten times its CPU time, with no phase breakdown to say why; now every run says.
PHASES: dict[str, float] = {}
COMPARED: list[dict] = []  # the last assert_matches' outputs: how close they came (record_case records them)


@contextmanager
def timed(phase: str) -> Iterator[None]:
    """Adds the block's time to PHASES[phase], the GPU work it queued included (synchronized)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        PHASES[phase] = PHASES.get(phase, 0.0) + time.perf_counter() - t0


@functools.wraps(_generate_inputs)
def generate_inputs(*args, **kwargs) -> Inputs:
    with timed("inputs"):
        return _generate_inputs(*args, **kwargs)


@functools.wraps(_assert_samples_match)
def assert_samples_match(*args, **kwargs) -> SampleReport:
    with timed("compare"):
        return _assert_samples_match(*args, **kwargs)


def reference_function(definition: Definition, device: str | None = None) -> ConfinedReference:
    """The definition's `run`, compiled once per (name, source) in a confined worker (docs/sandbox.md)."""
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
    it shows up in the determinism test. Raises SandboxError or ReferenceFailure (timeout, crash, ...).
    """
    in_place = definition.in_place_outputs
    with timed("reference"):
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


def assert_matches(definition: Definition, inputs: Inputs, actual, expected, tolerance: Tolerance) -> list[DiffReport]:
    """assert_close of a reference's outputs against a ground truth's on these inputs, with the op
    family's error model (errormodel.py): sums of products are judged against their operands' scale."""
    with timed("compare"):
        reports = compare_with_model(definition, inputs, actual, expected, tolerance)
    COMPARED[:] = [{"output": r.name, "tolerance_used": r.tolerance_used, "max_abs": round(r.max_abs, 6),
                    "max_rel": round(r.max_rel, 6), "cosine": round(r.cosine, 8), "mismatched": r.mismatched,
                    "total": r.total} for r in reports]
    if not all(r.passed for r in reports):
        raise Mismatch(reports)
    return reports


def is_sampler(definition: Definition) -> bool:
    """Sampling definitions draw random tokens: they are compared statistically, not element-wise.
    FlashInfer's fi_trace files `sampling` ops that return probabilities or logits (renorm, softmax,
    masking) under the same op_type: a sampler's first output is integer token ids."""
    if definition.op_type != "sampling":
        return False
    first = next(iter(definition.outputs.values()), None)
    return first is None or first.dtype is None or not first.dtype.is_float


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


def output_problems(definition: Definition, inputs: Inputs, outputs: tuple) -> list[str]:
    """Count, shape and dtype of a reference's outputs against the definition; empty when all match."""
    if len(outputs) != len(definition.outputs):
        return [f"returned {len(outputs)} output(s), the definition declares {len(definition.outputs)}"]
    problems = []
    specs = zip(definition.outputs, expected_shapes(definition, inputs), expected_dtypes(definition), outputs,
                strict=True)
    for name, shape, dtype, value in specs:
        got_shape = getattr(value, "shape", None)
        got_shape = None if got_shape is None else list(got_shape)
        got_dtype = str(getattr(value, "dtype", type(value).__name__)).replace("torch.", "")
        if not shape_fits(got_shape, shape):
            problems.append(f"{name}: shape {got_shape}, expected {shape}")
        if got_dtype != dtype:
            problems.append(f"{name}: dtype {got_dtype}, expected {dtype}")
    return problems

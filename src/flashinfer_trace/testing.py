"""The public testing API: what reference tests (ours and anyone's) are written against.

    d = load_definition("rmsnorm_h4096")
    inputs = generate_inputs(d, "medium", seed=0, device="cuda")
    expected = get_ground_truth("flashinfer", d)(inputs)      # or GroundTruthUnavailable: skip
    assert_close(run_reference(d, inputs), expected, tolerance=tolerance_for(d))

Re-exports only: each name lives where the data flow puts it (definition, inputs, reference,
groundtruth, verdict); `check` is the engine that runs whole cases.
"""

from __future__ import annotations

from .dataset import iter_definitions, load_definition
from .definition import Definition
from .groundtruth import SOURCES, GroundTruth, GroundTruthUnavailable, get_ground_truth, ground_truths
from .inputs import SIZES, Inputs, edge_cases, generate_inputs
from .reference import (
    _with_in_place,  # noqa: F401 - the fi_trace tests' in-place rule
    expected_dtypes,
    expected_shapes,
    output_problems,
    reference_function,
    run_reference,
    shape_fits,
)
from .sandbox import ConfinedReference, ReferenceFailure, SandboxError, compile_reference
from .verdict import assert_matches
from .verdict.compare import DiffReport, Mismatch, Tolerance, assert_close, compare_outputs, diff, tolerance_for
from .verdict.errormodel import error_scales
from .verdict.samples import SampleReport, SamplingMismatch, SamplingSettings, assert_samples_match


def is_sampler(definition: Definition) -> bool:
    """Whether a definition is compared statistically (`Definition.is_sampler`)."""
    return definition.is_sampler


__all__ = [
    "SIZES",
    "SOURCES",
    "ConfinedReference",
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

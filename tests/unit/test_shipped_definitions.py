"""Every definition the repository ships validates, and its reference runs on CPU at the small size.
The runs over definitions with more than 64 MiB of fixed-size inputs are `heavy` (sizes.py)."""

from pathlib import Path

import pytest
import torch
from sizes import param

from flashinfer_trace.dataset import Dataset
from flashinfer_trace.inputs.topk import kind
from flashinfer_trace.testing import generate_inputs, output_problems, run_reference
from flashinfer_trace.validate import validate_paths

DEFINITIONS = Path(__file__).resolve().parents[2] / "definitions"
NAMES = Dataset(DEFINITIONS).names()
REQUIRED_FAMILIES = {"rmsnorm", "gemm", "gqa_paged", "gqa_ragged", "mla_paged", "moe", "rope", "activation",
                     "sampling"}


def test_definitions_folder_is_clean():
    reports, summary = validate_paths([DEFINITIONS])
    assert summary.problems == 0, "\n".join(str(p) for r in reports for p in r.problems)
    assert summary.files == len(NAMES) >= 12


def test_one_definition_per_family_at_least():
    families = {d.op_type for d in Dataset(DEFINITIONS)}
    assert REQUIRED_FAMILIES <= families


@pytest.mark.parametrize("name", [param(n, n, n) for n in NAMES])
def test_reference_runs_on_cpu_small(name):
    d = Dataset(DEFINITIONS).load(name)
    inputs = generate_inputs(d, size="small", seed=0)
    outputs = run_reference(d, inputs)
    assert output_problems(d, inputs, outputs) == []
    for spec, value in zip(d.outputs.values(), outputs, strict=True):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            finite = value.float().isfinite()
            if kind(d) == "top_k_mask":  # masked logits are -inf by definition (docs/boundary/topk.md); no NaN, no +inf
                finite |= value.isneginf()
            if "lse" not in spec.dtype.value:  # lse may be -inf only for empty requests, absent here
                assert finite.all(), f"{name}: non-finite values in an output"

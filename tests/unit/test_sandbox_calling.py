"""A compiled reference is called like the `run` it stands for: by keyword, by position, or both, the
way FlashInfer's add-reference-tests template calls it:

    reference_fn = compile_reference(definition["reference"])
    ref_outputs = reference_fn(**inputs)
    output, lse = reference_fn(**inputs)
"""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.inputs import generate_inputs
from flashinfer_trace.sandbox.entry import UNEVALUATED, entry_signature
from flashinfer_trace.testing import compile_reference


def template_case(name: str):
    """(the definition's JSON as the template reads it, its generated inputs by name, run()'s order)."""
    d = load_definition(name)
    inputs = generate_inputs(d, "small", 0, device="cpu")
    return json.loads(d.source.read_text()), inputs.values, d.run_parameters


def test_the_template_calls_an_rmsnorm_by_keyword_and_by_position():
    definition, inputs, order = template_case("rmsnorm_h128")
    reference_fn = compile_reference(definition["reference"])  # the code only: no definition name
    ref_outputs = reference_fn(**inputs)
    assert isinstance(ref_outputs, torch.Tensor) and ref_outputs.shape == inputs["hidden_states"].shape
    assert ref_outputs.dtype == inputs["hidden_states"].dtype
    positional = reference_fn(*(inputs[n] for n in order))
    mixed = reference_fn(inputs[order[0]], **{n: inputs[n] for n in order[1:]})
    again = reference_fn(**inputs)
    assert torch.equal(ref_outputs, positional) and torch.equal(ref_outputs, mixed)
    assert torch.equal(ref_outputs, again)  # deterministic


def test_the_template_unpacks_a_decode_attentions_output_and_lse():
    definition, inputs, order = template_case("gqa_paged_decode_h4_kv1_d128_ps1")
    reference_fn = compile_reference(definition["reference"])
    output, lse = reference_fn(**inputs)
    q = inputs["q"]
    assert output.shape == q.shape and output.dtype == torch.bfloat16
    assert lse.shape == q.shape[:2] and lse.dtype == torch.float32
    by_position = reference_fn(*(inputs[n] for n in order))
    by_keyword_reversed = reference_fn(**dict(reversed(list(inputs.items()))))  # keyword order does not matter
    output2, lse2 = reference_fn(**inputs)
    for out, lse_ in (by_position, by_keyword_reversed, (output2, lse2)):
        assert torch.equal(out, output) and torch.equal(lse_, lse)


@pytest.fixture(scope="module")
def defaults_ref():
    return compile_reference("def run(a, b=1, c=2, *rest, d, e=5, **kw):\n"
                             "    return [a, b, c, list(rest), d, e, sorted(kw)]\n")


@pytest.mark.parametrize(("args", "kwargs", "expected"), [
    ((1,), {"d": 4}, [1, 1, 2, [], 4, 5, []]),
    ((1,), {"c": 3, "d": 4}, [1, 1, 3, [], 4, 5, []]),  # c by keyword after b left to its default
    ((), {"a": 1, "b": 2, "d": 4, "e": 6}, [1, 2, 2, [], 4, 6, []]),
    ((1, 2, 3, 7, 8), {"d": 4, "z": 9}, [1, 2, 3, [7, 8], 4, 5, ["z"]]),
], ids=["defaults", "after-a-default", "all-by-keyword", "varargs-and-kwargs"])
def test_arguments_bind_as_in_a_python_call(defaults_ref, args, kwargs, expected):
    assert defaults_ref(*args, **kwargs) == expected


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    ((), {"y": 2}, "run() missing a required argument: 'x'"),
    ((1,), {}, "run() missing a required argument: 'y'"),
    ((1, 2), {"z": 3}, "run() got an unexpected keyword argument 'z'"),
    ((1, 2), {"x": 3}, "run() multiple values for argument 'x'"),
    ((1, 2, 3), {}, "run() too many positional arguments"),
], ids=["missing-first", "missing", "unexpected", "duplicated", "too-many"])
def test_bad_arguments_are_a_type_error_before_the_worker_runs(args, kwargs, message):
    fn = compile_reference("def run(x, y):\n    return x + y\n", definition="add")
    with pytest.raises(TypeError) as e:
        fn(*args, **kwargs)
    assert str(e.value) == f"add: {message}"
    assert fn(1, y=2) == 3  # the worker was not disturbed


def test_code_whose_entry_is_not_a_plain_def_takes_positional_arguments_only():
    fn = compile_reference("run = lambda x: x * 2\n")
    assert fn.signature is None and fn(3) == 6
    with pytest.raises(TypeError, match=r"by position only here.*'x'"):
        fn(x=3)


def test_an_entry_called_by_names_binds_against_those_names():
    fn = compile_reference("def _ref(input, weight):\n    return input * weight\n", entry="_ref",
                           names=["input", "weight"])
    x, w = torch.arange(4.0), torch.full((4,), 2.0)
    assert torch.equal(fn(input=x, weight=w), x * 2) and torch.equal(fn(x, weight=w), x * 2)
    with pytest.raises(TypeError, match="missing a required argument: 'weight'"):
        fn(x)


def test_keyword_values_written_in_place_reach_the_caller():
    fn = compile_reference("def run(x, out):\n    out.copy_(x + 1)\n    return out\n")
    x, out = torch.zeros(3), torch.zeros(3)
    fn(x, out=out)
    assert torch.equal(out, torch.ones(3))


@pytest.mark.parametrize(("code", "expected"), [
    ("def run(a, b):\n    pass\n", "(a, b)"),
    ("def run(a, /, b=1, *c, d, e=2, **f):\n    pass\n", "(a, /, b=<default>, *c, d, e=<default>, **f)"),
    ("def run(a):\n    pass\n\n\ndef run(b, c):\n    pass\n", "(b, c)"),  # the last definition wins
    ("@torch.no_grad()\ndef run(x, eps=open('/etc/passwd')):\n    pass\n", "(x, eps=<default>)"),  # never evaluated
])
def test_entry_signature_reads_the_parameters_without_running_the_code(code, expected):
    sig = entry_signature(code)
    assert str(sig) == expected
    assert all(p.default in (inspect.Parameter.empty, UNEVALUATED) for p in sig.parameters.values())


@pytest.mark.parametrize("code", [
    "run = lambda x: x\n",
    "def run(x):\n    pass\n\n\nrun = 3\n",
    "from math import sqrt as run\n",
    "def run(x):\n    pass\n\n\nfor run in range(2):\n    pass\n",
    "if True:\n    def run(x):\n        pass\n",
    "def helper():\n    pass\n",
    "def run(:\n",
])
def test_entry_signature_is_none_where_the_name_is_not_just_a_top_level_def(code):
    assert entry_signature(code) is None

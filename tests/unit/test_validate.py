"""One test per validator error kind, plus the whole-file and whole-folder pipeline."""

import copy
import json

import pytest

from flashinfer_trace.definition import Definition, json_schema
from flashinfer_trace.validate import (
    UNPARSED,
    DefinitionError,
    check_data,
    check_file,
    load_file,
    parse_json,
    validate_paths,
)


def kinds(problems):
    return sorted({p.kind for p in problems})


def test_valid_definition_has_no_problems(valid, write_def):
    report = check_file(write_def(valid))
    assert report.problems == []
    assert report.ok and report.definition.name == "rmsnorm_h8"


def test_json_syntax_error_gives_line_and_column(write_def):
    report = check_file(write_def('{\n  "name": "x",\n  "op_type": \n}', stem="x"))
    (p,) = report.problems
    assert p.kind == "json-syntax" and "line 4, column 1" in p.message


def test_duplicate_keys_are_refused_not_silently_dropped():
    _, problems = parse_json('{"name": "a", "name": "b"}', "f.json")
    assert kinds(problems) == ["json-duplicate-key"] and "'name'" in problems[0].message


def test_nan_is_refused():
    data, problems = parse_json('{"x": NaN}', "f.json")
    assert data is UNPARSED and kinds(problems) == ["json-syntax"]


def test_json_null_is_a_problem_not_a_pass(write_def):
    (p,) = check_file(write_def("null", stem="x")).problems
    assert p.kind == "type" and "got NoneType" in p.message


def test_top_level_must_be_an_object():
    (p,) = check_data([1, 2], "f.json")
    assert p.kind == "type" and p.path == "$"


@pytest.mark.parametrize("field", ["name", "op_type", "axes", "inputs", "outputs", "reference"])
def test_missing_required_field(valid, field):
    del valid[field]
    problems = check_data(valid, "f.json")
    assert any(p.kind == "missing-field" and p.path == f"$.{field}" for p in problems)


def test_wrong_field_type_names_the_json_path(valid):
    valid["tags"] = "status:reference"
    valid["inputs"]["weight"]["shape"] = ["hidden_size", 3.5]  # an int would be a fixed dimension
    problems = check_data(valid, "f.json")
    paths = {p.path for p in problems if p.kind == "type"}
    assert "$.tags" in paths and "$.inputs.weight.shape[1]" in paths


def test_name_must_equal_file_stem(valid, write_def):
    report = check_file(write_def(valid, stem="rmsnorm_h4096"))
    assert kinds(report.problems) == ["name-mismatch"] and report.problems[0].path == "$.name"


def test_shape_axis_must_be_declared(valid):
    valid["inputs"]["weight"]["shape"] = ["hidden"]
    problems = check_data(valid, "f.json")
    assert [(p.kind, p.path) for p in problems] == [("unknown-axis", "$.inputs.weight.shape[0]")]


def test_var_axis_that_sizes_nothing_is_a_note(valid):
    valid["axes"]["num_pages"] = {"type": "var"}
    notes = []
    assert check_data(valid, "f.json", notes=notes) == []
    (p,) = notes
    assert p.kind == "unused-axis" and p.path == "$.axes.num_pages"


def test_a_name_on_both_sides_is_an_in_place_output_of_the_same_tensor(valid):
    spec = copy.deepcopy(valid["inputs"]["weight"])
    valid["outputs"]["weight"] = spec  # fi_trace's in-place tensors: the input's value after the call
    assert "io-overlap" not in kinds(check_data(valid, "f.json"))
    valid["outputs"]["weight"] = dict(spec, dtype="float32" if spec["dtype"] != "float32" else "bfloat16")
    problems = check_data(valid, "f.json")
    assert "io-overlap" in kinds(problems)


def test_outputs_must_not_be_empty(valid):
    valid["outputs"] = {}
    assert "empty-outputs" in kinds(check_data(valid, "f.json"))


def test_reference_syntax_error(valid):
    valid["reference"] = "def run(hidden_states, weight)\n    return 1\n"
    (p,) = check_data(valid, "f.json")
    assert p.kind == "reference-syntax" and "line 1" in p.message


def test_reference_without_run(valid):
    # no run(): the one function taking every input by name is the entry point (docs/definitions.md)
    valid["reference"] = "import torch\ndef forward(hidden_states, weight):\n    return hidden_states\n"
    assert kinds(check_data(valid, "f.json")) == []
    valid["reference"] = "import torch\ndef forward(hidden_states):\n    return hidden_states\n"
    (p,) = check_data(valid, "f.json")
    assert (p.kind, p.path) == ("reference-run", "$.reference") and "weight" in p.message


@pytest.mark.parametrize("signature", ["run(hidden_states)", "run(hidden_states, weight, eps)", "run(*args)",
                                       "run(hidden_states, hidden_states)", "run(hidden_states, *, weight)"])
def test_run_parameters_must_be_the_inputs(valid, signature):
    valid["reference"] = f"def {signature}:\n    return None\n"
    assert "reference-signature" in kinds(check_data(valid, "f.json"))


def test_run_takes_the_inputs_by_name_in_any_order(valid):
    """Four public MoE files list routing_bias second in run() and last among the inputs."""
    valid["reference"] = "def run(weight, hidden_states):\n    return hidden_states\n"
    assert "reference-signature" not in kinds(check_data(valid, "f.json"))
    valid["reference"] = "def run(weight, states):\n    return states\n"
    (p,) = [p for p in check_data(valid, "f.json") if p.kind == "reference-signature"]
    assert "no parameter for input(s) hidden_states" in p.message and "states are not inputs" in p.message


def test_reference_sandbox_violation_is_a_problem(valid):
    valid["reference"] = "import os\n\ndef run(hidden_states, weight):\n    return os.system('true')\n"
    problems = [p for p in check_data(valid, "f.json") if p.kind == "reference-sandbox"]
    assert problems and "line 1" in problems[0].message


def test_constraint_must_parse(valid):
    valid["constraints"] = ["batch_size =="]
    (p,) = check_data(valid, "f.json")
    assert p.kind == "constraint-syntax" and p.path == "$.constraints[0]"


def test_constraint_may_only_mention_axes_and_inputs(valid):
    valid["constraints"] = ["batch_size <= max_batch"]
    (p,) = check_data(valid, "f.json")
    assert p.kind == "constraint-name" and "max_batch" in p.message


def test_constraint_cannot_call_arbitrary_functions(valid):
    valid["constraints"] = ["open('x') is None"]
    assert kinds(check_data(valid, "f.json")) == ["constraint-syntax"]


@pytest.mark.parametrize("dtype", ["fp16", "float64", "", 16])
def test_unknown_dtype(valid, dtype):
    valid["outputs"]["output"]["dtype"] = dtype
    problems = check_data(valid, "f.json")
    assert any(p.kind == "dtype" and p.path == "$.outputs.output.dtype" for p in problems)


@pytest.mark.parametrize("value", [-1, 1.5, "8", True, None])
def test_const_value_must_be_a_non_negative_int(valid, value):
    valid["axes"]["hidden_size"]["value"] = value
    problems = check_data(valid, "f.json")
    assert [(p.kind, p.path) for p in problems] == [("const-value", "$.axes.hidden_size.value")]


def test_axis_type_must_be_const_or_var(valid):
    valid["axes"]["hidden_size"] = {"type": "fixed", "value": 8}
    (p,) = check_data(valid, "f.json")
    assert p.kind == "axis-type" and p.path == "$.axes.hidden_size.type"


def test_unreadable_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b"\xff\xfe\x00")
    (p,) = check_file(path).problems
    assert p.kind == "unreadable"


def test_all_problems_in_all_files_are_reported(valid, tmp_path):
    a = copy.deepcopy(dict(valid, name="a"))
    a["inputs"]["weight"]["dtype"] = "fp32"
    a["constraints"] = ["nope > 1"]
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.json").write_text("{")
    (tmp_path / "c.json").write_text(json.dumps(dict(valid, name="c")))
    reports, summary = validate_paths([tmp_path, tmp_path / "missing.json"])
    assert summary.files == 3
    assert summary.files_with_problems == 3  # a, b, and the missing path
    assert summary.by_kind == {"constraint-name": 1, "dtype": 1, "json-syntax": 1, "not-found": 1}
    assert not summary.ok


def test_load_file_raises_with_every_problem(valid, write_def):
    valid["inputs"]["weight"]["shape"] = ["nope"]
    valid["outputs"]["output"]["dtype"] = "nope"
    with pytest.raises(DefinitionError) as err:
        load_file(write_def(valid))
    assert len(err.value.problems) == 2 and "rmsnorm_h8.json" in str(err.value)


def test_definition_reads_like_the_json_and_keeps_unknown_fields(valid, write_def):
    valid["init"] = "def init(): pass"  # a field the public format may grow
    d = load_file(write_def(valid))
    assert d["reference"] == valid["reference"]
    assert d["init"] == "def init(): pass"
    assert "axes" in d and d.get("missing", 7) == 7
    assert d.const_axes == {"hidden_size": 8} and d.var_axes == ["batch_size"]
    assert d.models == ["toy"] and json.loads(d.to_json()) == valid


def test_scalar_and_zero_dim_shapes(valid):
    valid["tags"] = [t for t in valid["tags"] if not t.startswith("param:")]  # eps becomes an input instead
    valid["inputs"]["eps"] = {"shape": None, "dtype": "float32"}
    valid["inputs"]["scale"] = {"shape": [], "dtype": "float32"}
    valid["reference"] = "def run(hidden_states, weight, eps, scale):\n    return hidden_states\n"
    assert check_data(valid, "f.json") == []
    d = Definition.model_validate(valid)
    assert d.inputs["eps"].is_scalar and d.inputs["scale"].shape == []


def test_json_schema_describes_the_format():
    schema = json_schema()
    assert set(schema["required"]) == {"name", "op_type", "axes", "inputs", "outputs", "reference"}
    dtypes = schema["$defs"]["DType"]["enum"]
    assert "float8_e4m3fn" in dtypes and "float4_e2m1" in dtypes and len(dtypes) == 16
    assert {"str", "string"} <= set(dtypes)  # fi_trace's string arguments (scalar inputs only)
    assert {"uint8", "uint32", "float8_e8m0fnu"} <= set(dtypes)  # FlashInfer fi_trace's packed / scale dtypes

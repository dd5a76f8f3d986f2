import json

import pytest

from flashinfer_trace.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_schema_prints_json_schema(capsys):
    code, out, _ = run_cli(capsys, "schema")
    assert code == 0 and json.loads(out)["title"] == "flashinfer-trace Definition"


def test_validate_clean_folder_exits_zero(capsys, valid, write_def):
    path = write_def(valid)
    code, out, _ = run_cli(capsys, "validate", str(path.parent))
    assert code == 0 and "1 file(s), 0 with problems, 0 problem(s)" in out


def test_validate_reports_all_problems_and_exits_one(capsys, valid, write_def, tmp_path):
    valid["inputs"]["weight"]["shape"] = ["nope"]
    write_def(valid)
    (tmp_path / "broken.json").write_text("[")
    code, out, _ = run_cli(capsys, "validate", "--json", str(tmp_path))
    report = json.loads(out)
    assert code == 1 and report["summary"]["problems"] == 2
    assert {p["kind"] for p in report["problems"]} == {"unknown-axis", "json-syntax"}


def test_validate_human_output_names_file_and_path(capsys, valid, write_def):
    valid["outputs"]["output"]["shape"] = ["batch_size", "[weird]"]
    path = write_def(valid)
    code, out, _ = run_cli(capsys, "validate", str(path))
    assert code == 1 and str(path) in out and "$.outputs.output.shape[1]" in out and "[weird]" in out


def test_list_show_inputs_run(capsys, valid, write_def):
    folder = write_def(valid).parent
    code, out, _ = run_cli(capsys, "list", "--json", "--definitions", str(folder))
    assert code == 0 and [d["name"] for d in json.loads(out)] == ["rmsnorm_h8"]
    code, out, _ = run_cli(capsys, "show", "rmsnorm_h8", "--json", "--definitions", str(folder))
    assert code == 0 and json.loads(out)["axes"]["hidden_size"]["value"] == 8 and "ground_truths" not in out
    code, out, _ = run_cli(capsys, "show", "rmsnorm_h8", "--json", "--ground-truths", "--device", "cpu",
                           "--definitions", str(folder))
    paths = json.loads(out)["ground_truths"]
    assert code == 0 and paths["torch"]["api"].startswith("torch.nn.functional.rms_norm")
    assert paths["flashinfer"]["unavailable"].split(":")[0] in ("not-installed", "no-gpu")
    code, out, _ = run_cli(capsys, "inputs", "rmsnorm_h8", "--json", "--seed", "3", "--definitions", str(folder))
    info = json.loads(out)
    assert code == 0 and info["inputs"]["weight"]["shape"] == [8] and info["seed"] == 3
    code, out, _ = run_cli(capsys, "run", "rmsnorm_h8", "--json", "--definitions", str(folder))
    (result,) = json.loads(out)["results"]
    assert code == 0 and result["status"] == "ok" and result["outputs"]["output"]["dtype"] == "bfloat16"


def test_run_reports_a_reference_that_returns_the_wrong_shape(capsys, valid, write_def):
    valid["reference"] = "def run(hidden_states, weight):\n    return weight\n"
    folder = write_def(valid).parent
    code, out, _ = run_cli(capsys, "run", "--all", "--json", "--definitions", str(folder))
    (result,) = json.loads(out)["results"]
    assert code == 1 and result["status"] == "fail" and "shape" in result["problems"][0]


def test_run_reports_a_reference_that_raises(capsys, valid, write_def):
    valid["reference"] = "def run(hidden_states, weight):\n    raise ValueError('boom')\n"
    folder = write_def(valid).parent
    code, out, _ = run_cli(capsys, "run", "rmsnorm_h8", "--json", "--definitions", str(folder))
    (result,) = json.loads(out)["results"]
    assert code == 1 and result["status"] == "error" and "boom" in result["problems"][0]


def test_unknown_definition_is_a_clear_error(capsys, valid, write_def):
    folder = write_def(valid).parent
    code, _, err = run_cli(capsys, "show", "nope", "--definitions", str(folder))
    assert code == 2 and "no definition named 'nope'" in err


def test_sandbox_violation_surfaces_on_run(capsys, valid, write_def):
    valid["reference"] = "import os\n\ndef run(hidden_states, weight):\n    return hidden_states\n"
    folder = write_def(valid).parent
    # validation refuses it first, naming the file
    code, _, err = run_cli(capsys, "run", "rmsnorm_h8", "--definitions", str(folder))
    assert code == 2 and "rmsnorm_h8.json" in err and "reference-sandbox" in err


def test_run_without_names_asks_for_all(capsys):
    code, _, err = run_cli(capsys, "run")
    assert code == 2 and "--all" in err


def test_inputs_without_a_name_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["inputs"])
    assert exc.value.code == 2

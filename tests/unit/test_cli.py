import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

import flashinfer_trace
from flashinfer_trace.cli import definitions, main
from flashinfer_trace.escape import for_rich


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
    assert info["source"] == "generator"
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


def test_errors_of_the_modules_a_command_imported_are_one_clear_line(capsys, valid, write_def):
    """main() catches the input generator's errors by class once the command has imported its module (main
    imports none of those modules itself: they import torch)."""
    folder = write_def(valid).parent
    code, out, err = run_cli(capsys, "inputs", "rmsnorm_h8", "--case", "no_such_case", "--definitions", str(folder))
    assert code == 2 and out == "" and err.startswith("error: rmsnorm_h8: unknown edge case 'no_such_case'")


def test_run_without_names_asks_for_all(capsys):
    code, _, err = run_cli(capsys, "run")
    assert code == 2 and "--all" in err


def test_inputs_without_a_name_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["inputs"])
    assert exc.value.code == 2


# -- what a new user sees -----------------------------------------------------------------------------
HOSTILE = "kv_indices[kv_indptr:kv_indptr] [link=https://x]click[/link] \x1b]0;title\x07\x1b[2J:thumbs_up: \x9b1m"


def test_no_numpy_warning_on_stderr(valid, write_def):
    """torch warns on import when numpy is missing; neither the command nor its reference worker passes it on."""
    folder = write_def(valid).parent
    src = str(Path(flashinfer_trace.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "flashinfer_trace.cli", "run", "rmsnorm_h8", "--definitions",
                           str(folder)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "rmsnorm_h8" in done.stdout, done.stderr
    assert "NumPy" not in done.stderr and done.stderr == ""


def test_list_never_shortens_a_name_on_a_narrow_terminal(capsys, valid, write_def, monkeypatch):
    names = ["rmsnorm_h8_with_a_name_long_enough_to_be_cut_on_sixty_columns", "rmsnorm_h8_b"]
    for name in names:
        write_def({**valid, "name": name, "tags": [*valid["tags"], "fi_api:flashinfer.norm.a_long_api_name_here"]})
    for width in (60, 30):
        monkeypatch.setattr(definitions, "out", Console(width=width, soft_wrap=True, emoji=False))
        code, out, _ = run_cli(capsys, "list", "--definitions", str(write_def(valid).parent))
        assert code == 0 and "…" not in out
        for name in names:
            assert any(name in line for line in out.splitlines()), (width, out)


def test_show_prints_shapes_and_definition_text_as_written(capsys, valid, write_def, monkeypatch):
    monkeypatch.setattr(definitions, "out", Console(width=200, soft_wrap=True, emoji=False))  # no cell wraps
    valid["description"] = HOSTILE
    valid["inputs"]["weight"]["description"] = "weight[i] scales column i"
    valid["reference"] = valid["reference"].replace("EPS = 1e-5", "EPS = 1e-5  # [bold]not bold[/bold] \x1b[31m")
    folder = write_def(valid).parent
    code, out, err = run_cli(capsys, "show", "rmsnorm_h8", "--reference", "--definitions", str(folder))
    assert code == 0, err
    assert "[batch_size, hidden_size]" in out and "[hidden_size]" in out
    assert "kv_indices[kv_indptr:kv_indptr] [link=https://x]click[/link]" in out
    assert "\\x1b]0;title\\x07\\x1b[2J:thumbs_up: \\x9b1m" in out
    assert "weight[i] scales column i" in out and "# [bold]not bold[/bold] \\x1b[31m" in out
    assert not any(c in out for c in "\x1b\x07\x9b")


def test_for_rich_escapes_markup_and_control_characters():
    console = Console(width=200, file=io.StringIO(), emoji=False, soft_wrap=True)
    assert for_rich("tab\tand\nnewline stay", multiline=True) == "tab\tand\nnewline stay"
    assert for_rich("a name\tand\na forged line") == "a name\\x09and\\x0aa forged line"
    console.print(for_rich("a [red]b[/red] \\[c] \x00\x08\x0b\x0d\x1b\x7f\x80\x9f ok\nnext", multiline=True))
    assert console.file.getvalue() == "a [red]b[/red] \\[c] \\x00\\x08\\x0b\\x0d\\x1b\\x7f\\x80\\x9f ok\nnext\n"


def test_check_failure_lines_print_the_reason_as_written(capsys, valid, write_def, monkeypatch):
    monkeypatch.chdir(write_def(valid).parent)
    valid["reference"] = ("def run(hidden_states, weight):\n"
                          "    raise ValueError('[link=https://x]click[/link] \\x1b[2J')\n")
    path = write_def(valid)
    code, out, _ = run_cli(capsys, "check", str(path), "--ground-truth", "torch", "--size", "small",
                           "--no-edge-cases", "--device", "cpu", "--save-failures", "", "--results", "",
                           "--no-progress")
    failures = [line for line in out.splitlines() if line.startswith(("FAIL", "ERROR"))]
    assert code == 1 and failures
    assert all("[link=https://x]click[/link] \\x1b[2J" in line for line in failures)
    assert "\x1b" not in out


@pytest.mark.parametrize("results", [None, ""])
def test_check_says_first_where_its_records_go(capsys, valid, write_def, monkeypatch, tmp_path, results):
    """By default `check` appends to results/check.jsonl under the current folder: its first line says so."""
    monkeypatch.chdir(tmp_path)
    path = write_def(valid)
    extra = () if results is None else ("--results", results)
    code, _, err = run_cli(capsys, "check", str(path), "--ground-truth", "torch", "--size", "small",
                           "--no-edge-cases", "--device", "cpu", "--save-failures", "", "--no-progress", *extra)
    first = " ".join(err.split("\n")[0].split())
    assert code == 0, err
    if results is None:
        assert first.startswith("check: 1 definition(s); each record appended to")
        assert f"{tmp_path / 'results' / 'check.jsonl'}" in " ".join(err.split()) and (tmp_path / "results").is_dir()
    else:
        assert first == "check: 1 definition(s); no records file (--results '')"

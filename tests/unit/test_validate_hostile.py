"""Hostile definition files: every one becomes problems with file and JSON path, never an exception, a
hang or an incomplete report."""

from __future__ import annotations

import copy
import json
import os
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from samples import VALID

from flashinfer_trace.cli import main
from flashinfer_trace.constraints import ConstraintError, check_all, parse
from flashinfer_trace.sandbox import check_reference, reference_constants
from flashinfer_trace.validate import check_data, parse_json, validate_paths

HOSTILE_EXPRESSIONS = [
    pytest.param("\ud800", id="lone-surrogate"),
    pytest.param("x\x00", id="nul"),
    pytest.param("-" * 100_000 + "1", id="long-unary-chain"),
    pytest.param("a+" * 5000 + "a", id="deep-binop"),
    pytest.param("(" * 1000 + "1" + ")" * 1000, id="deep-parens"),
    pytest.param("a + " * 40 + "a", id="over-depth"),
    pytest.param("x" * 10_000_000, id="ten-megabytes"),
]


@pytest.mark.parametrize("text", HOSTILE_EXPRESSIONS)
def test_hostile_constraint_is_a_problem(text):
    d = copy.deepcopy(VALID)
    d["constraints"] = [text]
    problems = check_data(d, "f.json", stem="rmsnorm_h8")
    assert [(p.kind, p.path) for p in problems] == [("constraint-syntax", "$.constraints[0]")]
    assert len(problems[0].message) < 400  # the text is echoed shortened, never whole
    json.dumps([p.message for p in problems]).encode("ascii")
    with pytest.raises(ConstraintError):
        parse(text)


@pytest.mark.parametrize("text", HOSTILE_EXPRESSIONS)
def test_hostile_reference_text_is_a_problem(text):
    d = copy.deepcopy(VALID)
    d["reference"] = text
    problems = check_data(d, "f.json", stem="rmsnorm_h8")
    assert problems and all(p.path == "$.reference" for p in problems)
    assert isinstance(check_reference(text), list) and isinstance(reference_constants(text), dict)


def test_many_axes_and_a_huge_constraint_take_one_pass():
    d = copy.deepcopy(VALID)
    d["axes"].update({f"ax{i}": {"type": "var"} for i in range(2000)})
    d["constraints"] = ["ax7 == " + "1" * 1_000_000]
    notes = []
    problems = check_data(d, "f.json", stem="rmsnorm_h8", notes=notes)
    assert {p.kind for p in problems} == {"constraint-syntax"}
    assert {n.kind for n in notes} == {"unused-axis"}  # a var axis that sizes nothing is a note
    assert len(notes) == 1999  # ax7 is mentioned


def test_constraint_evaluation_is_bounded():
    with pytest.raises(ConstraintError, match="too large"):
        check_all(["2 ** 10 ** 10 == 1"], {}, definition="d")
    with pytest.raises(ConstraintError, match="too large"):
        check_all(["(2 ** 60000) * (2 ** 60000) > 0"], {}, definition="d")
    check_all(["2 ** 10 == 1024"], {}, definition="d")


def test_duplicate_key_reported_at_its_path():
    text = json.dumps(VALID)[:-1] + ', "tags": []}'
    text = text.replace('"batch_size": {"type": "var"}', '"batch_size": {"type": "var", "type": "var"}')
    _, problems = parse_json(text, "f.json")
    assert [(p.kind, p.path) for p in problems] == [("json-duplicate-key", "$.axes.batch_size.type"),
                                                   ("json-duplicate-key", "$.tags")]


@pytest.mark.parametrize("value", [2**63, 2**64, 10**30])
def test_const_axis_must_be_a_tensor_dimension(value):
    d = copy.deepcopy(VALID)
    d["axes"]["hidden_size"]["value"] = value
    problems = [p for p in check_data(d, "f.json") if p.kind == "const-value"]
    assert [p.path for p in problems] == ["$.axes.hidden_size.value"] and "2**63" in problems[0].message
    d["axes"]["hidden_size"]["value"] = 2**63 - 1
    assert not [p for p in check_data(d, "f.json") if p.kind == "const-value"]


@pytest.mark.parametrize("op_type", ["rms norm", "../x", "rmsnorm\n", "1abc", "\ud800"])
def test_op_type_must_be_an_identifier(op_type):
    d = copy.deepcopy(VALID)
    d["op_type"] = op_type
    assert [p.path for p in check_data(d, "f.json") if p.kind == "op-type"] == ["$.op_type"]


def _write(path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_op_type_must_match_its_folder(tmp_path):
    _write(tmp_path / "defs" / "gemm" / "rmsnorm_h8.json", VALID)
    _write(tmp_path / "defs" / "rmsnorm" / "rmsnorm_h8.json", VALID)
    _write(tmp_path / "loose" / "rmsnorm_h8.json", VALID)
    reports, _ = validate_paths([tmp_path / "defs", tmp_path / "loose" / "rmsnorm_h8.json"])
    by_file = {os.path.relpath(r.file, tmp_path): [p.kind for p in r.problems] for r in reports}
    assert by_file == {"defs/gemm/rmsnorm_h8.json": ["op-type-folder"], "defs/rmsnorm/rmsnorm_h8.json": [],
                       "loose/rmsnorm_h8.json": []}
    _write(tmp_path / "definitions" / "gemm" / "rmsnorm_h8.json", VALID)  # a file named directly
    reports, _ = validate_paths([tmp_path / "definitions" / "gemm" / "rmsnorm_h8.json"])
    assert [p.kind for p in reports[0].problems] == ["op-type-folder"]


@pytest.mark.skipif(sys.platform == "win32", reason="unsupported: symbolic links")
def test_dangling_links_are_reported(tmp_path):
    _write(tmp_path / "rmsnorm" / "rmsnorm_h8.json", VALID)
    (tmp_path / "rmsnorm" / "gone.json").symlink_to(tmp_path / "nowhere.json")
    (tmp_path / "rmsnorm" / "loop.json").symlink_to(tmp_path / "rmsnorm" / "loop.json")
    reports, summary = validate_paths([tmp_path])
    kinds = sorted((os.path.basename(r.file), p.kind) for r in reports for p in r.problems)
    assert kinds == [("gone.json", "dangling-link"), ("loop.json", "dangling-link")]
    assert summary.files_with_problems == 2


def test_validate_json_report_is_complete_over_hostile_files(tmp_path, capsys):
    folder = tmp_path / "rmsnorm"
    for i, text in enumerate(["\ud800", "-" * 100_000 + "1", "a+" * 5000 + "a"]):
        d = copy.deepcopy(VALID)
        d["name"] = f"rmsnorm_h{i}"
        d["constraints"] = [text]
        _write(folder / f"rmsnorm_h{i}.json", d)
    (folder / "rmsnorm_h9.json").write_text("{" * 100_000)
    (folder / "rmsnorm_h8.json").write_bytes(b'{"name": "\xff\xfe"}')
    _write(folder / "rmsnorm_h7.json", VALID | {"name": "rmsnorm_h7"})
    assert main(["validate", str(tmp_path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    files = {os.path.basename(p["file"]) for p in report["problems"]}
    assert files == {"rmsnorm_h0.json", "rmsnorm_h1.json", "rmsnorm_h2.json", "rmsnorm_h8.json", "rmsnorm_h9.json"}
    assert report["summary"]["files"] == 6 and "internal-error" not in report["summary"]["by_kind"]
    assert main(["validate", str(tmp_path)]) == 1  # the text report prints too
    assert "6 file(s), 5 with problems" in capsys.readouterr().out


@pytest.mark.skipif(sys.platform != "linux", reason="unsupported: non-UTF-8 file names")
def test_file_name_that_is_not_utf8(tmp_path, capsys):
    folder = os.fsencode(tmp_path / "rmsnorm")
    os.makedirs(folder)
    with open(os.path.join(folder, b"bad\xff.json"), "w") as f:
        json.dump(VALID, f)
    assert main(["validate", str(tmp_path)]) == 1
    assert "bad\\udcff.json" in capsys.readouterr().out  # printed escaped, not a crash
    assert main(["validate", str(tmp_path), "--json"]) == 1
    assert [p["kind"] for p in json.loads(capsys.readouterr().out)["problems"]] == ["name-mismatch"]


@pytest.mark.parametrize("code", [
    pytest.param("S = 'ab'\n" + "S = S + S\n" * 60, id="doubling-string"),
    pytest.param("N = 3\n" + "N = N * N\n" * 60, id="squaring-int"),
    pytest.param("N = 2\n" + "N = N ** N\n" * 8, id="tower"),
    pytest.param("T = (1,)\n" + "T = (T, T)\n" * 60, id="doubling-tuple"),
    pytest.param("N = 7\n" + "N = N + N\n" * 5000, id="long-chain"),
    pytest.param("F = 2.0\n" + "F = F ** F\n" * 20, id="float-tower"),
    pytest.param("M = 10 ** 4000 % 7\nD = 10 ** 4000 // 3\n", id="big-mod-div"),
])
def test_reference_constants_are_bounded(code):
    consts = reference_constants(code + "EPS = 1e-6\n")
    assert consts["EPS"] == 1e-6
    for value in consts.values():
        assert len(repr(value)) < 20_000


# -- fuzzing with hostile text --------------------------------------------------------------------------
hostile_text = st.one_of(
    st.text(alphabet=st.characters(codec=None, categories=("Cs", "Cc", "Lo", "Sm", "Nd")), max_size=50),
    st.integers(1, 20_000).map(lambda n: "-" * n + "1"),
    st.integers(1, 3000).map(lambda n: "(" * n + "x" + ")" * n),
    st.integers(1, 3000).map(lambda n: "a+" * n + "a"),
    st.integers(1, 3000).map(lambda n: "x[" * n + "0" + "]" * n),
    st.sampled_from(["\ud800", "\udfff", "\x00", "2 ** 10 ** 10", "x" * 5000, "lambda: 0", "__import__('os')"]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["constraint", "reference", "name", "op_type", "axis", "tag", "dtype"]), hostile_text)
def test_hostile_text_anywhere_is_problems(where, text):
    d = copy.deepcopy(VALID)
    if where == "constraint":
        d["constraints"] = [text, "hidden_size == 8"]
    elif where == "reference":
        d["reference"] = text
    elif where == "name":
        d["name"] = text
    elif where == "op_type":
        d["op_type"] = text
    elif where == "axis":
        d["axes"][text] = {"type": "var"}
        d["inputs"]["hidden_states"]["shape"] = [text, "hidden_size"]
    elif where == "tag":
        d["tags"] = [text]
    else:
        d["inputs"]["weight"]["dtype"] = text
    problems = check_data(d, "fuzz.json", stem="rmsnorm_h8")
    for p in problems:
        assert p.file == "fuzz.json" and p.path.startswith("$") and p.message and p.kind != "internal-error"
    json.dumps([[p.path, p.message] for p in problems], ensure_ascii=False).encode("utf-8", "backslashreplace")

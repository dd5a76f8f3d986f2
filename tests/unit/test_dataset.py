import json

import pytest

from flashinfer_trace import dataset
from flashinfer_trace.dataset import Dataset, definitions_dir, iter_definitions, load_definition
from flashinfer_trace.validate import DefinitionError


@pytest.fixture
def folder(tmp_path, valid):
    for op_type, name, tags in (("rmsnorm", "rmsnorm_h8", ["model:toy"]),
                                ("rmsnorm", "rmsnorm_h16", ["model:big", "fused"]),
                                ("other", "other_h8", ["model:toy"])):
        (tmp_path / op_type).mkdir(exist_ok=True)
        d = dict(valid, name=name, op_type=op_type, tags=tags)
        (tmp_path / op_type / f"{name}.json").write_text(json.dumps(d))
    return tmp_path


def test_load_by_name_and_by_path(folder):
    d = load_definition("rmsnorm_h16", definitions=folder)
    assert d.name == "rmsnorm_h16" and d.source.name == "rmsnorm_h16.json"
    assert load_definition(folder / "other" / "other_h8.json").op_type == "other"


def test_select_by_op_type_tag_and_model(folder):
    ds = Dataset(folder)
    assert sorted(d.name for d in ds.select(op_type="rmsnorm")) == ["rmsnorm_h16", "rmsnorm_h8"]
    assert [d.name for d in ds.select(tag="fused")] == ["rmsnorm_h16"]
    assert sorted(d.name for d in iter_definitions(model="toy", definitions=folder)) == ["other_h8", "rmsnorm_h8"]


def test_unknown_name_suggests_close_ones(folder):
    with pytest.raises(KeyError, match="did you mean .*rmsnorm_h8"):
        load_definition("rmsnorm_h", definitions=folder)


def test_parse_is_cached_until_the_file_changes(folder):
    path = folder / "rmsnorm" / "rmsnorm_h8.json"
    first = load_definition(path)
    assert load_definition(path) is first
    data = json.loads(path.read_text())
    data["description"] = "changed, and longer than before"
    path.write_text(json.dumps(data))
    assert load_definition(path).description == "changed, and longer than before"


def test_invalid_file_raises_with_its_problems(folder):
    bad = folder / "rmsnorm" / "rmsnorm_h8.json"
    bad.write_text("{}")
    with pytest.raises(DefinitionError, match="missing"):
        load_definition("rmsnorm_h8", definitions=folder)


def test_duplicate_names_across_folders_are_an_error(folder, valid):
    (folder / "other" / "rmsnorm_h8.json").write_text(json.dumps(valid))
    with pytest.raises(DefinitionError, match="duplicate|also defined"):
        Dataset(folder).names()


def test_folder_from_environment(monkeypatch, folder):
    monkeypatch.setenv(dataset.ENV_VAR, str(folder))
    assert definitions_dir() == folder
    assert definitions_dir("/elsewhere").as_posix() == "/elsewhere"


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Dataset(tmp_path / "nope")

import pytest
import torch

from flashinfer_trace.constraints import ConstraintError, check_all, parse


def test_names_exclude_called_functions():
    assert parse("len(kv_indptr) == batch_size + 1").names == {"kv_indptr", "batch_size"}


def test_evaluates_tensor_values():
    env = {"kv_indptr": torch.tensor([0, 3, 5], dtype=torch.int32), "num_kv_indices": 5, "batch_size": 2}
    assert parse("num_kv_indices == kv_indptr[-1].item()").evaluate(env) is True
    assert parse("kv_indptr.shape[0] == batch_size + 1 and batch_size >= 1").evaluate(env) is True
    assert parse("0 <= batch_size < 2").evaluate(env) is False


@pytest.mark.parametrize("text", [
    "__import__('os')", "x.__class__", "open('f')", "[x for x in y]", "lambda: 1", "'a' == 'a'",
    "x.tofile('f')", "f(x=1)", "x if y else z", "_x == 1",
])
def test_refuses_anything_outside_the_subset(text):
    with pytest.raises(ConstraintError):
        parse(text)


def test_check_all_names_every_failed_constraint():
    with pytest.raises(ConstraintError) as err:
        check_all(["a == 1", "b == 2", "a + b == 5"], {"a": 2, "b": 3}, definition="d")
    msg = str(err.value)
    assert msg.startswith("d:") and "'a == 1'" in msg and "'b == 2'" in msg and "a + b" not in msg


def test_check_all_reports_unknown_names():
    with pytest.raises(ConstraintError, match="unknown name 'c'"):
        check_all(["c == 1"], {}, definition="d")

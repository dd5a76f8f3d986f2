"""compare.py: which tolerance governs a definition, where overrides come from, and the diff report
with its verdict (pass / precision / bug)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from samples import VALID

from flashinfer_trace.dataset import load_path
from flashinfer_trace.definition import Definition
from flashinfer_trace.verdict.compare import (
    DTYPE_TOLERANCES,
    Mismatch,
    Tolerance,
    ToleranceConfigError,
    assert_close,
    compare_outputs,
    diff,
    governing_dtype,
    load_tolerance_config,
    tolerance_for,
)

EMPTY = {"op_type": {}, "definition": {}}
TIGHT = Tolerance(1e-5, 1e-5)


def make(name, op_type, inputs, outputs):
    """A definition whose specs are {name: (shape or None, dtype)}; the axes are all var."""
    specs = {**inputs, **outputs}
    axes = {a: {"type": "var"} for shape, _ in specs.values() for a in (shape or [])}
    return Definition.model_validate({
        "name": name, "op_type": op_type, "axes": axes,
        "inputs": {k: {"shape": s, "dtype": t} for k, (s, t) in inputs.items()},
        "outputs": {k: {"shape": s, "dtype": t} for k, (s, t) in outputs.items()},
        "reference": f"def run({', '.join(inputs)}):\n    return None\n",
    })


def rmsnorm_def(name="rmsnorm_h8"):
    return Definition.model_validate({**VALID, "name": name})


# -- which dtype governs ----------------------------------------------------------------------------
def test_bf16_input_with_fp32_output_gets_bf16_tolerance():
    d = make("attn", "gqa_ragged", {"q": (["t", "h"], "bfloat16"), "sm_scale": (None, "float32")},
             {"output": (["t", "h"], "bfloat16"), "lse": (["t"], "float32")})
    tol = tolerance_for(d, config=EMPTY)
    assert governing_dtype(d) == "bfloat16"
    assert (tol.atol, tol.rtol, tol.matched_ratio) == (1e-2, 1e-2, 1.0)
    assert tol.origin == "dtype:bfloat16"


def test_fp32_lse_output_alone_does_not_loosen_a_bf16_definition_further():
    d = make("d", "x", {"q": (["t"], "float16")}, {"lse": (["t"], "float32"), "o": (["t"], "bfloat16")})
    # bfloat16 is less precise than float16, so it governs whichever side it is on
    assert governing_dtype(d) == "bfloat16"


def test_fp8_inputs_get_fp8_tolerance_with_matched_ratio():
    d = make("moe", "moe", {"hidden_states": (["t", "h"], "float8_e4m3fn"), "scale": (["t"], "float32")},
             {"output": (["t", "h"], "bfloat16")})
    tol = tolerance_for(d, config=EMPTY)
    assert (tol.atol, tol.rtol, tol.matched_ratio) == (0.1, 0.2, 0.9)
    assert tol.origin == "dtype:float8_e4m3fn"


def test_fp32_only_gets_1e_5():
    d = make("g", "gemm", {"A": (["m", "k"], "float32"), "B": (["n", "k"], "float32")},
             {"C": (["m", "n"], "float32")})
    tol = tolerance_for(d, config=EMPTY)
    assert (tol.atol, tol.rtol, tol.matched_ratio) == (1e-5, 1e-5, 1.0)


def test_integer_only_definition_falls_back_to_fp32():
    d = make("ids", "x", {"ids": (["t"], "int32")}, {"out": (["t"], "int64")})
    assert governing_dtype(d) == "float32"


def test_scalars_do_not_govern():
    # a bf16 scalar is a Python float, not a bf16 tensor: it must not loosen an fp32 definition
    d = make("s", "x", {"x": (["t"], "float32"), "alpha": (None, "bfloat16")}, {"y": (["t"], "float32")})
    assert governing_dtype(d) == "float32"


@pytest.mark.parametrize("dtype", list(DTYPE_TOLERANCES))
def test_each_dtype_maps_to_its_table_entry(dtype):
    d = make("d", "x", {"x": (["t"], dtype), "y": (["t"], "float32")}, {"z": (["t"], "float32")})
    tol = tolerance_for(d, config=EMPTY)
    expected = DTYPE_TOLERANCES[dtype]
    assert (tol.atol, tol.rtol, tol.matched_ratio) == (expected.atol, expected.rtol, expected.matched_ratio)


# -- overrides: tolerances.toml and the command line -----------------------------------------------
TOML = """
[op_type.rmsnorm]
atol = 0.05
matched_ratio = 0.5

[definition.rmsnorm_h8]
rtol = 0.02
matched_ratio = 0.75
"""


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "tolerances.toml"
    path.write_text(TOML)
    return load_tolerance_config(path)


def test_load_tolerance_config_reads_both_tables(config):
    assert config == {"op_type": {"rmsnorm": {"atol": 0.05, "matched_ratio": 0.5}},
                      "definition": {"rmsnorm_h8": {"rtol": 0.02, "matched_ratio": 0.75}}}


def test_op_type_then_definition_overrides(config):
    tol = tolerance_for(rmsnorm_def(), config=config)
    assert (tol.atol, tol.rtol, tol.matched_ratio) == (0.05, 0.02, 0.75)
    assert tol.origin == "dtype:bfloat16, op_type:rmsnorm, definition:rmsnorm_h8"


def test_definition_table_applies_only_to_its_definition(config):
    tol = tolerance_for(rmsnorm_def("rmsnorm_other"), config=config)
    assert (tol.atol, tol.rtol, tol.matched_ratio) == (0.05, 1e-2, 0.5)
    assert tol.origin == "dtype:bfloat16, op_type:rmsnorm"


def test_cli_wins_and_none_values_are_ignored(config):
    tol = tolerance_for(rmsnorm_def(), config=config, cli={"atol": 0.5, "rtol": None, "matched_ratio": 0.99})
    assert (tol.atol, tol.rtol, tol.matched_ratio) == (0.5, 0.02, 0.99)
    assert tol.origin == "dtype:bfloat16, op_type:rmsnorm, definition:rmsnorm_h8, cli"


def test_cli_of_only_nones_is_no_layer(config):
    tol = tolerance_for(rmsnorm_def(), config=config, cli={"atol": None})
    assert "cli" not in tol.origin


def test_tolerances_toml_next_to_the_op_folders_is_found(tmp_path):
    folder = tmp_path / "definitions"
    (folder / "rmsnorm").mkdir(parents=True)
    path = folder / "rmsnorm" / "rmsnorm_h8.json"
    path.write_text(json.dumps(VALID))
    (folder / "tolerances.toml").write_text("[definition.rmsnorm_h8]\natol = 0.125\n")
    tol = tolerance_for(load_path(path))
    assert tol.atol == 0.125 and tol.origin == "dtype:bfloat16, definition:rmsnorm_h8"


def test_as_dict_round_trips_the_values():
    assert Tolerance(0.1, 0.2, 0.9, origin="x").as_dict() == {"atol": 0.1, "rtol": 0.2, "matched_ratio": 0.9,
                                                               "min_cosine": None, "origin": "x"}


@pytest.mark.parametrize("text, needles", [
    ("[kernel.rmsnorm]\natol = 1\n", ["[kernel]", "unknown table"]),
    ("op_type = 3\n", ["[op_type]", "unknown table"]),
    ("[op_type]\nrmsnorm = 1\n", ["[op_type.rmsnorm]", "must be a table"]),
    ("[op_type.rmsnorm]\natoll = 1\n", ["[op_type.rmsnorm].atoll", "unknown field"]),
    ("[definition.d]\natol = -1e-3\n", ["[definition.d].atol", "number >= 0"]),
    ("[definition.d]\nrtol = nan\n", ["[definition.d].rtol", "number >= 0"]),
    ("[op_type.gemm]\nmatched_ratio = 1.5\n", ["[op_type.gemm].matched_ratio", "ratio in [0, 1]"]),
    ("[op_type.moe]\nmin_cosine = 1.01\n", ["[op_type.moe].min_cosine", "ratio in [0, 1]"]),
    ("[op_type.gemm]\natol = true\n", ["[op_type.gemm].atol", "True"]),
    ("[op_type.gemm]\natol = \"0.1\"\n", ["[op_type.gemm].atol", "'0.1'"]),
    ("[op_type.gemm\natol = 1\n", []),
])
def test_bad_tolerance_config_names_file_and_field(tmp_path, text, needles):
    path = tmp_path / "tolerances.toml"
    path.write_text(text)
    with pytest.raises(ToleranceConfigError) as exc:
        load_tolerance_config(path)
    message = str(exc.value)
    assert message.startswith(f"{path}: ")
    for needle in needles:
        assert needle in message


def test_missing_tolerance_file_is_a_config_error(tmp_path):
    with pytest.raises(ToleranceConfigError, match="nope.toml"):
        load_tolerance_config(tmp_path / "nope.toml")


def test_ratio_of_exactly_one_and_zero_values_are_accepted(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text("[op_type.x]\nmatched_ratio = 1\natol = 0\nrtol = 0\n")
    assert load_tolerance_config(path)["op_type"]["x"] == {"matched_ratio": 1.0, "atol": 0.0, "rtol": 0.0}


# -- diff ---------------------------------------------------------------------------------------------
def test_identical_tensors_pass():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    r = diff(x, x.clone(), TIGHT, "out")
    assert r.passed and r.verdict == "pass" and r.mismatched == 0 and r.total == 12
    assert r.worst_index is None and r.max_abs == 0.0 and r.cosine == pytest.approx(1.0)
    assert r.shape == [3, 4] and r.name == "out"


def test_one_element_off_is_located():
    e = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    a = e.clone()
    a[1, 2] += 0.5
    r = diff(a, e, TIGHT)
    assert r.mismatched == 1 and r.mismatch_ratio == pytest.approx(1 / 12)
    assert r.worst_index == [1, 2]
    assert r.worst_actual == pytest.approx(float(a[1, 2])) and r.worst_expected == pytest.approx(float(e[1, 2]))
    assert r.max_abs == pytest.approx(0.5, rel=1e-5)
    assert not r.passed
    assert "worst at (1, 2)" in r.summary()


def test_worst_index_is_the_largest_error_among_several():
    e = torch.zeros(2, 3, 4)
    a = e.clone()
    a[0, 0, 0] = 0.01
    a[1, 2, 3] = 0.2
    a[0, 1, 1] = -0.05
    r = diff(a, e, TIGHT)
    assert r.mismatched == 3 and r.worst_index == [1, 2, 3] and r.worst_actual == pytest.approx(0.2)


def test_large_error_is_a_bug():
    e = torch.ones(1000)
    a = e.clone()
    a[7] = 3.0  # |diff| = 2 > BUG_ABS; cosine stays ~0.998
    r = diff(a, e, TIGHT)
    assert r.cosine > 0.99
    assert r.verdict == "bug"


def test_small_error_just_out_of_tolerance_is_precision():
    e = torch.linspace(1, 2, 100, dtype=torch.float64)
    a = e * (1 + 1e-4)
    r = diff(a, e, TIGHT)
    assert r.mismatched == 100 and r.max_abs < 1e-3 and r.cosine == pytest.approx(1.0)
    assert r.verdict == "precision"


def test_just_inside_tolerance_passes():
    e = torch.linspace(1, 2, 100, dtype=torch.float64)
    a = e + 0.9 * (TIGHT.atol + TIGHT.rtol * e)
    assert diff(a, e, TIGHT).verdict == "pass"


def test_tolerance_used_is_the_verdicts_margin():
    """<= 1 exactly when the comparison passes: the worst element at matched_ratio 1.0, the quantile
    where the verdict is decided below it; a NaN where the other side has a number counts as infinite."""
    e = torch.linspace(1, 2, 100, dtype=torch.float64)
    allowed = TIGHT.atol + TIGHT.rtol * e
    assert diff(e.clone(), e, TIGHT).tolerance_used == 0.0
    a = e + 0.25 * allowed
    a[7] = e[7] + 0.9 * allowed[7]
    r = diff(a, e, TIGHT)
    assert r.passed and r.tolerance_used == pytest.approx(0.9, rel=1e-4)
    a[7] = e[7] + 3 * allowed[7]
    r = diff(a, e, TIGHT)
    assert not r.passed and r.tolerance_used == pytest.approx(3, rel=1e-4)
    ninety = Tolerance(TIGHT.atol, TIGHT.rtol, matched_ratio=0.9)
    a = e + 0.5 * allowed
    a[:10] = e[:10] + 5 * allowed[:10]  # 10 of 100 out: 90% matched, the 90th smallest ratio is 0.5
    r = diff(a, e, ninety)
    assert r.passed and r.tolerance_used == pytest.approx(0.5, rel=1e-4)
    a[10] = e[10] + 2 * allowed[10]  # an 11th out: the verdict flips, and the margin with it
    r = diff(a, e, ninety)
    assert not r.passed and r.tolerance_used > 1
    a[:] = e + 0.5 * allowed
    a[:11] = math.nan
    r = diff(a, e, ninety)
    assert not r.passed and r.tolerance_used == math.inf
    lse = torch.tensor([-math.inf, 1.0, math.nan], dtype=torch.float64)  # the same -inf, NaN on both sides
    r = diff(lse, lse.clone(), TIGHT)
    assert r.passed and r.tolerance_used == 0.0
    assert diff(torch.tensor([1, 2]), torch.tensor([1, 2]), TIGHT).tolerance_used is None  # exact: no margin


def test_low_cosine_is_a_bug_even_when_errors_are_small():
    g = torch.Generator().manual_seed(2)
    e = torch.randn(1000, generator=g) * 0.01
    a = torch.randn(1000, generator=g) * 0.01  # unrelated values, all differences far below BUG_ABS
    r = diff(a, e, TIGHT)
    assert r.max_abs < 1.0 and r.cosine < 0.99
    assert r.verdict == "bug"


def test_matched_ratio_lets_a_few_mismatches_pass():
    e = torch.ones(100)
    a = e.clone()
    a[:5] += 0.01
    loose = Tolerance(1e-5, 1e-5, matched_ratio=0.9)
    r = diff(a, e, loose)
    assert r.passed and r.mismatched == 5
    a[:20] += 0.01
    r = diff(a, e, loose)
    assert not r.passed and r.mismatched == 20 and r.verdict == "precision"


def test_matching_neg_inf_passes_and_neg_inf_vs_finite_fails():
    e = torch.tensor([-math.inf, 1.0, 2.0])
    r = diff(e.clone(), e, TIGHT)
    assert r.passed and r.inf_actual == r.inf_expected == 1
    r = diff(torch.tensor([0.0, 1.0, 2.0]), e, TIGHT)
    assert r.mismatched == 1 and r.worst_index == [0] and r.inf_actual == 0 and r.inf_expected == 1
    assert r.verdict == "bug"


def test_infinity_of_the_wrong_sign_or_place_is_a_bug():
    # Not a rounding effect: the verdict must not be "precision" (close but out of tolerance).
    e = torch.tensor([-math.inf, 1.0, 2.0])
    r = diff(torch.tensor([math.inf, 1.0, 2.0]), e, TIGHT)  # +inf where -inf is expected
    assert r.mismatched == 1 and r.worst_index == [0]
    assert r.verdict == "bug"
    r = diff(torch.tensor([1.0, -math.inf, 2.0]), e, TIGHT)  # the empty request's -inf on the wrong row
    assert r.mismatched == 2
    assert r.verdict == "bug"


def test_nan_counts_are_reported():
    e = torch.tensor([0.0, 1.0, 2.0, math.nan])
    a = torch.tensor([math.nan, 1.0, 2.0, math.nan])
    r = diff(a, e, TIGHT)
    assert (r.nan_actual, r.nan_expected) == (2, 1)
    assert r.mismatched == 1 and r.worst_index == [0]  # NaN on both sides agrees
    assert r.verdict == "bug"
    assert "nan 2/1" in r.summary()


def test_nan_on_both_sides_agrees():
    e = torch.tensor([math.nan, 1.0])
    assert diff(e.clone(), e, TIGHT).passed


def test_shape_mismatch_is_a_bug_with_a_problem():
    r = diff(torch.zeros(2, 3), torch.zeros(3, 2), TIGHT, "o")
    assert r.verdict == "bug" and not r.passed
    assert r.problem == "shape (2, 3) != expected (3, 2)"
    assert r.summary() == "o: shape (2, 3) != expected (3, 2) [bug]"


def test_integer_tensors_compare_exactly_whatever_the_tolerance():
    huge = Tolerance(atol=10.0, rtol=10.0)
    assert diff(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3]), huge).passed
    r = diff(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 4]), huge)
    assert r.mismatched == 1 and r.worst_index == [2] and not r.passed
    assert (r.worst_actual, r.worst_expected) == (3.0, 4.0)


def test_low_precision_inputs_are_upcast_before_comparing():
    e = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    a = e.to(torch.bfloat16)
    assert diff(a, e, TIGHT).passed  # exact in bf16
    assert diff(torch.tensor([1.0, 2.0, 3.01], dtype=torch.bfloat16), e, TIGHT).mismatched == 1


def test_tolerance_recorded_in_report():
    tol = Tolerance(0.1, 0.2, 0.9, "dtype:float8_e4m3fn")
    r = diff(torch.zeros(2), torch.zeros(2), tol)
    assert r.tolerance == tol.as_dict()
    assert r.as_dict()["mismatch_ratio"] == 0.0


# -- assert_close / compare_outputs ------------------------------------------------------------------
def test_assert_close_raises_mismatch_naming_every_output():
    e = (torch.ones(4), torch.zeros(4))
    a = (torch.ones(4), torch.full((4,), 5.0))
    with pytest.raises(Mismatch) as exc:
        assert_close(a, e, names=["output", "lse"])
    message = str(exc.value)
    assert "1 of 2 output(s) differ [bug]" in message
    assert "output: 0/4" in message and "lse: 4/4" in message
    assert exc.value.verdict == "bug"
    assert [r.name for r in exc.value.reports] == ["output", "lse"]
    assert [r.passed for r in exc.value.reports] == [True, False]


def test_mismatch_verdict_is_precision_when_no_output_is_a_bug():
    e = torch.ones(4)
    with pytest.raises(Mismatch) as exc:
        assert_close(e * (1 + 1e-3), e)
    assert exc.value.verdict == "precision" and "[precision]" in str(exc.value)


def test_assert_close_returns_reports_when_everything_passes():
    e = (torch.ones(4), torch.arange(3))
    reports = assert_close(tuple(t.clone() for t in e), e, names=["a", "b"])
    assert [r.name for r in reports] == ["a", "b"] and all(r.passed for r in reports)


def test_assert_close_default_names():
    with pytest.raises(Mismatch, match=r"output\[1\]"):
        assert_close((torch.ones(2), torch.ones(2)), (torch.ones(2), torch.zeros(2)))


def test_rtol_atol_arguments_override_the_tolerance():
    e = torch.ones(8)
    a = e + 0.05
    with pytest.raises(Mismatch):
        assert_close(a, e, tolerance=Tolerance(1e-3, 1e-3))
    (r,) = assert_close(a, e, atol=0.1, tolerance=Tolerance(1e-3, 1e-3, origin="o"))
    assert r.tolerance["atol"] == 0.1 and r.tolerance["rtol"] == 1e-3 and r.tolerance["origin"] == "o"
    (r,) = assert_close(a, e, rtol=0.06)
    assert r.tolerance["rtol"] == 0.06 and r.tolerance["atol"] == 1e-5
    with pytest.raises(Mismatch):
        assert_close(a, e, rtol=0.01)


def test_assert_close_matched_ratio_override():
    e = torch.ones(10)
    a = e.clone()
    a[0] = 1.5
    with pytest.raises(Mismatch):
        assert_close(a, e)
    assert assert_close(a, e, matched_ratio=0.9)[0].mismatched == 1


def test_output_count_mismatch_is_one_bug_report():
    (r,) = compare_outputs((torch.ones(2),), (torch.ones(2), torch.ones(2)), TIGHT)
    assert r.verdict == "bug" and r.problem == "1 output(s) vs 2 expected"
    with pytest.raises(Mismatch, match="1 output"):
        assert_close((torch.ones(2),), (torch.ones(2), torch.ones(2)))


def test_single_tensor_and_scalars_are_accepted():
    assert compare_outputs(torch.ones(3), torch.ones(3), TIGHT)[0].passed
    assert compare_outputs(1.0, 1.0, TIGHT)[0].passed
    assert not compare_outputs(1.0, 2.0, TIGHT)[0].passed


def test_a_reference_test_records_how_much_tolerance_it_used(tmp_path):
    """The suite's record of a comparison carries each output's margin (the matrix's tests.json), a pass included."""
    import ast
    import subprocess
    import sys
    import xml.etree.ElementTree as ET
    from pathlib import Path

    from flashinfer_trace.results.record import CaseRecord

    root = Path(__file__).resolve().parents[2]
    junit = tmp_path / "junit.xml"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device=cpu",
                          "tests/references/test_rmsnorm.py::test_rmsnorm[rmsnorm_h4096-match-torch-small-0]",
                          f"--junitxml={junit}"],
                         cwd=root, capture_output=True, text=True)
    assert "1 passed" in out.stdout, out.stdout + out.stderr
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    record = CaseRecord.model_validate(ast.literal_eval(props["record"]))  # junit writes the property's repr
    assert record.status == "pass" and record.check == "match" and record.seed == 0
    (compared,) = record.compared
    assert compared["output"] == "output" and compared["total"] == 16384 and compared["mismatched"] == 0
    assert 0 < compared["tolerance_used"] <= 1 and compared["cosine"] > 0.9999


# -- the cosine floor (fp8: rounding scatters, a wrong formula bends) -------------------------------
def _scattered_and_bent(n: int = 4096):
    """A bf16-sized output, a copy with 2^-5 relative noise in no common direction (fp8 rounding), and one
    with a quarter of its elements scaled by 1.1 (a wrong weight on some tokens): both inside the fp8
    element tolerance."""
    g = torch.Generator().manual_seed(0)
    e = torch.randn(n, generator=g, dtype=torch.float64)
    noisy = e * (1 + 2 ** -5 * (2 * torch.rand(n, generator=g, dtype=torch.float64) - 1))
    bent = e.clone()
    bent[: n // 4] *= 1.1
    bent[n // 4: n // 2] *= 0.9
    return e, noisy, bent


def test_cosine_floor_fails_a_bent_output_that_every_element_tolerance_passes():
    e, noisy, bent = _scattered_and_bent()
    elementwise = Tolerance(0.1, 0.2, 0.9)
    floored = Tolerance(0.1, 0.2, 0.9, min_cosine=0.998)
    assert diff(bent, e, elementwise).passed and diff(noisy, e, floored).passed
    r = diff(bent, e, floored)
    assert not r.passed and r.mismatched == 0 and r.cosine_floor == 0.998
    assert "below the floor 0.998" in r.summary() and r.tolerance_used > 1


def test_cosine_floor_counts_in_the_tolerance_used():
    e, noisy, _ = _scattered_and_bent()
    r = diff(noisy, e, Tolerance(0.1, 0.2, 0.9, min_cosine=0.998))
    assert r.tolerance_used == pytest.approx(max(_elementwise_used(noisy, e), (1 - r.cosine) / 0.002), rel=1e-4)


def _elementwise_used(a, e):
    return diff(a, e, Tolerance(0.1, 0.2, 0.9)).tolerance_used


def test_cosine_floor_leaves_outputs_below_atol_to_the_element_tolerance():
    """An all-zero expected output (no token routed here) against rounding noise: its direction means nothing."""
    e = torch.zeros(256, dtype=torch.float64)
    noise = torch.full((256,), 1e-3, dtype=torch.float64)
    r = diff(noise, e, Tolerance(0.1, 0.2, 0.9, min_cosine=0.998))
    assert r.passed and r.cosine_floor is None


def test_the_fp8_moe_definitions_carry_the_floor():
    from flashinfer_trace.testing import load_definition

    name = "moe_fp8_block_scale_renorm_topk8_e128_h2048_i768"
    tol = tolerance_for(load_definition(name))
    assert tol.min_cosine == 0.998 and tol.origin.endswith(f"definition:{name}")


@pytest.mark.parametrize("matched_ratio", [1.0, 0.999, 0.9])
def test_a_large_output_compared_in_slices_reports_what_it_reports_whole(monkeypatch, matched_ratio):
    """An output past CHUNK elements (a KV cache of 2**31 elements) is upcast a slice at a time: every field of the
    report is the one the whole comparison gives (the worst element the first of the largest, tolerance_used the
    same quantile), NaN, infinities and an operand scale included."""
    from flashinfer_trace.verdict import compare

    g = torch.Generator().manual_seed(7)
    e = torch.randn(3, 1000, generator=g, dtype=torch.float64).to(torch.bfloat16)
    a = (e.to(torch.float64) + 0.01 * torch.randn(3, 1000, generator=g, dtype=torch.float64)).to(torch.bfloat16)
    a[0, 5], e[1, 7], a[2, 9], e[2, 9], a[2, 11] = float("nan"), float("inf"), float("-inf"), float("-inf"), 40.0
    scale = e.to(torch.float64).abs() + (torch.rand(3, 1000, generator=g, dtype=torch.float64) > 0.9) * 3
    tol = Tolerance(atol=0.01, rtol=0.01, matched_ratio=matched_ratio, min_cosine=0.5)
    whole = diff(a, e, tol, scale=scale).as_dict()
    monkeypatch.setattr(compare, "CHUNK", 128)
    sliced = diff(a, e, tol, scale=scale).as_dict()
    assert whole["mismatched"] > 0 and whole["worst_index"] == [0, 5] and whole["widened"] > 0  # NaN: worst first
    for key, value in whole.items():
        if isinstance(value, float) and math.isfinite(value):
            assert sliced[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
        elif isinstance(value, float) and math.isnan(value):
            assert math.isnan(sliced[key]), key
        else:
            assert sliced[key] == value, key

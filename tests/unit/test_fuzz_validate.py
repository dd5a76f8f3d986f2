"""Hypothesis fuzzing: malformed definitions always become validation problems, never exceptions."""

import copy
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from samples import VALID

from flashinfer_trace.definition import is_literal_dim
from flashinfer_trace.dtypes import DTYPE_NAMES
from flashinfer_trace.validate import UNPARSED, check_data, parse_json

REQUIRED = ("name", "op_type", "axes", "inputs", "outputs", "reference")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def _not(type_):
    return json_values.filter(lambda v: not isinstance(v, type_))


# Each mutation is guaranteed to make the definition invalid.
def _drop_required(draw, d):
    del d[draw(st.sampled_from(REQUIRED))]


def _retype_field(draw, d):
    field, type_ = draw(st.sampled_from([("name", str), ("op_type", str), ("axes", dict), ("inputs", dict),
                                         ("outputs", dict), ("reference", str), ("tags", list),
                                         ("constraints", list)]))
    d[field] = draw(_not(type_))


def _bad_axis_ref(draw, d):
    section = draw(st.sampled_from(["inputs", "outputs"]))
    tensor = draw(st.sampled_from(sorted(d[section])))
    # a positive integer literal ("1") is a fixed dimension (fi_trace's form), not a bad reference
    d[section][tensor]["shape"] = [draw(st.text(max_size=12).filter(
        lambda s: s not in d["axes"] and not is_literal_dim(s)))]


def _bad_dtype(draw, d):
    section = draw(st.sampled_from(["inputs", "outputs"]))
    tensor = draw(st.sampled_from(sorted(d[section])))
    d[section][tensor]["dtype"] = draw(json_values.filter(lambda v: v not in DTYPE_NAMES))


def _bad_const(draw, d):
    d["axes"]["hidden_size"]["value"] = draw(
        st.integers(max_value=-1) | st.floats(allow_nan=False) | st.text(max_size=5) | st.booleans() | st.none())


def _bad_axis(draw, d):
    d["axes"][draw(st.sampled_from(sorted(d["axes"])))] = draw(
        json_values.filter(lambda v: not (isinstance(v, dict) and v.get("type") in ("const", "var"))))


def _bad_reference(draw, d):
    d["reference"] = draw(st.text(max_size=200).filter(lambda s: "def run" not in s))


def _bad_constraint(draw, d):
    unknown = draw(st.from_regex(r"[a-z]{3,8}", fullmatch=True).filter(lambda s: s not in d["axes"]
                                                                      and s not in d["inputs"]
                                                                      and s not in ("len", "min", "max", "abs",
                                                                                    "int", "float", "and", "or",
                                                                                    "not", "in", "is", "if")))
    noise = draw(st.text(max_size=30))
    d["constraints"] = [*d.get("constraints", []), f"{unknown} {noise}"]


def _overlap(draw, d):
    # A name on both sides is an in-place output (fi_trace) when it is the input's own tensor; one that
    # differs from its input is malformed.
    name = draw(st.sampled_from(sorted(d["inputs"])))
    spec = copy.deepcopy(d["inputs"][name])
    spec["dtype"] = "int8" if spec.get("dtype") != "int8" else "float32"
    d["outputs"][name] = spec


MUTATIONS = [_drop_required, _retype_field, _bad_axis_ref, _bad_dtype, _bad_const, _bad_axis, _bad_reference,
             _bad_constraint, _overlap]


@st.composite
def malformed(draw):
    d = copy.deepcopy(VALID)
    for mutate in draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=4)):
        # An earlier mutation may have broken what a later one edits: skip the later one then.
        try:
            mutate(draw, d)
        except (KeyError, TypeError, AttributeError, IndexError):
            continue
    return d


@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(malformed())
def test_malformed_definitions_are_clear_problems(data):
    problems = check_data(data, "fuzz.json", stem=VALID["name"])
    assert problems, f"no problem reported for {json.dumps(data)[:500]}"
    for p in problems:
        assert p.file == "fuzz.json" and p.path.startswith("$") and p.message and p.kind


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | json_values.map(json.dumps))
def test_arbitrary_text_never_crashes(text):
    data, problems = parse_json(text, "fuzz.json")
    if data is not UNPARSED:
        problems = problems + check_data(data, "fuzz.json")
    if not (isinstance(data, dict) and all(k in data for k in REQUIRED)):
        assert problems

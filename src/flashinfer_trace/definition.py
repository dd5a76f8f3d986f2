"""The Definition model: the public flashinfer-trace format, as pydantic models.

Structure lives here (types, required fields, enums); cross-field rules (name equals file stem,
shapes use declared axes, the reference's signature, constraints) live in `validate.py`, which
reports every problem at once instead of stopping at the first.
"""

from __future__ import annotations

import json
import math
import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictInt,
    StrictStr,
    field_serializer,
    field_validator,
    model_validator,
)

from .dtypes import DType

# Fields a file may carry beyond these are kept (the public format grows; nothing is lost on load).
_KEEP_EXTRA = ConfigDict(extra="allow", frozen=True)


def is_literal_dim(axis: object) -> bool:
    """A positive integer literal used as a shape entry (`"1"`): a fixed dimension, not an axis name
    (`"0"` is no dimension a kernel is written for: it stays an undeclared axis)."""
    return (isinstance(axis, str) and axis.isascii() and axis.isdigit() and len(axis) <= 18
            and str(int(axis)) == axis and int(axis) > 0)


def implicit_axes(data: Any) -> list[str]:
    """Axis names a FlashInfer fi_trace file (one with `init` or `check`) uses in shapes without declaring
    them (`gemm_fp8`'s `K_div_block_size`): var axes by implication, valued by the template's `init` or a
    constraint. A hand-written file gets no such leniency: there an undeclared name is most likely a typo."""
    if not isinstance(data, dict) or not ("init" in data or "check" in data):
        return []
    axes = data.get("axes") if isinstance(data.get("axes"), dict) else {}
    found: list[str] = []
    for section in ("inputs", "outputs"):
        specs = data.get(section) if isinstance(data.get(section), dict) else {}
        for spec in specs.values():
            shape = spec.get("shape") if isinstance(spec, dict) else None
            for a in shape if isinstance(shape, list) else ():
                if isinstance(a, str) and a and not is_literal_dim(a) and a not in axes and a not in found:
                    found.append(a)
    return found


PARAM_TAG = "param:"
_PARAM_TAG = re.compile(r"^param:([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def param_tag(tag: str) -> tuple[str, float | int | bool] | None:
    """A `param:<name>=<value>` tag: a parameter the model fixes that the definition's inputs do not
    carry (`param:eps=1e-05`, `param:dt_softplus=true`). The ground truths read parameters here or from
    scalar inputs, never from the reference they judge. None for any other tag; ValueError, saying what
    is wrong, for a malformed one. A value is a decimal number (an int without '.' or exponent) or
    true / false."""
    if not tag.startswith(PARAM_TAG):
        return None
    m = _PARAM_TAG.fullmatch(tag)
    if m is None:
        raise ValueError(f"tag {tag!r} is not param:<name>=<value> with <name> an identifier")
    name, text = m.groups()
    if text in ("true", "false"):
        return name, text == "true"
    if not _NUMBER.fullmatch(text):
        raise ValueError(f"tag {tag!r}: value {text!r} is not a decimal number nor true / false")
    if re.fullmatch(r"[+-]?\d+", text):
        return name, int(text)
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"tag {tag!r}: value {text!r} is not finite")
    return name, value


class ConstAxis(BaseModel):
    model_config = _KEEP_EXTRA
    type: Literal["const"]
    value: Annotated[StrictInt, Field(ge=0, lt=2**63)]  # a tensor dimension is an int64
    description: StrictStr | None = None


class VarAxis(BaseModel):
    model_config = _KEEP_EXTRA
    type: Literal["var"]
    description: StrictStr | None = None


Axis = Annotated[ConstAxis | VarAxis, Field(discriminator="type")]


UNKNOWN_DTYPE = "unknown"


class TensorSpec(BaseModel):
    model_config = _KEEP_EXTRA
    # None: a Python scalar; []: a 0-d tensor; otherwise one axis name per dimension, or an integer
    # literal (fi_trace writes `"1"`; a JSON int is kept as its decimal text): a fixed dimension.
    shape: list[StrictStr] | None
    # None stands for FlashInfer's fi_trace "unknown": an optional input that was absent from the traced
    # call, so it has no dtype (validate allows it on optional inputs only; it is passed as None).
    dtype: DType | None
    description: StrictStr | None = None
    # fi_trace: the input may be absent (passed as None); the API parameter an output is written into.
    optional: StrictBool | None = None
    param: StrictStr | None = None

    @field_validator("shape", mode="before")
    @classmethod
    def _literal_dims(cls, v: Any) -> Any:
        if isinstance(v, list):  # a JSON int in a shape is a fixed dimension: its decimal text ("1")
            return [str(a) if type(a) is int and 0 <= a < 2**63 else a for a in v]
        return v

    @field_validator("dtype", mode="before")
    @classmethod
    def _unknown_is_absent(cls, v: Any) -> Any:
        if v is None:
            raise ValueError("dtype must be a string")  # only the literal "unknown" means no dtype
        return None if v == UNKNOWN_DTYPE else v

    @field_serializer("dtype")
    def _dump_dtype(self, v: DType | None) -> str:
        return UNKNOWN_DTYPE if v is None else v.value

    @property
    def is_scalar(self) -> bool:
        return self.shape is None

    @property
    def is_string(self) -> bool:
        """fi_trace's string argument (dtype "str"/"string", shape null): a Python str, no tensor."""
        return self.dtype is not None and self.dtype.is_string

    @property
    def is_absent(self) -> bool:
        """An optional input without a dtype (fi_trace's "unknown"): absent from the call, passed as None."""
        return self.dtype is None


class Definition(BaseModel):
    """One kernel definition. Reads like the JSON too: `definition["reference"]`."""

    model_config = _KEEP_EXTRA
    name: Annotated[StrictStr, Field(min_length=1)]
    op_type: Annotated[StrictStr, Field(min_length=1)]
    description: StrictStr | None = None
    tags: list[StrictStr] = Field(default_factory=list)
    axes: dict[StrictStr, Axis]
    constraints: list[StrictStr] = Field(default_factory=list)
    inputs: dict[StrictStr, TensorSpec]
    outputs: dict[StrictStr, TensorSpec]
    reference: StrictStr
    # FlashInfer's fi_trace (>= 0.7) adds these: the template's correctness check and its input
    # builder, both Python source. Code like the reference, and untrusted like it: kept, never
    # executed outside the confined worker (docs/definitions.md, "FlashInfer's trace format").
    check: StrictStr | None = None
    init: StrictStr | None = None

    _source: Path | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _declare_implicit_axes(cls, data: Any) -> Any:
        extra = implicit_axes(data)
        if not extra or not isinstance(data.get("axes"), dict):  # malformed axes: the structure check says so
            return data
        note = "undeclared in the fi_trace file: a var axis by implication"
        return {**data, "axes": {**data["axes"], **{a: {"type": "var", "description": note} for a in extra}}}

    # -- reading it like the JSON -------------------------------------------------------------
    @cached_property
    def as_dict(self) -> dict[str, Any]:
        """The definition as its JSON object (fields that were not in the file stay out)."""
        return self.model_dump(mode="json", exclude_unset=True)

    def __getitem__(self, key: str) -> Any:
        return self.as_dict[key]

    def __contains__(self, key: object) -> bool:
        return key in self.as_dict

    def get(self, key: str, default: Any = None) -> Any:
        return self.as_dict.get(key, default)

    def keys(self):
        return self.as_dict.keys()

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.as_dict, indent=indent)

    # -- conveniences the rest of the package uses -----------------------------------------------
    @property
    def source(self) -> Path | None:
        """The file this definition was loaded from, if any."""
        return self._source

    @property
    def const_axes(self) -> dict[str, int]:
        """Const axes' values, and the integer literals shapes use as fixed dimensions (`"1": 1`)."""
        return {**self.literal_dims, **{k: a.value for k, a in self.axes.items() if isinstance(a, ConstAxis)}}

    @property
    def literal_dims(self) -> dict[str, int]:
        """Integer literals in shapes (fi_trace's `"1"`), each a fixed dimension of its own value."""
        return {a: int(a) for s in (*self.inputs.values(), *self.outputs.values()) for a in s.shape or ()
                if is_literal_dim(a) and a not in self.axes}

    @property
    def unused_axes(self) -> list[str]:
        """Declared var axes that size nothing: in no present input's shape, no output's shape and no
        constraint (fi_trace declares some, e.g. a placeholder `one`). Harmless; they get no value."""
        from .constraints import parse

        used = {a for s in self.inputs.values() if not s.is_absent for a in s.shape or ()}
        used |= {a for s in self.outputs.values() for a in s.shape or ()}
        for c in self.constraints:
            try:
                used |= parse(c).names
            except ValueError:  # validate reports it; an unparsable constraint may mention any axis
                return []
        return [a for a in self.var_axes if a not in used]

    @property
    def var_axes(self) -> list[str]:
        return [k for k, a in self.axes.items() if isinstance(a, VarAxis)]

    def tag_values(self, namespace: str) -> list[str]:
        """Values of namespaced tags: `tag_values("model")` -> ["llama-3.1-8b"]."""
        prefix = namespace + ":"
        return [t[len(prefix):] for t in self.tags if t.startswith(prefix)]

    @property
    def declared_params(self) -> dict[str, float | int | bool]:
        """The `param:<name>=<value>` tags (param_tag); ValueError on a malformed one or a name given
        twice (validate reports both as `param-tag` problems)."""
        out: dict[str, float | int | bool] = {}
        for t in self.tags:
            found = param_tag(t)
            if found is None:
                continue
            if found[0] in out:
                raise ValueError(f"tag {t!r}: parameter {found[0]!r} is declared twice")
            out[found[0]] = found[1]
        return out

    @property
    def models(self) -> list[str]:
        return self.tag_values("model")

    @cached_property
    def reference_call(self):
        """How the reference is called (`sandbox.entry.Entry`): its entry function, whether by keyword,
        the keyword each input is passed as, and the inputs it ignores (docs/definitions.md)."""
        from .sandbox.entry import entry_point

        params = {n: s.param for n, s in self.inputs.items() if s.param is not None}
        optional = [n for n, s in self.inputs.items() if s.optional is True]
        return entry_point(self.reference, list(self.inputs), params, optional)

    @property
    def is_sampler(self) -> bool:
        """Sampling definitions draw random tokens: compared statistically, not element-wise. FlashInfer's
        fi_trace files `sampling` ops that return probabilities or logits (renorm, softmax, masking) under
        the same op_type: a sampler's first output is integer token ids."""
        if self.op_type != "sampling":
            return False
        first = next(iter(self.outputs.values()), None)
        return first is None or first.dtype is None or not first.dtype.is_float

    @property
    def reference_entry(self) -> str:
        """The function the reference is called through: `run`, or FlashInfer fi_trace's single
        function that takes the inputs by name (`entry_point`; validate reports why when none is)."""
        found = self.reference_call
        return found.name if found.name else "run"

    @property
    def reference_by_name(self) -> bool:
        """Whether the inputs are passed by keyword (an fi_trace entry point) rather than by position."""
        return self.reference_entry != "run"

    @property
    def reference_ignored(self) -> list[str]:
        """Inputs an fi_trace entry point does not take: call-site parameters of the API that the
        reference ignores. They are generated like any input, but never passed to the reference."""
        return list(self.reference_call.ignored) if self.reference_by_name else []

    @property
    def reference_keywords(self) -> list[str]:
        """The keyword each of `run_parameters` is passed as (an fi_trace entry point): the input's name,
        or its documented `param` where the reference takes that instead."""
        mapping = dict(self.reference_call.keywords)
        return [mapping.get(n, n) for n in self.run_parameters]

    @cached_property
    def run_parameters(self) -> list[str]:
        """The input names in the order `run()` takes them. Inputs are matched by name: the public
        dataset's MoE references list `routing_bias` second where the inputs list it last. Parsed,
        never run; the inputs' own order where the reference has no such run() (validate says why),
        and for an entry point called by keyword (fi_trace), less the inputs it ignores."""
        from .sandbox.entry import run_parameters

        if self.reference_by_name:
            ignored = set(self.reference_ignored)
            return [n for n in self.inputs if n not in ignored]
        params = run_parameters(self.reference)
        return params if params is not None and sorted(params) == sorted(self.inputs) else list(self.inputs)

    @property
    def from_fi_trace(self) -> bool:
        """Written by FlashInfer's fi_trace (>= 0.7): it carries the template's `init`/`check`, or its
        reference is called through a function other than run()."""
        return self.init is not None or self.check is not None or self.reference_by_name

    @property
    def in_place_outputs(self) -> list[str]:
        """Outputs that are also inputs (fi_trace's in-place tensors): the input's value after the call."""
        return [n for n in self.outputs if n in self.inputs]

    @property
    def stage(self) -> str | None:
        stages = self.tag_values("stage")
        return stages[0] if stages else None


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a definition file, as `flashinfer-trace schema` prints it."""
    schema = Definition.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "flashinfer-trace Definition"
    return schema

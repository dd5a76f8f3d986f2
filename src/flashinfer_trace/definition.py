"""The Definition model: the public flashinfer-trace format, as pydantic models.

Structure lives here (types, required fields, enums); cross-field rules (name equals file stem,
shapes use declared axes, the reference's signature, constraints) live in `validate.py`, which
reports every problem at once instead of stopping at the first.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictInt, StrictStr

from .dtypes import DType

# Fields a file may carry beyond these are kept (the public format grows; nothing is lost on load).
_KEEP_EXTRA = ConfigDict(extra="allow", frozen=True)


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


class TensorSpec(BaseModel):
    model_config = _KEEP_EXTRA
    # None: a Python scalar; []: a 0-d tensor; otherwise one axis name per dimension.
    shape: list[StrictStr] | None
    dtype: DType
    description: StrictStr | None = None

    @property
    def is_scalar(self) -> bool:
        return self.shape is None


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

    _source: Path | None = PrivateAttr(default=None)

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
        return {k: a.value for k, a in self.axes.items() if isinstance(a, ConstAxis)}

    @property
    def var_axes(self) -> list[str]:
        return [k for k, a in self.axes.items() if isinstance(a, VarAxis)]

    def tag_values(self, namespace: str) -> list[str]:
        """Values of namespaced tags: `tag_values("model")` -> ["llama-3.1-8b"]."""
        prefix = namespace + ":"
        return [t[len(prefix):] for t in self.tags if t.startswith(prefix)]

    @property
    def models(self) -> list[str]:
        return self.tag_values("model")

    @cached_property
    def run_parameters(self) -> list[str]:
        """The input names in the order `run()` takes them. Inputs are matched by name: the public
        dataset's MoE references list `routing_bias` second where the inputs list it last. Parsed,
        never run; the inputs' own order where the reference has no such run() (validate says why)."""
        from .sandbox.static import run_parameters

        params = run_parameters(self.reference)
        return params if params is not None and sorted(params) == sorted(self.inputs) else list(self.inputs)

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

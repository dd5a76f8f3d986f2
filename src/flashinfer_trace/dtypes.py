"""The dtype vocabulary of the flashinfer-trace format and its torch mapping.

Kept apart from the schema so the schema never imports torch: `validate` and `schema` must work
(and fail cleanly) on a machine where torch is broken or missing.
"""

from __future__ import annotations

from enum import Enum


class DType(str, Enum):
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"
    float8_e4m3fn = "float8_e4m3fn"
    float8_e5m2 = "float8_e5m2"
    float4_e2m1 = "float4_e2m1"
    int64 = "int64"
    int32 = "int32"
    int16 = "int16"
    int8 = "int8"
    bool = "bool"

    @property
    def is_float(self) -> bool:
        return self.value.startswith("float") or self.value == "bfloat16"

    @property
    def is_low_precision(self) -> bool:
        return self.value.startswith(("float8", "float4"))


DTYPE_NAMES = tuple(d.value for d in DType)


def torch_dtype(dtype: DType | str):
    """The torch dtype for a format dtype; float4_e2m1 maps to torch's packed fp4 type when present."""
    import torch

    name = DType(dtype).value
    if name == "float4_e2m1":
        packed = getattr(torch, "float4_e2m1fn_x2", None)
        if packed is None:
            raise ValueError(f"torch {torch.__version__} has no float4 dtype")
        return packed
    return getattr(torch, name)

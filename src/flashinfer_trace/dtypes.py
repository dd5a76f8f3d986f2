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
    uint8 = "uint8"  # packed fp4 pairs and raw scale bytes (FlashInfer's fi_trace writes them so)
    uint32 = "uint32"
    float8_e8m0fnu = "float8_e8m0fnu"  # MX block scales (power-of-two exponents)
    bool = "bool"
    # fi_trace: a string argument (`backend="auto"`, `return_lse_base="base2"`); only on a scalar input
    # (shape null), never a tensor (validate says so). FlashInfer writes both spellings.
    str = "str"
    string = "string"

    @property
    def is_string(self) -> bool:
        return self.value in ("str", "string")

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
    if DType(name).is_string:
        raise ValueError(f"dtype {name!r} is a string argument's, not a tensor's: it has no torch dtype")
    if name == "float4_e2m1":
        packed = getattr(torch, "float4_e2m1fn_x2", None)
        if packed is None:
            raise ValueError(f"torch {torch.__version__} has no float4 dtype")
        return packed
    return getattr(torch, name)

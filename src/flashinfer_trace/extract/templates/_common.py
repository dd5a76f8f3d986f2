"""Pieces shared by the op-family templates: argument checks, float formatting, JSON builders.

A template returns a plain dict in the public definition format, with the keys in the order the
shipped files use (name, op_type, description, tags, axes, constraints, inputs, outputs, reference).
"""

from __future__ import annotations

import math
from typing import Any

STATUS = "status:reference"
BLOCK = 128  # fp8 block-scale quantization block (activations 1 x 128, weights 128 x 128)


def positive_int(name: str, value: Any) -> int:
    """`value` as an int >= 1, or ValueError naming the parameter."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def positive_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def format_float(value: float) -> str:
    """The shortest text that reads back as `value`, exponent without padding: 1e-05 -> '1e-5'."""
    text = repr(float(value))
    if "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}e{int(exponent)}"
    return text


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def const_axis(value: int, description: str) -> dict[str, Any]:
    return {"type": "const", "value": value, "description": description}


def var_axis(description: str) -> dict[str, Any]:
    return {"type": "var", "description": description}


def tensor(shape: list[str] | None, dtype: str, description: str) -> dict[str, Any]:
    """An input or output; shape None is a Python scalar."""
    return {"shape": None if shape is None else list(shape), "dtype": dtype, "description": description}


def definition(*, name: str, op_type: str, description: str, tags: list[str], axes: dict[str, Any],
               constraints: list[str], inputs: dict[str, Any], outputs: dict[str, Any],
               reference: str) -> dict[str, Any]:
    return {
        "name": name,
        "op_type": op_type,
        "description": description,
        "tags": list(tags),
        "axes": axes,
        "constraints": list(constraints),
        "inputs": inputs,
        "outputs": outputs,
        "reference": reference,
    }


def replace_once(text: str, old: str, new: str) -> str:
    """Substitute one exact passage of a reference template; anything else is a template bug."""
    count = text.count(old)
    if count != 1:
        raise RuntimeError(f"template passage found {count} times, expected once: {old[:60]!r}")
    return text.replace(old, new)

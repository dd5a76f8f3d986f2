"""Input generation for kernel definitions: one generator per op family, three size tiers,
seeded and bit-reproducible, with the edge cases each family knows.

    inputs = generate_inputs(definition, size="medium", seed=0, device="cuda")
    out = run(*inputs.args())

The tensors are made on the device asked for (common.py says how the values stay bit-identical
on every device), so a case generated on a GPU equals the same case generated on a CPU.

Every case is checked before it is returned: each tensor's shape and dtype against the
definition, every axis bound, and all of the definition's constraints evaluated on the values.
A case that fails any of them raises InputGenerationError instead of reaching a kernel.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .common import SIZES, Builder, CaseTooLarge, InputGenerationError, Inputs, UnsupportedOpType
from .registry import family_for, supported_op_types

if TYPE_CHECKING:
    from ..definition import Definition

__all__ = [
    "SIZES",
    "CaseTooLarge",
    "InputGenerationError",
    "Inputs",
    "UnsupportedOpType",
    "edge_cases",
    "generate_inputs",
    "set_cache",
    "supported_op_types",
]


def _definition(definition: Definition | str | Path) -> Definition:
    if isinstance(definition, (str, Path)):
        from ..dataset import load_definition

        return load_definition(definition)
    return definition


_cache: OrderedDict[tuple, Inputs] = OrderedDict()
_cache_size = 0


def set_cache(maxsize: int) -> None:
    """Serve repeated cases from the last `maxsize` generated ones (0, the default: off; the kept
    cases stay until it is turned on again). The reference suite turns it on around each of its
    tests, whose order puts a case's tests together (shape, dtype, each ground truth); every call
    still gets its own copy of the tensors, on the device it asks for (a case is the same on every
    device, so one kept copy serves them all), and a caller that writes into them changes nothing."""
    global _cache_size
    _cache_size = max(0, int(maxsize))
    while _cache_size and len(_cache) > _cache_size:
        _cache.popitem(last=False)


def edge_cases(definition: Definition | str | Path) -> list[str]:
    """Names of the edge cases this definition's family supports (UnsupportedOpType if none does)."""
    d = _definition(definition)
    try:
        family = family_for(d)
    except UnsupportedOpType:
        if d.init:  # an fi_trace definition's own init makes its inputs (fitrace_init.py): no edge cases
            return []
        raise
    return list(family.edge_cases(d))


def _making_device(device: str | torch.device) -> torch.device:
    """Where a case for `device` is made: there, on a CPU or a CUDA device; on the CPU, then moved,
    for any other (the meta device has no values to draw; others lack integer ops)."""
    dev = torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        return torch.device("cpu")
    torch.empty(0, device=dev)  # an unusable device fails here, as a copy to it would, not as a generator bug
    return dev


def generate_inputs(definition: Definition | str | Path, size: str = "small", seed: int = 0, *,
                    device: str | torch.device = "cpu", case: str | None = None, memory: int | None = None) -> Inputs:
    """Inputs for one case of a definition: the same (definition, size, seed, case) always gives
    bit-identical values, whatever the device. The tensors are made on `device` itself (a CPU or
    a CUDA device; on the CPU and then moved for any other), the small structural ones on the CPU
    and then moved.

    An fi_trace definition that carries its template's `init`, where our family generator cannot make
    its inputs (no generator for its op_type, or upstream's names and layouts), gets them from that
    `init`, run in a confined worker on `device` (`fitrace_init.py`; `Inputs.source` says so). Such a
    case is reproducible on one device, not across devices."""
    d = _definition(definition)
    try:
        return _generate_by_family(d, size, seed, device=device, case=case, memory=memory)
    except InputGenerationError as e:
        if not d.init or case is not None or size not in SIZES or isinstance(seed, bool) or not isinstance(seed, int):
            raise
        from .fitrace_init import generate_from_init

        try:
            return _cached(d, size, seed, device,
                           lambda: generate_from_init(d, size, seed, device=_making_device(device)))
        except InputGenerationError as init_error:
            error = InputGenerationError(f"{init_error} (tried because our generator does not fit: {e})")
            error.definition = d.name
            raise error from init_error


def _cached(d: Definition, size: str, seed: int, device, make) -> Inputs:
    key = None
    if _cache_size:
        key = (hashlib.sha256(d.to_json(indent=None).encode()).hexdigest(), size, seed, None, "init")
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit.to(device, copy=True)
    inputs = make()
    if key is not None:
        _cache[key] = inputs
        set_cache(_cache_size)
        return inputs.to(device, copy=True)
    return inputs.to(device)


def _generate_by_family(d: Definition, size: str, seed: int, *, device: str | torch.device,
                        case: str | None, memory: int | None = None) -> Inputs:
    strings = [n for n, spec in d.inputs.items() if spec.is_string]
    if strings:  # fi_trace's string arguments: no generator knows a value for one (docs/definitions.md)
        raise InputGenerationError(
            f"input(s) {', '.join(strings)} are string arguments (dtype 'str'/'string', shape null) and no "
            "value is known for them: our generators make tensors and numbers, not strings", definition=d.name)
    family = family_for(d)
    if size not in SIZES:
        raise InputGenerationError(f"unknown size {size!r}; expected one of {', '.join(SIZES)}",
                                   definition=d.name)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputGenerationError(f"seed must be an int, got {seed!r}", definition=d.name)
    if case is not None:
        cases = family.edge_cases(d)
        if case not in cases:
            raise InputGenerationError(
                f"unknown edge case {case!r} for op_type {d.op_type!r}; valid: {', '.join(cases) or 'none'}",
                definition=d.name)
    key = None
    if _cache_size:
        key = (hashlib.sha256(d.to_json(indent=None).encode()).hexdigest(), size, seed, case)
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit.to(device, copy=True)
    builder = Builder(d, size, seed, case, device=_making_device(device), memory=memory)
    try:
        family.generate(builder)
    except InputGenerationError:
        raise
    except (ValueError, RuntimeError, IndexError, KeyError, TypeError) as e:
        # a definition the generator's assumptions do not fit: say which one, and what broke
        raise InputGenerationError(f"generating {family.name} inputs failed: {type(e).__name__}: {e}",
                                   definition=d.name) from e
    inputs = builder.finish()
    if key is not None:
        _cache[key] = inputs
        set_cache(_cache_size)
        return inputs.to(device, copy=True)
    return inputs.to(device)

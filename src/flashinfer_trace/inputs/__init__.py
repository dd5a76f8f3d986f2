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

from .common import (
    SIZES,
    Builder,
    CaseTooLarge,
    EdgeCaseUnavailable,
    GeneratorMismatch,
    InputGenerationError,
    Inputs,
    UnsupportedOpType,
)
from .registry import family_for, supported_op_types

if TYPE_CHECKING:
    from ..definition import Definition

__all__ = [
    "SIZES",
    "CaseTooLarge",
    "EdgeCaseUnavailable",
    "GeneratorMismatch",
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
    """Names of the edge cases this definition's family supports; none where no family generator knows
    its op type or the family's generator does not fit the file's inputs (FlashInfer's traced
    `segment_gemm` has no `seg_indptr`): its inputs come from its fi_trace `init` or the declared
    generator, which have none."""
    d = _definition(definition)
    try:
        family = family_for(d)
    except UnsupportedOpType:
        return []
    try:
        return list(family.edge_cases(d))
    except KeyError:  # an input or axis of ours that the file names otherwise: the family does not fit, so no case
        return []


def _making_device(device: str | torch.device) -> torch.device:
    """Where a case for `device` is made: there, on a CPU or a CUDA device; on the CPU, then moved,
    for any other (the meta device has no values to draw; others lack integer ops)."""
    dev = torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        return torch.device("cpu")
    torch.empty(0, device=dev)  # an unusable device fails here, as a copy to it would, not as a generator bug
    return dev


def generate_inputs(definition: Definition | str | Path, size: str = "small", seed: int = 0, *,
                    device: str | torch.device = "cpu", case: str | None = None, memory: int | None = None,
                    reserve=None, fresh: bool = False) -> Inputs:
    """Inputs for one case of a definition: the same (definition, size, seed, case) always gives
    bit-identical values, whatever the device. The tensors are made on `device` itself (a CPU or
    a CUDA device; on the CPU and then moved for any other), the small structural ones on the CPU
    and then moved.

    Where our family generator cannot make a definition's inputs (no generator for its op_type, or
    other input names and layouts than ours), they come from the definition's fi_trace `init` where it
    has one (run in a confined worker on `device`, `fitrace_init.py`; such a case is reproducible on one
    device, not across devices), else from its declaration alone (`declared.py`). `Inputs.source` says
    which. An edge case is the family's: where the family does not fit, EdgeCaseUnavailable. A family that
    fits but whose case breaks the definition (a constraint, a const axis) is an InputGenerationError, not
    a fallback: the definition or the generator is wrong, and benign declared inputs would hide which.
    `memory`: the bytes a case may use (a larger one is CaseTooLarge); `reserve(nbytes, what)`: asked before a
    family generator makes a large tensor (a device's memory budget). `fresh`: `seed` is a run's fresh seed, whose
    typical counts (rows, tokens, requests) are drawn too (Builder.count): sizes no table lists."""
    d = _definition(definition)
    if size not in SIZES:
        raise InputGenerationError(f"unknown size {size!r}; expected one of {', '.join(SIZES)}", definition=d.name)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputGenerationError(f"seed must be an int, got {seed!r}", definition=d.name)
    if case is not None and case not in (cases := edge_cases(d)):
        raise InputGenerationError(f"unknown edge case {case!r} for op_type {d.op_type!r}; valid: "
                                   f"{', '.join(cases) or 'none'}", definition=d.name)
    try:
        return _generate_by_family(d, size, seed, device=device, case=case, memory=memory, reserve=reserve,
                                   fresh=fresh)
    except GeneratorMismatch as e:
        if case is not None:
            error = EdgeCaseUnavailable(f"edge case {case!r} needs the {family_for(d).name} generator, which does not "
                                        f"fit this definition: {_message(e, d)}")
            error.definition = d.name
            raise error from e
        family_error = e
    tried = [f"our generator does not fit: {_message(family_error, d)}"]
    if d.init:
        from .fitrace_init import INIT_SOURCE, generate_from_init

        try:
            return _cached(d, size, seed, device, INIT_SOURCE,
                           lambda: generate_from_init(d, size, seed, device=_making_device(device)))
        except CaseTooLarge:
            raise
        except InputGenerationError as init_error:
            tried.append(f"its init: {_message(init_error, d)}")
    from .declared import DECLARED_SOURCE, generate_declared

    try:
        return _cached(d, size, seed, device, DECLARED_SOURCE,
                       lambda: generate_declared(d, size, seed, device=_making_device(device)))
    except InputGenerationError as declared_error:
        error = InputGenerationError(f"{declared_error} (tried because {'; '.join(tried)})")
        error.definition = d.name
        raise error from declared_error


def _message(e: InputGenerationError, d: Definition) -> str:
    """The error's text without the definition's name in front (the final error names it once)."""
    text = str(e)
    return text[len(d.name) + 2:] if text.startswith(f"{d.name}: ") else text


def _cached(d: Definition, size: str, seed: int, device, source: str, make) -> Inputs:
    key = None
    if _cache_size:
        key = (hashlib.sha256(d.to_json(indent=None).encode()).hexdigest(), size, seed, None, source)
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
                        case: str | None, memory: int | None = None, reserve=None, fresh: bool = False) -> Inputs:
    strings = [n for n, spec in d.inputs.items() if spec.is_string]
    if strings:  # fi_trace's string arguments: no generator knows a value for one (docs/definitions.md)
        raise GeneratorMismatch(
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
        key = (hashlib.sha256(d.to_json(indent=None).encode()).hexdigest(), size, seed, case, fresh)
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit.to(device, copy=True)
    builder = Builder(d, size, seed, case, device=_making_device(device), memory=memory, reserve=reserve,
                      fresh=fresh)
    try:
        family.generate(builder)
    except InputGenerationError:
        raise
    except (ValueError, RuntimeError, IndexError, KeyError, TypeError) as e:
        # a definition the generator's assumptions do not fit: say which one, and what broke
        raise GeneratorMismatch(f"generating {family.name} inputs failed: {type(e).__name__}: {e}",
                                definition=d.name) from e
    inputs = builder.finish()
    if key is not None:
        _cache[key] = inputs
        set_cache(_cache_size)
        return inputs.to(device, copy=True)
    return inputs.to(device)

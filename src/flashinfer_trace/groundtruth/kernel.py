"""A user's own kernel as a ground truth: `flashinfer-trace check DEFINITION --kernel MODULE:FUNCTION`.

"Does MY kernel compute the right thing?" The function is called like a definition's reference, with the
generated inputs in the definition's order (`FUNCTION(*inputs.args())`), and returns the outputs in the
definition's order: one tensor, a tuple, or a dict by output name. It goes through the same availability
pipeline as FlashInfer's adapters, so an uninstalled package is `not-installed`, a release without the
function `api-missing`, and the record names the distribution's version (what `bisect` probes rely on).
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .base import KERNEL, Adapter, Call, Package

if TYPE_CHECKING:
    from ..definition import Definition

_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class KernelSpec:
    module: str  # importable module: mykernels.norm
    function: str  # attribute path in it: rmsnorm, or Ops.rmsnorm

    @classmethod
    def parse(cls, text: str) -> KernelSpec:
        module, colon, function = (text or "").partition(":")
        if not colon or not _DOTTED.fullmatch(module) or not _DOTTED.fullmatch(function):
            raise ValueError(f"--kernel {text!r}: expected MODULE:FUNCTION, e.g. mykernels.norm:rmsnorm")
        return cls(module, function)

    @property
    def api(self) -> str:
        return f"{self.module}:{self.function}"


def distributions(module: str) -> tuple[str, ...]:
    """The installed distributions that provide the module's top-level package (its version is the record's);
    the top-level name itself where none does (a folder on sys.path)."""
    top = module.partition(".")[0]
    return tuple(dict.fromkeys(importlib.metadata.packages_distributions().get(top, []))) or (top,)


def _attr(module: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def outputs_of(raw: Any, definition: Definition) -> tuple:
    """A kernel's return value as the definition's outputs, in order."""
    if isinstance(raw, dict):
        missing = [name for name in definition.outputs if name not in raw]
        if missing:
            raise ValueError(f"the kernel returned a dict without output(s) {', '.join(missing)}")
        return tuple(raw[name] for name in definition.outputs)
    return tuple(raw) if isinstance(raw, (tuple, list)) else (raw,)


def adapter(spec: KernelSpec | str, definition: Definition) -> Adapter:
    """The adapter calling the user's function for this definition."""
    spec = KernelSpec.parse(spec) if isinstance(spec, str) else spec

    def call(c: Call) -> tuple:
        return outputs_of(_attr(c.module, spec.function)(*c.inputs.args()), c.definition)

    package = Package(spec.module, distributions(spec.module), spec.module)
    return Adapter(source=KERNEL, op_type=definition.op_type, api=spec.api, fn=call, package=package,
                   requires=(spec.function,))

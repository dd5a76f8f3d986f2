"""Which unit tests are heavy: those over definitions with more than UNIT_BYTES of fixed-size inputs
(MoE weights of 0.3-3 GiB, vocabulary-sized GEMMs), the same at every size tier. On a 2-core CPU one such
case costs tens of seconds, a mutant's whole plan minutes: they carry the `heavy` mark, which `nox -s
tests` deselects and `nox -s tests-heavy` (the nightly workflow) runs."""

from __future__ import annotations

import functools

import pytest

from flashinfer_trace.inputs.common import fixed_bytes
from flashinfer_trace.testing import load_definition

UNIT_BYTES = 64 << 20


@functools.cache
def is_heavy(definition: str) -> bool:
    return fixed_bytes(load_definition(definition)) > UNIT_BYTES


def param(value, definition: str, id: str | None = None):
    """`value` as a pytest parameter, marked heavy where its definition is."""
    return pytest.param(value, id=id, marks=[pytest.mark.heavy] if is_heavy(definition) else [])

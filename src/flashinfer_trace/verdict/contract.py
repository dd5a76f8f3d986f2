"""What a kernel API does not promise: a failing boundary case in such a regime is `info`, not red.

The decisions are data (`contract.toml` beside this module): which property each boundary case exercises,
and for which source, APIs and versions that property is outside the API's promise, with the reason and the
evidence. This module reads the table and decides one failure at a time (`reconsider`): the engine asks it
only about a comparison that failed the same way in every run, against a kernel source. A failure becomes
info only where

  * an entry covers the case's property, the source, the API and the version (the torch ground truth and the
    user's own kernel are never covered: they promise everything the definition says);
  * the case's inputs carry the property (a float16 `subnormal_query` holds no float32 subnormal); and
  * the property explains the difference: the reference, run again on the inputs as the API may treat them
    (`PropertyModel.apply`), agrees with the kernel. A kernel that is wrong in another way on the same case,
    or a reference that itself flushes what a kernel keeps, still fails (and the torch ground truth, never
    covered, catches a reference's bug in the regime whatever the kernel does).

Nothing here widens a tolerance: the second comparison uses the same tolerance and error model as the first.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .. import tables

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    from ..definition import Definition
    from ..inputs import Inputs
    from . import Judgement
    from .compare import Tolerance

__all__ = ["CONTRACT_FILE", "COVERABLE_SOURCES", "MODELS", "Contract", "ContractError", "Decision", "Entry", "Property",
           "PropertyModel", "applied", "carriers", "default_contract", "load_contract", "reconsider"]

CONTRACT_FILE = Path(__file__).with_name("contract.toml")
COVERABLE_SOURCES = ("flashinfer", "sglang")  # a kernel's promise; torch's and the user's kernel's are the definition's
FLOAT32_TINY = torch.finfo(torch.float32).tiny  # 2**-126, float32's smallest normal


class ContractError(ValueError):
    pass


# -- the properties' models: what carries the property, and the inputs as an API that does not promise it sees them
@dataclass(frozen=True)
class PropertyModel:
    count: Callable[[torch.Tensor], int]  # values of one float input that carry the property
    apply: Callable[[torch.Tensor], torch.Tensor]  # that input as the API may treat it (a new tensor)
    applied: str  # what `apply` does, for the record's detail


def _float32_subnormal(t: torch.Tensor) -> torch.Tensor:
    """Where t's values are float32 subnormals once widened (exact from bf16, fp16 and fp8)."""
    a = t.detach().to(torch.float32).abs()
    return (a > 0) & (a < FLOAT32_TINY)


def _tie_rank(t: torch.Tensor) -> torch.Tensor:
    """int64 like t ([rows, n] float): each element's place among the earlier ids of the same value in its row
    (0 for a value no earlier element holds); zeros for any other shape (a per-row parameter ties nothing)."""
    if t.dim() != 2 or not t.is_floating_point() or t.shape[-1] < 2:
        return torch.zeros(t.shape, dtype=torch.int64, device=t.device)
    s, order = torch.sort(t.detach(), dim=-1, stable=True)  # ascending; equal values keep id order
    place = torch.arange(s.shape[-1], device=t.device).expand_as(s)
    rank = place - torch.searchsorted(s.contiguous(), s.contiguous())  # minus the place of its value's first
    return torch.zeros_like(rank).scatter(-1, order, rank)


def _tied(t: torch.Tensor) -> torch.Tensor:
    """Where a finite value of a [rows, n] float tensor is held by another element of its row too."""
    if t.dim() != 2 or not t.is_floating_point():
        return torch.zeros(t.shape, dtype=torch.bool, device=t.device)
    s, order = torch.sort(t.detach(), dim=-1, stable=True)
    eq = s[..., 1:] == s[..., :-1]
    same = torch.zeros_like(s, dtype=torch.bool)
    same[..., 1:] |= eq
    same[..., :-1] |= eq
    return torch.zeros_like(same).scatter(-1, order, same) & t.isfinite()


def _ties_by_id(t: torch.Tensor) -> torch.Tensor:
    """The tied values of each row made distinct in id order, the lower id the larger: the j-th id of a tie
    moves j float32 steps down (a 16-bit input widens to float32 exactly first, so that the steps stay far
    below its own rounding). What a kernel that keeps exactly k by a stable rank computes, for ties of a few
    dozen: float32's tolerance (1e-5) holds 160 steps of 2^-24."""
    x = t.detach().to(torch.float32) if t.dtype in (torch.float16, torch.bfloat16) else t.detach().clone()
    steps = _tie_rank(x)
    if not bool(steps.any()):
        return x
    bits = x.view(torch.int32) if x.dtype == torch.float32 else x.view(torch.int64)
    down = torch.where(x > 0, bits - steps.to(bits.dtype), bits + steps.to(bits.dtype))  # sign-magnitude order
    return torch.where((steps > 0) & x.isfinite() & (x != 0), down.view(x.dtype), x)


MODELS: dict[str, PropertyModel] = {
    # flush to zero, sign kept (x * 0), as an FTZ float32 instruction does with a subnormal operand
    "float32-subnormals": PropertyModel(
        count=lambda t: int(_float32_subnormal(t).sum()),
        apply=lambda t: torch.where(_float32_subnormal(t), t * 0, t),
        applied="flushed to zero"),
    # a tie at the k-th value or across the top-p cut kept by id order (exactly k), not whole by value
    "ties-at-cut": PropertyModel(
        count=lambda t: int(_tied(t).sum()),
        apply=_ties_by_id,
        applied="ordered by token id (the lower id kept first)"),
}


# -- the table --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Property:
    name: str
    cases: tuple[str, ...]
    what: str

    @property
    def model(self) -> PropertyModel:
        return MODELS[self.name]


@dataclass(frozen=True)
class Entry:
    id: str
    property: str
    source: str
    apis: tuple[str, ...]
    versions: SpecifierSet
    reason: str
    evidence: tuple[str, ...]

    def covers(self, source: str | None, api: str | None, version: str | None) -> bool:
        if source != self.source or api is None or not any(fnmatch.fnmatchcase(api, g) for g in self.apis):
            return False
        try:
            return version is not None and self.versions.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return False


@dataclass(frozen=True)
class Contract:
    properties: dict[str, Property]
    entries: tuple[Entry, ...]

    def property_of(self, case: str | None) -> Property | None:
        return next((p for p in self.properties.values() if case in p.cases), None) if case else None

    def covering(self, case: str | None, ground_truth: dict[str, Any]) -> tuple[Entry, Property] | None:
        """The entry that puts this case's property outside the promise of this ground truth (its
        `describe()`: source, api, version), or None."""
        prop = self.property_of(case)
        if prop is None:
            return None
        for entry in self.entries:
            if entry.property == prop.name and entry.covers(ground_truth.get("source"), ground_truth.get("api"),
                                                            ground_truth.get("version")):
                return entry, prop
        return None


ENTRY_FIELDS = ("id", "property", "source", "apis", "versions", "reason", "evidence")
PROPERTY_FIELDS = ("cases", "what")


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ContractError(f"{where}: must be a non-empty list of strings")
    return tuple(value)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ContractError(f"{where}: must be a non-empty string")
    return value


def load_contract(path: str | Path = CONTRACT_FILE) -> Contract:
    """The table, checked: every field known and typed, every property modelled, every entry's property declared
    and its source a kernel's, a case in one property only, ids unique."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ContractError(f"{path}: {e}") from None
    unknown = sorted(set(data) - {"property", "outside"})
    if unknown:
        raise ContractError(f"{path}: unknown table(s) {unknown} (expected [property.NAME] and [[outside]])")
    properties: dict[str, Property] = {}
    seen_cases: dict[str, str] = {}
    raw_properties = data.get("property", {})
    if not isinstance(raw_properties, dict):
        raise ContractError(f"{path}: [property] must be tables [property.NAME]")
    for name, raw in raw_properties.items():
        where = f"{path}: [property.{name}]"
        if not isinstance(raw, dict):
            raise ContractError(f"{where}: must be a table")
        if sorted(set(raw) - set(PROPERTY_FIELDS)):
            raise ContractError(f"{where}: unknown field(s) {sorted(set(raw) - set(PROPERTY_FIELDS))}")
        if name not in MODELS:
            raise ContractError(f"{where}: no model for this property in verdict/contract.py (known: "
                                f"{', '.join(sorted(MODELS))})")
        cases = _strings(raw.get("cases"), f"{where}.cases")
        for case in cases:
            if case in seen_cases:
                raise ContractError(f"{where}.cases: {case!r} is already in [property.{seen_cases[case]}]")
            seen_cases[case] = name
        properties[name] = Property(name, cases, _text(raw.get("what"), f"{where}.what"))
    entries, ids = [], set()
    for where, raw in tables.entries(data.get("outside", []), f"{path}: outside", ENTRY_FIELDS, ENTRY_FIELDS,
                                     ContractError):
        entry_id = _text(raw["id"], f"{where}.id")
        if entry_id in ids:
            raise ContractError(f"{where}.id: {entry_id!r} is used twice")
        ids.add(entry_id)
        if raw["property"] not in properties:
            raise ContractError(f"{where}.property: {raw['property']!r} is not a declared [property.NAME]")
        if raw["source"] not in COVERABLE_SOURCES:
            raise ContractError(f"{where}.source: {raw['source']!r} cannot be outside its own contract (only "
                                f"{', '.join(COVERABLE_SOURCES)}: the torch ground truth and the user's kernel "
                                f"promise what the definition says)")
        try:
            versions = SpecifierSet(raw["versions"])
        except (InvalidSpecifier, TypeError):
            raise ContractError(f"{where}.versions: {raw['versions']!r} is not a version specifier") from None
        entries.append(Entry(entry_id, raw["property"], raw["source"], _strings(raw["apis"], f"{where}.apis"),
                             versions, _text(raw["reason"], f"{where}.reason"),
                             _strings(raw["evidence"], f"{where}.evidence")))
    return Contract(properties, tuple(entries))


@functools.cache
def default_contract() -> Contract:
    return load_contract(CONTRACT_FILE)


# -- one decision -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    entry: Entry
    property: Property
    carriers: dict[str, int]  # input -> how many of its values carry the property
    explained: bool  # the reference on the inputs as the API may treat them agrees with the kernel
    again: Judgement  # that second comparison

    def detail(self, measured: str | None) -> str:
        """The record's detail: the decision, its reason, the measured difference and what explains it."""
        where = ", ".join(f"{n} {k}" for n, k in self.carriers.items())
        model = self.property.model
        if self.explained:
            used = ", ".join(f"{c['output']} {c['tolerance_used']}" for c in self.again.compared
                             if c.get("tolerance_used") is not None)
            return (f"outside the contract ({self.entry.id}: {self.property.name}): {self.entry.reason}. "
                    f"Measured: {measured}. With the {self.property.name} of the inputs {model.applied} ({where}), "
                    f"the reference agrees with the kernel" + (f" (tolerance used: {used})" if used else ""))
        return (f"{measured}; not explained by {self.property.name}, which {self.entry.id} puts outside the "
                f"contract: with them {model.applied} ({where}) the reference still differs: {self.again.summary}")


def carriers(prop: Property, inputs: Inputs) -> dict[str, int]:
    """Per float input, how many of its values carry the property (inputs with none left out)."""
    found = {name: prop.model.count(v) for name, v in inputs.values.items()
             if isinstance(v, torch.Tensor) and v.is_floating_point()}
    return {name: n for name, n in found.items() if n}


def applied(prop: Property, inputs: Inputs, names: dict[str, int]) -> Inputs:
    """The inputs as an API that does not promise the property may treat them (new tensors where they change)."""
    values = {k: prop.model.apply(v) if k in names else v for k, v in inputs.values.items()}
    return dataclasses.replace(inputs, values=values)


def reconsider(definition: Definition, case: str | None, ground_truth: dict[str, Any], inputs: Inputs, expected,
               tolerance: Tolerance, rerun: Callable[[Inputs], Any], *,
               contract: Contract | None = None) -> Decision | None:
    """A failure of `case` against `ground_truth` (its `describe()`), on `inputs`, with the kernel's `expected`
    outputs: None where no entry covers it or the inputs do not carry the property; else the decision, after
    judging `rerun(inputs as the API may treat them)` (the reference's outputs there) against `expected`."""
    from . import judge

    found = (contract or default_contract()).covering(case, ground_truth)
    if found is None:
        return None
    entry, prop = found
    names = carriers(prop, inputs)
    if not names:
        return None
    seen = applied(prop, inputs, names)
    again = judge(definition, seen, rerun(seen), expected, tolerance)
    return Decision(entry, prop, names, again.passed, again)

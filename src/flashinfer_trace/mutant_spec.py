"""What a planted bug is (`Mutant`) and the shorthand that writes one (`_m`): apart from mutants.py so that a
family's own mutant module (mutants_<family>.py) can build its tuple without importing the engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    definition: str
    id: str
    bug: str
    edits: tuple[tuple[str, str], ...]  # (text in the reference, its replacement); each must occur
    survives: str | None = None  # why the checks cannot see this bug yet (kept, so the gap stays visible)
    cls: str = "wrong-math"  # the class of bug, for the kill rate per class (rates_by_class)
    gpu_only: str | None = None  # why only a GPU's settings can judge it (a bug planted at their thresholds)

    @property
    def name(self) -> str:
        return f"{self.definition}:{self.id}"


def _m(definition: str, id: str, bug: str, *edits: tuple[str, str], survives: str | None = None,
       cls: str = "wrong-math", gpu_only: str | None = None) -> Mutant:
    return Mutant(definition, id, bug, tuple(edits), survives, cls, gpu_only)

"""A matrix cell as a bisect: the two environments' pins say which package moved, from which release to which,
and the newer environment's combination is the one each probe varies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..matrix.diff import bisectable_change, environment_pins, environment_record
from .search import BisectError


def from_cell(matrix: dict[str, Any], env_old: str, env_new: str) -> dict[str, str]:
    """{package, good, bad, combination} of the cell's two environments (ids, or unique starts of ids)."""
    try:
        package, good, bad = bisectable_change(environment_pins(matrix, env_old), environment_pins(matrix, env_new))
        combination = environment_record(matrix, env_new).get("combination")
    except ValueError as e:
        raise BisectError(f"--cell {env_old} {env_new}: {e}") from None
    if not combination:
        raise BisectError(f"--cell: environment {env_new} names no combination")
    return {"package": package, "good": good, "bad": bad, "combination": combination}


def load_matrix(path: str | Path) -> dict[str, Any]:
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise BisectError(f"--cell {path}: not a readable matrix.json ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("environments"), list):
        raise BisectError(f"--cell {path}: not a matrix.json (no environments)")
    return data

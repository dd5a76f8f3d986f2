"""The checks every array of TOML tables this package reads gets (known issues, the contract table): each entry a
table, no field it does not know, every field it needs; each error names the file, the entry and the field."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


def entries(items: Any, where: str, known: Iterable[str], required: Iterable[str],
            error: type[Exception]) -> Iterator[tuple[str, dict]]:
    """(`where[i]`, the table) of each entry of `items`, an array of tables, checked; `error` is raised."""
    if not isinstance(items, list):
        raise error(f"{where}: must be an array of tables [[...]]")
    known = set(known)
    for i, raw in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(raw, dict):
            raise error(f"{at}: must be a table")
        unknown = sorted(set(raw) - known)
        if unknown:
            raise error(f"{at}: unknown field(s) {unknown}")
        for key in required:
            if key not in raw:
                raise error(f"{at}.{key}: missing")
        yield at, raw

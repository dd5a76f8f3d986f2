"""State a nox session hands to the session process it starts (the MPS daemon's, the compiler cache's): JSON in
one environment variable, read once where the session starts, since the two are separate processes."""

from __future__ import annotations

import json
import os


def read(name: str, environ: dict[str, str] | None = None) -> dict | None:
    """The state under `name` (None: not started through nox, or nothing handed down)."""
    try:
        state = json.loads((os.environ if environ is None else environ).get(name, "null"))
    except ValueError:
        return None
    return state if isinstance(state, dict) else None

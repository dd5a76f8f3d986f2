#!/usr/bin/env python3
"""Turn `nox -l --json -t nightly` into the nightly workflow's job matrices.

    nox -l --json -t nightly | python scripts/ci_plan.py >> "$GITHUB_OUTPUT"

prints `gpu=[...]` and `cpu=[...]`: one entry per session, {"session", "combination", "cuda", "arch"},
read from the session's tags (`combo:<id>`, `cuda12`/`cuda13`/`cpu`, the arch). GPU sessions carry
an arch tag and run on self-hosted runners labelled by it; the rest (CPU, known-uninstallable
combinations) run on hosted runners.
"""

from __future__ import annotations

import json
import re
import sys

ARCH = re.compile(r"^sm\d+$")


def plan(sessions: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"gpu": [], "cpu": []}
    for s in sessions:
        tags = s.get("tags") or []
        combo = next((t.split(":", 1)[1] for t in tags if t.startswith("combo:")), None)
        arch = next((t for t in tags if ARCH.match(t)), None)
        cuda = next((t for t in tags if t in ("cpu", "cuda12", "cuda13")), None)
        entry = {"session": s["name"], "combination": combo, "cuda": cuda, "arch": arch or "any"}
        out["gpu" if arch else "cpu"].append(entry)
    return out


def main() -> int:
    for key, entries in plan(json.load(sys.stdin)).items():
        print(f"{key}={json.dumps(entries, separators=(',', ':'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

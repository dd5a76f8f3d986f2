"""The compatibility matrix: results/<session>/ folders -> matrix.json, matrix.md, index.html;
the diff of two matrices; known issues as data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..sweep.results import write_atomic
from .build import STATES, SYMBOLS, build
from .diff import MatrixDiff, diff_environments, diff_matrices, render_diff_md, render_releases_md
from .render_md import render_md

__all__ = ["STATES", "SYMBOLS", "MatrixDiff", "build", "diff_environments", "diff_matrices", "render_diff_md",
           "render_releases_md",
           "render_md", "write_matrix"]


def write_matrix(matrix: dict[str, Any], out: str | Path) -> list[Path]:
    """matrix.json, matrix.md and index.html in `out`, each written atomically."""
    from .render_html import render_html

    out = Path(out)
    files = {"matrix.json": json.dumps(matrix, indent=1, default=str) + "\n", "matrix.md": render_md(matrix),
             "index.html": render_html(matrix)}
    for name, text in files.items():
        write_atomic(out / name, text)
    return [out / n for n in files]

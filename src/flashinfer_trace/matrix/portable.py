"""Results that name no machine: paths under the repository become relative, the home folder `~`, /tmp
`$TMPDIR`.

A committed snapshot is read on other machines; `/work/main/results/x/install.log` says where one
engineer's checkout was, nothing about the kernel. Applied to what `matrix build` writes and, through
`python -m flashinfer_trace.matrix portable FILE...`, to result files before they are committed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["portable", "portable_file"]


def _prefixes(root: str | Path) -> list[tuple[re.Pattern[str], str]]:
    out = []
    for path, to in ((Path(root).resolve(), ""), (Path(os.path.expanduser("~")).resolve(), "~/"),
                     (Path("/tmp"), "$TMPDIR/")):
        text = str(path).rstrip("/")
        if text and text != "/":  # the prefix starts a path (or follows file://), not the middle of one
            out.append((re.compile(r"(?:(?<=file://)|(?<![\w/.-]))" + re.escape(text)
                                   + r"(?:/|(?=[\s'\":;,)\][]|$))"), to))
    return out


def portable(value: Any, root: str | Path = ".") -> Any:
    """`value` with every path under `root` relative to it, every other one under $HOME as `~/...` and
    under /tmp as `$TMPDIR/...`, in every string at any depth (commands, log paths, interpreter paths)."""
    rules = _prefixes(root)

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            for pattern, to in rules:
                v = pattern.sub(lambda m, to=to: to or ("" if m.group(0).endswith("/") else "."), v)
            return v
        if isinstance(v, dict):
            return {walk(k): walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(value)


def portable_file(path: str | Path, root: str | Path = ".") -> bool:
    """Rewrite a result file in place (.json, .jsonl as data; logs and other text line by line); True when
    anything changed."""
    p = Path(path)
    text = p.read_text(encoding="utf-8", errors="surrogateescape")
    if p.suffix not in (".json", ".jsonl"):
        new = portable(text, root)
    elif p.suffix == ".jsonl":
        lines = [json.dumps(portable(json.loads(line), root)) for line in text.splitlines() if line.strip()]
        new = "\n".join(lines) + ("\n" if lines else "")
    else:
        new = json.dumps(portable(json.loads(text), root), indent=2) + "\n"
    if new == text:
        return False
    p.write_text(new, encoding="utf-8", errors="surrogateescape")
    return True

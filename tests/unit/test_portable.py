"""Committed results name no machine (matrix/portable.py)."""

from __future__ import annotations

import json
from pathlib import Path

from flashinfer_trace.matrix.__main__ import main
from flashinfer_trace.matrix.portable import portable, portable_file


def test_paths_under_the_root_home_and_tmp_lose_the_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    root = "/work/main"
    got = portable({"log": "/work/main/results/x/install.log",
                    "cmd": "/work/main/.nox/r/bin/python -m pip -c /work/main/results/c.txt -e '/work/main[dev]'",
                    "/work/main/key": ["file:///work/main", "/work/main", "/home/someone/.cache/fi", "/tmp/pip-x/a"],
                    "kept": ["/work/mainline/x", "/opt/x", "a/work/main/b", "/tmpfs/x", 3, None]}, root)
    assert got == {"log": "results/x/install.log",
                   "cmd": ".nox/r/bin/python -m pip -c results/c.txt -e '.[dev]'",
                   "key": ["file://.", ".", "~/.cache/fi", "$TMPDIR/pip-x/a"],
                   "kept": ["/work/mainline/x", "/opt/x", "a/work/main/b", "/tmpfs/x", 3, None]}


def test_portable_command_rewrites_json_jsonl_and_logs_in_place(tmp_path):
    root = tmp_path / "repo"
    (root / "results").mkdir(parents=True)
    (root / "results" / "s.json").write_text(json.dumps({"log": f"{root}/results/install.log"}))
    (root / "results" / "r.jsonl").write_text(json.dumps({"python": f"{root}/.nox/x/bin/python"}) + "\n")
    (root / "results" / "install.log").write_text(f"Obtaining file://{root}\n")
    (root / "results" / "clean.json").write_text(json.dumps({"a": "b"}, indent=2) + "\n")
    assert main(["portable", str(root / "results"), "--root", str(root)]) == 0
    assert json.loads((root / "results" / "s.json").read_text()) == {"log": "results/install.log"}
    assert json.loads((root / "results" / "r.jsonl").read_text()) == {"python": ".nox/x/bin/python"}
    assert (root / "results" / "install.log").read_text() == "Obtaining file://.\n"
    assert not portable_file(root / "results" / "clean.json", root)  # nothing to do: untouched


def test_the_committed_snapshot_names_no_machine():
    snapshot = Path(__file__).parents[2] / "docs" / "matrix-snapshot"
    for f in snapshot.rglob("*"):
        if f.is_file():
            text = f.read_text(errors="replace")
            assert "/work/main" not in text and "/root/" not in text and "/tmp/" not in text, f

"""JSONL record streams and atomic files: how every record is written (fsynced, a line at a time) and read (a torn
line skipped, the last record of a key winning). The engine and the sweep both go through here. Standard library
only: the noxfile imports the sweep's results module, which uses these."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file. The
    file gets the permissions an ordinary write would (mkstemp's are 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, default=str) + "\n")


class JsonlStream:
    """Results as they complete, one JSON object a line, flushed and fsynced per line: a kill, an
    interrupt or a crash loses at most the line being written (readers skip a torn last line).
    Thread-safe: the isolation supervisor reports from one thread per job."""

    def __init__(self, path: str | Path, *, append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = append and self.path.is_file() and self.path.stat().st_size > 0 and not _ends_line(self.path)
        self._file = open(self.path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if torn:  # a line cut by a kill: end it, so the next record starts a line of its own
            self._file.write("\n")
        self._lock = threading.Lock()

    def write(self, obj: Any) -> None:
        line = json.dumps(obj, default=str) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> JsonlStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_latest(path: str | Path, make: Callable[[dict], Any], key: Callable[[Any], Any]) -> list[Any]:
    """The objects of a JSONL stream built by `make` (one that does not fit is skipped), the last one
    per key winning, in the order they were written: what a resumed or rerun stream means."""
    out: dict[Any, Any] = {}
    for obj in read_jsonl(path):
        try:
            item = make(obj)
        except (TypeError, KeyError, ValueError):
            continue
        out.pop(key(item), None)
        out[key(item)] = item
    return list(out.values())


def from_fields(cls: type) -> Callable[[dict], Any]:
    """A dataclass built from the fields of a JSON object it knows (others ignored)."""
    fields = set(cls.__dataclass_fields__)
    return lambda obj: cls(**{k: v for k, v in obj.items() if k in fields})


def _ends_line(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every complete object in a JSONL stream; a torn or malformed line is skipped, never fatal."""
    out = []
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out

"""Finding and loading definitions: by name, op type, tag or model, parses cached per file.

The definitions folder is, in order: an explicit argument (the CLI's `--definitions`), the
FLASHINFER_TRACE_DEFINITIONS environment variable, `./definitions`, then the checkout's own folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from .definition import Definition
from .validate import DefinitionError, Problem, link_out_of_root, load_file

ENV_VAR = "FLASHINFER_TRACE_DEFINITIONS"
_CHECKOUT_DEFINITIONS = Path(__file__).resolve().parents[2] / "definitions"

_parsed: dict[Path, tuple[tuple[int, int], Definition]] = {}


def definitions_dir(explicit: str | Path | None = None) -> Path:
    if explicit is not None:
        return Path(explicit)
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    if Path("definitions").is_dir():
        return Path("definitions")
    return _CHECKOUT_DEFINITIONS


def load_path(path: str | Path, *, root: str | Path | None = None, follow_links: bool = False) -> Definition:
    """Load one file, reusing the parse while the file's mtime and size are unchanged. A file that resolves
    outside `root` (its own folder where none is given) is a DefinitionError, unread, unless `follow_links`."""
    if not follow_links and (outside := link_out_of_root(path, root)):
        raise DefinitionError([outside])
    path = Path(path).resolve()
    try:
        st = path.stat()
    except OSError as e:
        raise DefinitionError([Problem(str(path), "$", "not-found", str(e))]) from None
    key = (st.st_mtime_ns, st.st_size)
    hit = _parsed.get(path)
    if hit and hit[0] == key:
        return hit[1]
    definition = load_file(path)
    _parsed[path] = (key, definition)
    return definition


class Dataset:
    """A definitions folder: `definitions/<op_type>/<name>.json`. A file in it that links outside it is
    refused when loaded (a DefinitionError naming it) unless `follow_links`."""

    def __init__(self, root: str | Path | None = None, *, follow_links: bool = False):
        self.root = definitions_dir(root)
        self.follow_links = follow_links
        if not self.root.is_dir():
            raise FileNotFoundError(f"definitions folder {self.root} does not exist (set {ENV_VAR} or pass one)")
        self._index: dict[str, Path] | None = None

    @property
    def index(self) -> dict[str, Path]:
        """name -> file. File stems are names (validation enforces it), so no file is parsed here."""
        if self._index is None:
            index: dict[str, Path] = {}
            for path in sorted(self.root.rglob("*.json")):
                if path.stem in index:
                    raise DefinitionError([Problem(str(path), "$.name", "duplicate-name",
                                                   f"{path.stem!r} is also defined in {index[path.stem]}")])
                index[path.stem] = path
            self._index = index
        return self._index

    def names(self) -> list[str]:
        return list(self.index)

    def load(self, name: str) -> Definition:
        if name not in self.index:
            close = [n for n in self.index if name in n or n in name][:5]
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise KeyError(f"no definition named {name!r} under {self.root}{hint}")
        return load_path(self.index[name], root=self.root, follow_links=self.follow_links)

    def __iter__(self) -> Iterator[Definition]:
        for name in self.index:
            yield self.load(name)

    def names_maybe_of(self, op_type: str) -> list[str]:
        """The names whose file may define `op_type`: every file but those whose JSON plainly says another op
        type (a glance at its top-level `op_type`, no validation). A file that links out of the folder, is
        large, or does not parse stays in, so that loading it reports it as before. A reference test process
        needs one op type's definitions: validating all ~270 in each of ~35 processes was a quarter of its
        start-up."""
        out = []
        for name, path in self.index.items():
            declared = None
            if self.follow_links or link_out_of_root(path, self.root) is None:
                declared = _declared_op_type(path)
            if declared is None or declared == op_type:
                out.append(name)
        return out

    def select(self, *, op_type: str | None = None, tag: str | None = None,
               model: str | None = None, names: list[str] | None = None) -> list[Definition]:
        out = []
        for name in names if names is not None else self.index:
            d = self.load(name)
            if op_type and d.op_type != op_type:
                continue
            if tag and tag not in d.tags:
                continue
            if model and model not in d.models:
                continue
            out.append(d)
        return out


_PEEK_LIMIT = 1 << 20  # bytes: a larger file is loaded (and judged) in full


def _declared_op_type(path: Path) -> str | None:
    """The top-level `op_type` string of a JSON file, or None where it cannot be read plainly."""
    try:
        if path.stat().st_size > _PEEK_LIMIT:
            return None
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    found = data.get("op_type") if isinstance(data, dict) else None
    return found if isinstance(found, str) else None


def load_definition(name_or_path: str | Path, *, definitions: str | Path | None = None,
                    follow_links: bool = False) -> Definition:
    """A definition by name (looked up in the definitions folder) or by path to its JSON file."""
    p = Path(name_or_path)
    if p.suffix == ".json" or p.is_file():
        return load_path(p, follow_links=follow_links)
    return Dataset(definitions, follow_links=follow_links).load(str(name_or_path))


def iter_definitions(*, op_type: str | None = None, tag: str | None = None, model: str | None = None,
                     definitions: str | Path | None = None) -> list[Definition]:
    return Dataset(definitions).select(op_type=op_type, tag=tag, model=model)

"""Validation of definition files: every problem in every file, each with file, JSON path, message.

A pipeline of plain functions, each usable alone:
    discover(paths) -> files;  check_file(file) -> FileReport;  summarise(reports) -> Summary.
`check_data` never raises on any JSON value: malformed input is data to report, not a crash.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from . import constraints as _constraints
from .definition import Definition


@dataclass(frozen=True)
class Problem:
    file: str
    path: str  # JSON path, "$.inputs.q.shape[1]"
    kind: str  # machine-readable class: "json-syntax", "unknown-axis", ...
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.path}: {self.message} [{self.kind}]"


@dataclass
class FileReport:
    file: str
    problems: list[Problem] = field(default_factory=list)
    definition: Definition | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class Summary:
    files: int
    files_with_problems: int
    problems: int
    by_kind: dict[str, int]

    @property
    def ok(self) -> bool:
        return self.problems == 0 and self.files > 0


class DefinitionError(ValueError):
    """A definition that failed validation; carries every problem."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems = list(problems)
        lines = "\n  ".join(str(p) for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in definition:\n  {lines}")


# -- JSON paths ---------------------------------------------------------------------------------
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def json_path(*parts: Any) -> str:
    out = "$"
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and _IDENT.match(p):
            out += f".{p}"
        else:
            out += f"[{json.dumps(str(p))}]"
    return out


# -- stage 1: text -> JSON ----------------------------------------------------------------------
UNPARSED = object()  # parse_json's value for text that is not JSON (`null` is JSON, and a problem later)


def parse_json(text: str, file: str) -> tuple[Any, list[Problem]]:
    """Parse JSON, refusing duplicate keys and NaN/Infinity (both lose or corrupt data silently)."""
    problems: list[Problem] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for k, v in items:
            if k in seen:
                problems.append(Problem(file, "$", "json-duplicate-key", f"key {k!r} appears more than once"))
            seen[k] = v
        return seen

    def bad_constant(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_constant=bad_constant)
    except json.JSONDecodeError as e:
        return UNPARSED, [Problem(file, "$", "json-syntax", f"line {e.lineno}, column {e.colno}: {e.msg}")]
    except (ValueError, RecursionError) as e:
        return UNPARSED, [Problem(file, "$", "json-syntax", str(e) or type(e).__name__)]
    return data, problems


# -- stage 2: structure (pydantic) ----------------------------------------------------------------
def _structure_problems(data: dict[str, Any], file: str) -> list[Problem]:
    try:
        Definition.model_validate(data)
    except ValidationError as e:
        return [_from_pydantic(err, file) for err in e.errors(include_url=False)]
    except RecursionError:
        return [Problem(file, "$", "type", "nesting too deep")]
    return []


def _from_pydantic(err: dict[str, Any], file: str) -> Problem:
    loc = list(err["loc"])
    # A tagged union adds the tag to the location: ("axes", "x", "const", "value").
    if len(loc) >= 3 and loc[0] == "axes" and loc[2] in ("const", "var"):
        del loc[2]
    kind, msg = err["type"], err["msg"]
    if kind == "missing":
        return Problem(file, json_path(*loc), "missing-field", "required field is missing")
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        return Problem(file, json_path(*loc, "type"), "axis-type", 'axis "type" must be "const" or "var"')
    if kind == "enum" and loc[-1:] == ["dtype"]:
        return Problem(file, json_path(*loc), "dtype", f"unknown dtype {err.get('input')!r}; {msg}")
    if loc[-1:] == ["value"] and len(loc) >= 2 and loc[0] == "axes":
        return Problem(file, json_path(*loc), "const-value", f"const axis value must be an int >= 0 ({msg})")
    return Problem(file, json_path(*loc), "type", msg)


# -- stage 3: cross-field rules -------------------------------------------------------------------
def _semantic_problems(data: dict[str, Any], file: str, stem: str | None) -> list[Problem]:
    out: list[Problem] = []
    name = data.get("name")
    if stem is not None and isinstance(name, str) and name != stem:
        out.append(Problem(file, "$.name", "name-mismatch", f"name {name!r} must equal the file stem {stem!r}"))

    axes = data.get("axes") if isinstance(data.get("axes"), dict) else {}
    inputs = data.get("inputs") if isinstance(data.get("inputs"), dict) else {}
    outputs = data.get("outputs") if isinstance(data.get("outputs"), dict) else {}

    bound: set[str] = set()
    for section, specs in (("inputs", inputs), ("outputs", outputs)):
        if "outputs" == section and isinstance(data.get("outputs"), dict) and not specs:
            out.append(Problem(file, "$.outputs", "empty-outputs", "a definition must have at least one output"))
        for tname, spec in specs.items():
            shape = spec.get("shape") if isinstance(spec, dict) else None
            if not isinstance(shape, list):
                continue
            for i, axis in enumerate(shape):
                if isinstance(axis, str) and axis not in axes:
                    out.append(Problem(file, json_path(section, tname, "shape", i), "unknown-axis",
                                       f"axis {axis!r} is not declared in axes"))
                elif isinstance(axis, str) and section == "inputs":
                    bound.add(axis)

    # A var axis takes its value from an input dimension, or is derived through a constraint
    # (`len_indptr == batch_size + 1`); one that is neither can never get a value.
    cons = data.get("constraints")
    cons_text = " ".join(c for c in cons if isinstance(c, str)) if isinstance(cons, list) else ""
    for axis, spec in axes.items():
        if isinstance(spec, dict) and spec.get("type") == "var" and axis not in bound and \
                not re.search(rf"\b{re.escape(axis)}\b", cons_text):
            out.append(Problem(file, json_path("axes", axis), "unbound-axis",
                               f"var axis {axis!r} appears in no input shape and no constraint, "
                               "so it can never get a value"))

    for clash in sorted(set(inputs) & set(outputs)):
        out.append(Problem(file, json_path("outputs", clash), "io-overlap",
                           f"{clash!r} is both an input and an output"))

    reference = data.get("reference")
    if isinstance(reference, str):
        out.extend(_reference_problems(reference, list(inputs), file))

    known = set(axes) | set(inputs)
    if isinstance(cons, list):
        for i, text in enumerate(cons):
            if not isinstance(text, str):
                continue  # already a type problem
            try:
                unknown = sorted(_constraints.parse(text).names - known)
            except _constraints.ConstraintError as e:
                out.append(Problem(file, json_path("constraints", i), "constraint-syntax", f"{text!r}: {e}"))
                continue
            if unknown:
                out.append(Problem(file, json_path("constraints", i), "constraint-name",
                                   f"{text!r} mentions {', '.join(unknown)}, which are neither axes nor inputs"))
    return out


def _reference_problems(code: str, input_names: list[str], file: str) -> list[Problem]:
    from .sandbox import check_reference

    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return [Problem(file, "$.reference", "reference-syntax", f"line {e.lineno}: {e.msg}")]
    except (ValueError, RecursionError, MemoryError) as e:  # NUL bytes, absurd nesting
        return [Problem(file, "$.reference", "reference-syntax", f"{type(e).__name__}: {e}")]
    out = [Problem(file, "$.reference", "reference-sandbox", f"line {v.line}: {v.message}")
           for v in check_reference(code)]
    runs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    if not runs:
        out.append(Problem(file, "$.reference", "reference-run", "the reference defines no top-level run()"))
        return out
    args = runs[-1].args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
        out.append(Problem(file, "$.reference", "reference-signature",
                           "run() must take the inputs as plain positional parameters"))
    params = [a.arg for a in args.args]
    if params != input_names:
        out.append(Problem(file, "$.reference", "reference-signature",
                           f"run({', '.join(params)}) must take exactly the inputs, in order: "
                           f"run({', '.join(input_names)})"))
    return out


def check_data(data: Any, file: str = "<definition>", stem: str | None = None) -> list[Problem]:
    """Every problem in one parsed definition object."""
    if not isinstance(data, dict):
        return [Problem(file, "$", "type", f"a definition must be a JSON object, got {type(data).__name__}")]
    return _structure_problems(data, file) + _semantic_problems(data, file, stem)


def check_file(path: str | Path) -> FileReport:
    path = Path(path)
    file = str(path)
    report = FileReport(file)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        report.problems.append(Problem(file, "$", "unreadable", f"{type(e).__name__}: {e}"))
        return report
    data, report.problems = parse_json(text, file)
    if data is UNPARSED:
        return report
    report.problems += check_data(data, file, stem=path.stem)
    if report.ok:
        report.definition = Definition.model_validate(data)
        report.definition._source = path
    return report


# -- the pipeline -----------------------------------------------------------------------------
def discover(paths: Iterable[str | Path]) -> tuple[list[Path], list[Problem]]:
    """JSON files under the given files/folders, sorted; a missing path is a problem, not a crash."""
    files: list[Path] = []
    missing: list[Problem] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(sorted(q for q in p.rglob("*.json") if q.is_file()))
        elif p.is_file():
            files.append(p)
        else:
            missing.append(Problem(str(p), "$", "not-found", "no such file or directory"))
    return files, missing


def check_files(files: Iterable[Path]) -> list[FileReport]:
    return [check_file(f) for f in files]


def summarise(reports: Sequence[FileReport]) -> Summary:
    by_kind: dict[str, int] = {}
    for r in reports:
        for p in r.problems:
            by_kind[p.kind] = by_kind.get(p.kind, 0) + 1
    return Summary(
        files=sum(1 for r in reports if r.file and not any(p.kind == "not-found" for p in r.problems)),
        files_with_problems=sum(1 for r in reports if not r.ok),
        problems=sum(len(r.problems) for r in reports),
        by_kind=dict(sorted(by_kind.items())),
    )


def validate_paths(paths: Iterable[str | Path]) -> tuple[list[FileReport], Summary]:
    files, missing = discover(paths)
    reports = check_files(files) + [FileReport(p.file, [p]) for p in missing]
    return reports, summarise(reports)


def load_file(path: str | Path) -> Definition:
    """A validated Definition, or DefinitionError listing every problem."""
    report = check_file(path)
    if report.definition is None:
        raise DefinitionError(report.problems)
    return report.definition

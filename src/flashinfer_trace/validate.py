"""Validation of definition files: every problem in every file, each with file, JSON path, message.

A pipeline of plain functions, each usable alone:
    discover(paths) -> files;  check_file(file) -> FileReport;  summarise(reports) -> Summary.
`check_data` never raises on any JSON value: malformed input is data to report, not a crash. Hostile
text is bounded everywhere it is parsed (constraints, references) and echoed only shortened.
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from . import constraints as _constraints
from .definition import UNKNOWN_DTYPE, Definition, implicit_axes, is_literal_dim, param_tag


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
    # What was accepted by a documented fi_trace rule and is worth knowing (an input the reference ignores,
    # a var axis that sizes nothing): same shape as a Problem, never makes the file fail.
    notes: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class Summary:
    files: int
    files_with_problems: int
    problems: int
    by_kind: dict[str, int]
    notes: int = 0

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
_NAMES = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _snippet(text: Any, limit: int = 80) -> str:
    """repr() of a value from the file, shortened: hostile text never floods a report (and repr
    escapes lone surrogates and control characters)."""
    r = repr(text)
    return r if len(r) <= limit else r[:limit - 5] + "...'" + f" ({len(str(text))} chars)"


def json_path(*parts: Any) -> str:
    out = "$"
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and _IDENT.fullmatch(p):
            out += f".{p}"
        else:
            key = str(p) if len(str(p)) <= 80 else str(p)[:77] + "..."
            out += f"[{json.dumps(key)}]"
    return out


# -- stage 1: text -> JSON ----------------------------------------------------------------------
UNPARSED = object()  # parse_json's value for text that is not JSON (`null` is JSON, and a problem later)


class _Object(dict):
    """A parsed JSON object that remembers the keys it saw more than once."""

    duplicates: list[str]


def parse_json(text: str, file: str) -> tuple[Any, list[Problem]]:
    """Parse JSON, refusing duplicate keys (reported at the object that has them) and NaN/Infinity
    (both lose or corrupt data silently)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = _Object()
        obj.duplicates = []
        for k, v in items:
            if k in obj and k not in obj.duplicates:
                obj.duplicates.append(k)
            obj[k] = v
        return obj

    def bad_constant(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_constant=bad_constant)
    except json.JSONDecodeError as e:
        return UNPARSED, [Problem(file, "$", "json-syntax", f"line {e.lineno}, column {e.colno}: {e.msg}")]
    except (ValueError, RecursionError, MemoryError) as e:
        return UNPARSED, [Problem(file, "$", "json-syntax", f"{type(e).__name__}: {_snippet(str(e))}")]
    return data, _duplicate_problems(data, file)


def _duplicate_problems(data: Any, file: str) -> list[Problem]:
    out: list[Problem] = []
    stack: list[tuple[Any, tuple]] = [(data, ())]
    while stack:  # iterative: the parser accepted the nesting, a recursive walk might not
        value, path = stack.pop()
        if isinstance(value, dict):
            out += [Problem(file, json_path(*path, k), "json-duplicate-key",
                            f"key {_snippet(k)} appears more than once (the last value is kept)")
                    for k in getattr(value, "duplicates", ())]
            stack.extend((v, (*path, k)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(value))
    return sorted(out, key=lambda p: p.path)


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
    if kind in ("enum", "value_error") and loc[-1:] == ["dtype"]:
        return Problem(file, json_path(*loc), "dtype", f"unknown dtype {err.get('input')!r}; {msg}")
    if loc[-1:] == ["value"] and len(loc) >= 2 and loc[0] == "axes":
        return Problem(file, json_path(*loc), "const-value",
                       f"const axis value must be an int in [0, 2**63), a possible tensor dimension ({msg})")
    return Problem(file, json_path(*loc), "type", msg)


# -- stage 3: cross-field rules -------------------------------------------------------------------
_STRING_DTYPES = ("str", "string")


def _semantic_problems(data: dict[str, Any], file: str, stem: str | None, folder: str | None,
                       notes: list[Problem] | None = None) -> list[Problem]:
    out: list[Problem] = []
    notes = [] if notes is None else notes
    name = data.get("name")
    if stem is not None and isinstance(name, str) and name != stem:
        out.append(Problem(file, "$.name", "name-mismatch",
                           f"name {_snippet(name)} must equal the file stem {_snippet(stem)}"))
    op_type = data.get("op_type")
    if isinstance(op_type, str) and op_type and not _IDENT.fullmatch(op_type):
        out.append(Problem(file, "$.op_type", "op-type", f"op_type {_snippet(op_type)} is not an identifier "
                           "(letters, digits, '_'; it names a folder and a test module)"))
    elif isinstance(op_type, str) and folder is not None and op_type != folder:
        out.append(Problem(file, "$.op_type", "op-type-folder",
                           f"op_type {_snippet(op_type)} disagrees with the folder {_snippet(folder)} the file is in"))

    out += _param_tag_problems(data, file)
    axes = data.get("axes") if isinstance(data.get("axes"), dict) else {}
    implicit = implicit_axes(data)
    if implicit:
        notes += [Problem(file, json_path("axes", a), "implicit-axis",
                          f"axis {a!r} is used in a shape but not declared: in an fi_trace file, a var axis by "
                          "implication (its value comes from the template's init or a constraint)")
                  for a in implicit]
        axes = {**axes, **{a: {"type": "var"} for a in implicit}}
    inputs = data.get("inputs") if isinstance(data.get("inputs"), dict) else {}
    outputs = data.get("outputs") if isinstance(data.get("outputs"), dict) else {}

    bound: set[str] = set()
    for section, specs in (("inputs", inputs), ("outputs", outputs)):
        if "outputs" == section and isinstance(data.get("outputs"), dict) and not specs:
            out.append(Problem(file, "$.outputs", "empty-outputs", "a definition must have at least one output"))
        for tname, spec in specs.items():
            absent = isinstance(spec, dict) and spec.get("dtype") == UNKNOWN_DTYPE
            if absent and (section == "outputs" or spec.get("optional") is not True):
                out.append(Problem(file, json_path(section, tname, "dtype"), "dtype",
                                   f"dtype 'unknown' is allowed only on an input marked \"optional\": true (fi_trace "
                                   "writes it for an optional input absent from the traced call); "
                                   f"this {section[:-1]} needs a dtype"))
            shape = spec.get("shape") if isinstance(spec, dict) else None
            if isinstance(spec, dict) and spec.get("dtype") in _STRING_DTYPES and (section == "outputs" or
                                                                                   shape is not None):
                out.append(Problem(file, json_path(section, tname, "dtype"), "dtype",
                                   f"dtype {spec['dtype']!r} is a string argument's: allowed only on an input with "
                                   f"\"shape\": null (a Python str), not on "
                                   f"{'an output' if section == 'outputs' else 'a tensor'}"))
            if not isinstance(shape, list):
                continue
            for i, axis in enumerate(shape):
                if is_literal_dim(axis) or (type(axis) is int and 0 <= axis < 2**63):
                    continue  # an integer literal is a fixed dimension of that size
                if isinstance(axis, str) and axis not in axes:
                    out.append(Problem(file, json_path(section, tname, "shape", i), "unknown-axis",
                                       f"axis {axis!r} is not declared in axes"))
                elif isinstance(axis, str) and section == "inputs" and not absent:
                    bound.add(axis)  # an absent input (passed as None) gives its axes no value

    # A var axis takes its value from an input dimension, or is derived through a constraint
    # (`len_indptr == batch_size + 1`); one that is neither can never get a value. One pass over the
    # constraints' identifiers, whatever the number of axes.
    cons = data.get("constraints")
    mentioned: set[str] = set()
    for c in cons if isinstance(cons, list) else []:
        if isinstance(c, str):
            mentioned.update(_NAMES.findall(c))
    in_outputs = {a for spec in outputs.values() if isinstance(spec, dict) and isinstance(spec.get("shape"), list)
                  for a in spec["shape"] if isinstance(a, str)}
    for axis, spec in axes.items():
        # A var axis only an output has is the reference's to size (fi_trace's scale-factor counts): allowed.
        # One that sizes nothing at all is harmless: it gets no value and nothing needs one (a note).
        if (isinstance(spec, dict) and spec.get("type") == "var" and axis not in bound and axis not in mentioned
                and axis not in in_outputs):
            notes.append(Problem(file, json_path("axes", axis), "unused-axis",
                                 f"var axis {axis!r} sizes no input or output and no constraint mentions it "
                                 "(or only an absent optional input has it): it gets no value, and nothing needs one"))

    for clash in sorted(set(inputs) & set(outputs)):
        # fi_trace lists a tensor the API writes in place as both: the output is the input's value after
        # the call. That needs the same tensor on both sides.
        i_spec, o_spec = inputs[clash], outputs[clash]
        if not (isinstance(i_spec, dict) and isinstance(o_spec, dict)):
            continue
        same = (i_spec.get("shape") == o_spec.get("shape") and i_spec.get("dtype") == o_spec.get("dtype")
                and isinstance(i_spec.get("shape"), list) and i_spec.get("dtype") != UNKNOWN_DTYPE)
        if not same:
            out.append(Problem(file, json_path("outputs", clash), "io-overlap",
                               f"{clash!r} is both an input and an output, which means written in place, but the "
                               f"two differ (input shape {_snippet(i_spec.get('shape'), 60)} dtype "
                               f"{_snippet(i_spec.get('dtype'), 30)}, output shape {_snippet(o_spec.get('shape'), 60)} "
                               f"dtype {_snippet(o_spec.get('dtype'), 30)}): an in-place output must be a tensor "
                               "input's own shape and dtype"))

    reference = data.get("reference")
    if isinstance(reference, str):
        params = {n: spec["param"] for n, spec in inputs.items()
                  if isinstance(spec, dict) and isinstance(spec.get("param"), str)}
        optional = [n for n, spec in inputs.items() if isinstance(spec, dict) and spec.get("optional") is True]
        out.extend(_reference_problems(reference, list(inputs), file, params, notes, optional))

    known = set(axes) | set(inputs)
    if isinstance(cons, list):
        for i, text in enumerate(cons):
            if not isinstance(text, str):
                continue  # already a type problem
            try:
                unknown = sorted(_constraints.parse(text).names - known)
            except _constraints.ConstraintError as e:
                out.append(Problem(file, json_path("constraints", i), "constraint-syntax", f"{_snippet(text)}: {e}"))
                continue
            if unknown:
                out.append(Problem(file, json_path("constraints", i), "constraint-name", f"{_snippet(text)} "
                                   f"mentions {', '.join(unknown)}, which are neither axes nor inputs"))
    return out


def _param_tag_problems(data: dict[str, Any], file: str) -> list[Problem]:
    """`param:<name>=<value>` tags (definition.param_tag): the syntax, one tag per name, and no name that
    is also an input (a parameter comes from one place: the call's input, or the model's tag)."""
    tags = data.get("tags") if isinstance(data.get("tags"), list) else []
    inputs = data.get("inputs") if isinstance(data.get("inputs"), dict) else {}
    out, seen = [], set()
    for i, tag in enumerate(tags):
        if not isinstance(tag, str):
            continue  # a type problem already
        try:
            found = param_tag(tag)
        except ValueError as e:
            out.append(Problem(file, json_path("tags", i), "param-tag", str(e)))
            continue
        if found is None:
            continue
        name = found[0]
        if name in seen:
            out.append(Problem(file, json_path("tags", i), "param-tag", f"parameter {name!r} is declared twice"))
        elif name in inputs:
            out.append(Problem(file, json_path("tags", i), "param-tag", f"parameter {name!r} is also an input: "
                               "declare it once (the input, given per call, or the tag, fixed by the model)"))
        seen.add(name)
    return out


def _reference_problems(code: str, input_names: list[str], file: str, params: dict[str, str] | None = None,
                        notes: list[Problem] | None = None, optional: Sequence[str] = ()) -> list[Problem]:
    """The reference's problems (and its notes, into `notes`), remembered per (code, inputs, file, params,
    optional): the static analysis parses the code several times, ~80% of a definition's validation, and the same
    reference is validated again and again (each test process that loads a definition; the fuzz test's 2500
    variants of one). Problems are frozen; a very long code is analysed afresh each time."""
    key = (code, tuple(input_names), file, None if params is None else tuple(sorted(params.items())), tuple(optional))
    hit = _REFERENCE_PROBLEMS.get(key) if len(code) <= _REMEMBERED_CODE else None
    if hit is None:
        found: list[Problem] = []
        hit = (tuple(_analyse_reference(code, input_names, file, params, found, optional)), tuple(found))
        if len(code) <= _REMEMBERED_CODE:
            if len(_REFERENCE_PROBLEMS) >= _REMEMBERED:
                _REFERENCE_PROBLEMS.pop(next(iter(_REFERENCE_PROBLEMS)))
            _REFERENCE_PROBLEMS[key] = hit
    if notes is not None:
        notes += hit[1]
    return list(hit[0])


_REFERENCE_PROBLEMS: dict[tuple, tuple[tuple[Problem, ...], tuple[Problem, ...]]] = {}
_REMEMBERED, _REMEMBERED_CODE = 1024, 1 << 16  # entries, characters of code


def _analyse_reference(code: str, input_names: list[str], file: str, params: dict[str, str] | None,
                       notes: list[Problem], optional: Sequence[str]) -> list[Problem]:
    from .sandbox.entry import entry_point, undefined_names
    from .sandbox.static import check_reference, parse

    try:
        tree = parse(code)
    except SyntaxError as e:
        return [Problem(file, "$.reference", "reference-syntax", f"line {e.lineno}: {e.msg}")]
    except (ValueError, RecursionError, MemoryError) as e:  # NUL bytes, surrogates, absurd nesting or size
        return [Problem(file, "$.reference", "reference-syntax", f"{type(e).__name__}: {_snippet(str(e), 200)}")]
    out = [Problem(file, "$.reference", "reference-sandbox", f"line {v.line}: {v.message}")
           for v in check_reference(code)]
    entry = entry_point(code, input_names, params, optional)
    if entry.name is None:
        out.append(Problem(file, "$.reference", "reference-run", entry.problem or "no entry point"))
        return out
    out += [Problem(file, "$.reference", "reference-undefined",
                    f"{fn}() reads {name!r}, which the reference neither defines nor imports: calling it raises "
                    "NameError (a helper left out of the file?)") for fn, name in undefined_names(code, entry.name)]
    if entry.by_name:  # fi_trace: the function takes the inputs by name (entry_point checked that)
        if notes is not None:
            renamed = dict(entry.renamed)
            notes += [Problem(file, json_path("inputs", n), "ignored-input",
                              f"{entry.name}() does not take {n!r}: a call-site parameter of the API that the "
                              "reference ignores (generated, never passed to it)") for n in entry.ignored]
            notes += [Problem(file, json_path("inputs", n, "param"), "param-input",
                              f"{entry.name}() takes {n!r} as its documented param {k!r}")
                      for n, k in entry.mapped if n not in renamed]
            notes += [Problem(file, json_path("inputs", n), "renamed-param",
                              f"{entry.name}() has no parameter {n!r}; it takes it as {k!r}, the required "
                              "parameter at the same position (passed by that keyword)") for n, k in renamed.items()]
        return out
    runs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    args = runs[-1].args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
        out.append(Problem(file, "$.reference", "reference-signature",
                           "run() must take the inputs as plain positional parameters"))
    params = [a.arg for a in args.args]
    if sorted(params) != sorted(input_names):  # matched by name: the order is the reference's own
        missing, extra = sorted(set(input_names) - set(params)), sorted(set(params) - set(input_names))
        duplicated = sorted({p for p in params if params.count(p) > 1})
        why = "; ".join(x for x in (f"no parameter for input(s) {', '.join(missing)}" if missing else "",
                                    f"parameter(s) {', '.join(extra)} are not inputs" if extra else "",
                                    f"parameter(s) {', '.join(duplicated)} repeated" if duplicated else "") if x)
        out.append(Problem(file, "$.reference", "reference-signature",
                           f"run({', '.join(params)}) must take the inputs by name ({why}): "
                           f"run({', '.join(input_names)}) in any order"))
    return out


def check_data(data: Any, file: str = "<definition>", stem: str | None = None,
               folder: str | None = None, notes: list[Problem] | None = None) -> list[Problem]:
    """Every problem in one parsed definition object. `stem`/`folder`: the file's name and, where the
    layout says so, the op_type folder it sits in. `notes`, where given, gets what a documented fi_trace
    rule accepted (docs/definitions.md): never problems."""
    if not isinstance(data, dict):
        return [Problem(file, "$", "type", f"a definition must be a JSON object, got {type(data).__name__}")]
    return _structure_problems(data, file) + _semantic_problems(data, file, stem, folder, notes)


def op_type_folder(path: Path, root: Path | None = None) -> str | None:
    """The op_type a file's place implies: `<root>/<op_type>/<name>.json` under a folder given to
    validate, or `definitions/<op_type>/<name>.json`; None where the layout says nothing."""
    if root is not None:
        try:
            parts = path.relative_to(root).parts
        except ValueError:
            parts = ()
        if len(parts) == 2:
            return parts[0]
    if path.parent.parent.name == "definitions":
        return path.parent.name
    return None


def display_path(path: Path | str) -> str:
    """A file name that prints anywhere: bytes that are not UTF-8 shown as escapes."""
    return str(path).encode("utf-8", "backslashreplace").decode("utf-8")


def link_out_of_root(path: str | Path, root: str | Path | None = None) -> Problem | None:
    """The problem of a file that resolves outside `root` (the folder it was found under; for a file named
    alone, its own folder), or None. A definitions folder is third-party input: a link in it to
    ~/.config/x.json must not have that file read, nor any field of it quoted back in a problem."""
    path = Path(path)
    base = Path(root) if root is not None else path.parent
    try:
        inside = path.resolve().is_relative_to(base.resolve())
    except (OSError, RuntimeError, ValueError):  # a loop, a NUL byte
        inside = False
    if inside:
        return None
    return Problem(display_path(path), "$", "link-outside-root",
                   f"symlink out of the definitions root {_snippet(display_path(base))}: not read "
                   "(--follow-links reads it)")


def check_file(path: str | Path, root: Path | None = None, *, follow_links: bool = False) -> FileReport:
    """Every problem of one file; `root` is the folder it was found under. A file that resolves outside
    it (outside its own folder where there is no root) is not read unless `follow_links`."""
    path = Path(path)
    file = display_path(path)
    report = FileReport(file)
    if not follow_links and (outside := link_out_of_root(path, root)):
        report.problems.append(outside)
        return report
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        report.problems.append(Problem(file, "$", "unreadable", f"{type(e).__name__}: {_snippet(str(e), 200)}"))
        return report
    data, report.problems = parse_json(text, file)
    if data is UNPARSED:
        return report
    report.problems += check_data(data, file, stem=path.stem, folder=op_type_folder(path, root), notes=report.notes)
    if report.ok:
        report.definition = Definition.model_validate(data)
        report.definition._source = path
    return report


# -- the pipeline -----------------------------------------------------------------------------
def _dangling(p: Path) -> Problem:
    try:
        target = os.readlink(p)
    except OSError:
        target = "?"
    return Problem(display_path(p), "$", "dangling-link",
                   f"symbolic link to {_snippet(target)}, which does not resolve to a file (missing target or a loop)")


def discover(paths: Iterable[str | Path]) -> tuple[list[tuple[Path, Path | None]], list[Problem]]:
    """(file, the folder it was found under) for JSON files under the given files/folders, sorted; a
    missing path or a dangling `*.json` link is a problem, not a crash or a silent skip."""
    files: list[tuple[Path, Path | None]] = []
    problems: list[Problem] = []
    for p in map(Path, paths):
        if p.is_dir():
            for q in sorted(p.rglob("*.json")):
                if q.is_file():
                    files.append((q, p))
                elif q.is_symlink():
                    problems.append(_dangling(q))
        elif p.is_file():
            files.append((p, None))
        elif p.is_symlink():
            problems.append(_dangling(p))
        else:
            problems.append(Problem(display_path(p), "$", "not-found", "no such file or directory"))
    return files, problems


def check_files(files: Iterable[tuple[Path, Path | None] | Path], *, follow_links: bool = False) -> list[FileReport]:
    """One report per file, whatever the file holds: a validator bug becomes an `internal-error`
    problem of that file, so a report is always complete."""
    reports = []
    for item in files:
        path, root = item if isinstance(item, tuple) else (item, None)
        try:
            reports.append(check_file(path, root, follow_links=follow_links))
        except Exception as e:  # noqa: BLE001 - the last line of defence; the fuzz tests keep it unused
            reports.append(FileReport(display_path(path), [Problem(display_path(path), "$", "internal-error",
                                                                  f"the validator failed: {type(e).__name__}: "
                                                                  f"{_snippet(str(e), 200)}")]))
    return reports


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
        notes=sum(len(r.notes) for r in reports),
    )


def validate_paths(paths: Iterable[str | Path], *, follow_links: bool = False) -> tuple[list[FileReport], Summary]:
    """Every file under `paths`, checked; a symlink out of the folder it was found under is a problem
    (`link-outside-root`, its content unread) unless `follow_links`."""
    files, problems = discover(paths)
    reports = check_files(files, follow_links=follow_links) + [FileReport(p.file, [p]) for p in problems]
    return reports, summarise(reports)


def load_file(path: str | Path) -> Definition:
    """A validated Definition, or DefinitionError listing every problem."""
    report = check_file(path)
    if report.definition is None:
        raise DefinitionError(report.problems)
    return report.definition

"""Drift between our definitions and FlashInfer's own (`fi_trace`, FlashInfer >= 0.7), per FlashInfer version.

    flashinfer-trace drift --ours definitions --upstream DIR [--out results/drift-<version>.json]

`DIR` holds upstream definitions as FlashInfer wrote them (a raw emission, or the `definitions/` layout
that `import-fi-trace` writes); files are read as JSON, so a definition our loader would refuse is still
compared field by field.

Pairing (each of ours with at most one of theirs; one of theirs may pair with several of ours):

1. **fi_api**: the same `fi_api:` tag, a wrapper's method folded into its class
   (`...BatchDecodeWithPagedKVCacheWrapper.run` pairs with our `...BatchDecodeWithPagedKVCacheWrapper`).
   Among several candidates: the same op_type, then the most const axes equal (name and value), then the
   most input names in common, a `run` before a `plan`, then the same name. Const axes may differ (our
   `rmsnorm_h4096` and their `rmsnorm_h2048` are one kernel); that is reported as an `axes.const.*`
   difference, and for the result comparison their const axis takes our value where both have an axis
   of that name (their references read sizes off the tensors; the result records which it changed).
2. **op_type+const_axes**: for one of ours with no tag match, the upstream definitions of the same op_type
   whose const axes are all equal (names and values); several are told apart by input names in common,
   then the name, and a tie leaves ours unpaired, naming the candidates.

Compared per pair: op_type; output names (in order) and count; input names; each common input's and
output's dtype and shape; const axes (names, values) and var axis names; the reference's epsilon
(declared as `semantics.eps` reads it: "input" for an eps scalar input, a `param:eps=` tag; for a file that
declares neither, its reference's named EPS constant, else the one literal added in a norm, else a parameter
default: drift compares definitions and judges neither, so it may read references) and every other
constant both references define (`sandbox/constants.py`, never executed); and
the results: inputs generated once from OUR definition, both references run in the confined sandbox,
compared with `compare.py` at our definition's tolerance, only where every parameter of their reference
maps to one of our inputs by name and the shapes bind to their axes (otherwise `not-compared`, and why).
Their reference is compiled after two rewrites that do not change what it computes: `from __future__`
imports dropped (the sandbox allows none) and annotations removed (under PEP 563 they are never evaluated).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
WRAPPER_METHODS = ("run", "plan", "forward", "__call__")
PAIRING_RULE = ("fi_api: the same fi_api tag (a wrapper's .run/.plan folded into its class), ranked by same op_type, "
                "equal const axes, common input names, run before plan, same name; else op_type+const_axes: "
                "same op_type and all const axes equal, ranked by common input names then name (a tie stays unpaired)")


# -- loading ---------------------------------------------------------------------------------------
@dataclass
class Entry:
    """One definition file, as JSON (`data`), and its parsed Definition where ours."""

    name: str
    path: Path
    data: dict[str, Any]
    definition: Any = None  # Definition (ours only)

    @property
    def op_type(self) -> str | None:
        return self.data.get("op_type") if isinstance(self.data.get("op_type"), str) else None

    @property
    def tags(self) -> list[str]:
        tags = self.data.get("tags")
        return [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []

    @property
    def api(self) -> str | None:
        """The first fi_api tag, a wrapper's method folded into its class."""
        for t in self.tags:
            if t.startswith("fi_api:"):
                return api_key(t.removeprefix("fi_api:"))
        return None

    @property
    def method(self) -> str | None:
        for t in self.tags:
            if t.startswith("fi_api:"):
                last = t.rsplit(".", 1)[-1]
                return last if last in WRAPPER_METHODS else None
        return None

    def section(self, key: str) -> dict[str, dict[str, Any]]:
        value = self.data.get(key)
        return {k: v for k, v in value.items() if isinstance(v, dict)} if isinstance(value, dict) else {}

    @property
    def const_axes(self) -> dict[str, Any]:
        return {k: a.get("value") for k, a in self.section("axes").items() if a.get("type") == "const"}

    @property
    def var_axes(self) -> list[str]:
        return [k for k, a in self.section("axes").items() if a.get("type") == "var"]


def api_key(path: str) -> str:
    """`flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run` -> `...Wrapper`; plain functions unchanged."""
    parts = path.split(".")
    if len(parts) >= 3 and parts[-1] in WRAPPER_METHODS and parts[-2][:1].isupper():
        parts = parts[:-1]
    return ".".join(parts)


def load_upstream(root: Path) -> tuple[list[Entry], list[dict[str, str]]]:
    """Every `*.json` under root that is a definition object (name, op_type); the rest are problems
    unless they are plainly not definitions (a manifest: a JSON object without op_type)."""
    entries: list[Entry] = []
    problems: list[dict[str, str]] = []
    seen: dict[str, Path] = {}
    for path in sorted(root.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            problems.append({"path": str(path), "problem": f"unreadable: {e}"})
            continue
        if not isinstance(data, dict) or "op_type" not in data:
            continue  # a manifest or report, not a definition
        name = data.get("name")
        if not isinstance(name, str) or not name:
            problems.append({"path": str(path), "problem": "$.name: missing or not a string"})
            continue
        if name in seen:
            problems.append({"path": str(path), "problem": f"$.name: {name!r} is also defined in {seen[name]}"})
            continue
        seen[name] = path
        entries.append(Entry(name, path, data))
    return entries, problems


def load_ours(root: Path) -> list[Entry]:
    from ..dataset import Dataset

    ds = Dataset(root)
    out = []
    for name, path in ds.index.items():
        d = ds.load(name)
        out.append(Entry(name, path, d.as_dict, d))
    return out


def infer_version(upstream: Path) -> str:
    """The FlashInfer version in the upstream folder's path (`/tmp/fitrace/0.7.2.post1`), else "unknown"."""
    from packaging.version import InvalidVersion, Version

    for part in reversed(upstream.resolve().parts):
        if re.match(r"^v?\d+\.\d+", part):
            try:
                return str(Version(part))
            except InvalidVersion:
                continue
    return "unknown"


# -- pairing ---------------------------------------------------------------------------------------
def _common_inputs(a: Entry, b: Entry) -> int:
    return len(set(a.section("inputs")) & set(b.section("inputs")))


def _equal_consts(a: Entry, b: Entry) -> int:
    ca, cb = a.const_axes, b.const_axes
    return sum(1 for k, v in ca.items() if k in cb and cb[k] == v)


def pair(ours: list[Entry], theirs: list[Entry]) -> tuple[list[tuple[Entry, Entry, str]], list[dict[str, str]]]:
    """(ours, theirs, rule) per pair, and ours left unpaired with the reason."""
    by_api: dict[str, list[Entry]] = {}
    for t in theirs:
        if t.api:
            by_api.setdefault(t.api, []).append(t)
    pairs, unpaired = [], []
    for o in ours:
        cands = by_api.get(o.api or "", [])
        if cands:
            best = max(cands, key=lambda t: (t.op_type == o.op_type, _equal_consts(o, t), _common_inputs(o, t),
                                             t.method != "plan", t.name == o.name, t.name))
            pairs.append((o, best, "fi_api"))
            continue
        same = [t for t in theirs if t.op_type == o.op_type and t.const_axes == o.const_axes]
        if not same:
            why = (f"no upstream definition tagged fi_api:{o.api}" if o.api else "no fi_api tag") + \
                  f", and none of op_type {o.op_type!r} with const axes {o.const_axes}"
            unpaired.append({"name": o.name, "reason": why})
            continue
        ranked = sorted(same, key=lambda t: (_common_inputs(o, t), t.name == o.name), reverse=True)
        top = [t for t in ranked if (_common_inputs(o, t), t.name == o.name) ==
               (_common_inputs(o, ranked[0]), ranked[0].name == o.name)]
        if len(top) > 1:
            unpaired.append({"name": o.name, "reason": "ambiguous: op_type and const axes match "
                                                       + ", ".join(sorted(t.name for t in top))})
            continue
        pairs.append((o, top[0], "op_type+const_axes"))
    return pairs, unpaired


# -- fields ----------------------------------------------------------------------------------------
def entry_function(code: str) -> str | None:
    """`run` where the code defines it, else its last top-level function (fi_trace's rendered reference)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    return "run" if "run" in defs else (defs[-1] if defs else None)


def _parameters(code: str, entry: str) -> list[tuple[str, bool, Any]] | None:
    """(name, has a default, the default if a literal) per positional parameter of `entry`; None when it
    takes *args or cannot be read."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry]
    if not fns or fns[-1].args.vararg:
        return None
    a = fns[-1].args
    params = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(params) - len(a.defaults)) + list(a.defaults)
    out = []
    for p, d in zip(params, defaults, strict=True):
        value = None
        if d is not None:
            try:
                value = ast.literal_eval(d)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                value = None
        out.append((p.arg, d is not None, value))
    return out


def constants(entry: Entry) -> dict[str, Any]:
    """The reference's constants (top level and the entry's straight-line body), plus literal defaults
    of the entry's parameters that no input gives."""
    from ..sandbox import reference_constants

    code = entry.data.get("reference")
    if not isinstance(code, str):
        return {}
    fn = entry_function(code) or "run"
    out = dict(reference_constants(code, fn))
    inputs = entry.section("inputs")
    for name, has_default, value in _parameters(code, fn) or []:
        if has_default and name not in inputs and isinstance(value, (int, float, str, bool)) and name not in out:
            out[name] = value
    return out


EPS_NAMES = ("EPS", "EPSILON", "eps", "epsilon", "VARIANCE_EPSILON")  # constants a reference may name it by


def epsilon(entry: Entry, consts: dict[str, Any]) -> float | str | None:
    """The epsilon a definition declares, as `semantics.eps` reads it: "input" where an `eps` scalar input
    brings it per call, else its `param:eps=` tag; for a file that declares none (the public dataset, fi_trace
    files that keep EPS in the reference), the reference's named constant, else the one literal added in a
    norm. Reading a reference is right here and only here: drift compares two definitions and judges
    neither, while a ground truth must never take a parameter from the code it judges."""
    from ..definition import param_tag
    from ..sandbox.constants import literal_epsilon
    from ..semantics import EPS_INPUTS

    inputs = entry.section("inputs")
    if any(isinstance(inputs.get(n), dict) and inputs[n].get("shape") in (None, []) for n in EPS_INPUTS):
        return "input"
    tags = entry.data.get("tags")
    for tag in tags if isinstance(tags, list) else []:
        try:
            found = param_tag(tag) if isinstance(tag, str) else None
        except ValueError:
            continue
        if found and found[0] == "eps" and isinstance(found[1], (int, float)) and not isinstance(found[1], bool):
            return float(found[1])
    for n in EPS_NAMES:
        v = consts.get(n)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    code = entry.data.get("reference")
    return literal_epsilon(code) if isinstance(code, str) else None


def compare_fields(o: Entry, t: Entry) -> tuple[list[str], list[dict[str, Any]]]:
    matched: list[str] = []
    diffs: list[dict[str, Any]] = []

    def check(name: str, ours: Any, theirs: Any) -> None:
        if ours == theirs:
            matched.append(name)
        else:
            diffs.append({"field": name, "ours": ours, "theirs": theirs})

    check("op_type", o.op_type, t.op_type)
    oo, to = o.section("outputs"), t.section("outputs")
    check("outputs.count", len(oo), len(to))
    check("outputs.names", list(oo), list(to))
    oi, ti = o.section("inputs"), t.section("inputs")
    check("inputs.names", sorted(oi), sorted(ti))
    for kind, a, b in (("inputs", oi, ti), ("outputs", oo, to)):
        for n in a:
            if n in b:
                check(f"{kind}.{n}.dtype", a[n].get("dtype"), b[n].get("dtype"))
                check(f"{kind}.{n}.shape", a[n].get("shape"), b[n].get("shape"))
    oc, tc = o.const_axes, t.const_axes
    check("axes.const.names", sorted(oc), sorted(tc))
    for n in oc:
        if n in tc:
            check(f"axes.const.{n}", oc[n], tc[n])
    check("axes.var.names", sorted(o.var_axes), sorted(t.var_axes))
    ok, tk = constants(o), constants(t)
    check("eps", epsilon(o, ok), epsilon(t, tk))
    for n in sorted(set(ok) & set(tk) - set(EPS_NAMES)):
        check(f"constants.{n}", ok[n], tk[n])
    return matched, diffs


def category(field_name: str) -> str:
    """The summary's group of a field: dtypes, shapes, axes.const, constants, or the field itself."""
    if field_name.endswith(".dtype"):
        return "dtypes"
    if field_name.endswith(".shape"):
        return "shapes"
    if field_name.startswith("axes.const"):
        return "axes.const"
    if field_name.startswith("constants."):
        return "constants"
    return field_name


# -- results ---------------------------------------------------------------------------------------
def sandboxable(code: str) -> str:
    """Their reference without `from __future__` imports and annotations (neither changes what it computes)."""

    class Strip(ast.NodeTransformer):
        def visit_ImportFrom(self, node: ast.ImportFrom):
            return None if node.module == "__future__" else node

        def visit_arg(self, node: ast.arg):
            node.annotation = None
            return node

        def visit_FunctionDef(self, node: ast.FunctionDef):
            node.returns = None
            self.generic_visit(node)
            return node

        def visit_AnnAssign(self, node: ast.AnnAssign):
            if node.value is None:
                return None
            return ast.copy_location(ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno), node)

    tree = Strip().visit(ast.parse(code))
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


@dataclass
class ResultSettings:
    size: str = "small"
    seed: int = 0
    device: str = "cpu"
    enabled: bool = True
    _inputs: dict[str, Any] = field(default_factory=dict)


def _bind(t: Entry, params: list[tuple[str, bool, Any]], values: dict[str, Any], ours: dict[str, Any] | None = None,
          relaxed: dict[str, list] | None = None) -> tuple[list[Any], str | None]:
    """Their reference's positional arguments from our inputs, or why they do not map. A const axis of
    theirs that ours also has (`ours`: our const axes) takes our value; `relaxed` records each."""
    import torch

    specs = t.section("inputs")
    axes = t.section("axes")
    ours = ours or {}
    bound: dict[str, int] = {}
    args: list[Any] = []
    for name, has_default, _ in params:
        if name not in values:
            if has_default:
                break  # the rest keep their defaults
            return [], f"their reference takes {name}, which our definition has no input for"
        v = values[name]
        spec = specs.get(name, {})
        shape = spec.get("shape")
        if isinstance(v, torch.Tensor) != isinstance(shape, list):
            return [], f"{name}: ours is a {'tensor' if isinstance(v, torch.Tensor) else 'scalar'}, theirs a " \
                       f"{'tensor' if isinstance(shape, list) else 'scalar'}"
        if isinstance(shape, list):
            if len(shape) != v.dim():
                return [], f"{name}: ours has {v.dim()} dimension(s) {list(v.shape)}, theirs {len(shape)} {shape}"
            for axis, size in zip(shape, v.shape, strict=True):
                a = axes.get(axis, {})
                if a.get("type") == "const":
                    want = a.get("value")
                    if axis in ours and ours[axis] != want:
                        if relaxed is not None:
                            relaxed[axis] = [want, ours[axis]]
                        want = ours[axis]
                else:
                    want = bound.setdefault(axis, int(size))
                if want is not None and want != int(size):
                    return [], f"{name}: shape {list(v.shape)} does not bind theirs {shape} ({axis} = {want})"
        args.append(v)
    return args, None


def compare_results(o: Entry, t: Entry, s: ResultSettings) -> dict[str, Any]:
    from ..inputs import InputGenerationError, generate_inputs
    from ..reference import run_reference
    from ..sandbox import ReferenceFailure, SandboxError, compile_reference
    from ..verdict.compare import compare_outputs, tolerance_for

    if not s.enabled:
        return {"outcome": "not-compared", "reason": "result comparison turned off (--no-results)"}
    d = o.definition
    code = t.data.get("reference")
    if not isinstance(code, str) or not code.strip():
        return {"outcome": "not-compared", "reason": "their definition has no reference"}
    if d is None:
        return {"outcome": "not-compared", "reason": "our definition did not load"}
    if d.is_sampler:
        return {"outcome": "not-compared", "reason": "sampling references draw random tokens; fields only"}
    entry = entry_function(code)
    params = _parameters(code, entry) if entry else None
    if params is None:
        return {"outcome": "not-compared", "reason": "their reference has no function with plain parameters"}
    try:
        inputs = s._inputs.get(d.name)
        if inputs is None:
            inputs = s._inputs[d.name] = generate_inputs(d, s.size, s.seed, device=s.device)
    except InputGenerationError as e:
        return {"outcome": "not-compared", "reason": f"our inputs: {e}"}
    relaxed: dict[str, list] = {}
    args, why = _bind(t, params, inputs.values, o.const_axes, relaxed)
    if why:
        return {"outcome": "not-compared", "reason": why}
    try:
        ours = run_reference(d, inputs, seed=s.seed)
    except (SandboxError, ReferenceFailure) as e:
        return {"outcome": "error", "reason": f"our reference: {e}"}
    try:
        fn = compile_reference(sandboxable(code), definition=f"{t.name} (upstream)", entry=entry, device=s.device)
        out = fn.call(args, seed=s.seed)
    except (SandboxError, ReferenceFailure, SyntaxError) as e:
        return {"outcome": "error", "reason": f"their reference: {e}"}
    theirs = out if isinstance(out, tuple) else (out,)
    their_names = list(t.section("outputs"))[:len(theirs)]
    their_names += [f"output[{i}]" for i in range(len(their_names), len(theirs))]
    our_names = list(d.outputs)
    common = [n for n in our_names if n in their_names]
    if common:
        pairs = [(n, ours[our_names.index(n)], theirs[their_names.index(n)]) for n in common]
        how = "by name"
    else:
        k = min(len(ours), len(theirs))
        pairs = [(f"{our_names[i]}~{their_names[i]}", ours[i], theirs[i]) for i in range(k)]
        how = "by position"
    if not pairs:
        return {"outcome": "not-compared", "reason": "no output to compare"}
    reports = compare_outputs([p[1] for p in pairs], [p[2] for p in pairs], tolerance_for(d),
                              [p[0] for p in pairs])
    result = {"outcome": "agree" if all(r.passed for r in reports) else "differ", "matched": how,
              "size": s.size, "seed": s.seed,
              "outputs": [{"name": r.name, "verdict": r.verdict, "summary": r.summary()} for r in reports]}
    if relaxed:
        result["const_axes_from_ours"] = relaxed  # axis: [theirs, ours]
    left = sorted(set(our_names) - set(common)) if common else our_names[len(pairs):]
    if left or len(theirs) != len(pairs):
        result["not_compared_outputs"] = {"ours": list(left),
                                          "theirs": [n for n in their_names if n not in common] if common
                                          else their_names[len(pairs):]}
    return result


# -- the report ------------------------------------------------------------------------------------
def report(ours_dir: str | Path, upstream_dir: str | Path, *, version: str | None = None,
           settings: ResultSettings | None = None) -> dict[str, Any]:
    ours_dir, upstream_dir = Path(ours_dir), Path(upstream_dir)
    if not upstream_dir.is_dir():
        raise FileNotFoundError(f"upstream folder {upstream_dir} does not exist")
    settings = settings or ResultSettings()
    ours = load_ours(ours_dir)
    theirs, problems = load_upstream(upstream_dir)
    pairs, unpaired_ours = pair(ours, theirs)
    records = []
    for o, t, rule in pairs:
        matched, diffs = compare_fields(o, t)
        records.append({"ours": o.name, "theirs": t.name, "ours_file": str(o.path), "theirs_file": str(t.path),
                        "pairing": rule, "fi_api": o.api if rule == "fi_api" else None, "op_type": o.op_type,
                        "matched": matched, "differences": diffs, "result": compare_results(o, t, settings)})
    used = {r["theirs"] for r in records}
    unpaired_theirs = [{"name": t.name, "reason": "no definition of ours pairs with it"
                        + (f" (fi_api:{t.api})" if t.api else "")} for t in theirs if t.name not in used]
    return {"schema_version": SCHEMA_VERSION, "flashinfer": version or infer_version(upstream_dir),
            "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "ours": str(ours_dir), "upstream": str(upstream_dir), "pairing_rule": PAIRING_RULE,
            "summary": summarise(records, len(ours), len(theirs), unpaired_ours, unpaired_theirs),
            "pairs": records, "unpaired": {"ours": unpaired_ours, "upstream": unpaired_theirs},
            "problems": problems}


def summarise(records: list[dict[str, Any]], n_ours: int, n_theirs: int, unpaired_ours: list,
              unpaired_theirs: list) -> dict[str, Any]:
    by_field: dict[str, int] = {}
    results: dict[str, int] = {}
    for r in records:
        for c in sorted({category(d["field"]) for d in r["differences"]}):
            by_field[c] = by_field.get(c, 0) + 1
        outcome = r["result"]["outcome"]
        results[outcome] = results.get(outcome, 0) + 1
    return {"ours": n_ours, "upstream": n_theirs, "paired": len(records),
            "drifting": sum(1 for r in records if r["differences"] or r["result"]["outcome"] == "differ"),
            "drifting_by_field": dict(sorted(by_field.items())), "results": dict(sorted(results.items())),
            "unpaired_ours": len(unpaired_ours), "unpaired_upstream": len(unpaired_theirs)}


def write(report_: dict[str, Any], out: str | Path) -> Path:
    from ..sweep.results import write_atomic

    out = Path(out)
    write_atomic(out, json.dumps(report_, indent=1, default=str) + "\n")
    return out


def summary_lines(r: dict[str, Any]) -> list[str]:
    s = r["summary"]
    lines = [f"flashinfer {r['flashinfer']}: {s['paired']} paired of {s['ours']} ours / {s['upstream']} upstream; "
             f"{s['drifting']} drifting; unpaired: {s['unpaired_ours']} ours, {s['unpaired_upstream']} upstream",
             "drifting by field: " + (", ".join(f"{k} {v}" for k, v in s["drifting_by_field"].items()) or "none"),
             "results: " + (", ".join(f"{k} {v}" for k, v in s["results"].items()) or "none")]
    for p in r["pairs"]:
        if p["differences"] or p["result"]["outcome"] == "differ":
            fields = sorted({category(d["field"]) for d in p["differences"]})
            lines.append(f"  {p['ours']} ~ {p['theirs']} ({p['pairing']}): {', '.join(fields) or '-'}; "
                         f"results {p['result']['outcome']}")
    return lines

"""FlashInfer ground truth found from a definition's `fi_api:` tag, with no hand-written adapter.

FlashInfer >= 0.7 writes its own definitions (`func.fi_trace(...)`) and tags each with the API that
computes it, `fi_api:flashinfer.norm.rmsnorm`; their input names are that API's parameter names. So a
definition can say how to call its kernel, and this module turns the tag into an adapter:

- the dotted path is resolved in the installed FlashInfer at availability time: a module or attribute
  that is not there is `api-missing: flashinfer.x.y absent in flashinfer 0.6.6 (...)`; no FlashInfer at
  all is `not-installed: flashinfer` (the usual pipeline of `base.availability`);
- the call is checked against `inspect.signature` before anything runs: every input must name a
  parameter (an input's `param` field overrides its name, `tuple_idx` packs several inputs into one
  tuple parameter such as `paged_kv_cache=(k, v)`), and every required parameter must be given;
  otherwise `api-missing` says which names do not fit and what the API takes. A `param:<name>=<value>`
  tag naming an optional parameter (`param:eps=1e-05` -> `eps=1e-05`) is passed too; the reference's
  own constants never are (they are what is judged: semantics.py);
- it is called with every argument by keyword, on clones of the inputs (kernels write in place);
- outputs are read in the definition's order: an output named like an input, or whose `param` names
  an input's parameter, is that input after the call (in place); every other output takes the next
  value the API returned. A count that does not fit is a precise reason, not a wrong comparison.

Wrapper classes (`BatchDecodeWithPagedKVCacheWrapper.run`) need a plan() first: a tag naming one is
`unsupported` here and stays with the hand-written adapters of `flashinfer.py`, which are always
preferred (`groundtruth.get_ground_truth` tries this one only for a definition none of them applies to).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from packaging.version import Version

from ..semantics import EPS_INPUTS
from .base import Adapter, Call, GroundTruthUnavailable
from .flashinfer import PACKAGE

if TYPE_CHECKING:
    from ..definition import Definition

__all__ = ["NAMESPACE", "Plan", "adapters", "api_paths", "plan", "resolve_path"]

NAMESPACE = "fi_api"
ROOT = "flashinfer"
_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def api_paths(definition: Definition) -> list[str]:
    """The definition's `fi_api:` tags, in order, without repeats."""
    return list(dict.fromkeys(definition.tag_values(NAMESPACE)))


def _version_text(version: Version | None) -> str:
    return f"flashinfer {version}" if version is not None else "the installed flashinfer"


def resolve_path(module: ModuleType, path: str, version: Version | None) -> tuple[Any, Any]:
    """(the object at `path`, its parent) in the imported flashinfer, or GroundTruthUnavailable."""
    parts = path.split(".")
    if parts[0] != ROOT or len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise GroundTruthUnavailable("unsupported", f"fi_api tag {path!r} is not a dotted flashinfer.* name")
    parent, obj = None, module
    for i, part in enumerate(parts[1:], start=1):
        try:
            parent, obj = obj, getattr(obj, part)
        except Exception:  # noqa: BLE001 - lazy submodules may raise anything on access
            owner = ".".join(parts[:i])
            raise GroundTruthUnavailable(
                "api-missing", f"{path} absent in {_version_text(version)} ({owner} has no attribute {part!r})"
            ) from None
    return obj, parent


@dataclass(frozen=True)
class Plan:
    """How one definition calls one API: keyword -> input name (or input names, for a tuple
    parameter), constants passed as keywords, and where each output comes from."""

    path: str
    fn: Callable[..., Any]
    arguments: dict[str, str | tuple[str, ...]]
    constants: dict[str, Any]
    in_place: dict[str, str]  # output name -> the input whose buffer holds it after the call
    returned: tuple[str, ...]  # outputs read, in order, from the API's return value


def _declared_param(spec: Any) -> Any:
    """The spec's `param` (a field of TensorSpec, or an extra field where the model has none)."""
    param = getattr(spec, "param", None)
    return (spec.model_extra or {}).get("param") if param is None else param


def _param_of(spec: Any, name: str, where: str) -> str:
    param = _declared_param(spec)
    param = name if param is None else param
    if not isinstance(param, str) or not param.isidentifier():
        raise GroundTruthUnavailable("unsupported", f"{where}.param: {param!r} is not a parameter name")
    return param


def _arguments(definition: Definition) -> dict[str, str | tuple[str, ...]]:
    """keyword -> input name, or the input names of a tuple parameter in `tuple_idx` order."""
    direct: dict[str, str] = {}
    packed: dict[str, dict[int, str]] = {}
    for name, spec in definition.inputs.items():
        where = f"{definition.name}: inputs.{name}"
        param = _param_of(spec, name, where)
        idx = (spec.model_extra or {}).get("tuple_idx")
        if idx is None:
            if param in direct or param in packed:
                raise GroundTruthUnavailable("unsupported", f"{where}: parameter {param!r} is given twice")
            direct[param] = name
            continue
        if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
            raise GroundTruthUnavailable("unsupported", f"{where}.tuple_idx: {idx!r} is not an index >= 0")
        slots = packed.setdefault(param, {})
        if param in direct or idx in slots:
            raise GroundTruthUnavailable("unsupported", f"{where}: parameter {param!r}[{idx}] is given twice")
        slots[idx] = name
    out: dict[str, str | tuple[str, ...]] = dict(direct)
    for param, slots in packed.items():
        if sorted(slots) != list(range(len(slots))):
            raise GroundTruthUnavailable("unsupported", f"{definition.name}: tuple parameter {param!r} has "
                                                        f"items {sorted(slots)}, not 0..{len(slots) - 1}")
        out[param] = tuple(slots[i] for i in range(len(slots)))
    return out


def plan(module: ModuleType, version: Version | None, definition: Definition, path: str) -> Plan:
    """Resolve `path` and check the call the definition describes against its signature; raises
    GroundTruthUnavailable with the first reason it cannot be made."""
    obj, parent = resolve_path(module, path, version)
    if inspect.isclass(obj):
        raise GroundTruthUnavailable("unsupported", f"{path} is a class (a wrapper with plan/run): it takes a "
                                                    "hand-written adapter")
    if inspect.isclass(parent):
        raise GroundTruthUnavailable("unsupported", f"{path} is a method of the wrapper class {parent.__name__}: "
                                                    "it needs the wrapper built and planned first, which takes a "
                                                    "hand-written adapter")
    if not callable(obj):
        raise GroundTruthUnavailable("unsupported", f"{path} is not callable ({type(obj).__name__})")
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError) as e:
        raise GroundTruthUnavailable("unsupported", f"{path}: signature unreadable ({e})") from None
    keywords = {n: p for n, p in params.items() if p.kind in _KEYWORD}
    takes = ", ".join(keywords) or "no keyword parameters"
    where = f"{_version_text(version)} {path}({takes})"
    arguments = _arguments(definition)
    unknown = [p for p in arguments if p not in keywords]
    if unknown:
        given = ", ".join(f"{p} (input {arguments[p] if isinstance(arguments[p], str) else '/'.join(arguments[p])})"
                          for p in unknown)
        raise GroundTruthUnavailable("api-missing", f"signature mismatch: {where} takes no parameter {given}")
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in arguments
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if required:
        raise GroundTruthUnavailable("api-missing", f"signature mismatch: {where} needs {', '.join(required)}, "
                                                    f"which no input of {definition.name} gives")
    constants = {}
    try:
        declared = definition.declared_params
    except ValueError as e:
        raise GroundTruthUnavailable("unsupported", f"{definition.name}: {e}") from None
    for name, value in declared.items():
        key = name.lower()
        if key in keywords and key not in arguments and keywords[key].default is not inspect.Parameter.empty \
                and isinstance(value, (int, float, bool, str)):
            constants[key] = value
    # outputs: in place (named like an input, or `param` naming an input's parameter) or returned
    by_param = {p: n for p, n in arguments.items() if isinstance(n, str)}
    in_place: dict[str, str] = {}
    returned: list[str] = []
    for name, spec in definition.outputs.items():
        target = _declared_param(spec)
        if target is not None:
            target = _param_of(spec, name, f"{definition.name}: outputs.{name}")
            if target in by_param:
                in_place[name] = by_param[target]
            elif target in keywords:  # an out= buffer the API also returns
                returned.append(name)
            else:
                raise GroundTruthUnavailable("api-missing", f"signature mismatch: {definition.name}: output {name} "
                                                            f"is written into {target}, which {where} does not take")
        elif name in definition.inputs and definition.inputs[name].shape is not None:
            in_place[name] = name
        else:
            returned.append(name)
    undeclared = [k for k in EPS_INPUTS if k in keywords and k not in arguments and k not in constants]
    if undeclared:  # the API's default would be a guess at the model's epsilon
        raise GroundTruthUnavailable("unsupported", f"{definition.name} declares no {undeclared[0]}: {path} takes "
                                                    f"{undeclared[0]}=, and no input or param:{undeclared[0]}= tag "
                                                    "gives it")
    return Plan(path, obj, arguments, constants, in_place, tuple(returned))


def _as_values(result: Any) -> tuple:
    if result is None:
        return ()
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def run(p: Plan, call: Call) -> tuple:
    """Call the API on clones of the inputs; the outputs in the definition's order."""
    x = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in call.inputs.values.items()}
    kwargs: dict[str, Any] = dict(p.constants)
    for param, source in p.arguments.items():
        if isinstance(source, str):
            if source in x:  # an optional input the case leaves out is not passed
                kwargs[param] = x[source]
        else:
            kwargs[param] = tuple(x[s] for s in source)
    values = _as_values(p.fn(**kwargs))
    if len(values) != len(p.returned):
        reads = f"{len(p.returned)} output(s) from its return value ({', '.join(p.returned) or 'none'})"
        if p.in_place:
            reads += f" and {', '.join(p.in_place)} in place"
        raise GroundTruthUnavailable("unsupported", f"{p.path} returned {len(values)} value(s); "
                                                    f"{call.definition.name} reads {reads}")
    returned = dict(zip(p.returned, values, strict=True))
    return tuple(x[p.in_place[n]] if n in p.in_place else returned[n] for n in call.definition.outputs)


ROWS_PER_CALL = 256  # a sampler's repeated rows per API call


def run_sampler(p: Plan, c: Call) -> tuple:
    """A sampler's [batch, draws] token ids: the API called on each row repeated, its first output read.
    (One call per row gives one draw per row: too few to compare distributions.)"""
    import dataclasses

    from ..inputs.sampling import distribution_input, repeat_rows

    d, x = c.definition, c.inputs.values
    dist = x[distribution_input(d)]
    out = torch.empty(dist.shape[0], c.draws, dtype=torch.int64, device=dist.device)
    for row in range(dist.shape[0]):
        done = 0
        while done < c.draws:
            n = min(c.draws - done, ROWS_PER_CALL)
            named = dict(zip(x, repeat_rows(d, c.inputs, n, slice(row, row + 1)), strict=True))
            one = dataclasses.replace(c, inputs=dataclasses.replace(c.inputs, values=named))
            out[row, done:done + n] = run(p, one)[0].reshape(-1).to(torch.int64)
            done += n
    return (out,)


def adapters(definition: Definition) -> list[Adapter]:
    """One adapter per `fi_api:` tag of the definition (none without one)."""
    sampler = definition.is_sampler
    out = []
    for path in api_paths(definition):
        def check(module: ModuleType, version: Version | None, d: Definition, path: str = path) -> None:
            plan(module, version, d, path)

        def call(c: Call, path: str = path) -> tuple:
            p = plan(c.module, c.version, c.definition, path)
            return run_sampler(p, c) if sampler else run(p, c)

        out.append(Adapter("flashinfer", definition.op_type, f"{NAMESPACE}:{path}", call, package=PACKAGE,
                           needs_cuda=True, resolve=check, kind="sampler" if sampler else "exact"))
    return out

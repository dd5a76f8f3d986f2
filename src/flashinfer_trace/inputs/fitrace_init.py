"""Inputs from a FlashInfer fi_trace definition's own `init` (the template's input builder), where no
family generator of ours fits the definition (an op_type we have no generator for, or upstream's input
names and layouts).

`init` is untrusted code, like a reference: it is checked statically (`sandbox.static`) and runs only in
a confined worker (`sandbox.pool`: the references' memory limit, CPU-time limit and timeout, capped at
INIT_MEMORY and INIT_TIMEOUT),
never in this process. The worker seeds torch's RNG with the case's seed before the call (and the init
gets `seed=` too where it takes it), so a case is the same on every call on one device; unlike our own
generators, an init's values are NOT the same across devices (it draws with `torch.randn` on the device
it is given). Its tensors come back through the shared-memory transport the way reference outputs do.

The call: FlashInfer's inits are keyword-only functions of the template's axes, `device` and `seed`
(`def _rmsnorm_init(*, batch_size, hidden_size=4096, device="cuda", seed=0)`), returning the API's call
arguments by parameter name (`{"plan": {...}, "run": {...}}` for wrapper classes). Each parameter the
init requires gets: a var axis its size tier's value (`VAR_SIZES`; the next one where the init raises,
e.g. for a block multiple), a const axis the definition's value, `*_plus_1` one more than its base.
Const axes the init takes with a default get the definition's value too; anything else keeps its default.
The answer's keys are matched to the definition's inputs by name, else by the input's `param`; an input
with no key (not optional) is an InputGenerationError naming the file, the input and the unmatched keys.
Every case then passes the same checks as a generated one (shapes bind the axes, dtypes, finiteness,
constraints: `common.Builder.finish`).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

import torch

from .common import Builder, InputGenerationError, Inputs

if TYPE_CHECKING:
    from ..definition import Definition, TensorSpec

__all__ = ["INIT_SOURCE", "VAR_SIZES", "generate_from_init", "init_entry", "init_source"]

INIT_SOURCE = "fi_trace init"  # Inputs.source of cases made here
# A var axis the init requires: the tier's value first, larger ones where the init refuses it.
VAR_SIZES = {"small": (4, 16, 128), "medium": (64, 128), "large": (1024, 2048)}
_FIXED = {"zero": 0, "one": 1}  # placeholder axes some templates declare
# Bounds of one init call, below the references' settings where those are larger: the inits build
# model-sized weights by default (a CPU MoE init quantizing 32 experts of 7168 x 4096 took 12 GB and
# minutes), and a case that needs more is better skipped than allowed to starve the machine.
INIT_TIMEOUT = 300.0
INIT_MEMORY = 8 << 30
_PLUS = ("_plus_1", "_plus_one")


def _where(d: Definition) -> str:
    return str(d.source) if getattr(d, "source", None) else d.name


def _error(d: Definition, message: str) -> InputGenerationError:
    return InputGenerationError(f"{_where(d)}: $.init: {message}", definition=d.name)


def init_source(d: Definition) -> str:
    """The init's code as it runs: FlashInfer inlines its shared helpers module, whose `__all__ = [...]`
    (a list of names, nothing else) the static check refuses as an underscore name; that one statement
    is blanked (line numbers stay). Nothing else is changed."""
    code = d.init or ""
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        raise _error(d, f"line {e.lineno}: not valid Python: {e.msg}") from None
    lines = code.split("\n")
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple))
                and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.value.elts)):
            for i in range(node.lineno - 1, node.end_lineno or node.lineno):
                lines[i] = ""
    return "\n".join(lines)


def init_entry(d: Definition, code: str) -> tuple[str, dict[str, bool]]:
    """The init function (the last top-level function: the helpers come first) and its parameters,
    name -> has a default, read from the source without running it."""
    tree = ast.parse(code)
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    if not funcs:
        raise _error(d, "defines no function (expected the template's init as the last top-level function)")
    fn = funcs[-1]
    a = fn.args
    params: dict[str, bool] = {}
    positional = [*a.posonlyargs, *a.args]
    first_default = len(positional) - len(a.defaults)
    for i, p in enumerate(positional):
        params[p.arg] = i >= first_default
    for p, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params[p.arg] = default is not None
    if a.posonlyargs:
        raise _error(d, f"{fn.name}() has positional-only parameters; an init is called by keyword")
    return fn.name, params


def _kwargs(d: Definition, params: dict[str, bool], var_value: int, device: str, seed: int) -> dict[str, Any]:
    consts = d.const_axes
    var_axes = set(d.axes) - set(consts)
    out: dict[str, Any] = {}
    for name, has_default in params.items():
        if name == "device":
            out[name] = device
        elif name == "seed":
            out[name] = seed
        elif name in consts:
            out[name] = consts[name]
        elif not has_default:
            if name in _FIXED:
                out[name] = _FIXED[name]
            elif name in var_axes:
                out[name] = var_value
            elif not any(name.endswith(s) for s in _PLUS):
                raise _error(d, f"the init requires parameter {name!r}, which is no axis of the definition "
                                f"(its axes: {', '.join(d.axes)})")
    for name, has_default in params.items():  # `batch_size_plus_1`: one more than its base
        for s in _PLUS:
            if name.endswith(s) and not has_default:
                base = name[: -len(s)]
                if base not in out and base not in var_axes:
                    raise _error(d, f"the init requires {name!r}, and {base!r} has no value")
                out[name] = out.get(base, var_value) + 1
    return out


def _flatten(made: Any, d: Definition) -> dict[str, Any]:
    """The call arguments: wrapper inits return {"plan": {...}, "run": {...}} (run's win)."""
    if not isinstance(made, dict):
        raise _error(d, f"the init returned {type(made).__name__}, not a dict of call arguments")
    if set(made) <= {"init", "plan", "run"} and any(isinstance(made.get(k), dict) for k in ("plan", "run")):
        merged: dict[str, Any] = {}
        for k in ("init", "plan", "run"):
            if isinstance(made.get(k), dict):
                merged.update(made[k])
        return merged
    return dict(made)


def reference_defaults(d: Definition) -> dict[str, Any]:
    """The literal defaults of the reference entry's parameters (`rope_scale: float = 1`), read without
    running anything: an optional input the init leaves out gets the value the API call would have."""
    try:
        tree = ast.parse(d.reference or "")
        entry = d.reference_entry
    except (SyntaxError, ValueError):
        return {}
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == entry:
            a = node.args
            positional = [*a.posonlyargs, *a.args]
            pairs = [*zip(positional[len(positional) - len(a.defaults):], a.defaults, strict=True),
                     *((p, v) for p, v in zip(a.kwonlyargs, a.kw_defaults, strict=True) if v is not None)]
            for p, v in pairs:
                try:
                    out[p.arg] = ast.literal_eval(v)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    pass
    return out


def _match(d: Definition, made: dict[str, Any]) -> dict[str, Any]:
    """Input name -> value: by name, else by the input's `param`. Missing required inputs are an error;
    a missing optional one gets the reference's literal default for it (else None)."""
    defaults = reference_defaults(d)
    values: dict[str, Any] = {}
    used: set[str] = set()
    missing = []
    for name, spec in d.inputs.items():
        key = name if name in made else spec.param if spec.param in made and spec.param not in d.inputs else None
        if spec.is_absent:  # fi_trace traced the call without it: passed as None, whatever the init made
            values[name] = None
            used.update(k for k in (key,) if k)
        elif key is not None:
            values[name] = made[key]
            used.add(key)
        elif spec.optional:
            value = defaults.get(name, defaults.get(spec.param) if spec.param else None)
            scalar = spec.shape is None and isinstance(value, (bool, int, float, str))
            values[name] = value if scalar else None  # a tensor's default is None in every fi_trace reference
        else:
            missing.append(name)
    if missing:
        unmatched = [k for k in made if k not in used]
        raise _error(d, f"the init made no value for input(s) {', '.join(repr(m) for m in missing)} (matched by "
                        "name, or by an input's \"param\"); keys it returned that match no input: "
                        f"{', '.join(repr(k) for k in unmatched) or 'none'}")
    return values


def _convert(d: Definition, name: str, spec: TensorSpec, value: Any) -> Any:
    """Scalars as Python values of the spec's kind; tensors as made (a wrong dtype is an error)."""
    from ..dtypes import torch_dtype

    if value is None:
        return None
    if spec.is_string:
        if not isinstance(value, str):
            raise _error(d, f"input {name!r} is a string argument; the init made a {type(value).__name__}")
        return value
    if spec.shape is None:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise _error(d, f"input {name!r} is a scalar; the init made a tensor of shape {tuple(value.shape)}")
            value = value.item()
        if not isinstance(value, (bool, int, float)):
            raise _error(d, f"input {name!r} is a scalar; the init made a {type(value).__name__}")
        kind = spec.dtype.value
        return bool(value) if kind == "bool" else int(value) if kind.startswith(("int", "uint")) else float(value)
    if not isinstance(value, torch.Tensor):
        if spec.shape == [] and isinstance(value, (bool, int, float)):
            return torch.tensor(value, dtype=torch_dtype(spec.dtype))
        raise _error(d, f"input {name!r} is a tensor {spec.shape}; the init made a {type(value).__name__}")
    return value


def _buffer(d: Definition, name: str, value: Any) -> Any:
    """An input the op writes in place (also an output) that the init left uninitialised
    (`torch.empty`): its non-finite garbage becomes 0, so the case passes the finiteness check."""
    if (name in d.outputs and isinstance(value, torch.Tensor) and value.is_floating_point()
            and value.dtype.itemsize > 1 and value.numel()):
        return torch.nan_to_num(value, nan=0.0, posinf=0.0, neginf=0.0)
    return value


class _InitBuilder(Builder):
    """The usual checks, plus fi_trace's string arguments, absent optional inputs (None), and var axes
    only outputs have (scale-factor counts, `hidden_div_2`): the reference sizes those, and the init's
    tensors cannot say their values."""

    def _unsized_axes(self) -> set[str]:
        """Var axes no tensor the init made has (only outputs', or only inputs' it left None) and no
        constraint names once `derive_axes` ran."""
        d = self.definition
        from ..constraints import parse

        sized = {a for n, s in d.inputs.items() if self.values.get(n) is not None for a in s.shape or ()}
        named: set[str] = set()
        for c in d.constraints:
            try:
                named |= parse(c).names
            except ValueError:  # validate reports it; it may mention any axis
                return set()
        return {a for a in d.var_axes if a not in sized and a not in named}

    def derive_axes(self) -> None:
        """An unbound var axis X a constraint `L == R` ties to bound ones (`hidden_size == 2 * hidden_div_2`,
        `K_packed == K // 2`): where L - R is linear in X (two evaluations), X is that root, kept only if
        it is a non-negative integer for which the constraint then holds."""
        from ..constraints import parse

        for text in self.definition.constraints:
            try:
                c = parse(text)
            except ValueError:
                continue
            body = c.tree.body
            if not (isinstance(body, ast.Compare) and len(body.ops) == 1 and isinstance(body.ops[0], ast.Eq)):
                continue
            free = [n for n in c.names if n in self.definition.var_axes and n not in self.axes]
            if len(free) != 1 or not c.names - {free[0]} <= set(self.axes):
                continue
            x = free[0]
            lhs, rhs = ast.Expression(body.left), ast.Expression(body.comparators[0])
            try:
                f = [parse_eval(lhs, {**self.axes, x: v}) - parse_eval(rhs, {**self.axes, x: v}) for v in (0, 1)]
                if f[1] == f[0]:
                    continue
                root = -f[0] / (f[1] - f[0])
                if root < 0 or root != int(root) or not c.evaluate({**self.axes, x: int(root)}):
                    continue
            except Exception:  # noqa: BLE001 - an expression that does not evaluate on numbers derives nothing
                continue
            self.axes[x] = int(root)

    def _check_value(self, name: str, spec: TensorSpec, value: Any) -> None:
        if value is None and (spec.optional or spec.is_absent):
            return
        if spec.is_string:
            if not isinstance(value, str):
                raise self.error(f"input {name!r}: expected a str, got {type(value).__name__}")
            return
        super()._check_value(name, spec, value)


def generate_from_init(d: Definition, size: str, seed: int, *, device: torch.device) -> Inputs:
    """One case from the definition's `init`, run confined on `device` (a CPU or a CUDA device)."""
    from ..sandbox import ConfinementUnavailable, ReferenceFailure, SandboxError, compile_reference
    from ..sandbox.pool import canonical_device

    if not d.init:
        raise _error(d, "the definition has no init")
    code = init_source(d)
    entry, params = init_entry(d, code)
    dev = canonical_device(device)
    label = f"{d.name} (init)"
    names = list(_kwargs(d, params, VAR_SIZES[size][0], dev, seed))  # the same names for every size tried
    try:
        fn = compile_reference(code, definition=label, entry=entry, device=dev, names=names)
    except ConfinementUnavailable:
        raise
    except SandboxError as e:
        raise _error(d, f"refused by the sandbox: {e}") from None
    except ReferenceFailure as e:
        raise _error(d, f"its module body failed in the worker: {e}") from None
    fn.timeout, fn.memory_bytes = INIT_TIMEOUT, INIT_MEMORY
    last: Exception | None = None
    for var_value in VAR_SIZES[size]:
        kwargs = _kwargs(d, params, var_value, dev, seed)
        try:
            made = fn.call(list(kwargs.values()), seed=seed, device=dev)
        except ReferenceFailure as e:
            if e.kind != "raised":  # timeout, crash, memory, cpu-time: no second try
                raise _error(d, f"{entry}({_show(kwargs)}): {e.kind}: {e.detail}") from None
            last = e
            continue
        values = _match(d, _flatten(made, d))
        b = _InitBuilder(d, size, seed, None, device=device)
        for name, spec in d.inputs.items():
            b.put(name, _buffer(d, name, _convert(d, name, spec, values[name])))
        b.derive_axes()
        inputs = b.finish()
        return Inputs(inputs.definition, inputs.size, inputs.seed, inputs.case, inputs.values, inputs.axes,
                      inputs.ignored, source=INIT_SOURCE)
    raise _error(d, f"{entry}() raised for every var-axis size tried ({', '.join(map(str, VAR_SIZES[size]))}); "
                    f"last: {last}")


def parse_eval(expr: ast.Expression, env: dict[str, Any]) -> Any:
    from ..constraints import _eval

    return _eval(expr.body, env)


def _show(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())

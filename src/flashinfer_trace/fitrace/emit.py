"""Emit one definition per traced FlashInfer API, the way FlashInfer's own `fi_trace` writes them.

FlashInfer >= 0.7 decorates its public APIs with `@flashinfer_api(trace=<TraceTemplate>)` and keeps
`(function, template, label)` in `flashinfer.api_logging._TRACE_REGISTRY`. For each entry this module
calls the template's `init` (keyword-only var axes, `device`, `seed`: it returns the API's call
arguments, `{"plan": ..., "run": ...}` for wrapper classes) and feeds the arguments to the template's
`fi_trace` function. The result is FlashInfer's definition dict, unchanged.

Only the standard library, torch and flashinfer are imported here, so the module runs inside the
confined worker (`sandbox/worker.py`, op `fi_trace_emit`) and as a script in a bare FlashInfer
environment:

    python -m flashinfer_trace.fitrace.emit --out DIR [--op-type T ...] --unconfined

(the script runs FlashInfer's template code in its own process: `flashinfer-trace import-fi-trace`
is the confined way). Templates that cannot be emitted are results too, each with its reason.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import os
import sys
import textwrap
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["MIN_VERSION", "TraceUnavailable", "complete_reference", "emit_all", "restore_params", "traced_modules",
           "var_axis_values"]

MIN_VERSION = "0.7"  # flashinfer.trace (TraceTemplate, fi_trace) first shipped in 0.7.0

# A var axis the init requires gets the first of these sizes that its init accepts (small, so CPU
# tensors stay tiny; larger ones for inits that need a multiple of a block size).
_TRY_SIZES = (4, 16, 128)
# Var axes whose names fix their value (`zero`, `one`: placeholders some templates declare).
_FIXED = {"zero": 0, "one": 1}


class TraceUnavailable(RuntimeError):
    """The installed FlashInfer has no `flashinfer.trace` (or none at all)."""


def _flashinfer():
    try:
        import flashinfer  # noqa: PLC0415
    except ImportError as e:
        raise TraceUnavailable(f"not-installed: flashinfer cannot be imported ({type(e).__name__}: {e})") from None
    version = getattr(flashinfer, "__version__", "unknown")
    try:
        import flashinfer.trace  # noqa: F401, PLC0415
        from flashinfer.api_logging import _TRACE_REGISTRY  # noqa: F401, PLC0415
    except ImportError:
        raise TraceUnavailable(f"flashinfer {version} has no flashinfer.trace (added in {MIN_VERSION})") from None
    return flashinfer, version


def traced_modules(package_dir: str | Path, package: str = "flashinfer") -> list[str]:
    """Modules of the package whose source attaches a trace template (`@flashinfer_api(... trace=...)`):
    importing them fills the registry. Found by reading the files, so nothing else is imported."""
    root = Path(package_dir)
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in ("data", "trace") or "tests" in rel.parts:
            continue  # bundled third-party sources; the templates themselves
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "flashinfer_api" not in text or "trace=" not in text:
            continue
        parts = [package, *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out.append(".".join(parts))
    return out


_preloaded: dict[str, str] | None = None  # module -> why its import failed, once preload() ran


def _import_traced(flashinfer) -> dict[str, str]:
    failures: dict[str, str] = {}
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        for module in traced_modules(Path(flashinfer.__file__).parent):
            try:
                importlib.import_module(module)
            except BaseException as e:  # noqa: BLE001 - SystemExit from a module that refuses this machine too
                failures[module] = _missing_module(e) if isinstance(e, ImportError) else \
                    f"import-failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
    return failures


def preload() -> None:
    """Import flashinfer and its traced modules now (the confined worker does it before it confines
    itself: importing FlashInfer writes its JIT log); emit_all then runs only the templates."""
    global _preloaded
    try:
        flashinfer, _ = _flashinfer()
    except TraceUnavailable:
        return  # emit_all says so
    _preloaded = _import_traced(flashinfer)


def _missing_module(e: BaseException) -> str:
    name = getattr(e, "name", None) or ""
    known = {"cutlass": "nvidia-cutlass-dsl (cutlass)", "cuda": "cuda-python (cuda)",
             "cudnn": "nvidia-cudnn-frontend (cudnn)", "tvm_ffi": "apache-tvm-ffi (tvm_ffi)"}
    top = name.partition(".")[0]
    if top in known:
        return f"not-installed: {known[top]}"
    text = str(e)
    for mod, pkg in known.items():
        if f"'{mod}'" in text:
            return f"not-installed: {pkg}"
    if isinstance(e, ModuleNotFoundError) and top:
        return f"not-installed: {top}"
    return f"import-failed: {type(e).__name__}: {text[:300]}"


def var_axis_values(init, size: int) -> dict[str, int]:
    """Keyword arguments for the init's required parameters (its var axes): `size` each, except
    the placeholders whose names fix them."""
    out = {}
    params = inspect.signature(init).parameters
    for name, p in params.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not p.empty:
            continue
        out[name] = _FIXED.get(name, size)
    for name in out:  # `batch_size_plus_1`, `num_experts_plus_one`: derived, one more than their base
        for suffix in ("_plus_1", "_plus_one"):
            if name.endswith(suffix):
                base = name[: -len(suffix)]
                out[name] = (out.get(base) or _default(params.get(base)) or size) + 1
    return out


def _default(p: inspect.Parameter | None) -> int | None:
    return p.default if p is not None and isinstance(p.default, int) and not isinstance(p.default, bool) else None


def _call_kwargs(made: Any) -> dict[str, Any]:
    """The API's keyword arguments from what init returned: wrapper inits return {"plan", "run"}."""
    if not isinstance(made, dict):
        raise TypeError(f"init returned {type(made).__name__}, not a dict of call arguments")
    if set(made) <= {"plan", "run", "init"} and any(isinstance(made.get(k), dict) for k in ("plan", "run")):
        merged: dict[str, Any] = {}
        for k in ("init", "plan", "run"):  # run's arguments win: fi_trace describes the run call
            if isinstance(made.get(k), dict):
                merged.update(made[k])
        return merged
    return dict(made)


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if isinstance(e, ImportError):
        return _missing_module(e)
    if isinstance(e, PermissionError):
        return (f"refused-by-sandbox: {type(e).__name__}: {text[:200]} (the init wanted a file, a process or "
                "the network; the confined worker allows none)")
    if "CUDA" in text or "cuda" in text.split(":")[0] or "NVIDIA driver" in text:
        return f"needs-gpu: {type(e).__name__}: {text[:240]}"
    return f"{type(e).__name__}: {text[:300]}"


_CONSTANT_TYPES = (bool, int, float, str, type(None))


def complete_reference(definition: dict[str, Any], reference_fn: Any) -> list[str]:
    """Add to the definition's reference the helpers it calls but fi_trace left out; return their names.

    fi_trace writes a template's reference with the helpers it was told to inline and drops others that
    its module defines (0.7.2.post1: `_rotate`, `_apply_rope_core`, `_single_prefill_reference`, ...): such
    a file raises NameError when run. Each missing name that the reference function's module binds to a
    plain function (its source) or a literal constant goes in before the entry function (which stays last:
    the entry rule picks the last one), helpers of helpers too. Names nothing binds stay missing, and so
    does everything where an added helper would change which function is the entry point."""
    from ..sandbox.entry import undefined_names  # noqa: PLC0415 - standard library only
    from ..sandbox.static import parse  # noqa: PLC0415

    code = definition.get("reference")
    try:  # `@torch.no_grad()` wraps it: the wrapper's globals are torch's
        scope = getattr(inspect.unwrap(reference_fn), "__globals__", None) if callable(reference_fn) else None
    except ValueError:  # a wrapper cycle
        scope = None
    if not isinstance(code, str) or not isinstance(scope, dict):
        return []
    added: list[str] = []
    for _ in range(16):  # each round adds what the previous round's helpers need
        missing = [n for n in dict.fromkeys(name for _, name in undefined_names(code, None)) if n not in added]
        pieces = []
        for name in missing:
            value = scope.get(name)
            if inspect.isfunction(value) and value.__name__ == name:
                try:
                    pieces.append(textwrap.dedent(inspect.getsource(value)).rstrip())
                except (OSError, TypeError):
                    continue
            elif isinstance(value, _CONSTANT_TYPES) and name in scope:
                pieces.append(f"{name} = {value!r}")
            else:
                continue
            added.append(name)
        if not pieces:
            break
        tree = parse(code)
        last = [n for n in tree.body if isinstance(n, ast.FunctionDef)][-1]
        start = min([last.lineno, *(d.lineno for d in last.decorator_list)]) - 1
        lines = code.splitlines()
        code = "\n".join([*lines[:start], "# ----- helpers inlined by flashinfer-trace import-fi-trace -----",
                          *"\n\n".join(pieces).splitlines(), "", *lines[start:]]) + "\n"
    if added and _entry(code, definition) == _entry(definition["reference"], definition):
        definition["reference"] = code
        return added
    return []  # an added helper would become the entry point (it takes every input): keep the file as written


def restore_params(definition: dict[str, Any], template: Any) -> dict[str, str]:
    """Write back each input's `param` that the template declares but fi_trace leaves out of the file
    (0.7.2.post1 writes `param` on outputs only): `hidden_states` is passed as the API's `input`. Returns
    {input: param} for those written; the `param` rule (docs/definitions.md) then binds them."""
    declared = getattr(template, "inputs", None)
    inputs = definition.get("inputs")
    if not isinstance(declared, dict) or not isinstance(inputs, dict):
        return {}
    restored = {}
    names = [getattr(s, "param", None) for s in declared.values()]
    for name, spec in declared.items():
        param = getattr(spec, "param", None)
        mine = inputs.get(name)
        if (isinstance(param, str) and param != name and isinstance(mine, dict) and "param" not in mine
                and names.count(param) == 1):  # one API parameter split over several inputs is a tuple: no
            mine["param"] = param
            restored[name] = param
    return restored


def _entry(code: str, definition: dict[str, Any]) -> str | None:
    from ..sandbox.entry import entry_point  # noqa: PLC0415

    inputs = definition.get("inputs") if isinstance(definition.get("inputs"), dict) else {}
    specs = {n: s for n, s in inputs.items() if isinstance(s, dict)}
    params = {n: s["param"] for n, s in specs.items() if isinstance(s.get("param"), str)}
    return entry_point(code, list(inputs), params, [n for n, s in specs.items() if s.get("optional") is True]).name


def _emit_one(template, fi_api: str, device: str) -> dict[str, Any]:
    if template.init is None:
        raise LookupError("no-init: the template has no init(), so nothing makes its call arguments")
    fi_trace = template.build_fi_trace_fn(fi_api)
    last: BaseException | None = None
    # fi_trace reads shapes and dtypes only: tensors on the meta device have both and no storage, so the
    # inits' model-sized defaults (MoE weights of many GB) cost nothing. An init that computes values
    # (quantizers, .item()) fails there and runs on `device` next.
    for size in _TRY_SIZES:
        for dev in ("meta", device):
            try:
                kwargs = _call_kwargs(template.init(**var_axis_values(template.init, size), device=dev, seed=0))
                return fi_trace(save_dir=None, **kwargs)
            except Exception as e:  # noqa: BLE001 - a template's init/extractors may raise anything: a result
                if dev == device or last is None:
                    last = e
    assert last is not None
    raise RuntimeError(_reason(last)) from last


def emit_all(op_types: Iterable[str] | None = None, *, device: str = "cpu") -> dict[str, Any]:
    """Every registered (API, template) pair's definition, or why not.

    Returns {"flashinfer_version", "results": [{"fi_api", "label", "op_type", "definition"[, "params",
    "inlined"]} |
    {"fi_api", "label", "op_type", "error"}], "import_failures": {module: reason}}.
    """
    flashinfer, version = _flashinfer()
    wanted = set(op_types) if op_types else None
    os.environ.pop("FLASHINFER_TRACE_DUMP", None)  # fi_trace(save_dir=None) must write nothing
    os.environ.pop("FLASHINFER_TRACE_DUMP_DIR", None)
    import_failures = dict(_preloaded) if _preloaded is not None else _import_traced(flashinfer)
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        from flashinfer.api_logging import _TRACE_REGISTRY  # noqa: PLC0415

        try:
            from flashinfer.api_logging import _trace_fi_api_for  # noqa: PLC0415
        except ImportError:  # older 0.7.x: the tag is module.qualname without aliases
            def _trace_fi_api_for(f):
                return f"{f.__module__}.{f.__qualname__}"

        results = []
        for original, template, label in list(_TRACE_REGISTRY):
            op_type = getattr(template, "op_type", None)
            if wanted is not None and op_type not in wanted:
                continue
            fi_api = _trace_fi_api_for(original)
            entry: dict[str, Any] = {"fi_api": fi_api, "label": str(label), "op_type": op_type}
            try:
                entry["definition"] = _emit_one(template, fi_api, device)
                restored = restore_params(entry["definition"], template)
                if restored:
                    entry["params"] = restored
                inlined = complete_reference(entry["definition"], getattr(template, "reference", None))
                if inlined:
                    entry["inlined"] = inlined
            except Exception as e:  # noqa: BLE001
                entry["error"] = str(e) if isinstance(e, (LookupError, RuntimeError)) else _reason(e)
            results.append(entry)
    return {"flashinfer_version": version, "results": results, "import_failures": import_failures}


def _main(argv: list[str] | None = None) -> int:
    import argparse  # noqa: PLC0415
    import json  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="python -m flashinfer_trace.fitrace.emit", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for <op_type>/<name>.json and the manifest")
    p.add_argument("--op-type", action="append", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--memory-gb", type=float, default=6.0,
                   help="address-space limit for this process (an init that allocates more fails, as a result)")
    p.add_argument("--unconfined", action="store_true",
                   help="required: this runs FlashInfer's template code in this process, unconfined")
    a = p.parse_args(argv)
    if not a.unconfined:
        p.error("pass --unconfined to run the templates in this process "
                "(`flashinfer-trace import-fi-trace` runs them in the confined worker)")
    import resource  # noqa: PLC0415

    limit = int(a.memory_gb * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    try:
        emitted = emit_all(a.op_type, device=a.device)
    except TraceUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    from .layout import write_layout  # noqa: PLC0415 - standard library only, like this module

    manifest = write_layout(emitted, Path(a.out))
    print(json.dumps({k: manifest[k] for k in ("flashinfer_version", "count", "failed")}))
    return 0


if __name__ == "__main__":
    sys.exit(_main())


# -- the confined worker's task -----------------------------------------------------------------
def run(msg: dict, device: str = "cpu") -> dict:
    """The worker task (sandbox/worker.py): this emitter runs the installed FlashInfer's trace templates and their
    init() here, confined: FlashInfer's template code is third-party code like a reference. The answer is
    JSON the parent checks (fitrace/layout.py); nothing is written here (the worker cannot write).
    `device`: this worker's (inits that compute values run there after the meta device)."""
    op_types = msg.get("op_types")
    if op_types is not None and not (isinstance(op_types, list) and all(isinstance(t, str) for t in op_types)):
        return {"error": {"kind": "protocol", "message": "op_types must be a list of strings"}}
    try:
        return {"ok": emit_all(op_types or None, device=device)}
    except TraceUnavailable as e:
        return {"error": {"kind": "unavailable", "message": str(e)}}
    except Exception as e:  # noqa: BLE001 - whatever FlashInfer's import raises, as a message
        return {"error": {"kind": "raised", "type": type(e).__name__, "message": str(e)[:2000], "line": None}}

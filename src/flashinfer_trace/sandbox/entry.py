"""Which function of a reference runs and how it is called (the entry point rule, docs/definitions.md), read from
its source without running it; and the names a reference reaches but never defines or imports. The allowlist
over the same source is static.py's."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterable
from dataclasses import dataclass

from .static import parse


def run_parameters(code: str, entry: str = "run") -> list[str] | None:
    """The plain positional parameters of the last top-level `def <entry>`; None when there is no such
    function, it takes *args / **kwargs / keyword-only / positional-only ones, or the code does not parse."""
    try:
        tree = parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry]
    if not defs:
        return None
    a = defs[-1].args
    if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs:
        return None
    return [p.arg for p in a.args]


class _Unevaluated:
    """A parameter's default as `entry_signature` gives it: the expression stays unevaluated in the parent
    (only the worker runs a reference's code); the worker's function applies the real default."""

    def __repr__(self) -> str:
        return "<default>"


UNEVALUATED = _Unevaluated()


def entry_signature(code: str, entry: str = "run") -> inspect.Signature | None:
    """The parameter list of the top-level `def <entry>` in `code`, read from the AST (never run): names,
    kinds (positional-only, keyword-only, *args, **kwargs) and which have a default (UNEVALUATED), so a
    caller can bind arguments exactly as calling the function would. None when the code does not parse,
    or `entry` is bound other than by top-level `def`s (an assignment, an import, a nested definition):
    then which function the name ends up as is not readable statically."""
    try:
        tree = parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    top = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry]
    for node in ast.walk(tree):
        binds = (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == entry
                 or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == entry
                 and node not in top
                 or isinstance(node, ast.alias) and (node.asname or node.name.partition(".")[0]) == entry
                 or isinstance(node, (ast.Global, ast.Nonlocal)) and entry in node.names
                 or isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name == entry
                 or isinstance(node, ast.MatchMapping) and node.rest == entry)
        if binds:
            return None
    if not top:
        return None
    a = top[-1].args
    kind = inspect.Parameter
    positional = [(p, kind.POSITIONAL_ONLY) for p in a.posonlyargs] + [(p, kind.POSITIONAL_OR_KEYWORD) for p in a.args]
    first_default = len(positional) - len(a.defaults)
    params = [kind(p.arg, k, default=UNEVALUATED if i >= first_default else kind.empty)
              for i, (p, k) in enumerate(positional)]
    if a.vararg:
        params.append(kind(a.vararg.arg, kind.VAR_POSITIONAL))
    params += [kind(p.arg, kind.KEYWORD_ONLY, default=kind.empty if d is None else UNEVALUATED)
               for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    if a.kwarg:
        params.append(kind(a.kwarg.arg, kind.VAR_KEYWORD))
    try:
        return inspect.Signature(params)
    except ValueError:  # not reachable for code that parses; never a crash of the caller
        return None


@dataclass(frozen=True)
class Entry:
    """The function a reference is called through: `name`, or None and `problem` saying why none is.

    For an fi_trace entry point (`by_name`), `keywords` maps each input it takes to the keyword it is
    passed as (its own name, or its documented `param`), and `ignored` lists the inputs it does not
    take: call-site parameters of the API that the reference ignores (never passed to it)."""

    name: str | None
    problem: str | None = None
    by_name: bool = False  # the inputs are passed by keyword (an fi_trace entry point), not by position
    keywords: tuple[tuple[str, str], ...] = ()  # (input, keyword) in input order; only when by_name
    ignored: tuple[str, ...] = ()
    renamed: tuple[tuple[str, str], ...] = ()  # (input, parameter) bound by position (rule 4)

    @property
    def mapped(self) -> list[tuple[str, str]]:
        """(input, keyword) pairs where the keyword is the input's `param`, not its name."""
        return [(i, k) for i, k in self.keywords if i != k]


def _keywords(fn: ast.FunctionDef, inputs: list[str], params: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """({input: keyword it is passed as}, inputs it cannot take). An input is taken by a parameter of its
    own name; else by one named as its documented `param` (that no other input takes by name); else by
    `**kwargs` under its own name."""
    a = fn.args
    by_name = {p.arg for p in a.args + a.kwonlyargs}
    taken: dict[str, str] = {}
    unaccepted: list[str] = []
    for n in inputs:
        alias = params.get(n)
        if n in by_name:
            taken[n] = n
        elif alias is not None and alias in by_name and alias not in inputs:
            taken[n] = alias
        elif a.kwarg is not None:
            taken[n] = n
        else:
            unaccepted.append(n)
    return taken, unaccepted


def _accepts(fn: ast.FunctionDef, inputs: list[str],
             params: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """(inputs it cannot take by name, its required parameters that no input is passed as)."""
    a = fn.args
    taken, unaccepted = _keywords(fn, inputs, params or {})
    positional = a.posonlyargs + a.args
    required = [p.arg for p in positional[:len(positional) - len(a.defaults)]]
    required += [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None]
    posonly = {p.arg for p in a.posonlyargs}
    passed = set(taken.values())
    missing = [p for p in required if p not in passed or p in posonly]
    return unaccepted, missing


def entry_point(code: str, inputs: list[str], params: dict[str, str] | None = None,
                optional: Iterable[str] = ()) -> Entry:
    """The reference's entry point, parsed (never run). The rule (docs/definitions.md):

    1. a top-level `run`, called with the inputs by position (the public format);
    2. else the one top-level function that takes every input by name (a parameter of that name, one
       named as the input's documented `param`, or `**kwargs`) and requires nothing else: FlashInfer's
       fi_trace names its reference after the template (`_rmsnorm_reference`) and inlines helper
       functions before it; it is called by keyword;
    3. else the last top-level function, if it requires nothing that is not an input, takes at least one
       input, and every input it does not take is `optional`: those are call-site parameters of the API
       that the reference ignores (`ignored`; never passed to it; validate notes them);
    4. else the last one, if its positional parameters line up one to one with the inputs, and the only one
       it requires that is no input is its first, while no parameter takes the first input
       (`_gemma_rmsnorm_reference(input, weight)` for inputs `hidden_states`, `weight`): the template
       renamed the API's first parameter and the reference kept its name (`renamed`; noted);
    5. else none, and `problem` says why (no function, several candidates, or what the last one lacks).
    `params`: input name -> its `param` field (the API parameter it is passed as), where it has one;
    `optional`: the inputs marked `"optional": true` (only those may be ignored).
    """
    params = params or {}
    optional = set(optional)
    try:
        tree = parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return Entry(None, "the reference does not parse")
    defs: dict[str, ast.FunctionDef] = {}
    for n in tree.body:
        if isinstance(n, ast.FunctionDef):
            defs.pop(n.name, None)
            defs[n.name] = n  # the last definition of a name wins, and keeps its place last
    if "run" in defs:
        return Entry("run")
    if not defs:
        return Entry(None, "the reference defines no top-level function (expected run(), or one function "
                           "taking the inputs by name)")

    def entry(name: str, renamed: dict[str, str] | None = None) -> Entry:
        taken, unaccepted = _keywords(defs[name], inputs, {**params, **(renamed or {})})
        return Entry(name, by_name=True, keywords=tuple(taken.items()), ignored=tuple(unaccepted),
                     renamed=tuple((renamed or {}).items()))

    fits = [name for name, fn in defs.items() if _accepts(fn, inputs, params) == ([], [])]
    if len(fits) == 1:
        return entry(fits[0])
    if fits and fits[-1] == list(defs)[-1]:
        # fi_trace inlines the reference's helpers before it ("# ----- reference -----"): the last wins
        return entry(fits[-1])
    if fits:
        return Entry(None, f"no run(), and {len(fits)} top-level functions take the inputs by name "
                           f"({', '.join(fits)}): which one is the reference is ambiguous")
    last = list(defs.values())[-1]
    unaccepted, missing = _accepts(last, inputs, params)
    if not missing and len(unaccepted) < len(inputs) and set(unaccepted) <= optional:
        return entry(last.name)  # rule 3: the inputs it does not take are ignored call-site parameters
    renamed = _renamed(last, inputs, params, missing)
    if renamed:
        unaccepted, missing = _accepts(last, inputs, {**params, **renamed})
        if not missing and set(unaccepted) <= optional:
            return entry(last.name, renamed)  # rule 4: a parameter renamed in place
    why = "; ".join(x for x in (
        f"it has no parameter for input(s) {', '.join(unaccepted)}" + _optional_hint(unaccepted, optional)
        if unaccepted else "",
        f"it requires {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not an input"
        + _param_hint(missing, inputs, params) if missing else "") if x)
    return Entry(None, f"no run(), and no top-level function takes the inputs by name; the last one, "
                       f"{last.name}(), does not fit: {why}")


def _renamed(fn: ast.FunctionDef, inputs: list[str], params: dict[str, str], missing: list[str]) -> dict[str, str]:
    """{first input: first parameter} where the first parameter is the one required parameter no input is
    passed as, the first input is taken by no parameter, and the positional parameters line up one to one
    with the inputs; else {}. Only the first: a template names the API's `input` after what it holds
    (`hidden_states`); anywhere else a position is too weak a reason (a `return_lse` is no `workspace`)."""
    positional = [p.arg for p in fn.args.args]
    if (fn.args.posonlyargs or len(positional) != len(inputs) or missing != positional[:1]
            or inputs[0] in set(positional) | {p.arg for p in fn.args.kwonlyargs} | set(params.values())
            or inputs[0] in params):
        return {}
    return {inputs[0]: positional[0]}


def _optional_hint(unaccepted: list[str], optional: set[str]) -> str:
    required = [n for n in unaccepted if n not in optional]
    if not required:
        return ""
    return f" ({', '.join(required)} not marked \"optional\", so not an ignorable call-site parameter)"


def _param_hint(missing: list[str], inputs: list[str], params: dict[str, str]) -> str:
    """Why a required parameter is no input: say so where no input documents it as its `param`."""
    if any(params.get(i) in missing for i in inputs):
        return ""  # an input names it as its param but another input takes that name (reported above)
    return " (nor any input's \"param\"), and it has no default"


def _annotations(fn: ast.FunctionDef) -> list[ast.expr]:
    a = fn.args
    found = [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
             if x is not None and x.annotation is not None]
    return found + ([fn.returns] if fn.returns is not None else [])


def _loads(node: ast.AST, skip: set[int]) -> list[ast.Name]:
    """Names read under `node`, leaving out the subtrees in `skip` (by id)."""
    out: list[ast.Name] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in skip:
            continue
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            out.append(n)
        stack.extend(ast.iter_child_nodes(n))
    return out


def undefined_names(code: str, entry: str | None) -> list[tuple[str, str]]:
    """(function, name) for each name that a function reachable from `entry` (None: every top-level
    function) reads but that nothing binds:
    no parameter or assignment of its own, no top-level definition or import, no builtin. Such a reference
    raises NameError when called (fi_trace leaves some helpers out of the file it writes). Annotations count
    only where they are evaluated (no `from __future__ import annotations`)."""
    import builtins

    try:
        tree = parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    lazy = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in tree.body)
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    module = set(dir(builtins))
    for n in tree.body:
        if isinstance(n, ast.FunctionDef):
            module.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            module.update((a.asname or a.name).split(".")[0] for a in n.names)
        else:
            module.update(x.id for x in ast.walk(n) if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Store))
    found: list[tuple[str, str]] = []
    todo = [entry] if entry is not None else list(defs)[::-1]
    seen = set(todo)
    while todo:
        fn = defs.get(todo.pop())
        if fn is None:
            continue
        own: set[str] = set()  # everything bound anywhere inside it (nested functions included): lenient
        skip: set[int] = {id(x) for x in _annotations(fn)} if lazy else set()
        for x in ast.walk(fn):
            if isinstance(x, ast.arg):
                own.add(x.arg)
            elif isinstance(x, ast.Name) and isinstance(x.ctx, (ast.Store, ast.Del)):
                own.add(x.id)
            elif isinstance(x, ast.FunctionDef) and x is not fn:
                own.add(x.name)
                if lazy:
                    skip.update(id(y) for y in _annotations(x))
            elif isinstance(x, ast.Import | ast.ImportFrom):
                own.update((a.asname or a.name).split(".")[0] for a in x.names)
            elif isinstance(x, ast.ExceptHandler) and x.name:
                own.add(x.name)
            elif isinstance(x, ast.AnnAssign) and lazy:
                skip.add(id(x.annotation))
        for name in _loads(fn, skip):
            if name.id in own:
                continue
            if name.id in defs and name.id not in seen:
                seen.add(name.id)
                todo.append(name.id)
            elif name.id not in module and (fn.name, name.id) not in found:
                found.append((fn.name, name.id))
    return found

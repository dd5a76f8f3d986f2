"""The package's modules import one another in one direction (definitions -> inputs -> reference |
ground truth -> verdict -> engine -> results -> matrix): no import cycle, counting function-local
imports too (a local import hides a cycle from Python, not from the design). Imports under
`if TYPE_CHECKING:` are annotations only and are not counted."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "flashinfer_trace"


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every import statement, at any depth, outside `if TYPE_CHECKING:` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            stack.append(child)


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in modules}
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    found = set()
    for alias in node.names:
        if f"{mod}.{alias.name}" in modules:
            found.add(f"{mod}.{alias.name}")  # `from pkg import submodule`
        elif mod in modules:
            found.add(mod)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        deps: set[str] = set()
        for node in _imports(tree):
            deps |= _targets(name, path.name == "__init__.py", node, modules)
        graph[name] = deps - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50  # the whole package was read
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(
        " <-> ".join(c) + "\n    " + "\n    ".join(f"{m} -> {sorted(d & set(c))}" for m in c for d in [graph[m]])
        for c in found)


def test_the_guard_sees_function_local_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n")
    graph = import_graph(pkg)
    assert graph["pkg.b"] == {"pkg.a"} and graph["pkg.c"] == set()
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


@pytest.mark.parametrize("leaf", ["flashinfer_trace.status", "flashinfer_trace.results.record"])
def test_the_vocabulary_is_a_leaf(leaf):
    """The status vocabulary and the record are read by every layer: they import none of them."""
    allowed = {"flashinfer_trace.status"}
    assert import_graph()[leaf] <= allowed


def test_the_noxfile_imports_need_no_pydantic_or_torch():
    """nox runs in an environment of its own (on an offline node: nox and packaging only): what the noxfile
    imports of the package stays on the standard library and packaging."""
    import subprocess
    import sys

    code = ("import sys, builtins\n"
            "real = builtins.__import__\n"
            "def guard(name, *a, **k):\n"
            "    if name.split('.')[0] in ('pydantic', 'torch', 'rich'):\n"
            "        raise ImportError(f'the noxfile pulled in {name}')\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = guard\n"
            "sys.argv = ['noxfile']\n"
            "import runpy\n"
            "ns = runpy.run_path('noxfile.py')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parents[1], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


@pytest.mark.parametrize("engine", ["flashinfer_trace.check", "flashinfer_trace.memo"])
def test_the_engine_does_not_reach_up_into_the_sweep(engine):
    """The engine reads and writes records through results/ alone, and what it needs of the JIT prebuild's report
    comes in through its config (CheckConfig.prebuild_lookup, set by the CLI or the pytest plugin)."""
    up = sorted(m for m in _reaches(import_graph(), engine) if m.startswith(("flashinfer_trace.sweep",
                                                                              "flashinfer_trace.cli",
                                                                              "flashinfer_trace.matrix")))
    assert not up, f"{engine} reaches {up}"

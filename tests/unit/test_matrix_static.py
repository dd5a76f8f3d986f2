"""Lint the page's own CSS and JavaScript (matrix/static/), which no Python linter looks at.

The JavaScript must parse (``node --check``; skipped, naming it, where node is absent). The CSS gets a structural
check with the standard library (no CSS parser is a dependency of this project): comments and strings are set
aside, braces, brackets and parentheses balance, every rule has a selector list with no empty member and a body of
well-formed ``property: value`` declarations, and every ``var(--x)`` names a custom property that is defined.
"""

from __future__ import annotations

import importlib.resources
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from flashinfer_trace.matrix import render_html

STATIC = Path(render_html.__file__).parent / "static"
PROPERTY = re.compile(r"^(--[A-Za-z0-9_-]+|-?[a-z][a-z0-9-]*)$")
PAIRS = {"(": ")", "[": "]", "{": "}"}


def _mask(css: str) -> str:
    """The CSS with comments blanked and string contents replaced by 'x', so punctuation inside them is not read."""
    out, i = [], 0
    while i < len(css):
        if css.startswith("/*", i):
            end = css.find("*/", i + 2)
            assert end >= 0, f"unclosed comment at offset {i}"
            out.append(" " * (end + 2 - i))
            i = end + 2
        elif css[i] in "\"'":
            quote, j = css[i], i + 1
            while j < len(css) and css[j] != quote:
                assert css[j] != "\n", f"string broken by a newline at offset {i}"
                j += 2 if css[j] == "\\" else 1
            assert j < len(css), f"unclosed string at offset {i}"
            out.append(quote + "x" * (j - i - 1) + quote)
            i = j + 1
        else:
            out.append(css[i])
            i += 1
    return "".join(out)


def _check_balanced(css: str) -> None:
    stack: list[tuple[str, int]] = []
    for i, c in enumerate(css):
        if c in PAIRS:
            stack.append((c, i))
        elif c in PAIRS.values():
            assert stack and PAIRS[stack[-1][0]] == c, f"unbalanced {c!r} at offset {i}"
            stack.pop()
    assert not stack, f"unclosed {stack[-1][0]!r} at offset {stack[-1][1]}"


def _rules(css: str) -> list[tuple[str, str]]:
    """(selector list, body) of every style rule, descending into the blocks of @-rules such as @media."""
    rules, i = [], 0
    while True:
        open_ = css.find("{", i)
        if open_ < 0:
            assert not css[i:].strip(), f"text after the last rule: {css[i:].strip()[:40]!r}"
            return rules
        prelude = css[i:open_].strip()
        depth, j = 1, open_ + 1
        while depth:
            depth += {"{": 1, "}": -1}.get(css[j], 0)
            j += 1
        body = css[open_ + 1:j - 1]
        if prelude.startswith("@"):
            rules.extend(_rules(body))
        else:
            assert "}" not in prelude and ";" not in prelude, f"stray text before {prelude!r}"
            rules.append((prelude, body))
        i = j


def _declarations(body: str) -> list[tuple[str, str]]:
    out = []
    for decl in body.split(";"):
        if not decl.strip():
            continue
        name, sep, value = decl.partition(":")
        assert sep, f"declaration without ':': {decl.strip()!r}"
        out.append((name.strip(), value.strip()))
    return out


def test_static_files_are_package_data():
    """The page reads them through importlib.resources, so they must ship with the package (pyproject.toml)."""
    for name in ("matrix.css", "matrix.js"):
        assert importlib.resources.files("flashinfer_trace.matrix").joinpath("static", name).is_file()
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert '"matrix/static/*.css"' in pyproject and '"matrix/static/*.js"' in pyproject


def _check_css(text: str) -> int:
    """Fail with the first problem found in ``text``; return how many style rules it has."""
    css = _mask(text)
    _check_balanced(css)
    rules = _rules(css)
    defined, used = set(), set()
    for selectors, body in rules:
        assert all(s.strip() for s in selectors.split(",")), f"empty selector in {selectors!r}"
        declarations = _declarations(body)
        assert declarations, f"rule {selectors!r} declares nothing"
        for name, value in declarations:
            assert PROPERTY.match(name), f"{selectors!r}: bad property name {name!r}"
            assert value, f"{selectors!r}: {name} has no value"
            if name.startswith("--"):
                defined.add(name)
            used.update(re.findall(r"var\(\s*(--[A-Za-z0-9_-]+)", value))
    assert used <= defined, f"var() of undefined custom properties: {sorted(used - defined)}"
    return len(rules)


def test_css_is_well_formed():
    assert _check_css((STATIC / "matrix.css").read_text(encoding="utf-8")) > 20


@pytest.mark.parametrize("css, problem", [
    ("a { color: red; ", "unclosed"),
    ("a { color: red; } }", "unbalanced"),
    ("a { font-family: \"x}\" ; } b { color: red }", None),
    ("/* a { */ b { color: red; }", None),
    ("@media (max-width: 1px) { a { color: red; } }", None),
    (", a { color: red; }", "empty selector"),
    ("a { }", "declares nothing"),
    ("a { color red; }", "without ':'"),
    ("a { color: ; }", "has no value"),
    ("a { 1color: red; }", "bad property name"),
    ("a { color: var(--nope); }", "undefined custom"),
    ("a { font-family: \"x; }", "string broken|unclosed string"),
])
def test_css_check_is_real(css, problem):
    """Each mistake the check claims to catch fails it; comments, strings and @media blocks do not."""
    if problem is None:
        assert _check_css(css) >= 1
    else:
        with pytest.raises(AssertionError, match=problem):
            _check_css(css)


def test_js_parses():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: cannot check static/matrix.js")
    result = subprocess.run([node, "--check", str(STATIC / "matrix.js")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


def test_js_check_is_real(tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    broken = tmp_path / "broken.js"
    broken.write_text("(function () { var x = ; })();\n", encoding="utf-8")
    assert subprocess.run([node, "--check", str(broken)], capture_output=True, timeout=60).returncode != 0

"""Text a definition controls, escaped for where it is written (docs/sandbox.md, "Output a definition controls").

A definition is third-party input, and so is everything that quotes it: its name, description and reference,
the problems and errors about it, test messages, the results folders a matrix is built from. Every writer
passes such text through the one function for its medium, here:

    for_terminal  plain text to a terminal
    for_rich      the same, inside a string rich reads as markup
    for_markdown  a Markdown table cell or list item (code=True: a code span)
    for_xml       XML 1.0 character data or an attribute value (ElementTree escapes & < > " itself)

Control characters are shown, never sent: ESC becomes the four characters `\\x1b`, so an OSC 52 clipboard
write, an OSC 8 hyperlink, a screen clear or a cursor move prints as text. Standard library only at import:
the noxfile imports sweep.results (for_xml) without the package's dependencies.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["for_markdown", "for_rich", "for_terminal", "for_xml"]

# What a terminal acts on or that hides text: C0 (\n and \t are separate), DEL, C1 (\x9b is a one-byte CSI,
# \x9d an OSC), the Unicode line/paragraph separators, bidi embeddings, overrides and isolates (they
# reorder what is shown: "Trojan Source"), and lone surrogates (they cannot be encoded: printing one crashes).
_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_CONTROL_LINE = re.compile(f"[\n\t{_UNSAFE}]")  # one line: a newline could forge a line of output
_CONTROL_TEXT = re.compile(f"[{_UNSAFE}]")  # multi-line text printed on purpose (a reference, a traceback)
# XML 1.0 allows none of C0 but \t \n \r, no surrogate, not U+FFFE/U+FFFF; DEL and C1 it allows but
# discourages (a CI page may print the message to a terminal): all shown as escapes.
_XML_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def for_terminal(value: Any, *, multiline: bool = False) -> str:
    """`value` as text that prints as written: control characters become `\\xNN` / `\\uNNNN`. A newline or
    tab is kept only with `multiline=True` (a reference, a description, an error's several lines); in a name,
    a path or a one-line message it is escaped too, so the text cannot start a forged line of output."""
    return (_CONTROL_TEXT if multiline else _CONTROL_LINE).sub(_visible, str(value))


def for_rich(value: Any, *, multiline: bool = False) -> str:
    """for_terminal, then escaped for rich markup: a `[bold]` or `[link=...]` in a definition prints as
    written instead of styling the output or making a hidden link (`x[:, :I]` is not swallowed either)."""
    from rich.markup import escape  # here: rich is a dependency of the CLI, not of this module's importers

    return escape(for_terminal(value, multiline=multiline))


# What could make a link or image ([, ]), raw HTML or an autolink (<, >), an entity (&), a code span (`) or a
# new cell (|) gets a backslash (CommonMark's escape, which GFM also honours for | inside a table), and the
# backslash itself one; emphasis (*, _) is left alone: it changes how text looks, never where it leads.
_MD_TEXT = {c: "\\" + c for c in "\\|[]`<>&"} | {"\n": " "}
_MD_TEXT_RE = re.compile("[" + re.escape("".join(_MD_TEXT)) + "]")


def for_markdown(value: Any, *, code: bool = False) -> str:
    """`value` for one Markdown table cell or list item, shown as written: no link, image, HTML tag or
    entity it contains takes effect, a `|` does not end the cell and a newline (a space here) does not end
    the row. Control characters are escaped as for the terminal. `code=True` gives a whole code span
    (`` `name` ``): inside one only a backtick, a pipe and a newline matter, so the rest stays unescaped
    and the fence is longer than any run of backticks in the text. (A bare URL is still made a link by
    GitHub's autolinking, but it shows its address: no text hides where it goes.)"""
    text = for_terminal(str(value).replace("\r\n", "\n").replace("\t", " "), multiline=True)
    # GFM splits a table row before it parses code spans, and there `\\|` is a backslash and a cell border:
    # text with both is shown as escaped text rather than risk it
    if not code or ("|" in text and "\\" in text):
        return _MD_TEXT_RE.sub(lambda m: _MD_TEXT[m.group()], text)
    text = text.replace("\n", " ").replace("|", "\\|")
    if not text:
        return ""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def for_xml(value: Any) -> str:
    """`value` as text XML 1.0 can hold: a character it forbids (ESC in a test message, a lone surrogate
    from a file name) is shown as `\\xNN` / `\\uNNNN` instead of making junit.xml unparseable."""
    return _XML_FORBIDDEN.sub(_visible, str(value))

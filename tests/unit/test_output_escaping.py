"""Output a definition controls (docs/sandbox.md): a definition, and every result or error that quotes it, is
third-party text. On a terminal its control sequences print as text (no OSC 52 clipboard write, OSC 8 link,
screen clear, cursor move, C1 sequence), rich markup in it prints as written, in Markdown it makes no link,
image, HTML or extra table cell, in junit.xml it cannot make the file unparseable, and a definition file
that is a symlink out of the definitions root is neither read nor quoted."""

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from flashinfer_trace.check import CheckConfig
from flashinfer_trace.check import discover as check_discover
from flashinfer_trace.cli import definitions, main
from flashinfer_trace.dataset import Dataset, load_path
from flashinfer_trace.escape import for_markdown, for_rich, for_terminal, for_xml
from flashinfer_trace.matrix import build, render_md
from flashinfer_trace.sweep.results import SessionInfo, TestRecord, junit_xml, write_session
from flashinfer_trace.validate import DefinitionError, link_out_of_root, validate_paths

# one of each class of escape sequence; none contains "/" or NUL, so each can also be a file name
SEQUENCES = {
    "osc52-clipboard": "\x1b]52;c;cm0gLXJmIH4K\x07",
    "osc8-link": "\x1b]8;;mailto:a@evil.example\x1b\\click me\x1b]8;;\x1b\\",
    "screen-clear": "\x1b[2J\x1b[3J\x1bc",
    "csi-cursor": "\x1b[1A\x1b[2K\x1b[31mall tests passed\x1b[0m",  # up a line, erase it, write over it
    "c1": "\x9b2J\x9d52;c;cm0gLXJmIH4K\x9c\x85",  # 8-bit CSI, OSC, ST and NEL
}
RAW = "\x1b\x07\x9b\x9c\x9d\x85"


def shown(text: str) -> str:
    """How the text must print: each C0/C1 character as its \\xNN escape."""
    return "".join(f"\\x{ord(c):02x}" if ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f else c for c in text)


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def session_results(root: Path, folder: str, records: list[TestRecord], *, definition: str = "rmsnorm_h8",
                    label_pin: str = "0.6.6") -> Path:
    info = SessionInfo(folder, "cu130-fi066", status="tests-failed", arch="sm90", finished="2026-11-22T11:00:00")
    manifest = {"combination": {"id": "cu130-fi066", "cuda": "13", "pins": {"torch": "2.11.0",
                                                                             "flashinfer-python": label_pin}}}
    write_session(root / folder, info, records=records, manifest=manifest)
    return root


# -- the terminal: one test per class of sequence -----------------------------------------------------------
@pytest.mark.parametrize("kind", SEQUENCES)
def test_terminal_sequences_print_as_text(kind, capsys, valid, write_def, tmp_path, monkeypatch):
    seq = SEQUENCES[kind]
    assert for_terminal(seq) == shown(seq)
    console = Console(width=400, soft_wrap=True, emoji=False, force_terminal=True)
    with console.capture() as printed:
        console.print(for_rich(f"{seq} end"), highlight=False)
    assert printed.get() == f"{shown(seq)} end\n"
    monkeypatch.setattr(definitions, "out", Console(width=400, soft_wrap=True, emoji=False))
    # show: the description, printed on purpose as multi-line text, still escapes every control character
    valid["description"] = f"before {seq} after"
    defs = write_def(valid).parent
    code, out, err = run_cli(capsys, "show", "rmsnorm_h8", "--definitions", str(defs))
    assert code == 0, err
    assert f"before {shown(seq)} after" in out and not any(c in out for c in RAW)
    # validate: a file name is the definition's text too
    bad = tmp_path / "named"
    bad.mkdir()
    (bad / f"x{seq}.json").write_text(json.dumps(valid))
    code, out, _ = run_cli(capsys, "validate", str(bad))
    assert code == 1 and f"x{shown(seq)}.json" in out and not any(c in out for c in RAW)
    # matrix build: a results folder's name is the results' text, and the problems with it are printed
    results = tmp_path / "results"
    (results / f"s{seq}").mkdir(parents=True)
    (results / f"s{seq}" / "session.json").write_text("{not json")
    code, out, err = run_cli(capsys, "matrix", "build", str(results), "-o", str(tmp_path / "m"), "--definitions",
                             str(defs), "--constraints", "", "--known-issues", "")
    assert code == 0 and f"s{shown(seq)}" in err and not any(c in out + err for c in RAW)
    assert f"s{shown(seq)}" in (tmp_path / "m" / "matrix.md").read_text()


def test_a_newline_in_a_file_name_cannot_forge_a_line(capsys, valid, tmp_path):
    (tmp_path / "x\n✓ nothing to see.json").write_text(json.dumps(valid))
    code, out, _ = run_cli(capsys, "validate", str(tmp_path))
    assert code == 1 and "x\\x0a✓ nothing to see.json" in out
    assert not any(line.startswith("✓") for line in out.splitlines())
    assert for_terminal("a\tb\nc") == "a\\x09b\\x0ac" and for_terminal("a\tb\nc", multiline=True) == "a\tb\nc"
    assert for_terminal("\u202eevil\u2066 \ud800") == "\\u202eevil\\u2066 \\ud800"  # bidi reordering, surrogates


# -- rich markup ---------------------------------------------------------------------------------------------
def test_rich_markup_and_links_in_a_definition_print_as_written(capsys, valid, write_def, monkeypatch):
    hostile = "x[:, :I] [link=https://evil.example]click[/link] [bold red]loud[/] \\[/] [/] end"
    console = Console(width=400, soft_wrap=True, emoji=False, force_terminal=True, color_system="truecolor")
    monkeypatch.setattr(definitions, "out", console)
    valid["description"] = hostile
    valid["inputs"]["weight"]["description"] = "[link=https://evil.example]w[/link]"
    code, out, err = run_cli(capsys, "show", "rmsnorm_h8", "--definitions", str(write_def(valid).parent))
    assert code == 0, err
    assert "\x1b]8;" not in out  # rich made no hyperlink
    plain = Console(width=400, soft_wrap=True, emoji=False, file=None)
    with plain.capture() as cap:
        plain.print(for_rich(hostile))
    assert cap.get() == hostile + "\n"
    assert "https://evil.example]click[/link]" in out and "[bold red]loud[/]" in out
    assert for_rich("[link=x]a[/link]\x1b") == "\\[link=x]a\\[/link]\\x1b"


# -- Markdown ------------------------------------------------------------------------------------------------
def test_markdown_table_break_link_and_html_stay_text(tmp_path, capsys):
    md_it = pytest.importorskip("markdown_it")
    name = "gemm`|` <b>x</b>"
    reason = ("Mismatch | forged cell\n| forged | row | [click](https://evil.example) ![i](https://evil.example/i.png) "
              "<img src=x onerror=alert(1)> <script>alert(1)</script> \\| \x1b]52;c;eA==\x07")
    records = [TestRecord(f"tests/references/test_gemm.py::test_matches_ground_truth[small-0-{name}-flashinfer]",
                          "failed", 0.1, reason, {"definition": name, "source": "flashinfer"})]
    results = session_results(tmp_path / "results", "references-x", records, label_pin="0.6.6 <i>[l](u)</i> |")
    assert main(["matrix", "build", str(results), "-o", str(tmp_path / "m"), "--definitions", str(tmp_path),
                 "--constraints", "", "--known-issues", ""]) == 0
    capsys.readouterr()
    for text in (render_md(build([results])), (tmp_path / "m" / "matrix.md").read_text()):
        html = md_it.MarkdownIt("commonmark").enable("table").render(text)
        assert "<a " not in html and "<img" not in html and "<script" not in html and "<b>" not in html
        assert "<i>" not in html and "\x1b" not in html and "\x07" not in html
        for table in re.findall("<table>.*?</table>", html, re.S):  # every row as many cells as its header
            head = len(re.findall("<th[ >]", table.split("</thead>")[0]))
            rows = re.findall("<tr>(.*?)</tr>", table.split("</thead>")[1], re.S)
            assert rows and all(len(re.findall("<td[ >]", row)) == head for row in rows), table
        assert "<code>gemm`|` &lt;b&gt;x&lt;/b&gt;</code>" in html  # the name, whole, in its code span
    assert for_markdown("a|b [c](d) <e> `f` \\") == "a\\|b \\[c\\](d) \\<e\\> \\`f\\` \\\\"
    assert for_markdown("x`y|z", code=True) == "``x`y\\|z``"


# -- JUnit XML -----------------------------------------------------------------------------------------------
def test_junit_xml_with_control_characters_stays_well_formed(tmp_path):
    message = "Mismatch \x1b[31mred\x1b[0m \x00\x08\x0b\x0c\x1f \ud800 \ufffe\uffff \x9b tab\tnewline\n end"
    records = [TestRecord("tests/a.py::test_x[\x1b]52;c;eA==\x07]", "failed", 0.1, message,
                          {"definition": "d\x01", "note\x02": "v\x03"}),
               TestRecord("tests/a.py::test_skip", "skipped", 0.0, "skip \x1b[2J")]
    write_session(tmp_path, SessionInfo("s\x1b", "c"), records=records)
    root = ET.parse(tmp_path / "junit.xml").getroot()  # parses: no character XML 1.0 forbids
    suite = root.find("testsuite")
    assert suite.get("name") == "s\\x1b"
    case = suite.find("testcase")
    assert case.get("name") == "test_x[\\x1b]52;c;eA==\\x07]"
    failure = case.find("failure")
    assert failure.text == ("Mismatch \\x1b[31mred\\x1b[0m \\x00\\x08\\x0b\\x0c\\x1f \\ud800 \\ufffe\\uffff \\x9b "
                            "tab\tnewline\n end")
    assert {p.get("name"): p.get("value") for p in case.iter("property")} == {"definition": "d\\x01",
                                                                            "note\\x02": "v\\x03"}
    assert suite.findall("testcase")[1].find("skipped").get("message") == "skip \\x1b[2J"
    assert ET.fromstring(junit_xml(records, "s")) is not None
    assert for_xml("a\x1b\tb\r\n") == "a\\x1b\tb\r\n"


# -- a symlink out of the definitions root -----------------------------------------------------------------
SECRET = "SECRET-7f3a-do-not-print"


def test_a_symlink_out_of_the_definitions_root_is_refused_unread(capsys, valid, tmp_path):
    outside = tmp_path / "home" / "config.json"
    outside.parent.mkdir()
    outside.write_text(json.dumps({**valid, "name": SECRET, "description": SECRET}))
    root = tmp_path / "definitions"
    (root / "rmsnorm").mkdir(parents=True)
    (root / "rmsnorm" / "rmsnorm_h8.json").write_text(json.dumps(valid))
    link = root / "rmsnorm" / "evil.json"
    link.symlink_to(outside)

    reports, summary = validate_paths([root])
    problems = [p for r in reports for p in r.problems]
    assert [(Path(p.file).name, p.kind) for p in problems] == [("evil.json", "link-outside-root")]
    assert "symlink out of the definitions root" in problems[0].message
    for argv in (["validate", str(root)], ["validate", "--json", str(root)], ["validate", str(link)]):
        code, out, err = run_cli(capsys, *argv)
        assert code == 1 and "evil.json" in out and "symlink out of the definitions root" in out, argv
        assert SECRET not in out + err
    code, out, err = run_cli(capsys, "show", "evil", "--definitions", str(root))
    assert code == 2 and "evil.json" in err and "symlink out of the definitions root" in err
    assert SECRET not in out + err
    with pytest.raises(DefinitionError, match="symlink out of the definitions root") as e:
        Dataset(root).load("evil")
    assert SECRET not in str(e.value)
    with pytest.raises(DefinitionError, match="symlink out of the definitions root"):
        load_path(link)
    assert Dataset(root).load("rmsnorm_h8").name == "rmsnorm_h8"  # the others still load
    found = check_discover([str(root)], CheckConfig(definitions_dir=str(root)))  # `check` refuses it too
    assert [d.name for d in found.definitions] == ["rmsnorm_h8"]
    assert [(Path(e.definition).name, "symlink out of the definitions root" in e.detail) for e in found.errors] == [
        ("evil.json", True)] and SECRET not in str(found.errors)

    # the opt-in reads it (here: a name that is not its file's stem)
    assert validate_paths([root], follow_links=True)[0][0].problems[0].kind == "name-mismatch"
    code, out, _ = run_cli(capsys, "validate", "--follow-links", "--json", str(root))
    assert "link-outside-root" not in out and code == 1
    # a link that stays inside the root is an ordinary file
    inside = root / "rmsnorm" / "alias.json"
    inside.symlink_to(root / "rmsnorm" / "rmsnorm_h8.json")
    assert link_out_of_root(inside, root) is None and link_out_of_root(link, root) is not None

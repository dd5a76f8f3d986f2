"""The static HTML page of the compatibility matrix: pure-Python checks, and a real headless-Chromium check.

The browser test drives the system Chromium (/usr/bin/chromium) through the system chromedriver
(/usr/bin/chromedriver) with Selenium, and is skipped, naming what is missing, where any of the three is absent.
It writes a screenshot to $FLASHINFER_TRACE_SCREENSHOT, else to tmp_path/matrix.png.
"""

from __future__ import annotations

import copy
import html
import json
import os
import re
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from flashinfer_trace.matrix.render_html import SYMBOLS, TITLE, render_html

FIXTURE = Path(__file__).parent / "fixtures" / "matrix_sample.json"
# Debian's packages by default; elsewhere (GitHub's runners ship Chrome) point these at the browser
CHROMIUM = os.environ.get("FLASHINFER_TRACE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("FLASHINFER_TRACE_CHROMEDRIVER", "/usr/bin/chromedriver")
CHROME_ARGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
               "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--window-size=1400,1000")
SVG_NS = "http://www.w3.org/2000/svg"
REQUIRED_IDS = ("matrix", "count", "filter-op", "filter-model", "filter-status", "filter-text", "matrix-data",
                "legend", "summary", "details", "plot", "environments", "problems")


@pytest.fixture
def sample() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


class _Page(HTMLParser):
    """What the tests need from a page, parsed the way a browser splits it (script text ends at '</script')."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.ids: list[str] = []
        self.scripts: list[tuple[dict, str]] = []
        self.starttags: list[tuple[str, dict]] = []
        self._script: dict | None = None
        self._script_text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.starttags.append((tag, attrs))
        if "id" in attrs:
            self.ids.append(attrs["id"])
        if tag == "script":
            self._script, self._script_text = attrs, []

    def handle_data(self, data):
        if self._script is not None:
            self._script_text.append(data)

    def handle_endtag(self, tag):
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, "".join(self._script_text)))
            self._script = None

    def script(self, element_id: str) -> str:
        (text,) = [t for a, t in self.scripts if a.get("id") == element_id]
        return text


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def _row(page: str, name: str) -> str:
    pattern = r'<tr class="def-row"[^>]*data-definition="' + re.escape(html.escape(name)) + r'".*?</tr>'
    match = re.search(pattern, page, re.S)
    assert match, name
    return match.group(0)


def _cells(row: str) -> list[str]:
    return re.findall(r"<td\b.*?</td>", row, re.S)


def _grid_state(matrix: dict, definition: str, environment: str) -> str:
    for cell in matrix["cells"]:
        if cell["definition"] == definition and cell["environment"] == environment:
            return cell["state"]
    return "not-run"


# -- pure Python ---------------------------------------------------------------------------------------------------


def test_page_is_html5_with_the_required_elements(sample):
    page = render_html(sample)
    assert page.startswith("<!doctype html>\n<html lang=\"en\">")
    assert '<meta charset="utf-8">' in page and f"<title>{TITLE}</title>" in page
    parsed = _Page(page)
    assert len(parsed.ids) == len(set(parsed.ids)), "duplicate ids"
    assert set(REQUIRED_IDS) <= set(parsed.ids)
    for tag, attrs in parsed.starttags:
        if tag == "th":
            assert attrs.get("scope") in ("col", "row", "rowgroup"), attrs
    labelled = {a["for"] for t, a in parsed.starttags if t == "label"}
    assert {"filter-op", "filter-model", "filter-status", "filter-text"} <= labelled


def test_page_loads_nothing_from_elsewhere(sample):
    page = render_html(sample)
    parsed = _Page(page)
    for tag, attrs in parsed.starttags:
        for key in ("src", "href", "srcset", "action", "formaction", "poster", "data", "xlink:href"):
            if key in attrs:
                assert attrs[key].startswith(("#", "data:")), (tag, key, attrs[key])
    assert not re.search(r"url\s*\(|@import", page)
    assert "default-src 'none'" in page  # the Content-Security-Policy forbids any load that slips in
    # Outside the embedded data the only URL is the SVG namespace (an identifier, never fetched).
    code = page.replace(parsed.script("matrix-data"), "").replace(parsed.script("matrix-config"), "")
    assert set(re.findall(r"https?://[^\s\"'<>)]+", code)) <= {SVG_NS}


def test_embedded_json_round_trips(sample):
    page = render_html(sample)
    assert json.loads(_Page(page).script("matrix-data")) == sample
    block = re.search(r'<script type="application/json" id="matrix-data">(.*?)</script>', page, re.S)
    assert block and json.loads(block.group(1)) == sample


def test_script_end_tag_in_data_is_escaped(sample):
    evil = "evil</script><script>alert(1)</script><!--x"
    sample["definitions"].append({"name": evil, "op_type": "rmsnorm</SCRIPT >", "models": ["m</script>"]})
    sample["cells"].append({"definition": evil, "environment": sample["environments"][1]["id"], "state": "fail",
                            "reason": "<!-- </script> & >", "sources": {}, "tolerance": None, "timing": None})
    sample["problems"].append({"path": "results/</script>/tests.json", "problem": "corrupt: <!--"})
    page = render_html(sample)
    parsed = _Page(page)
    assert len(parsed.scripts) == 3  # data, config, code: the name opened no script of its own
    text = parsed.script("matrix-data")
    assert "</" not in text and "<!--" not in text and "<" not in text
    assert json.loads(text) == sample
    assert "<!--" not in page and "alert(1)</script>" not in page
    assert f'data-definition="{html.escape(evil)}"' in page and html.escape(evil) in _row(page, evil)


def test_every_definition_appears_once_in_its_group(sample):
    page = render_html(sample)
    assert page.count('<tr class="def-row"') == len(sample["definitions"])
    for d in sample["definitions"]:
        row = _row(page, d["name"])
        assert f'data-op-type="{d["op_type"]}"' in row
        assert len(_cells(row)) == len(sample["environments"])
    for op in {d["op_type"] for d in sample["definitions"]}:
        assert page.count(f'<tr class="group-row" data-op-type="{op}">') == 1
    # rows come grouped: each op type's rows follow its group header
    order = re.findall(r'<tr class="(group-row|def-row)"[^>]*data-op-type="([^"]*)"', page)
    current = None
    for kind, op in order:
        if kind == "group-row":
            current = op
        else:
            assert op == current


def test_legend_and_filter_list_every_state(sample):
    page = render_html(sample)
    legend = re.search(r'<section id="legend".*?</section>', page, re.S).group(0)
    status = re.search(r'<select id="filter-status">.*?</select>', page, re.S).group(0)
    for state, description in sample["states"].items():
        item = re.search(r'<div class="legend-item[^"]*" data-state="' + re.escape(state) + r'">.*?</div>', legend)
        assert item, state
        assert SYMBOLS[state] in item.group(0) and html.escape(description) in item.group(0)
        assert f'<option value="{state}">' in status


def test_cells_show_symbol_and_median(sample):
    page = render_html(sample)
    envs = [e["id"] for e in sample["environments"]]
    for d in sample["definitions"]:
        for env, cell in zip(envs, _cells(_row(page, d["name"])), strict=True):
            state = _grid_state(sample, d["name"], env)
            assert f'data-state="{state}"' in cell
            assert _text(cell).startswith(SYMBOLS[state])
    sm90 = envs.index("cu130-torch2.11-fi0.6.6@sm90")
    cell = _cells(_row(page, "rmsnorm_h4096"))[sm90]
    assert _text(cell) == "✅ 5.7 µs" and 'data-median="5.7"' in cell
    title = html.unescape(re.search(r'title="([^"]*)"', cell).group(1))
    for part in ("state: pass", "flashinfer: pass (passed 8)", "sglang: skip:not-installed", "atol 0.01",
                 "origin dtype:bfloat16", "median 5.7 µs", "q1 5.62 µs", "q3 5.81 µs", "timer graph", "184 GB/s"):
        assert part in title, part
    fail = _cells(_row(page, "top_k_top_p_sampling_from_probs_v128256"))[sm90]
    assert _text(fail) == "❌" and "reason: samples outside the top-k/top-p support" in html.unescape(fail)
    missing = _cells(_row(page, "gqa_paged_prefill_causal_h32_kv8_d128_ps1"))[envs.index("cpu-torch2.13@cpu")]
    assert _text(missing) == "·" and 'data-state="not-run"' in missing


def test_headers_summary_environments_and_problems(sample):
    page = render_html(sample)
    head = re.search(r"<thead>.*?</thead>", page, re.S).group(0)
    failed = re.search(r'<th [^>]*data-environment="cu128-torch2.9-fi0.5.3-sgl0.3.9@sm90".*?</th>', head, re.S).group(0)
    for line in ("CUDA 12.8", "torch 2.9.1", "flashinfer 0.5.3", "sglang 0.3.9", "sm90", "install-failed"):
        assert f">{line}</span>" in failed, line
    assert 'title="pip: No matching distribution found for sglang-kernel==0.3.9 (cp312, cu128)"' in failed
    cpu = re.search(r'<th [^>]*data-environment="cpu-torch2.13@cpu".*?</th>', head, re.S).group(0)
    assert ">CPU</span>" in cpu and "env-status" not in cpu

    summary = _text(re.search(r'<section id="summary".*?</section>', page, re.S).group(0))
    assert "2026-11-23T00:40:00+00:00" in summary and "3 environments" in summary and "6 definitions" in summary
    for state, count in {"pass": 7, "fail": 1, "skip:not-installed": 3, "install-failed": 6, "not-run": 1}.items():
        assert f"{state}: {count}" in summary, state

    envs = _text(re.search(r'<section id="environments".*?</section>', page, re.S).group(0))
    for fact in ("NVIDIA H100 80GB HBM3", "580.95.05", "2.11.0+cu130 (CUDA 13.0)", "0.6.6", "2.13.0+cpu",
                 "install-failed", "No matching distribution found"):
        assert fact in envs, fact
    problems = _text(re.search(r'<section id="problems".*?</section>', page, re.S).group(0))
    for p in sample["problems"]:
        assert p["path"] in problems and p["problem"] in problems


def test_output_is_deterministic_and_input_untouched(sample):
    before = copy.deepcopy(sample)
    first = render_html(sample)
    assert sample == before
    assert render_html(copy.deepcopy(sample)) == first == render_html(sample)


def test_sparse_and_odd_matrices_still_render():
    page = render_html({})
    assert "0 of 0 definitions" in page and json.loads(_Page(page).script("matrix-data")) == {}
    odd = {"schema_version": 1, "states": {"pass": "ok"}, "problems": [],
           "environments": [{"id": "e", "label": "E", "status": "corrupt", "manifest": "not a dict"}],
           "definitions": [{"name": "d", "op_type": None, "models": None}],
           "cells": [{"definition": "d", "environment": "e", "state": "weird", "timing": {"median_us": float("nan")}}]}
    page = render_html(odd)
    data = json.loads(_Page(page).script("matrix-data"))  # NaN is not JSON: it is embedded as null
    assert data["cells"][0]["timing"] == {"median_us": None}
    assert 'data-state="weird"' in page and "No problems" in page and ">corrupt</span>" in page


# -- real browser --------------------------------------------------------------------------------------------------


def _browser_or_skip():
    missing = []
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install selenium)")
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            missing.append(f"{path} (apt-get install {package})")
    if missing:
        why = "headless browser test needs " + ", ".join(missing)
        if os.environ.get("FLASHINFER_TRACE_REQUIRE_BROWSER"):  # CI sets it: there a skip would hide the check
            pytest.fail(why)
        pytest.skip(reason=why)


def _visible_rows(driver) -> list[str]:
    from selenium.webdriver.common.by import By

    return [r.get_attribute("data-definition") for r in driver.find_elements(By.CSS_SELECTOR, "#matrix tr.def-row")
            if r.is_displayed()]


def _chrome(tmp_path):
    """Headless Chromium through Selenium, its console log kept (the tests assert it stays empty)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in CHROME_ARGS:
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={tmp_path / 'chrome-profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    return webdriver.Chrome(service=service, options=options)


def test_page_in_headless_chromium(sample, tmp_path):
    _browser_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    page = tmp_path / "matrix.html"
    page.write_text(render_html(sample), encoding="utf-8")
    driver = _chrome(tmp_path)
    try:
        driver.get(page.as_uri())
        assert driver.title == TITLE
        assert driver.execute_script("return document.documentElement.dataset.ready") == "1"  # the script ran
        names = [d["name"] for d in sample["definitions"]]
        assert len(driver.find_elements(By.CSS_SELECTOR, "#matrix tr.def-row")) == len(names)
        assert _visible_rows(driver) == names
        count = driver.find_element(By.ID, "count")
        assert count.text == f"{len(names)} of {len(names)} definitions"

        # op type filter
        Select(driver.find_element(By.ID, "filter-op")).select_by_value("gqa_paged")
        expected = [d["name"] for d in sample["definitions"] if d["op_type"] == "gqa_paged"]
        assert _visible_rows(driver) == expected
        assert count.text == f"{len(expected)} of {len(names)} definitions"
        groups = [g.get_attribute("data-op-type") for g in driver.find_elements(By.CSS_SELECTOR, "tr.group-row")
                  if g.is_displayed()]
        assert groups == ["gqa_paged"]
        Select(driver.find_element(By.ID, "filter-op")).select_by_value("")

        # status filter: only rows with a cell in that state
        env_ids = [e["id"] for e in sample["environments"]]
        for state in ("fail", "skip:not-installed", "not-run"):
            Select(driver.find_element(By.ID, "filter-status")).select_by_value(state)
            expected = [n for n in names if any(_grid_state(sample, n, e) == state for e in env_ids)]
            assert expected and _visible_rows(driver) == expected, state
            assert count.text == f"{len(expected)} of {len(names)} definitions"
            for row in driver.find_elements(By.CSS_SELECTOR, "#matrix tr.def-row"):
                if row.is_displayed():
                    assert row.find_elements(By.CSS_SELECTOR, f'td[data-state="{state}"]')
        Select(driver.find_element(By.ID, "filter-status")).select_by_value("")

        # model and text filters
        Select(driver.find_element(By.ID, "filter-model")).select_by_value("llama-3.1-70b")
        assert _visible_rows(driver) == [d["name"] for d in sample["definitions"] if "llama-3.1-70b" in d["models"]]
        Select(driver.find_element(By.ID, "filter-model")).select_by_value("")
        driver.find_element(By.ID, "filter-text").send_keys("TOP_K_TOP")
        assert _visible_rows(driver) == ["top_k_top_p_sampling_from_probs_v128256"]
        assert count.text == f"1 of {len(names)} definitions"
        driver.find_element(By.ID, "filter-reset").click()
        assert _visible_rows(driver) == names

        # sorting, within the op-type groups (the group headers stay put)
        sm90 = env_ids.index("cu130-torch2.11-fi0.6.6@sm90") + 1
        by_sm90 = driver.find_element(By.CSS_SELECTOR, f'thead button.sort[data-col="{sm90}"]')
        by_sm90.click()  # most severe first, then by median: the failing sampling cell first, 5.7 µs before 6.94 µs
        rows = _visible_rows(driver)
        assert rows[:2] == ["rmsnorm_h4096", "fused_add_rmsnorm_h4096"]
        assert rows[-2:] == ["top_k_top_p_sampling_from_probs_v128256", "top_k_sampling_from_probs_v128256"]
        header = driver.find_element(By.CSS_SELECTOR, f"#matrix thead th:nth-child({sm90 + 1})")
        assert header.get_attribute("aria-sort") == "ascending"
        by_sm90.click()
        rows = _visible_rows(driver)
        assert rows[:2] == ["fused_add_rmsnorm_h4096", "rmsnorm_h4096"]
        assert rows[-2:] == ["top_k_sampling_from_probs_v128256", "top_k_top_p_sampling_from_probs_v128256"]
        assert header.get_attribute("aria-sort") == "descending"
        by_name = driver.find_element(By.CSS_SELECTOR, 'thead button.sort[data-col="0"]')
        ops = list(dict.fromkeys(d["op_type"] for d in sample["definitions"]))
        grouped = [sorted(d["name"] for d in sample["definitions"] if d["op_type"] == op) for op in ops]
        by_name.click()
        assert _visible_rows(driver) == [n for group in grouped for n in group]
        by_name.click()
        assert _visible_rows(driver) == [n for group in grouped for n in reversed(group)]
        assert header.get_attribute("aria-sort") == "none"
        tbody_ops = [g.get_attribute("data-op-type") for g in driver.find_elements(By.CSS_SELECTOR, "tbody.group")]
        assert tbody_ops == ops
        for group in driver.find_elements(By.CSS_SELECTOR, "tbody.group"):
            first = group.find_element(By.CSS_SELECTOR, "tr:first-child")
            assert first.get_attribute("class") == "group-row"

        # a row with timing shows one bar per environment with timing
        for name in ("rmsnorm_h4096", "fused_add_rmsnorm_h4096", "top_k_top_p_sampling_from_probs_v128256"):
            timed = [c["environment"] for c in sample["cells"]
                     if c["definition"] == name and (c.get("timing") or {}).get("median_us") is not None]
            driver.find_element(By.CSS_SELECTOR, f'#matrix tr.def-row[data-definition="{name}"]').click()
            assert driver.find_element(By.ID, "details-title").text == name
            bars = driver.find_elements(By.CSS_SELECTOR, "#plot svg rect.bar")
            assert sorted(b.get_attribute("data-environment") for b in bars) == sorted(timed), name
            if timed:
                scale = driver.find_element(By.CSS_SELECTOR, "#plot svg").get_attribute("data-scale")
                assert scale == ("log" if name == "rmsnorm_h4096" else "linear")  # 5.7 µs next to 412.5 µs: log
                assert all(float(b.get_attribute("width")) > 0 for b in bars)
                assert len(driver.find_elements(By.CSS_SELECTOR, "#plot svg line.whisker")) == 3 * len(timed)
                values = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#plot svg text.bar-value")]
                assert len(values) == len(timed) and all(v.endswith("µs") for v in values)
            else:
                assert driver.find_element(By.CSS_SELECTOR, "#plot .no-timing").is_displayed()
        row = driver.find_element(By.CSS_SELECTOR, '#matrix tr.def-row[data-definition="rmsnorm_h4096"]')
        row.click()
        assert "selected" in row.get_attribute("class")
        # the plot's values (JavaScript) read as the table's (Python): 412.5 rounds to 413 in both
        tds = row.find_elements(By.CSS_SELECTOR, "td")
        cell_times = {env_ids[i]: td.find_element(By.CSS_SELECTOR, ".t").text.removesuffix(" µs")
                      for i, td in enumerate(tds) if td.get_attribute("data-median")}
        plot_times = {g.get_attribute("data-environment"): g.find_element(By.CSS_SELECTOR, "text.bar-value").text
                      .removesuffix(" µs") for g in driver.find_elements(By.CSS_SELECTOR, "#plot svg g.bar-group")}
        assert plot_times == cell_times == {"cpu-torch2.13@cpu": "413", "cu130-torch2.11-fi0.6.6@sm90": "5.7"}

        # screenshot of the whole page
        shot = Path(os.environ.get("FLASHINFER_TRACE_SCREENSHOT") or tmp_path / "matrix.png")
        shot.parent.mkdir(parents=True, exist_ok=True)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1400, min(max(int(height) + 120, 1000), 4000))
        time.sleep(0.2)
        assert driver.save_screenshot(str(shot))
        assert shot.exists() and shot.stat().st_size > 10_000
        print(f"screenshot: {shot}")

        # no console errors or warnings, and the log channel really works
        problems = [e for e in driver.get_log("browser") if e.get("level") in ("SEVERE", "WARNING")]
        for entry in problems:
            print("console:", entry)
        assert problems == []
        driver.execute_script("console.error('matrix-html-log-probe')")
        assert any("matrix-html-log-probe" in e.get("message", "") for e in driver.get_log("browser"))
    finally:
        driver.quit()


def test_the_committed_snapshot_page_in_headless_chromium(tmp_path):
    """docs/matrix-snapshot/index.html as published: every definition a row, no console message, and a
    definition timed on the H100 plots one bar per timed environment."""
    _browser_or_skip()
    from selenium.webdriver.common.by import By

    snapshot = Path(__file__).parents[2] / "docs" / "matrix-snapshot"
    matrix = json.loads((snapshot / "matrix.json").read_text())
    driver = _chrome(tmp_path)
    try:
        driver.get((snapshot / "index.html").as_uri())
        assert driver.execute_script("return document.documentElement.dataset.ready") == "1"
        names = [d["name"] for d in matrix["definitions"]]
        assert _visible_rows(driver) == names
        timed = [c for c in matrix["cells"] if (c.get("timing") or {}).get("median_us") is not None]
        assert timed, "the snapshot has benchmarks"
        name = timed[0]["definition"]
        driver.find_element(By.CSS_SELECTOR, f'#matrix tr.def-row[data-definition="{name}"]').click()
        bars = driver.find_elements(By.CSS_SELECTOR, "#plot svg rect.bar")
        assert sorted(b.get_attribute("data-environment") for b in bars) == sorted(
            c["environment"] for c in timed if c["definition"] == name)
        assert [e for e in driver.get_log("browser") if e.get("level") in ("SEVERE", "WARNING")] == []
    finally:
        driver.quit()


def test_a_cells_title_says_how_much_tolerance_its_passes_used(sample):
    sm90 = "cu130-torch2.11-fi0.6.6@sm90"
    cell = next(c for c in sample["cells"] if c["definition"] == "rmsnorm_h4096" and c["environment"] == sm90)
    cell["sources"]["flashinfer"]["tolerance_used"] = 0.29
    envs = [e["id"] for e in sample["environments"]]
    shown = _cells(_row(render_html(sample), "rmsnorm_h4096"))[envs.index(sm90)]
    title = html.unescape(re.search(r'title="([^"]*)"', shown).group(1))
    assert "flashinfer: pass (passed 8); its passes used at most 0.29 of the tolerance" in title
    assert "sglang: skip:not-installed" in title and title.count("of the tolerance") == 1  # only where recorded
    cell["sources"]["flashinfer"]["passed_over"] = [{"api": "fi.trtllm_moe", "reason": "arch-unsupported: sm100"}]
    shown = _cells(_row(render_html(sample), "rmsnorm_h4096"))[envs.index(sm90)]
    assert "; passed over fi.trtllm_moe (arch-unsupported: sm100)" in html.unescape(shown)


def test_an_info_cell_has_its_symbol_colour_count_legend_and_reason(sample):
    """A cell whose kernel differs only where its API promises nothing (info): its own symbol and background (not
    a failure's red, not a pass's green), its own count in the summary, a legend line and a filter option, and
    the reason in its title."""
    from flashinfer_trace.matrix.build import STATES

    sm90 = "cu130-torch2.11-fi0.6.6@sm90"
    cell = next(c for c in sample["cells"]
                if c["definition"] == "gqa_paged_decode_h32_kv8_d128_ps1" and c["environment"] == sm90)
    why = "outside the contract (flashinfer-jit-fast-math-ftz: float32-subnormals): flush-to-zero"
    cell.update(state="info", reason=why)
    sample["states"]["info"] = STATES["info"]
    page = render_html(sample)
    envs = [e["id"] for e in sample["environments"]]
    shown = _cells(_row(page, "gqa_paged_decode_h32_kv8_d128_ps1"))[envs.index(sm90)]
    assert 'class="cell st-info"' in shown and _text(shown).startswith(SYMBOLS["info"])
    assert f"reason: {why}" in html.unescape(shown)
    assert re.search(r'<li class="st-info" data-state="info">.*?info: <strong>1</strong></li>', page)
    assert '<option value="info">' in page and 'data-state="info"><dt>' in page
    css = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    assert ".st-info {" in css and "#plot .bar.st-info" in css

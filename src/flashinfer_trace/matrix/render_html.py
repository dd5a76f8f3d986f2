"""Render ``matrix.json`` (schema version 1) as one static, self-contained HTML page.

``render_html(matrix)`` returns the whole page as a string: no file I/O beyond reading this package's own
``static/matrix.css`` and ``static/matrix.js``, standard library only, and the same output for the same input
(nothing depends on the time of rendering or on dict/set iteration that is not already fixed by the input).

The page fetches nothing when viewed: CSS and JavaScript are inline, there are no fonts, images or scripts
from elsewhere, and a Content-Security-Policy ``<meta>`` (``default-src 'none'``) makes the browser refuse
any load that might slip in. The matrix itself is embedded as JSON in
``<script type="application/json" id="matrix-data">``; every ``<``, ``>`` and ``&`` in it is written as a
``\\u00XX`` escape, so no string in the data (a definition called ``</script>``, a reason containing
``<!--``) can end the script element. ``JSON.parse`` (or ``json.loads``) of the element's text gives the
matrix back (non-finite floats, which JSON cannot hold, become ``null``).

What the page shows:

* a title and a summary: generated time, how many environments / definitions, counts per cell state;
* a legend of the states, with their symbols (``matrix["symbols"]`` where the builder gives them, else
  ``SYMBOLS``) and the descriptions from ``matrix["states"]``;
* the matrix table ``#matrix``: one row ``tr.def-row`` per definition (``data-definition``,
  ``data-op-type``, ``data-models``), one ``<tbody class="group">`` per op type whose first row is a group
  header; one column per environment, its header showing CUDA / torch / flashinfer / sglang / arch on
  separate lines and the environment status when it is not ``ok`` (its reason as the tooltip). A cell shows
  the state symbol and, with timing, the median (``✅ 5.7 µs``); its tooltip gives the state, reason,
  per-source states, tolerance and timing. A definition/environment pair with no cell shows ``·``
  (not-run);
* filters: op type ``#filter-op``, model ``#filter-model``, state ``#filter-status`` (rows with at least one
  cell in that state) and a text filter on the definition name ``#filter-text``; filtered-out rows get the
  ``hidden`` attribute, a group header is hidden when all its rows are, and ``#count`` reads
  "N of M definitions";
* sorting: the "definition" header sorts by name, an environment header by that column's state severity
  (error, fail, timeout, install-failed, xfail, xpass, info, skips, pass, not-run) and then median time; a second
  click reverses the order. Sorting happens *within* each op-type group, so the group headers stay where they
  are and always head their own rows;
* clicking a row (or Enter / Space on a focused row) fills the details panel ``#details`` below the table:
  the definition's cells per environment and, in ``#plot``, an inline SVG bar chart (drawn by the page's
  JavaScript from the embedded data) with one ``rect.bar`` per environment that has timing, labelled, the
  median in µs, and the q1–q3 spread as a whisker;
* the environments (``#environments``): status, reason and the manifest's key facts (GPU, driver, torch,
  flashinfer, sglang, Python, git SHA) where present; the problems (``#problems``): unreadable or missing
  result files.
"""

from __future__ import annotations

import functools
import html
import importlib.resources
import json
import math
import re
from collections import Counter
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from ..status import SEVERITY as CELL_SEVERITY
from ..status import SYMBOL
from . import drift_view
from .build import fi_trace_label, jit_label

__all__ = ["SEVERITY", "SYMBOLS", "TITLE", "render_html"]

TITLE = "flashinfer-trace compatibility matrix"

SYMBOLS: dict[str, str] = {state.value: symbol for state, symbol in SYMBOL.items()}
# Most severe first: the order an environment column sorts in (ascending).
SEVERITY: tuple[str, ...] = tuple(state.value for state in CELL_SEVERITY)

NOT_RUN = "not-run"
UNKNOWN_SYMBOL = "?"


@functools.cache
def _static(name: str) -> str:
    """The text of ``static/<name>``: kept as real .css/.js files so linters and editors see them, and inlined
    into the page so it stays one self-contained file."""
    return importlib.resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8").strip()


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _fmt_us(value: float) -> str:
    """A time in µs, short: 188, 21.4, 5.7, 1.72, 0.123 (rounding like the page's JavaScript: ties away from 0)."""
    if value == 0:
        return "0"
    a = abs(value)
    if a >= 100:
        places = 0
    elif a >= 10:
        places = 1
    elif a >= 1:
        places = 2
    else:  # three significant digits
        places = 2 - math.floor(math.log10(a))
    text = format(Decimal(value).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _json_safe(value: Any) -> Any:
    """The value with non-finite floats (not representable in JSON) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _embed_json(value: Any) -> str:
    """JSON that is safe as the text of a <script> element: no '<', '>' or '&' survives unescaped.

    In JSON these characters can only occur inside strings, where ``\\u003c`` etc. mean the same thing.
    """
    text = json.dumps(_json_safe(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _state_class(state: str) -> str:
    return "st-" + "".join(c if c.isalnum() else "-" for c in state)


def _env_lines(env: dict) -> list[str]:
    """The environment's header split over lines: CUDA / torch / flashinfer / sglang / arch."""
    lines = []
    if any(env.get(k) for k in ("cuda", "torch", "flashinfer", "sglang", "arch")):
        lines.append(f"CUDA {env['cuda']}" if env.get("cuda") not in (None, "", "none") else "CPU")
        for key in ("torch", "flashinfer", "sglang"):
            if env.get(key):
                lines.append(f"{key} {env[key]}")
        if env.get("arch") not in (None, "", "cpu", "any"):
            lines.append(str(env["arch"]))
        return lines
    label = env.get("label") or env.get("id") or "?"
    return [part.strip() for part in str(label).split(" / ") if part.strip()] or [str(label)]


def _group(d: dict) -> str:
    """A definition's row group: its op type, or `fi_trace/<op type>` for FlashInfer's own (build.py's `group`)."""
    return str(d.get("group") or d.get("op_type") or "other")


def _env_label(env: dict) -> str:
    return str(env.get("label") or " / ".join(_env_lines(env)))


def _manifest_facts(env: dict) -> dict[str, str | None]:
    """Key facts of an environment, from its manifest (env.json) where present, else from the environment."""
    manifest = _dict(env.get("manifest"))
    torch = _dict(manifest.get("torch"))
    packages = _dict(manifest.get("packages"))
    gpu_info = _dict(manifest.get("gpu"))
    gpu = env.get("gpu")
    if not gpu:
        devices = [d for d in _list(torch.get("devices")) if isinstance(d, dict)]
        smi = [d for d in _list(gpu_info.get("nvidia_smi")) if isinstance(d, dict)]
        gpu = (devices[0].get("name") if devices else None) or (smi[0].get("name") if smi else None)
    python = _dict(manifest.get("python")).get("version")
    torch_version = torch.get("version") or packages.get("torch") or env.get("torch")
    if torch_version and torch.get("cuda"):
        torch_version = f"{torch_version} (CUDA {torch['cuda']})"
    sglang = packages.get("sglang") or env.get("sglang")
    kernel = packages.get("sglang-kernel") or packages.get("sgl-kernel")
    if kernel:
        sglang = f"{sglang or '—'} (kernel {kernel})"
    return {
        "GPU": gpu,
        "driver": gpu_info.get("driver"),
        "torch": torch_version,
        "flashinfer": packages.get("flashinfer-python") or env.get("flashinfer"),
        "sglang": sglang,
        "Python": python,
        "references ran": env.get("sandbox"),  # confined / unconfined (allowed) / refused (docs/sandbox.md)
        "JIT prebuild": jit_label(env.get("jit")) if env.get("jit") else None,
        "fi_trace": fi_trace_label(env.get("fi_trace")) if env.get("fi_trace") else None,
        "slowest JIT modules": ", ".join(f"{m['module']} {m['seconds']} s" for m in _modules(env)[:5]) or None,
        "git": manifest.get("git_sha"),
    }


def _modules(env: dict) -> list[dict]:
    return (env.get("jit") or {}).get("modules") or []


def _cell_title(definition: str, env: dict, cell: dict | None, states: dict) -> str:
    lines = [f"{definition} @ {_env_label(env)}"]
    if cell is None:
        lines.append(f"state: {NOT_RUN} ({states.get(NOT_RUN) or 'no result for this cell'})")
        return "\n".join(lines)
    state = str(cell.get("state") or NOT_RUN)
    description = states.get(state)
    lines.append(f"state: {state}" + (f" ({description})" if description else ""))
    if cell.get("reason"):
        lines.append(f"reason: {cell['reason']}")
    sources = _dict(cell.get("sources"))
    if sources:
        lines.append("sources:")
        for name in sorted(sources):
            source = _dict(sources[name])
            text = f"  {name}: {source.get('state') or '?'}"
            counts = _dict(source.get("counts"))
            if counts:
                text += " (" + ", ".join(f"{k} {_fmt(v)}" for k, v in counts.items()) + ")"
            if source.get("reason"):
                text += f" — {source['reason']}"
            api = source.get("api")
            if api:  # which kernel path ran (e.g. the tensor-core decode)
                text += f" via {', '.join(api) if isinstance(api, list) else api}"
            used = _number(source.get("tolerance_used"))
            if used is not None:
                text += f"; its passes used at most {_fmt(used)} of the tolerance"
            for over in source.get("passed_over") or []:
                if isinstance(over, dict):
                    text += f"; passed over {over.get('api')} ({over.get('reason')})"
            lines.append(text)
            for path, info in sorted(_dict(source.get("paths")).items()):  # each call mode checked, its state
                info = _dict(info)
                text = f"    path {path}: {info.get('state') or '?'}"
                if info.get("state") not in ("pass", None) and info.get("reason"):
                    text += f" — {info['reason']}"
                lines.append(text)
    tolerance = {k: v for k, v in _dict(cell.get("tolerance")).items() if v is not None}
    if tolerance:
        lines.append("tolerance: " + ", ".join(f"{k} {_fmt(v)}" for k, v in tolerance.items()))
    timing = _dict(cell.get("timing"))
    median = _number(timing.get("median_us"))
    if median is not None:
        text = f"timing: median {_fmt_us(median)} µs"
        for key, name in (("q1_us", "q1"), ("q3_us", "q3"), ("iqr_us", "IQR")):
            value = _number(timing.get(key))
            if value is not None:
                text += f", {name} {_fmt_us(value)} µs"
        lines.append(text)
        extra = [f"{k} {timing[k]}" for k in ("timer", "source", "size") if timing.get(k) not in (None, "")]
        if extra:
            lines.append("  " + ", ".join(extra))
        rates = []
        for key, unit in (("gb_per_s", " GB/s"), ("tflop_per_s", " TFLOP/s"),
                          ("pct_of_peak_bandwidth", "% of peak bandwidth")):
            value = _number(timing.get(key))
            if value is not None:
                rates.append(f"{value:g}{unit}")
        if rates:
            lines.append("  " + ", ".join(rates))
    if cell.get("tests") is not None:
        lines.append(f"tests: {cell['tests']}")
    return "\n".join(lines)


def _drift_id(version: str, name: str) -> str:
    return "drift-" + re.sub(r"[^A-Za-z0-9_.-]", "_", f"{version}-{name}")


def _drift_section(w, matrix: dict, definitions: list[dict]) -> None:
    """`#drift`: per FlashInfer version, the drift report's counts and each definition's pair, differences
    (ours vs theirs) and result comparison; the badges in the table link here."""
    reports = [r for r in _list(matrix.get("drift")) if isinstance(r, dict)]
    if not reports:
        return
    w("<section id=\"drift\" aria-labelledby=\"drift-title\">\n<h2 id=\"drift-title\">Drift from FlashInfer's own "
      "definitions</h2>\n")
    for r in reports:
        version = str(r.get("flashinfer"))
        s = _dict(r.get("summary"))
        by_field = ", ".join(f"{k} {v}" for k, v in _dict(s.get("drifting_by_field")).items()) or "none"
        w(f"<h3>FlashInfer {_esc(version)}</h3>\n<p>{_esc(s.get('paired'))} paired, {_esc(s.get('drifting'))} "
          f"drifting (by field: {_esc(by_field)}); unpaired: {_esc(s.get('unpaired_ours'))} ours, "
          f"{_esc(s.get('unpaired_upstream'))} upstream. From <code>{_esc(r.get('file'))}</code>.</p>\n")
        w("<div class=\"table-wrap\"><table class=\"drift-table\">\n<thead><tr><th scope=\"col\">definition</th>"
          "<th scope=\"col\">theirs</th><th scope=\"col\">drift</th><th scope=\"col\">differences (ours / theirs)"
          "</th><th scope=\"col\">results</th></tr></thead>\n<tbody>\n")
        for d in definitions:
            name = str(d.get("name"))
            entry = _dict(_dict(d.get("drift")).get(version))
            if not entry:
                continue
            diffs = "<br>".join(f"{_esc(x.get('field'))}: {_esc(x.get('ours'))} / {_esc(x.get('theirs'))}"
                                for x in _list(entry.get("differences")) if isinstance(x, dict))
            result = _esc(entry.get("result") or "")
            if entry.get("result_reason"):
                result += f" <span class=\"reason\">({_esc(entry['result_reason'])})</span>"
            theirs = entry.get("theirs") or entry.get("reason") or ""
            w(f"<tr id=\"{_drift_id(version, name)}\"><th scope=\"row\">{_esc(name)}</th><td>{_esc(theirs)}</td>"
              f"<td>{_esc(drift_view.label(entry))}</td><td>{diffs}</td><td>{result}</td></tr>\n")
        w("</tbody>\n</table></div>\n")
    w("</section>\n")


def render_html(matrix: dict) -> str:
    """The whole page for ``matrix`` (a matrix.json dict, schema version 1) as one string."""
    states: dict[str, str] = {str(k): "" if v is None else str(v) for k, v in _dict(matrix.get("states")).items()}
    if not states:
        states = {k: "" for k in SYMBOLS}
    symbols = {**SYMBOLS, **{str(k): str(v) for k, v in _dict(matrix.get("symbols")).items() if v}}

    def symbol(state: str) -> str:
        return symbols.get(state, UNKNOWN_SYMBOL)

    environments = [e for e in _list(matrix.get("environments")) if isinstance(e, dict)]
    definitions = [d for d in _list(matrix.get("definitions")) if isinstance(d, dict)]
    env_ids = [str(e.get("id")) for e in environments]
    cells: dict[tuple[str, str], dict] = {}
    for cell in _list(matrix.get("cells")):
        if isinstance(cell, dict):
            cells[(str(cell.get("definition")), str(cell.get("environment")))] = cell

    # Every state seen in the grid (not-run for missing cells) gets a place in the legend and the filter.
    grid_states: Counter[str] = Counter()
    for d in definitions:
        for env_id in env_ids:
            cell = cells.get((str(d.get("name")), env_id))
            grid_states[str(cell.get("state") or NOT_RUN) if cell else NOT_RUN] += 1
    all_states = list(states) + sorted(s for s in grid_states if s not in states)

    op_types: list[str] = []  # the row groups: op types, FlashInfer's own (fi_trace) as fi_trace/<op type>
    for d in definitions:
        op = _group(d)
        if op not in op_types:
            op_types.append(op)
    models = sorted({str(m) for d in definitions for m in _list(d.get("models"))})

    out: list[str] = []
    w = out.append
    w("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n")
    w("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n")
    w("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'; "
      "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'\">\n")
    w("<link rel=\"icon\" href=\"data:,\">\n")
    w(f"<title>{_esc(TITLE)}</title>\n<style>{_static('matrix.css')}</style>\n</head>\n<body>\n")

    # Header and summary.
    generated = matrix.get("generated")
    w(f"<header>\n<h1>{_esc(TITLE)}</h1>\n<section id=\"summary\" aria-label=\"Summary\">\n<p>")
    w(f"Generated <time id=\"generated\">{_esc(generated or 'unknown')}</time>"
      f" &middot; <strong>{len(environments)}</strong> environment{'s' if len(environments) != 1 else ''}"
      f" &middot; <strong>{len(definitions)}</strong> definition{'s' if len(definitions) != 1 else ''}"
      f" &middot; <strong>{sum(grid_states.values())}</strong> cells")
    problems = [p for p in _list(matrix.get("problems")) if isinstance(p, dict)]
    if problems:
        w(f" &middot; <a href=\"#problems\">{len(problems)} problem{'s' if len(problems) != 1 else ''}</a>")
    w("</p>\n<ul class=\"state-counts\">")
    for state in all_states:
        if grid_states.get(state):
            w(f"<li class=\"{_state_class(state)}\" data-state=\"{_esc(state)}\"><span class=\"sym\">"
              f"{_esc(symbol(state))}</span> {_esc(state)}: <strong>{grid_states[state]}</strong></li>")
    w("</ul>\n")
    inputs = [str(i) for i in _list(matrix.get("inputs"))]
    if inputs:
        w("<p class=\"inputs\">From: " + ", ".join(f"<code>{_esc(i)}</code>" for i in inputs) + "</p>\n")
    w("</section>\n</header>\n<main>\n")

    # Legend.
    w("<section id=\"legend\" aria-labelledby=\"legend-title\">\n<h2 id=\"legend-title\">Legend</h2>\n<dl>\n")
    for state in all_states:
        w(f"<div class=\"legend-item {_state_class(state)}\" data-state=\"{_esc(state)}\"><dt><span class=\"sym\">"
          f"{_esc(symbol(state))}</span> {_esc(state)}</dt><dd>{_esc(states.get(state, ''))}</dd></div>\n")
    w("</dl>\n</section>\n")

    # Filters.
    w("<section id=\"filters\" aria-label=\"Filters\">\n")
    w("<label for=\"filter-op\">Op type</label>\n<select id=\"filter-op\">\n<option value=\"\">all</option>\n")
    for op in op_types:
        w(f"<option value=\"{_esc(op)}\">{_esc(op)}</option>\n")
    w("</select>\n<label for=\"filter-model\">Model</label>\n<select id=\"filter-model\">\n"
      "<option value=\"\">all</option>\n")
    for model in models:
        w(f"<option value=\"{_esc(model)}\">{_esc(model)}</option>\n")
    w("</select>\n<label for=\"filter-status\">Has a cell in state</label>\n<select id=\"filter-status\">\n"
      "<option value=\"\">any</option>\n")
    for state in all_states:
        w(f"<option value=\"{_esc(state)}\">{_esc(symbol(state))} {_esc(state)}</option>\n")
    w("</select>\n<label for=\"filter-text\">Definition</label>\n"
      "<input id=\"filter-text\" type=\"search\" placeholder=\"name contains…\" autocomplete=\"off\">\n"
      "<button type=\"button\" id=\"filter-reset\">Reset</button>\n")
    w(f"<output id=\"count\" for=\"filter-op filter-model filter-status filter-text\" aria-live=\"polite\">"
      f"{len(definitions)} of {len(definitions)} definitions</output>\n</section>\n")

    # The matrix table.
    ncols = len(environments) + 1
    w("<div class=\"table-wrap\">\n<table id=\"matrix\">\n<caption>Cell state per definition (rows) and environment "
      "(columns); click a row for its timing plot, a column header to sort.</caption>\n<thead>\n<tr>\n")
    w("<th scope=\"col\" class=\"def-col\" aria-sort=\"none\"><button type=\"button\" class=\"sort\" "
      "data-col=\"0\">definition<span class=\"sort-ind\" aria-hidden=\"true\"></span></button></th>\n")
    for i, env in enumerate(environments):
        status = str(env.get("status") or "ok")
        tip = [_env_label(env), f"id: {env.get('id')}", f"status: {status}"]
        if env.get("reason"):
            tip.append(f"reason: {env['reason']}")
        if env.get("gpu"):
            tip.append(f"GPU: {env['gpu']}")
        w(f"<th scope=\"col\" class=\"env-col env-{_esc(status)}\" data-environment=\"{_esc(env.get('id'))}\" "
          f"aria-sort=\"none\" title=\"{_esc(chr(10).join(tip))}\"><button type=\"button\" class=\"sort\" "
          f"data-col=\"{i + 1}\">")
        w("".join(f"<span class=\"line\">{_esc(line)}</span>" for line in _env_lines(env)))
        if status != "ok":
            w(f"<span class=\"line env-status\" title=\"{_esc(env.get('reason') or status)}\">{_esc(status)}</span>")
        w("<span class=\"sort-ind\" aria-hidden=\"true\"></span></button></th>\n")
    w("</tr>\n</thead>\n")
    by_op: dict[str, list[tuple[int, dict]]] = {op: [] for op in op_types}
    for index, d in enumerate(definitions):
        by_op[_group(d)].append((index, d))
    for op in op_types:
        rows = by_op[op]
        w(f"<tbody class=\"group\" data-op-type=\"{_esc(op)}\">\n<tr class=\"group-row\" data-op-type=\"{_esc(op)}\">"
          f"<th scope=\"rowgroup\" colspan=\"{ncols}\">{_esc(op)} <span class=\"group-count\">({len(rows)})</span>"
          "</th></tr>\n")
        for index, d in rows:
            name = str(d.get("name"))
            dmodels = [str(m) for m in _list(d.get("models"))]
            w(f"<tr class=\"def-row\" tabindex=\"0\" data-index=\"{index}\" data-definition=\"{_esc(name)}\" "
              f"data-op-type=\"{_esc(op)}\" data-models=\"{_esc(json.dumps(dmodels, ensure_ascii=False))}\">"
              f"<th scope=\"row\"><span class=\"def-name\">{_esc(name)}</span>")
            if dmodels:
                w(f"<span class=\"models\">{_esc(', '.join(dmodels))}</span>")
            for version, entry in sorted(_dict(d.get("drift")).items()):  # flashinfer-trace drift: a link below
                w(f"<a class=\"drift drift-{_esc(_dict(entry).get('state'))}\" href=\"#{_drift_id(version, name)}\" "
                  f"title=\"{_esc(drift_view.detail(_dict(entry)))}\">fi {_esc(version)}: "
                  f"{_esc(drift_view.label(_dict(entry)))}</a>")
            w("</th>")
            for env, env_id in zip(environments, env_ids, strict=True):
                cell = cells.get((name, env_id))
                state = str(cell.get("state") or NOT_RUN) if cell else NOT_RUN
                median = _number(_dict(cell.get("timing")).get("median_us")) if cell else None
                attrs = f" data-state=\"{_esc(state)}\""
                if median is not None:
                    attrs += f" data-median=\"{median!r}\""
                attrs += f" title=\"{_esc(_cell_title(name, env, cell, states))}\""
                w(f"<td class=\"cell {_state_class(state)}\"{attrs}>"
                  f"<span class=\"sym\" role=\"img\" aria-label=\"{_esc(state)}\">{_esc(symbol(state))}</span>")
                if median is not None:
                    w(f" <span class=\"t\">{_fmt_us(median)} µs</span>")
                w("</td>")
            w("</tr>\n")
        w("</tbody>\n")
    w("</table>\n</div>\n")
    w("<p id=\"no-match\" hidden>No definition matches the filters.</p>\n")

    # Details panel, filled by the script.
    w("<section id=\"details\" aria-live=\"polite\" aria-labelledby=\"details-title\">\n"
      "<h2 id=\"details-title\">Details</h2>\n<p class=\"hint\">Click a row of the table to see its timing plot"
      " and its cells.</p>\n<div id=\"plot\"></div>\n<div id=\"details-cells\"></div>\n</section>\n")

    # Environments.
    w("<section id=\"environments\" aria-labelledby=\"environments-title\">\n"
      "<h2 id=\"environments-title\">Environments</h2>\n")
    if environments:
        fact_names = list(_manifest_facts({}))
        w("<div class=\"table-wrap\"><table class=\"env-table\">\n<thead><tr><th scope=\"col\">environment</th>"
          "<th scope=\"col\">status</th><th scope=\"col\">reason</th>")
        w("".join(f"<th scope=\"col\">{_esc(f)}</th>" for f in fact_names))
        w("<th scope=\"col\">sessions</th><th scope=\"col\">finished</th></tr></thead>\n<tbody>\n")
        for env in environments:
            status = str(env.get("status") or "ok")
            facts = _manifest_facts(env)
            w(f"<tr data-environment=\"{_esc(env.get('id'))}\"><th scope=\"row\">{_esc(_env_label(env))}"
              f"<span class=\"env-id\">{_esc(env.get('id'))}</span></th>"
              f"<td class=\"env-{_esc(status)}\">{_esc(status)}</td><td>{_esc(env.get('reason') or '')}</td>")
            for fact in fact_names:
                value = facts[fact]
                if value in (None, ""):
                    w("<td>—</td>")
                elif fact == "git":
                    value = str(value)
                    short = value[:12] + ("-dirty" if value.endswith("-dirty") else "")
                    w(f"<td title=\"{_esc(value)}\"><code>{_esc(short)}</code></td>")
                else:
                    w(f"<td>{_esc(value)}</td>")
            sessions = ", ".join(str(s) for s in _list(env.get("sessions")))
            w(f"<td>{_esc(sessions)}</td><td>{_esc(env.get('finished') or '')}</td></tr>\n")
        w("</tbody>\n</table></div>\n")
    else:
        w("<p>No environments.</p>\n")
    missing = [c for c in _list(matrix.get("not_run")) if isinstance(c, dict)]
    if missing:
        w("<h3 id=\"not-run\">Combinations not run</h3>\n<ul>\n")
        for c in missing:
            w(f"<li>{_esc(c.get('label'))} (<code>{_esc(c.get('combination'))}</code>, CUDA {_esc(c.get('cuda'))}, "
              f"{_esc(', '.join(c.get('archs') or []))}): {_esc(c.get('reason'))}</li>\n")
        w("</ul>\n")
    w("</section>\n")

    _drift_section(w, matrix, definitions)

    # Problems.
    w("<section id=\"problems\" aria-labelledby=\"problems-title\">\n<h2 id=\"problems-title\">Problems</h2>\n")
    if problems:
        w("<p>Result files that could not be read:</p>\n<ul>\n")
        for p in problems:
            w(f"<li><code>{_esc(p.get('path'))}</code>: {_esc(p.get('problem'))}</li>\n")
        w("</ul>\n")
    else:
        w("<p>No problems: every result file was read.</p>\n")
    w("</section>\n</main>\n")

    config = {
        "symbols": {s: symbol(s) for s in all_states},
        "severity": list(SEVERITY),
        "notRun": NOT_RUN,
        "envLines": [_env_lines(e) for e in environments],
    }
    w("<noscript><p>Filtering, sorting and the timing plots need JavaScript.</p></noscript>\n")
    w(f"<script type=\"application/json\" id=\"matrix-data\">{_embed_json(matrix)}</script>\n")
    w(f"<script type=\"application/json\" id=\"matrix-config\">{_embed_json(config)}</script>\n")
    w(f"<script>{_static('matrix.js')}</script>\n</body>\n</html>\n")
    return "".join(out)


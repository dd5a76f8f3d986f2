"""Render ``matrix.json`` (schema version 1) as one static, self-contained HTML page.

``render_html(matrix)`` returns the whole page as a string: no file I/O, standard library only, and the same
output for the same input (nothing depends on the time of rendering or on dict/set iteration that is not
already fixed by the input).

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
  (error, fail, timeout, install-failed, xfail, xpass, skips, pass, not-run) and then median time; a second
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

import html
import json
import math
import re
from collections import Counter
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from . import drift_view
from .build import jit_label

__all__ = ["SEVERITY", "SYMBOLS", "TITLE", "render_html"]

TITLE = "flashinfer-trace compatibility matrix"

SYMBOLS: dict[str, str] = {
    "pass": "✅",
    "fail": "❌",
    "error": "💥",
    "timeout": "⏱",
    "skip:arch": "🚫",
    "skip:api-missing": "➖",
    "skip:not-installed": "⬜",
    "skip:other": "⏭",
    "install-failed": "📦",
    "xfail": "🟡",
    "xpass": "⭐",
    "not-run": "·",
}

# Most severe first: the order an environment column sorts in (ascending).
SEVERITY: tuple[str, ...] = ("error", "fail", "timeout", "install-failed", "xfail", "xpass", "skip:api-missing",
                             "skip:arch", "skip:other", "skip:not-installed", "pass", "not-run")

NOT_RUN = "not-run"
UNKNOWN_SYMBOL = "?"


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

    op_types: list[str] = []
    for d in definitions:
        op = str(d.get("op_type") or "other")
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
    w(f"<title>{_esc(TITLE)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n")

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
        by_op[str(d.get("op_type") or "other")].append((index, d))
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
    w(f"<script>{_JS}</script>\n</body>\n</html>\n")
    return "".join(out)


_CSS = """
:root { color-scheme: light; --border: #d0d7de; --muted: #57606a; --head: #f6f8fa; --sel: #fff8c5; }
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
  margin: 0 1.5rem 2rem; color: #1f2328; background: #fff; font-size: 14px; }
h1 { font-size: 1.5rem; margin: 1rem 0 0.25rem; }
h2 { font-size: 1.15rem; margin: 1.5rem 0 0.5rem; }
code { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 0.9em; }
.state-counts { list-style: none; padding: 0; margin: 0.25rem 0; display: flex; flex-wrap: wrap; gap: 0.4rem 1rem; }
.inputs { color: var(--muted); margin: 0.25rem 0; }
#legend dl { display: grid; grid-template-columns: repeat(auto-fill, minmax(17rem, 1fr)); gap: 0.2rem 1rem;
  margin: 0; }
.legend-item { display: flex; gap: 0.5rem; align-items: baseline; }
.legend-item dt { font-weight: 600; white-space: nowrap; }
.legend-item dd { margin: 0; color: var(--muted); }
#filters { display: flex; flex-wrap: wrap; align-items: center; gap: 0.4rem 0.6rem; margin: 1rem 0 0.5rem;
  padding: 0.5rem 0.75rem; background: var(--head); border: 1px solid var(--border); border-radius: 6px; }
#filters label { font-weight: 600; }
#filters select, #filters input, #filters button { font: inherit; padding: 0.15rem 0.3rem; }
#count { margin-left: auto; color: var(--muted); }
.table-wrap { overflow: auto; max-width: 100%; border: 1px solid var(--border); border-radius: 6px; }
table { border-collapse: collapse; }
caption { caption-side: bottom; text-align: left; color: var(--muted); padding: 0.4rem; font-size: 0.85em; }
th, td { border: 1px solid var(--border); padding: 0.25rem 0.5rem; }
thead th { background: var(--head); position: sticky; top: 0; vertical-align: bottom; z-index: 1; }
th button.sort { font: inherit; font-weight: 600; background: none; border: 0; padding: 0; cursor: pointer;
  text-align: left; color: inherit; }
th button.sort .line { display: block; white-space: nowrap; }
.sort-ind { margin-left: 0.25rem; color: var(--muted); }
.env-status { color: #cf222e; font-weight: 700; }
.group-row th { text-align: left; background: #eaeef2; font-size: 1rem; }
.group-count { color: var(--muted); font-weight: 400; }
tr.def-row { cursor: pointer; }
tr.def-row:hover td, tr.def-row:hover th { background: #f3f6f9; }
tr.def-row.selected td, tr.def-row.selected th { background: var(--sel); }
tr.def-row:focus-visible { outline: 2px solid #0969da; outline-offset: -2px; }
tr.def-row th { text-align: left; font-weight: 500; white-space: nowrap; }
.drift { display: block; font-size: 0.8em; font-weight: 400; }
.models { display: block; color: var(--muted); font-size: 0.8em; font-weight: 400; }
td.cell { text-align: center; white-space: nowrap; }
td.cell .t { font-variant-numeric: tabular-nums; }
.st-pass { background: #dafbe1; }
.st-fail, .st-error, .st-timeout { background: #ffebe9; }
.st-install-failed { background: #fff1e5; }
.st-xfail, .st-xpass { background: #fff8c5; }
.st-not-run { color: var(--muted); }
#details { border-top: 1px solid var(--border); margin-top: 1rem; }
#plot svg { max-width: 100%; height: auto; font-family: inherit; }
#plot .bar { fill: #2da44e; }
#plot .bar.st-fail, #plot .bar.st-error, #plot .bar.st-timeout { fill: #cf222e; }
#plot .bar.st-xfail, #plot .bar.st-xpass { fill: #bf8700; }
#plot .whisker { stroke: #1f2328; stroke-width: 1.5; }
#plot .grid { stroke: #d0d7de; stroke-width: 1; }
#plot text { font-size: 12px; fill: #1f2328; }
#plot text.tick, #plot text.axis { fill: var(--muted); }
.details-table td, .details-table th { font-size: 0.9em; }
.details-table th[scope=row] { text-align: left; font-weight: 500; }
.env-table th[scope=row] { text-align: left; font-weight: 500; }
.env-id { display: block; color: var(--muted); font-size: 0.8em; font-weight: 400; }
td.env-ok { color: #1a7f37; }
td.env-install-failed, td.env-tests-failed, td.env-corrupt, td.env-uninstallable { color: #cf222e; }
""".strip()

_JS = r"""
(function () {
  'use strict';
  var SVG_NS = 'http://www.w3.org/2000/svg';
  var data = JSON.parse(document.getElementById('matrix-data').textContent);
  var config = JSON.parse(document.getElementById('matrix-config').textContent);
  var environments = Array.isArray(data.environments) ? data.environments.filter(isObject) : [];
  var definitions = Array.isArray(data.definitions) ? data.definitions.filter(isObject) : [];
  var states = isObject(data.states) ? data.states : {};
  var cellIndex = new Map();
  (Array.isArray(data.cells) ? data.cells : []).forEach(function (c) {
    if (isObject(c)) { cellIndex.set(String(c.definition) + '\u0000' + String(c.environment), c); }
  });
  var table = document.getElementById('matrix');
  var rows = Array.prototype.slice.call(table.querySelectorAll('tr.def-row'));
  var groups = Array.prototype.slice.call(table.querySelectorAll('tbody.group'));
  var selOp = document.getElementById('filter-op');
  var selModel = document.getElementById('filter-model');
  var selStatus = document.getElementById('filter-status');
  var inText = document.getElementById('filter-text');
  var counter = document.getElementById('count');
  var noMatch = document.getElementById('no-match');
  var sortCol = null;
  var sortDir = 1;

  function isObject(v) { return v !== null && typeof v === 'object' && !Array.isArray(v); }
  function num(v) { return (typeof v === 'number' && isFinite(v)) ? v : null; }
  function symbol(s) { return config.symbols[s] || '?'; }
  function stateClass(s) { return 'st-' + String(s).replace(/[^A-Za-z0-9]/g, '-'); }
  function fmtUs(v) {
    if (v === 0) { return '0'; }
    var a = Math.abs(v);
    var places = a >= 100 ? 0 : (a >= 10 ? 1 : (a >= 1 ? 2 : 2 - Math.floor(Math.log10(a))));
    var s = v.toFixed(Math.min(places, 20));
    return s.indexOf('.') >= 0 ? s.replace(/0+$/, '').replace(/\.$/, '') : s;
  }
  function rowModels(row) {
    try { return JSON.parse(row.dataset.models || '[]'); } catch (e) { return []; }
  }

  function applyFilters() {
    var op = selOp.value, model = selModel.value, status = selStatus.value;
    var text = inText.value.trim().toLowerCase();
    var shown = 0;
    rows.forEach(function (row) {
      var ok = (!op || row.dataset.opType === op) &&
        (!model || rowModels(row).indexOf(model) >= 0) &&
        (!status || Array.prototype.some.call(row.cells, function (c) { return c.dataset.state === status; })) &&
        (!text || row.dataset.definition.toLowerCase().indexOf(text) >= 0);
      row.hidden = !ok;
      if (ok) { shown += 1; }
    });
    groups.forEach(function (g) {
      var header = g.querySelector('tr.group-row');
      var any = Array.prototype.some.call(g.querySelectorAll('tr.def-row'), function (r) { return !r.hidden; });
      if (header) { header.hidden = !any; }
    });
    counter.textContent = shown + ' of ' + rows.length + ' definitions';
    noMatch.hidden = shown !== 0;
  }

  function severity(state) {
    var i = config.severity.indexOf(state);
    return i < 0 ? config.severity.length : i;
  }
  function compareRows(a, b) {
    var r = 0;
    if (sortCol === 0) {
      var x = a.dataset.definition, y = b.dataset.definition;
      r = x < y ? -1 : (x > y ? 1 : 0);
    } else {
      var ca = a.cells[sortCol], cb = b.cells[sortCol];
      r = severity(ca.dataset.state) - severity(cb.dataset.state);
      if (r === 0) {
        var ma = ca.dataset.median !== undefined ? Number(ca.dataset.median) : Infinity;
        var mb = cb.dataset.median !== undefined ? Number(cb.dataset.median) : Infinity;
        r = ma === mb ? 0 : (ma < mb ? -1 : 1);
      }
    }
    return r * sortDir || Number(a.dataset.index) - Number(b.dataset.index);
  }
  function sortBy(col) {
    if (sortCol === col) { sortDir = -sortDir; } else { sortCol = col; sortDir = 1; }
    groups.forEach(function (g) {
      Array.prototype.slice.call(g.querySelectorAll('tr.def-row')).sort(compareRows)
        .forEach(function (r) { g.appendChild(r); });
    });
    table.querySelectorAll('thead th').forEach(function (th) {
      var b = th.querySelector('button.sort');
      var active = b && Number(b.dataset.col) === col;
      th.setAttribute('aria-sort', active ? (sortDir > 0 ? 'ascending' : 'descending') : 'none');
      var ind = th.querySelector('.sort-ind');
      if (ind) { ind.textContent = active ? (sortDir > 0 ? '▲' : '▼') : ''; }
    });
  }

  function svg(name, attrs, text) {
    var el = document.createElementNS(SVG_NS, name);
    Object.keys(attrs || {}).forEach(function (k) { el.setAttribute(k, String(attrs[k])); });
    if (text !== undefined && text !== null) { el.textContent = text; }
    return el;
  }
  function niceCeil(v) {
    if (!(v > 0)) { return 1; }
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) { if (v <= steps[i] * p) { return steps[i] * p; } }
    return 10 * p;
  }
  function shorten(s, n) { return s.length > n ? s.slice(0, n - 1) + '…' : s; }

  function timingChart(name, entries) {
    var labelW = 340, plotW = 430, valueW = 90, rowH = 30, top = 24, axisH = 36;
    var width = labelW + plotW + valueW, height = top + rowH * entries.length + axisH;
    var values = [];
    entries.forEach(function (e) {
      values.push(e.median);
      if (e.q1 !== null && e.q3 !== null) { values.push(e.q1, e.q3); }
    });
    var lo = Math.min.apply(null, values), hi = Math.max.apply(null, values);
    // Times that span orders of magnitude (a CPU next to a GPU) get a log scale, one tick per decade.
    var log = lo > 0 && hi / lo >= 20;
    var ticks = [], x;
    if (log) {
      var d0 = Math.floor(Math.log10(lo)), d1 = Math.max(Math.ceil(Math.log10(hi)), d0 + 1);
      x = function (v) { return labelW + (Math.log10(Math.max(v, lo)) - d0) / (d1 - d0) * plotW; };
      for (var d = d0; d <= d1; d++) { ticks.push(Math.pow(10, d)); }
    } else {
      var top_ = niceCeil(hi);
      x = function (v) { return labelW + Math.max(0, v) / top_ * plotW; };
      for (var k = 0; k <= 4; k++) { ticks.push(top_ * k / 4); }
    }
    var root = svg('svg', {viewBox: '0 0 ' + width + ' ' + height, width: width, height: height,
      role: 'img', 'aria-labelledby': 'plot-title', 'data-scale': log ? 'log' : 'linear'});
    root.appendChild(svg('title', {id: 'plot-title'}, name + ': median time per environment (µs), whiskers q1–q3'));
    root.appendChild(svg('text', {x: labelW, y: 14, 'class': 'axis'},
      'median time (µs' + (log ? ', log scale' : '') + '); whisker: q1–q3'));
    ticks.forEach(function (v) {
      var gx = x(v);
      root.appendChild(svg('line', {x1: gx, x2: gx, y1: top - 4, y2: top + rowH * entries.length, 'class': 'grid'}));
      root.appendChild(svg('text', {x: gx, y: top + rowH * entries.length + 16, 'text-anchor': 'middle',
        'class': 'tick'}, fmtUs(v)));
    });
    entries.forEach(function (e, i) {
      var y = top + i * rowH, mid = y + rowH / 2;
      var g = svg('g', {'class': 'bar-group', 'data-environment': e.env.id});
      g.appendChild(svg('text', {x: labelW - 8, y: mid + 4, 'text-anchor': 'end', 'class': 'bar-label'},
        shorten(e.label, 52)));
      var rect = svg('rect', {x: labelW, y: y + 6, width: Math.max(1, x(e.median) - labelW), height: rowH - 12,
        rx: 2, 'class': 'bar ' + stateClass(e.state), 'data-environment': e.env.id});
      var tip = e.label + ': median ' + fmtUs(e.median) + ' µs';
      if (e.q1 !== null && e.q3 !== null) { tip += ', q1 ' + fmtUs(e.q1) + ' µs, q3 ' + fmtUs(e.q3) + ' µs'; }
      if (e.timing.timer) { tip += ', timer ' + e.timing.timer; }
      rect.appendChild(svg('title', {}, tip));
      g.appendChild(rect);
      var right = e.median;
      if (e.q1 !== null && e.q3 !== null) {
        var x1 = x(e.q1), x3 = x(e.q3);
        g.appendChild(svg('line', {x1: x1, x2: x3, y1: mid, y2: mid, 'class': 'whisker'}));
        g.appendChild(svg('line', {x1: x1, x2: x1, y1: mid - 6, y2: mid + 6, 'class': 'whisker'}));
        g.appendChild(svg('line', {x1: x3, x2: x3, y1: mid - 6, y2: mid + 6, 'class': 'whisker'}));
        right = Math.max(right, e.q3);
      }
      g.appendChild(svg('text', {x: x(right) + 6, y: mid + 4, 'class': 'bar-value'}, fmtUs(e.median) + ' µs'));
      root.appendChild(g);
    });
    return root;
  }

  function el(name, text, cls) {
    var e = document.createElement(name);
    if (text !== undefined && text !== null) { e.textContent = text; }
    if (cls) { e.className = cls; }
    return e;
  }

  function showDetails(row) {
    rows.forEach(function (r) { r.classList.toggle('selected', r === row); });
    var def = definitions[Number(row.dataset.index)] || {name: row.dataset.definition};
    var name = String(def.name);
    document.getElementById('details-title').textContent = name;
    var hint = document.querySelector('#details .hint');
    var models = Array.isArray(def.models) && def.models.length ? ' · models: ' + def.models.join(', ') : '';
    hint.textContent = 'op type: ' + (def.op_type || 'other') + models;
    var entries = [];
    var tbl = el('table', null, 'details-table');
    var head = tbl.createTHead().insertRow();
    ['environment', 'state', 'reason', 'median', 'q1–q3', 'timer', 'tests'].forEach(function (h) {
      var th = el('th', h); th.scope = 'col'; head.appendChild(th);
    });
    var body = tbl.createTBody();
    environments.forEach(function (env, i) {
      var cell = cellIndex.get(name + '\u0000' + String(env.id)) || null;
      var state = cell && cell.state ? String(cell.state) : config.notRun;
      var timing = cell && isObject(cell.timing) ? cell.timing : {};
      var median = num(timing.median_us), q1 = num(timing.q1_us), q3 = num(timing.q3_us);
      var label = (config.envLines[i] || [String(env.label || env.id)]).join(' · ');
      if (median !== null) {
        entries.push({env: env, label: label, state: state, timing: timing, median: median, q1: q1, q3: q3});
      }
      var tr = body.insertRow();
      var th = el('th', label); th.scope = 'row'; th.title = String(env.label || env.id); tr.appendChild(th);
      var st = el('td', symbol(state) + ' ' + state, stateClass(state));
      st.title = states[state] || '';
      tr.appendChild(st);
      tr.appendChild(el('td', cell && cell.reason ? String(cell.reason) : ''));
      tr.appendChild(el('td', median !== null ? fmtUs(median) + ' µs' : ''));
      tr.appendChild(el('td', q1 !== null && q3 !== null ? fmtUs(q1) + '–' + fmtUs(q3) + ' µs' : ''));
      tr.appendChild(el('td', timing.timer ? String(timing.timer) : ''));
      tr.appendChild(el('td', cell && cell.tests !== undefined && cell.tests !== null ? String(cell.tests) : ''));
    });
    var plot = document.getElementById('plot');
    plot.replaceChildren(entries.length ? timingChart(name, entries)
      : el('p', 'No timing for this definition in any environment.', 'no-timing'));
    var wrap = el('div', null, 'table-wrap');
    wrap.appendChild(tbl);
    document.getElementById('details-cells').replaceChildren(wrap);
  }

  [selOp, selModel, selStatus].forEach(function (s) { s.addEventListener('change', applyFilters); });
  inText.addEventListener('input', applyFilters);
  document.getElementById('filter-reset').addEventListener('click', function () {
    selOp.value = ''; selModel.value = ''; selStatus.value = ''; inText.value = '';
    applyFilters();
  });
  table.querySelectorAll('thead button.sort').forEach(function (b) {
    b.addEventListener('click', function () { sortBy(Number(b.dataset.col)); });
  });
  rows.forEach(function (row) {
    row.addEventListener('click', function () { showDetails(row); });
    row.addEventListener('keydown', function (ev) {
      if (ev.target === row && (ev.key === 'Enter' || ev.key === ' ')) { ev.preventDefault(); showDetails(row); }
    });
  });
  applyFilters();
  document.documentElement.dataset.ready = '1';
})();
""".strip()

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

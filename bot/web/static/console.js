/* msmon web console: live tables and curves over Server-Sent Events, and the command box.
   Served from the bot (no CDN). Everything from a job is put in the page as text (textContent), never
   as HTML. Settings come from data- attributes (the Content-Security-Policy allows no inline script). */
(function () {
  "use strict";
  var body = document.body;
  var BASE = body.dataset.base || "/console";
  var CSRF = body.dataset.csrf || "";
  var root = document.getElementById("page");
  var MAX_POINTS = 5000; // per device and curve: the page's memory is bounded too
  var LEGEND_MAX = 8;    // ranks named in a chart's legend; more are lines only
  var COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                "#bcbd22", "#17becf"];
  var state = {charts: {}, devices: {}, alerts: [], run: null, events: 0, pending: null, clock: {}, xs: []};
  window.msmonConsole = state; // for people debugging a page (and the browser tests)

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function runHref(id) { return BASE + "/runs/" + encodeURIComponent(id); }

  // -- commands --------------------------------------------------------------------------------------
  // The command box sends its text; an alert's ack / silence button sends its fields as they are (a run
  // id with a space in it stays one run id: never joined into a text that parses back as another alert).
  function commandBody(form) {
    var f = new FormData(form);
    if (f.get("text")) return {text: String(f.get("text"))};
    var verb = f.get("verb");
    if (verb !== "ack" && verb !== "silence") return null;
    var body = {verb: verb};
    ["run", "rule", "device", "duration"].forEach(function (k) { if (f.get(k) !== null) body[k] = String(f.get(k)); });
    return body;
  }

  function showAnswer(text, ok) {
    var box = document.getElementById("answer");
    if (!box) return;
    box.textContent = text;
    box.className = ok ? "ok" : "refused";
  }

  function send(body) {
    return fetch(BASE + "/commands", {
      method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json", "X-CSRF-Token": CSRF, "Accept": "application/json"},
      body: JSON.stringify(body)
    }).then(function (r) { return r.json(); }).then(function (a) {
      showAnswer(a.text || a.error || "", !!a.ok);
      // a command the job applies later: its result is added here when the commands table says it is done
      state.pending = a.command && a.command.status === "pending" ? {id: a.command.id, text: a.text} : null;
      return a;
    }).catch(function (e) { showAnswer("The bot did not answer: " + e, false); });
  }

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (!form.classList || !form.classList.contains("cmd")) return;
    ev.preventDefault();
    var body = commandBody(form);
    if (!body) return;
    send(body).then(function () {
      var input = document.getElementById("command-text");
      if (input && form.id === "command-form") input.value = "";
    });
  });

  // -- tables ----------------------------------------------------------------------------------------
  function hidden(name, value) {
    var i = document.createElement("input");
    i.type = "hidden"; i.name = name; i.value = value;
    return i;
  }

  function alertActions(a) {
    var td = el("td", null, "actions");
    if (a.status !== "firing") return td;
    var ack = document.createElement("form");
    ack.method = "post"; ack.action = BASE + "/commands"; ack.className = "cmd";
    [["csrf", CSRF], ["verb", "ack"], ["run", a.run_id], ["rule", a.rule], ["device", a.device]].forEach(function (kv) {
      ack.appendChild(hidden(kv[0], kv[1]));
    });
    ack.appendChild(el("button", "ack"));
    var sil = document.createElement("form");
    sil.method = "post"; sil.action = BASE + "/commands"; sil.className = "cmd silence";
    [["csrf", CSRF], ["verb", "silence"], ["run", a.run_id], ["rule", a.rule]].forEach(function (kv) {
      sil.appendChild(hidden(kv[0], kv[1]));
    });
    var sel = document.createElement("select");
    sel.name = "duration";
    ["30m", "1h", "4h", "1d"].forEach(function (d) { sel.appendChild(el("option", d)); });
    sil.appendChild(sel);
    sil.appendChild(el("button", "silence"));
    td.appendChild(ack); td.appendChild(sil);
    return td;
  }

  function renderAlerts(rows, withRun) {
    var table = document.getElementById("alerts");
    if (!table) return;
    var tbody = table.tBodies[0];
    tbody.replaceChildren();
    rows.forEach(function (a) {
      var tr = el("tr", null, "alert sev-" + a.severity + " st-" + a.status);
      tr.dataset.rule = a.rule; tr.dataset.device = a.device;
      if (withRun) {
        var td = el("td"); var link = el("a", a.run_id); link.href = runHref(a.run_id);
        td.appendChild(link); tr.appendChild(td);
      }
      [a.rule, a.device, a.severity, a.status, a.first_step, a.last_step, a.acked_by || ""].forEach(function (v, i) {
        tr.appendChild(el("td", v, i === 4 || i === 5 ? "num" : ""));
      });
      tr.appendChild(alertActions(a));
      tbody.appendChild(tr);
    });
  }

  function ago(s) {  // as pages.ago: by the bot's clock, not the browser's
    if (s === null || s === undefined) return "-";
    return s < 120 ? Math.round(s) + " s ago" : s < 7200 ? Math.round(s / 60) + " min ago" : (s / 3600).toFixed(1) + " h ago";
  }

  function badge(s) { return el("span", s, "state state-" + s); }

  function renderRuns(rows) {
    var table = document.getElementById("runs");
    if (!table) return;
    var tbody = table.tBodies[0];
    tbody.replaceChildren();
    rows.forEach(function (r) {
      var tr = el("tr"); tr.dataset.run = r.run_id;
      var td = el("td"); var a = el("a", r.run_id); a.href = runHref(r.run_id); td.appendChild(a); tr.appendChild(td);
      tr.appendChild(el("td", r.project));
      td = el("td"); td.appendChild(badge(r.state)); tr.appendChild(td);
      tr.appendChild(el("td", r.step.toLocaleString("en"), "num"));
      td = el("td");
      if (r.total_steps) {
        var p = document.createElement("progress"); p.max = r.total_steps; p.value = r.step;
        td.appendChild(p); td.appendChild(document.createTextNode(" " + Math.round(100 * (r.progress || 0)) + " %"));
      }
      tr.appendChild(td);
      tr.appendChild(el("td", r.firing, "num" + (r.errors ? " firing error" : r.firing ? " firing" : "")));
      tr.appendChild(el("td", ago(r.seen_ago)));
      tbody.appendChild(tr);
    });
  }

  function renderRun(r) {
    state.run = r;
    var s = document.getElementById("run-state");
    if (s) s.replaceChildren(badge(r.state));
    var step = document.getElementById("run-step");
    if (step) step.textContent = r.step.toLocaleString("en");
    var devs = document.getElementById("run-devices");
    if (devs) devs.textContent = r.devices.length > LEGEND_MAX ? r.devices.length + " (" + r.devices[0] + " ... " +
      r.devices[r.devices.length - 1] + ")" : r.devices.join(", ");
  }

  function renderCommands(rows) {
    var p = state.pending;
    rows.forEach(function (c) {
      if (p && c.id === p.id && c.status !== "pending") {
        showAnswer(p.text + "\n" + c.id + " " + c.status + (c.detail ? ": " + c.detail : ""), c.status === "done");
        state.pending = null;
      }
    });
    var table = document.getElementById("commands");
    if (!table) return;
    var tbody = table.tBodies[0];
    tbody.replaceChildren();
    rows.forEach(function (c) {
      var tr = el("tr");
      tr.appendChild(el("td", c.id)); tr.appendChild(el("td", c.user));
      var td = el("td"); td.appendChild(el("code", c.text)); tr.appendChild(td);
      tr.appendChild(el("td", c.status)); tr.appendChild(el("td", c.detail));
      tbody.appendChild(tr);
    });
  }

  // -- curves ----------------------------------------------------------------------------------------
  // Values come as numbers, null (not reported) or the wire's "NaN" / "Infinity" / "-Infinity": both of the
  // last are drawn as a gap, and the chart says at which steps the values were not finite.
  function addSamples(fresh) {
    Object.keys(fresh).forEach(function (dev) {
      var cols = fresh[dev];
      var have = state.devices[dev];
      if (!have) { have = state.devices[dev] = {}; }
      Object.keys(cols).forEach(function (k) {
        if (k === "throughput_unit") { have.unit = cols[k][0]; return; }
        var arr = (have[k] || []).concat(cols[k]);
        if (arr.length > MAX_POINTS) arr = arr.slice(arr.length - MAX_POINTS);
        have[k] = arr;
      });
    });
  }

  function finite(v) { return typeof v === "number" ? v : null; }

  function aligned(key) {
    // uPlot wants one x array: the union of every device's steps, each device's values on it (null: a gap)
    var devs = Object.keys(state.devices).sort(function (a, b) { return a.length - b.length || (a < b ? -1 : 1); });
    var steps = {}, clock = {};
    devs.forEach(function (d) {
      var dv = state.devices[d];
      dv.steps.forEach(function (s, i) { steps[s] = true; if (dv.time && dv.time[i]) clock[s] = dv.time[i]; });
    });
    var xs = Object.keys(steps).map(Number).sort(function (a, b) { return a - b; });
    var index = {};
    xs.forEach(function (s, i) { index[s] = i; });
    var data = [xs], bad = [];  // bad: the steps whose value was NaN or Inf on some device
    devs.forEach(function (d) {
      var ys = new Array(xs.length).fill(null);
      var dv = state.devices[d];
      dv.steps.forEach(function (s, i) {
        var v = dv[key] ? dv[key][i] : null;
        ys[index[s]] = finite(v);
        if (typeof v === "string") bad.push(s);
      });
      data.push(ys);
    });
    return {devs: devs, data: data, bad: bad, clock: clock};
  }

  function stretches(steps, spacing) {
    // steps -> "2,005-2,999" ranges: steps no further apart than the samples' own spacing (or 1% of the span)
    // are one stretch
    if (!steps.length) return [];
    steps = steps.slice().sort(function (a, b) { return a - b; });
    var gap = Math.max(1, 1.5 * (spacing || 1), (steps[steps.length - 1] - steps[0]) / 100);
    var out = [], lo = steps[0], hi = steps[0];
    steps.slice(1).forEach(function (s) {
      if (s - hi > gap) { out.push([lo, hi]); lo = s; }
      hi = s;
    });
    out.push([lo, hi]);
    return out.map(function (r) { return r[0] === r[1] ? fmtStep(r[0]) : fmtStep(r[0]) + "-" + fmtStep(r[1]); });
  }

  function fmtStep(s) { return Number(s).toLocaleString("en"); }

  function compact(v) {
    // tick labels that fit the axis: 1.2M, 350k, 0.0021, 2e-05
    if (v === null || v === undefined) return "";
    var a = Math.abs(v);
    if (a === 0) return "0";
    if (a >= 1e9) return +(v / 1e9).toPrecision(3) + "G";
    if (a >= 1e6) return +(v / 1e6).toPrecision(3) + "M";
    if (a >= 1e4) return +(v / 1e3).toPrecision(3) + "k";
    if (a < 1e-3) return v.toExponential(1);
    return String(+v.toPrecision(4));
  }

  function wallClock(t) {
    var d = new Date(t * 1000);
    function two(n) { return (n < 10 ? "0" : "") + n; }
    return two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds());
  }

  function nearestClock(clock, xs, s) {
    // the wall-clock time of the sample nearest step s (the job's clock, shown in the browser's time zone)
    if (!xs.length) return "";
    var lo = 0, hi = xs.length - 1;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (xs[mid] < s) lo = mid + 1; else hi = mid; }
    var best = lo > 0 && Math.abs(xs[lo - 1] - s) < Math.abs(xs[lo] - s) ? xs[lo - 1] : xs[lo];
    var spacing = xs.length > 1 ? (xs[xs.length - 1] - xs[0]) / (xs.length - 1) : 1;
    if (Math.abs(best - s) > 2 * spacing) return "";  // no sample near that step (before the bot's window)
    return clock[best] ? wallClock(clock[best]) : "";
  }

  function firstAlertStep() {
    // where the run's firing alerts began: the x axis reaches back to it
    var first = null;
    state.alerts.forEach(function (a) {
      if (a.status === "firing" && (first === null || a.first_step < first)) first = a.first_step;
    });
    return first;
  }

  function markers(u) {
    // the run's alerts, a vertical line at the step each started firing, labelled with its rule; a label that
    // would run into the one before it goes on the next row down
    var ctx = u.ctx, dpr = devicePixelRatio;
    var min = u.scales.x.min, max = u.scales.x.max;
    var rows = [], lineH = 12 * dpr;
    ctx.save();
    ctx.font = (10 * dpr) + "px sans-serif";
    ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";  // not what uPlot's axes left set
    state.alerts.slice().sort(function (a, b) { return a.first_step - b.first_step; }).forEach(function (a) {
      if (a.first_step < min || a.first_step > max) return;
      var x = u.valToPos(a.first_step, "x", true);
      ctx.strokeStyle = ctx.fillStyle = a.severity === "ERROR" ? "#c62828" : "#ef8f00";
      ctx.setLineDash([4 * dpr, 3 * dpr]);
      ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
      var w = ctx.measureText(a.rule).width, lx = x + 3 * dpr;
      if (lx + w > u.bbox.left + u.bbox.width) lx = x - 3 * dpr - w;  // at the right edge: left of its line
      var row = 0;
      while (rows[row] !== undefined && lx < rows[row] + 4 * dpr) row++;
      rows[row] = lx + w;
      ctx.fillText(a.rule, lx, u.bbox.top + lineH * (row + 1));
      (u.labels = u.labels || []).push({rule: a.rule, x: lx, w: w, row: row});
    });
    ctx.restore();
  }

  function note(fig, text) {
    var p = fig.querySelector(".note");
    if (!p) { p = el("p", null, "note"); fig.appendChild(p); }
    p.textContent = text;
    p.hidden = !text;
  }

  function draw() {
    var figs = document.querySelectorAll("figure.chart");
    var reach = firstAlertStep();
    figs.forEach(function (fig) {
      var key = fig.dataset.key;
      var al = aligned(key);
      var points = 0;
      al.data.slice(1).forEach(function (ys) { ys.forEach(function (v) { if (v !== null) points++; }); });
      fig.dataset.points = String(points);
      fig.dataset.devices = al.devs.join(",");
      var plot = fig.querySelector(".plot");
      if (key === "throughput") {
        var unit = (al.devs.length && state.devices[al.devs[0]].unit) || "";
        fig.querySelector("figcaption").textContent = "throughput" + (unit ? " (" + unit.replace("_per_s", "/s") + ")" : "");
      }
      var xs = al.data[0], says = [];
      var spacing = xs.length > 1 ? (xs[xs.length - 1] - xs[0]) / (xs.length - 1) : 1;
      if (al.bad.length) says.push("not finite (NaN or Inf) at steps " + stretches(al.bad, spacing).join(", ") +
                                   ": drawn as a gap");
      if (reach !== null && xs.length && reach < xs[0])
        says.push("the alerts began at step " + fmtStep(reach) + "; the bot keeps samples from step " + fmtStep(xs[0]) +
                  " on (bot.window_samples)");
      if (!points && xs.length && !al.bad.length) says.push("no " + key.replace("_", " ") + " reported");
      if (al.devs.length > LEGEND_MAX) says.push(al.devs.length + " ranks, one line each (colours repeat)");
      note(fig, says.join("; "));
      fig.dataset.note = says.join("; ");
      state.clock = al.clock; state.xs = xs;
      var chart = state.charts[key];
      if (chart && chart.series.length === al.data.length) {
        chart.reach = reach;
        chart.setData(al.data);
        return;
      }
      if (chart) chart.destroy();
      var series = [{label: "step", value: function (u, s) { return s === null ? "" : fmtStep(s) + " " + nearestClock(state.clock, state.xs, s); }}];
      al.devs.forEach(function (d, i) {
        series.push({label: d === "whole run" ? "whole run (downsampled)" : al.devs.length > 1 ? "rank " + d : key, stroke: COLORS[i % COLORS.length], width: 1.5,
                     spanGaps: false, points: {show: false}});
      });
      chart = state.charts[key] = new uPlot({
        width: Math.max(plot.clientWidth || 420, 280), height: 220, series: series,
        padding: [8, 30, 0, 0],  // room on the right for the last tick's label
        scales: {
          x: {time: false, range: function (u, lo, hi) {
            var r = u.reach;
            if (r !== null && r !== undefined && r < lo) lo = r;  // the alerts' start in view
            if (lo === hi) { lo -= 1; hi += 1; }
            return [lo, hi];
          }},
          y: {range: function (u, lo, hi) {
            if (lo === null || hi === null) return [0, 1];
            if (hi - lo <= Math.abs(hi) * 1e-6) {  // a constant (a flat LR): the value in the middle, not noise
              var pad = Math.abs(hi) * 0.5 || 1;
              return [lo - pad, hi + pad];
            }
            return uPlot.rangeNum(lo, hi, 0.1, true);
          }}
        },
        legend: {show: al.devs.length > 1 && al.devs.length <= LEGEND_MAX},  // 64 ranks: lines, not a table
        axes: [
          {label: "step", size: 52, values: function (u, splits) {
            return splits.map(function (s) { return compact(s) + "\n" + nearestClock(state.clock, state.xs, s); });
          }},
          {size: 64, values: function (u, splits) { return splits.map(compact); }}
        ],
        hooks: {drawClear: [function (u) { u.labels = []; }], draw: [markers]}
      }, al.data, plot);
      chart.reach = reach;
      if (reach !== null) chart.setData(al.data);  // again, with the alerts' start in the x range
    });
  }

  function redrawMarkers() {
    if (window.uPlot && Object.keys(state.devices).length) draw();
    Object.keys(state.charts).forEach(function (k) { state.charts[k].redraw(false, false); });
  }

  // -- the stream ------------------------------------------------------------------------------------
  function listen(url, handlers) {
    var es = new EventSource(url, {withCredentials: true});
    Object.keys(handlers).forEach(function (name) {
      es.addEventListener(name, function (ev) {
        state.events++;
        handlers[name](JSON.parse(ev.data));
      });
    });
    es.onerror = function () { body.classList.add("disconnected"); };
    es.onopen = function () { body.classList.remove("disconnected"); };
    return es;
  }

  if (!root) return;
  var kind = root.dataset.page;
  if (kind === "run") {
    var runId = root.dataset.run;
    listen(BASE + "/api/stream?run=" + encodeURIComponent(runId), {
      reset: function () { state.devices = {}; },
      samples: function (fresh) { addSamples(fresh); if (window.uPlot) draw(); },
      alerts: function (rows) { state.alerts = rows; renderAlerts(rows, false); redrawMarkers(); },
      run: renderRun,
      commands: renderCommands
    });
  } else if (kind === "runs") {
    listen(BASE + "/api/stream", {runs: renderRuns, alerts: function () {}});
  } else if (kind === "alerts") {
    listen(BASE + "/api/stream", {runs: function () {}, alerts: function (rows) { renderAlerts(rows, true); }});
  }
})();

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
  var COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                "#bcbd22", "#17becf"];
  var state = {charts: {}, devices: {}, alerts: [], run: null, events: 0};
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
    if (devs) devs.textContent = r.devices.join(", ");
  }

  function renderCommands(rows) {
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

  function aligned(key) {
    // uPlot wants one x array: the union of every device's steps, each device's values on it (null: none)
    var devs = Object.keys(state.devices).sort(function (a, b) { return a.length - b.length || (a < b ? -1 : 1); });
    var steps = {};
    devs.forEach(function (d) { state.devices[d].steps.forEach(function (s) { steps[s] = true; }); });
    var xs = Object.keys(steps).map(Number).sort(function (a, b) { return a - b; });
    var index = {};
    xs.forEach(function (s, i) { index[s] = i; });
    var data = [xs];
    devs.forEach(function (d) {
      var ys = new Array(xs.length).fill(null);
      var dv = state.devices[d];
      dv.steps.forEach(function (s, i) { ys[index[s]] = dv[key][i]; });
      data.push(ys);
    });
    return {devs: devs, data: data};
  }

  function markers(u) {
    // the run's alerts, a vertical line at the step each started firing, labelled with its rule
    var ctx = u.ctx;
    var min = u.scales.x.min, max = u.scales.x.max;
    ctx.save();
    ctx.font = (10 * devicePixelRatio) + "px sans-serif";
    state.alerts.forEach(function (a) {
      if (a.first_step < min || a.first_step > max) return;
      var x = u.valToPos(a.first_step, "x", true);
      ctx.strokeStyle = ctx.fillStyle = a.severity === "ERROR" ? "#c62828" : "#ef8f00";
      ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
      ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
      ctx.fillText(a.rule, x + 3 * devicePixelRatio, u.bbox.top + 12 * devicePixelRatio);
    });
    ctx.restore();
  }

  function draw() {
    var figs = document.querySelectorAll("figure.chart");
    figs.forEach(function (fig) {
      var key = fig.dataset.key;
      var al = aligned(key);
      var points = 0;
      al.data.slice(1).forEach(function (ys) { ys.forEach(function (v) { if (v !== null) points++; }); });
      fig.dataset.points = String(points);
      fig.dataset.devices = al.devs.join(",");
      var plot = fig.querySelector(".plot");
      var chart = state.charts[key];
      if (key === "throughput") {
        var unit = (al.devs.length && state.devices[al.devs[0]].unit) || "";
        fig.querySelector("figcaption").textContent = "throughput" + (unit ? " (" + unit.replace("_per_s", "/s") + ")" : "");
      }
      if (chart && chart.series.length === al.data.length) {
        chart.setData(al.data);
        return;
      }
      if (chart) chart.destroy();
      var series = [{label: "step"}];
      al.devs.forEach(function (d, i) {
        series.push({label: al.devs.length > 1 ? "rank " + d : key, stroke: COLORS[i % COLORS.length], width: 1.5,
                     spanGaps: true, points: {show: false}});
      });
      state.charts[key] = new uPlot({
        width: Math.max(plot.clientWidth || 420, 280), height: 200, series: series,
        scales: {x: {time: false}}, legend: {show: al.devs.length > 1},
        axes: [{label: "step"}, {size: 60}], hooks: {draw: [markers]}
      }, al.data, plot);
    });
  }

  function redrawMarkers() {
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

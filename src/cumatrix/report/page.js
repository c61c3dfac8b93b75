"use strict";
(function () {
  var data = JSON.parse(document.getElementById("cumatrix-data").textContent);
  var cells = Array.prototype.slice.call(document.querySelectorAll("button.cell"));
  var panel = document.getElementById("panel");
  var detail = document.getElementById("detail");
  var keys = ["cat", "outcome", "driver", "runtime", "host"];
  var NAMES = {ok: "ok", expected: "expected failure reproduced", fail: "mismatch", skip: "skipped", "not-run": "not run"};

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function table(rows) {
    var t = el("table");
    rows.forEach(function (r) {
      if (r[1] === undefined || r[1] === null || r[1] === "") return;
      var tr = el("tr");
      tr.appendChild(el("td", r[0]));
      var v = r[1];
      tr.appendChild(el("td", typeof v === "object" ? JSON.stringify(v) : v));
      t.appendChild(tr);
    });
    return t;
  }
  function section(title, node) {
    detail.appendChild(el("h3", title));
    detail.appendChild(node);
  }

  function show(idx) {
    var item = data.cells[idx];
    if (!item) return;
    cells.forEach(function (b) { b.classList.toggle("sel", b.getAttribute("data-idx") === String(idx)); });
    detail.textContent = "";
    detail.appendChild(el("h2", item.id));
    var badge = el("span", NAMES[item.cat] + (item.host ? " · " + item.host : ""), "badge c-" + item.cat);
    detail.appendChild(badge);
    var c = item.cell;
    if (!c) {
      detail.appendChild(el("p", "This cell is in the matrix but has no result: the run was killed before it, or no host ran it."));
      section("axes", table(Object.keys(item.axes).map(function (k) { return [k, item.axes[k]]; })));
    } else {
      if (c.mismatch) detail.appendChild(el("div", c.mismatch, "mismatch"));
      var o = c.observed;
      section("expected vs observed", table([
        ["expected", c.expected.outcomes.join(" | ")],
        ["observed", item.label],
        ["reason", c.expected.reason],
        ["rule", c.expected.rule],
        ["error", o.error_name],
        ["detail", o.detail],
        ["exit status", o.exit_status],
        ["duration", c.duration_s === null ? null : c.duration_s + " s"],
        ["started", c.started]
      ]));
      var t = c.timings || {};
      if (t.gbps !== undefined || t.loop_gbps !== undefined) {
        var s = t.spread || {};
        section("timings", table([
          ["batch GB/s", t.gbps],
          ["loop GB/s", t.loop_gbps],
          ["speedup", t.speedup === undefined ? null : t.speedup + "×"],
          ["repetitions", t.repetitions],
          ["spread", s.min === undefined ? null : "min " + s.min + " · p10 " + s.p10 + " · p90 " + s.p90 + " · max " + s.max],
          ["bytes", t.bytes],
          ["wall", t.wall_s === undefined ? null : t.wall_s + " s"]
        ]));
      }
      var fp = c.fingerprint || {};
      section("fingerprint", table(Object.keys(fp).sort().map(function (k) { return [k, fp[k]]; })));
      section("stderr (tail)", el("pre", c.stderr_tail || "(empty)", "stderr"));
      if (c.stdout_tail) section("stdout (tail)", el("pre", c.stdout_tail, "stdout"));
      section("axes", table(Object.keys(item.axes).map(function (k) { return [k, item.axes[k]]; })));
    }
    panel.hidden = false;
    if (history.replaceState) history.replaceState(null, "", "#cell=" + encodeURIComponent(item.id) + (item.host ? "@" + encodeURIComponent(item.host) : ""));
  }

  function apply() {
    var want = {};
    keys.forEach(function (k) {
      var s = document.getElementById("f-" + k);
      want[k] = s ? s.value : "";
    });
    var text = document.getElementById("f-text").value.trim().toLowerCase();
    var shown = 0;
    cells.forEach(function (b) {
      var ok = keys.every(function (k) { return !want[k] || b.getAttribute("data-" + k) === want[k]; });
      if (ok && text) ok = b.getAttribute("data-id").toLowerCase().indexOf(text) >= 0;
      b.classList.toggle("off", !ok);
      if (ok) shown++;
    });
    Array.prototype.forEach.call(document.querySelectorAll("table.grid tbody tr"), function (tr) {
      tr.classList.toggle("off", !tr.querySelector("button.cell:not(.off)"));
    });
    Array.prototype.forEach.call(document.querySelectorAll(".grid-block"), function (g) {
      g.classList.toggle("off", !g.querySelector("button.cell:not(.off)"));
    });
    Array.prototype.forEach.call(document.querySelectorAll(".stat"), function (s) {
      s.classList.toggle("on", want.cat === s.getAttribute("data-cat"));
    });
    document.getElementById("shown").textContent = shown + " of " + cells.length + " cells shown";
  }

  document.addEventListener("click", function (ev) {
    var t = ev.target;
    var hit = t.closest ? t.closest("[data-idx]") : null;
    if (hit) { show(Number(hit.getAttribute("data-idx"))); return; }
    var stat = t.closest ? t.closest(".stat") : null;
    if (stat) {
      var sel = document.getElementById("f-cat");
      sel.value = sel.value === stat.getAttribute("data-cat") ? "" : stat.getAttribute("data-cat");
      apply();
    }
  });
  keys.forEach(function (k) {
    var s = document.getElementById("f-" + k);
    if (s) s.addEventListener("change", apply);
  });
  document.getElementById("f-text").addEventListener("input", apply);
  document.getElementById("f-reset").addEventListener("click", function () {
    keys.forEach(function (k) { var s = document.getElementById("f-" + k); if (s) s.value = ""; });
    document.getElementById("f-text").value = "";
    apply();
  });
  document.getElementById("close").addEventListener("click", function () {
    panel.hidden = true;
    cells.forEach(function (b) { b.classList.remove("sel"); });
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.key === "Escape") document.getElementById("close").click();
  });
  apply();
  var m = /^#cell=([^@]*)(?:@(.*))?$/.exec(location.hash);
  if (m) {
    var id = decodeURIComponent(m[1]), host = m[2] ? decodeURIComponent(m[2]) : null;
    data.cells.forEach(function (c, i) { if (c.id === id && (host === null || c.host === host)) show(i); });
  }
})();

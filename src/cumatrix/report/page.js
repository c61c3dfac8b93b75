"use strict";
(function () {
  // The index: data.cells[i] = [id, category code, label string, grid, row, col, host string].
  var data = JSON.parse(document.getElementById("cumatrix-data").textContent);
  var S = data.strings, CATS = data.cats, cells = data.cells, grids = data.grids;
  var details = null;  // parsed on the first click: the panel's block is the large one
  var panel = document.getElementById("panel");
  var detail = document.getElementById("detail");
  var keys = ["cat", "outcome", "driver", "runtime", "host"];
  var SVG = "http://www.w3.org/2000/svg";
  var shown = new Uint8Array(cells.length);
  var perGrid = grids.map(function () { return []; });
  var drawn = {};  // grid index -> {buttons: {cell index: button}, rows: [tr]}
  var selected = -1;
  cells.forEach(function (c, i) { perGrid[c[3]].push(i); });

  function str(n) { return n < 0 ? null : S[n]; }
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function field(c, k) {
    if (k === "cat") return CATS[c[1]];
    if (k === "outcome") return S[c[2]];
    if (k === "driver") return grids[c[3]].driver;
    if (k === "runtime") return grids[c[3]].t ? grids[c[3]].cols[c[5]] : grids[c[3]].rows[c[4]];
    if (k === "host") return str(c[6]) || "";
    return "";
  }

  // ------------------------------------------------------------------ grids, drawn when seen
  // A grid's layout comes with it: t (transposed: runtimes across, cases or variants down),
  // fr/fc (rows/columns whose every cell is a neutral skip: folded until asked for), co (the
  // order of the columns: those that matter first when the grid is wide).
  var unfolded = {};  // grid index -> its folded rows and columns are shown
  function lineHead(th, name, runtime) {
    if (runtime) {
      if (name === "none") { th.textContent = "none"; th.appendChild(el("small", "driver API")); } else th.textContent = name;
      return;
    }
    var m = /^(.*) h(\d.*)$/.exec(name);
    if (m) { th.appendChild(document.createTextNode(m[1])); th.appendChild(el("small", "headers " + m[2])); }
    else th.textContent = name;
  }
  function cellButton(i) {
    var c = cells[i], cat = CATS[c[1]], label = S[c[2]];
    var b = el("button", null, "cell c-" + cat);
    b.type = "button";
    b.setAttribute("data-idx", i);
    b.setAttribute("data-id", c[0]);
    b.title = c[0] + ": " + label;
    b.appendChild(el("span", data.glyphs[cat], "g"));
    b.appendChild(el("span", label, "l"));
    return b;
  }
  function blockOf(g) { return document.querySelector('.grid-block[data-grid="' + g + '"]'); }
  function drawGrid(g) {
    if (drawn[g]) return;
    var block = blockOf(g);
    if (block.classList.contains("folded")) return;  // every cell skipped: drawn when unfolded
    var G = grids[g], box = block.querySelector(".scroll"), all = !!unfolded[g];
    var at = {};
    perGrid[g].forEach(function (i) { at[cells[i][4] + "," + cells[i][5]] = i; });
    var fr = {}, fc = {};
    (G.fr || []).forEach(function (r) { fr[r] = true; });
    (G.fc || []).forEach(function (k) { fc[k] = true; });
    var order = (G.co || G.cols.map(function (_, k) { return k; })).filter(function (k) { return all || !fc[k]; });
    var table = el("table", null, "grid"), thead = el("thead"), hr = el("tr");
    hr.appendChild(el("th", G.t ? "case / variant" : "runtime", "corner"));
    order.forEach(function (k) { var th = el("th"); th.scope = "col"; lineHead(th, G.cols[k], G.t); hr.appendChild(th); });
    thead.appendChild(hr);
    table.appendChild(thead);
    var tbody = el("tbody"), buttons = {}, rows = {};
    G.rows.forEach(function (row, r) {
      if (!all && fr[r]) return;
      var tr = el("tr"), th = el("th");
      th.scope = "row";
      lineHead(th, row, !G.t);
      tr.appendChild(th);
      order.forEach(function (k) {
        var i = at[r + "," + k], td = el("td");
        if (i === undefined) td.className = "empty";
        else { buttons[i] = cellButton(i); td.appendChild(buttons[i]); }
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
      rows[r] = tr;
    });
    table.appendChild(tbody);
    box.textContent = "";
    box.style.minHeight = "";
    box.classList.toggle("tall", !!G.t);  // cases down the page: the page scrolls, not the block
    box.appendChild(table);
    var nf = (G.fr || []).length + (G.fc || []).length, note = block.querySelector(".lines-note");
    note.textContent = "";
    if (nf) {
      var what = (G.fc || []).length ? "column" : "row";
      note.appendChild(document.createTextNode(" " + nf + " " + what + (nf === 1 ? "" : "s") + " where every cell skipped " + (all ? "shown " : "folded ")));
      var b = el("button", all ? "fold" : "show", "link unfold");
      b.type = "button";
      b.setAttribute("data-lines", g);
      note.appendChild(b);
    }
    drawn[g] = {buttons: buttons, rows: rows};
    paintGrid(g);
  }
  function paintGrid(g) {
    var d = drawn[g];
    if (!d) return;
    var rowOn = {};
    perGrid[g].forEach(function (i) {
      var b = d.buttons[i];
      if (!b) return;
      b.classList.toggle("off", !shown[i]);
      b.classList.toggle("sel", i === selected);
      if (shown[i]) rowOn[cells[i][4]] = true;
    });
    Object.keys(d.rows).forEach(function (r) { d.rows[r].classList.toggle("off", !rowOn[r]); });
  }
  function redraw(g) { drawn[g] = null; drawGrid(g); }

  // ------------------------------------------------------------------ charts, drawn when seen
  function svg(tag, attrs, text) {
    var e = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function fmt(v, d) { return v === null || v === undefined ? "—" : v.toFixed(d === undefined ? 1 : d); }
  function drawChart(n) {
    var fig = document.querySelector('figure[data-chart="' + n + '"]');
    if (!fig || fig.getAttribute("data-drawn")) return;
    fig.setAttribute("data-drawn", "1");
    var rows = data.charts[n].rows, LW = 300, BW = 520, RW = 90, RH = 34, TOP = 30;
    var W = LW + BW + RW, H = TOP + RH * rows.length + 10, peak = 0;
    rows.forEach(function (r) { [r[1], r[2], r[4]].forEach(function (v) { if (v !== null && v > peak) peak = v; }); });
    peak = peak || 1;
    function x(v) { return (LW + BW * v / peak).toFixed(1); }
    var s = svg("svg", {"class": "chart", role: "img", viewBox: "0 0 " + W + " " + H, width: W, height: H,
                        "aria-label": "bandwidth of workload " + data.charts[n].workload});
    for (var k = 0; k <= 4; k++) {
      var gx = (LW + BW * k / 4).toFixed(1);
      s.appendChild(svg("line", {"class": "gl", x1: gx, x2: gx, y1: TOP - 6, y2: H - 8}));
      s.appendChild(svg("text", {"class": "ax", x: gx, y: TOP - 12, "text-anchor": "middle"}, (peak * k / 4).toFixed(1)));
    }
    s.appendChild(svg("text", {"class": "ax", x: LW + BW + 6, y: TOP - 12}, "GB/s · speedup"));
    rows.forEach(function (r, j) {
      var i = r[0], y = TOP + j * RH, id = cells[i][0], p = id.split("/");
      var label = (p[2] || "?") + " " + (p[3] || "") + " · " + p[0] + " · " + p[1] + (str(cells[i][6]) ? " · " + str(cells[i][6]) : "");
      var g = svg("g", {"class": "row", "data-idx": i});
      g.appendChild(svg("title", {}, id));
      g.appendChild(svg("rect", {"class": "hit", x: 0, y: y, width: W, height: RH - 2}));
      g.appendChild(svg("text", {"class": "lab", x: LW - 8, y: y + 15, "text-anchor": "end"}, label));
      if (r[1] !== null) g.appendChild(svg("rect", {"class": "batch", x: LW, y: y + 4, width: x(r[1]) - LW, height: 11}));
      if (r[3] !== null && r[4] !== null) {
        var y0 = y + 9.5;
        g.appendChild(svg("path", {"class": "wh", d: "M" + x(r[3]) + " " + (y0 - 4) + "v8M" + x(r[3]) + " " + y0 + "H" + x(r[4]) + "M" + x(r[4]) + " " + (y0 - 4) + "v8"}));
      }
      if (r[2] !== null) g.appendChild(svg("rect", {"class": "loop", x: LW, y: y + 17, width: x(r[2]) - LW, height: 9}));
      g.appendChild(svg("text", {"class": "val", x: LW + BW + 6, y: y + 13}, fmt(r[1]) + " / " + fmt(r[2])));
      g.appendChild(svg("text", {"class": "spd", x: LW + BW + 6, y: y + 27}, r[5] === null ? "" : r[5].toFixed(2) + "×"));
      s.appendChild(g);
    });
    fig.querySelector(".chart-box").appendChild(s);
  }

  var blocks = Array.prototype.slice.call(document.querySelectorAll(".grid-block"));
  var figures = Array.prototype.slice.call(document.querySelectorAll("figure[data-chart]"));
  blocks.forEach(function (b) {  // reserve the grid's height so the scrollbar does not jump
    var G = grids[Number(b.getAttribute("data-grid"))], n = G.rows.length - (G.fr || []).length;
    if (!b.classList.contains("folded")) b.querySelector(".scroll").style.minHeight = (34 + 31 * n) + "px";
  });
  function drawAll() {  // printing: every grid, folded lines and all
    blocks.forEach(function (b) {
      var g = Number(b.getAttribute("data-grid")), u = b.querySelector("[data-unfold]");
      b.classList.remove("folded");
      if (u) u.remove();
      unfolded[g] = true;
      drawn[g] = null;
      drawGrid(g);
    });
    figures.forEach(function (f) { drawChart(Number(f.getAttribute("data-chart"))); });
  }
  var seen = window.IntersectionObserver ? new IntersectionObserver(function (es) {
    es.forEach(function (e) {
      if (!e.isIntersecting) return;
      var t = e.target;
      if (t.hasAttribute("data-grid")) drawGrid(Number(t.getAttribute("data-grid")));
      else drawChart(Number(t.getAttribute("data-chart")));
      seen.unobserve(t);
    });
  }, {rootMargin: "600px 0px"}) : null;
  window.addEventListener("beforeprint", drawAll);  // a printed page holds every grid

  // ------------------------------------------------------------------ the details panel
  function table(rows) {
    var t = el("table");
    rows.forEach(function (r) {
      var v = r[1];
      if (v === undefined || v === null || v === "") return;
      var tr = el("tr"), td = el("td");
      tr.appendChild(el("td", r[0]));
      var text = typeof v === "object" ? JSON.stringify(v) : String(v);
      // Multi-line values (compiler output, loader messages) keep their lines, in monospace.
      if (text.indexOf("\n") >= 0 || r[2]) td.appendChild(el("pre", text, "val")); else td.textContent = text;
      tr.appendChild(td);
      t.appendChild(tr);
    });
    return t;
  }
  function section(title, node) {
    detail.appendChild(el("h3", title));
    detail.appendChild(node);
  }
  function axesOf(i) {
    var p = cells[i][0].split("/"), a = {runtime: p[0], driver: p[1]};
    if (p.length === 3) a[p[2] === "probe" ? "kind" : "case"] = p[2];
    if (p.length > 3) { a.variant = p[2]; a.build = (p[3] || "").replace(/^h/, ""); a.workload = p.slice(4).join("/"); }
    return a;
  }
  function show(i) {
    var c = cells[i];
    if (!c) return;
    if (details === null) details = JSON.parse(document.getElementById("cumatrix-details").textContent);
    var d = details[i], cat = CATS[c[1]], host = str(c[6]);
    selected = i;
    Object.keys(drawn).forEach(paintGrid);
    detail.textContent = "";
    detail.appendChild(el("h2", c[0]));
    detail.appendChild(el("span", data.names[cat] + (host ? " · " + host : ""), "badge c-" + cat));
    if (!d) {
      detail.appendChild(el("p", "This cell is in the matrix but has no result: the run was killed before it, or no host ran it."));
      var a0 = axesOf(i);
      section("axes", table(Object.keys(a0).map(function (k) { return [k, a0[k]]; })));
    } else {
      if (d.m) detail.appendChild(el("pre", d.m, "mismatch"));
      section("expected vs observed", table([
        ["expected", str(d.e)], ["observed", S[c[2]]], ["reason", str(d.r)], ["rule", str(d.u)],
        ["error", d.n], ["detail", d.d, true], ["exit status", d.x],
        ["duration", d.du === undefined ? null : d.du + " s"], ["started", d.st === undefined ? null : str(d.st)]
      ]));
      var t = d.t;
      if (t && (t[0] !== null || t[1] !== null)) {
        section("timings", table([
          ["batch GB/s", t[0]], ["loop GB/s", t[1]], ["speedup", t[4] === null ? null : t[4] + "×"],
          ["repetitions", t[5]],
          ["spread", t[8] === null ? null : "min " + t[8] + " · p10 " + t[2] + " · p90 " + t[3] + " · max " + t[9]],
          ["bytes", t[6]], ["wall", t[7] === null ? null : t[7] + " s"]
        ]));
      }
      var fp = JSON.parse(str(d.f) || "{}");
      section("fingerprint", table(Object.keys(fp).sort().map(function (k) { return [k, fp[k]]; })));
      section("stderr (tail)", el("pre", d.se || "(empty)", "stderr"));
      if (d.so) section("stdout (tail)", el("pre", d.so, "stdout"));
      var a = JSON.parse(str(d.a) || "{}");
      section("axes", table(Object.keys(a).map(function (k) { return [k, a[k]]; })));
    }
    panel.hidden = false;
    if (history.replaceState) history.replaceState(null, "", "#cell=" + encodeURIComponent(c[0]) + (host ? "@" + encodeURIComponent(host) : ""));
  }

  // ------------------------------------------------------------------ filters
  function apply() {
    var want = {};
    keys.forEach(function (k) { var s = document.getElementById("f-" + k); want[k] = s ? s.value : ""; });
    var text = document.getElementById("f-text").value.trim().toLowerCase();
    var n = 0, gridOn = grids.map(function () { return false; }), lineOn = grids.map(function () { return false; });
    var filtering = !!text || keys.some(function (k) { return !!want[k]; });
    cells.forEach(function (c, i) {
      var ok = keys.every(function (k) { return !want[k] || field(c, k) === want[k]; });
      if (ok && text) ok = c[0].toLowerCase().indexOf(text) >= 0;
      shown[i] = ok ? 1 : 0;
      if (ok) {
        n++;
        gridOn[c[3]] = true;
        var G = grids[c[3]];
        if ((G.fr || []).indexOf(c[4]) >= 0 || (G.fc || []).indexOf(c[5]) >= 0) lineOn[c[3]] = true;
      }
    });
    blocks.forEach(function (b) {
      var g = Number(b.getAttribute("data-grid"));
      b.classList.toggle("off", !gridOn[g]);
      // A filter that picks cells of a folded grid or line (status "skipped", a driver, an id)
      // shows them: folding hides what nobody asked for, never what a reader looks for.
      if (!filtering || !gridOn[g]) return;
      if (b.classList.contains("folded")) {
        b.classList.remove("folded");
        var u = b.querySelector("[data-unfold]");
        if (u) u.remove();
        drawGrid(g);
      }
      if (lineOn[g] && !unfolded[g]) { unfolded[g] = true; redraw(g); }
    });
    Object.keys(drawn).forEach(paintGrid);
    Array.prototype.forEach.call(document.querySelectorAll("figure .row"), function (r) {
      r.classList.toggle("off", !shown[Number(r.getAttribute("data-idx"))]);
    });
    Array.prototype.forEach.call(document.querySelectorAll(".stat"), function (s) {
      s.classList.toggle("on", want.cat === s.getAttribute("data-cat"));
    });
    document.getElementById("shown").textContent = n + " of " + cells.length + " cells shown";
  }

  document.addEventListener("click", function (ev) {
    var t = ev.target;
    var unfold = t.closest ? t.closest("[data-unfold],[data-lines]") : null;
    if (unfold) {
      if (unfold.hasAttribute("data-unfold")) {
        var gb = Number(unfold.getAttribute("data-unfold"));
        blockOf(gb).classList.remove("folded");
        unfold.remove();
        drawGrid(gb);
      } else {
        var gl = Number(unfold.getAttribute("data-lines"));
        unfolded[gl] = !unfolded[gl];
        redraw(gl);
      }
      return;
    }
    var hit = t.closest ? t.closest("[data-idx]") : null;
    if (hit) { show(Number(hit.getAttribute("data-idx"))); return; }
    var stat = t.closest ? t.closest(".stat") : null;
    if (stat) {
      var sel = document.getElementById("f-cat");
      sel.value = sel.value === stat.getAttribute("data-cat") ? "" : stat.getAttribute("data-cat");
      apply();
    }
  });
  keys.forEach(function (k) { var s = document.getElementById("f-" + k); if (s) s.addEventListener("change", apply); });
  document.getElementById("f-text").addEventListener("input", apply);
  document.getElementById("f-reset").addEventListener("click", function () {
    keys.forEach(function (k) { var s = document.getElementById("f-" + k); if (s) s.value = ""; });
    document.getElementById("f-text").value = "";
    apply();
  });
  document.getElementById("close").addEventListener("click", function () {
    panel.hidden = true;
    selected = -1;
    Object.keys(drawn).forEach(paintGrid);
  });
  document.addEventListener("keydown", function (ev) { if (ev.key === "Escape") document.getElementById("close").click(); });

  apply();
  if (seen) { blocks.concat(figures).forEach(function (b) { seen.observe(b); }); } else drawAll();
  var m = /^#cell=([^@]*)(?:@(.*))?$/.exec(location.hash);
  if (m) {
    var id = decodeURIComponent(m[1]), host = m[2] ? decodeURIComponent(m[2]) : null;
    cells.forEach(function (c, i) {
      if (c[0] === id && (host === null || str(c[6]) === host)) {
        blockOf(c[3]).classList.remove("folded");  // a linked cell is shown, folded or not
        var ub = blockOf(c[3]).querySelector("[data-unfold]");
        if (ub) ub.remove();
        var G = grids[c[3]];
        if ((G.fr || []).indexOf(c[4]) >= 0 || (G.fc || []).indexOf(c[5]) >= 0) unfolded[c[3]] = true;
        redraw(c[3]);
        show(i);
      }
    });
  }
  if (window.performance && performance.mark) performance.mark("cumatrix-ready");
  document.body.setAttribute("data-ready", "1");
})();

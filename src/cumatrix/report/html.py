"""``index.html``: one self-contained page (inline CSS, JS, SVG; no network fetches).

The grid and the bandwidth charts are rendered here, in Python, so the page reads without
JavaScript; the inline script only adds filters and the per-cell details panel, reading the
cells from an embedded ``application/json`` block.  Every piece of cell text is escaped
(HTML in the markup, ``<`` as ``\\u003c`` in the JSON) and the details panel writes with
``textContent`` only.  A Content-Security-Policy allows exactly the page's own style and
script (by hash) and no network at all, so even text that slipped escaping could neither
run nor fetch.
"""

from __future__ import annotations

import base64
import hashlib
import json
from importlib import resources
from pathlib import Path

from .grid import LEGEND, Entry, Grid, entries, grids, timed
from .markdown import verdict_line
from .records import CATEGORIES, CellResult, RunData
from .text import clean, html_text

#: Glyphs the page uses per category (present in common fonts, no emoji font needed).
GLYPHS = {"ok": "✓", "expected": "◎", "fail": "✗", "skip": "–", "not-run": "○"}
NAMES = {"ok": "ok", "expected": "expected failure", "fail": "mismatch", "skip": "skipped", "not-run": "not run"}


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def _json_for_script(obj: object) -> str:
    # Inside <script> only "</script" or "<!--" could end or change the block; escaping
    # every <, > and & keeps the JSON valid and the block inert.
    text = json.dumps(obj, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _cleaned(obj: object) -> object:
    """Every string of a JSON value with terminal escapes stripped (for display)."""
    if isinstance(obj, str):
        return clean(obj)
    if isinstance(obj, dict):
        return {k: _cleaned(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_cleaned(v) for v in obj]
    return obj


def _entry_json(e: Entry) -> object:
    return _cleaned({
        "id": e.id,
        "host": e.host,
        "cat": e.category,
        "label": e.label,
        "axes": dict(e.axes),
        "cell": e.cell.to_json() if e.cell else None,
    })


def _cell_button(e: Entry) -> str:
    a = e.axes
    attrs = {
        "class": f"cell c-{e.category}",
        "type": "button",
        "data-idx": str(e.index),
        "data-cat": e.category,
        "data-outcome": e.label,
        "data-driver": a.get("driver", ""),
        "data-runtime": a.get("runtime", ""),
        "data-host": e.host or "",
        "data-id": e.id,
        "title": f"{e.id}: {e.label}" + (f" — {e.cell.mismatch}" if e.cell and e.cell.mismatch else ""),
    }
    attr_text = " ".join(f'{k}="{html_text(v)}"' for k, v in attrs.items())
    return (
        f"<button {attr_text}><span class=g>{GLYPHS[e.category]}</span>"
        f"<span class=l>{html_text(e.label)}</span></button>"
    )


def _col_head(col: str) -> str:
    variant, sep, build = col.rpartition(" h")
    if sep and build and build[0].isdigit():
        return f"{html_text(variant)}<small>headers {html_text(build)}</small>"
    return html_text(col)


def _grid_html(g: Grid) -> str:
    counts = " ".join(
        f'<span class="n c-{cat}">{GLYPHS[cat]} {g.count(cat)}</span>' for cat in CATEGORIES if g.count(cat)
    )
    head = "".join(f"<th scope=col>{_col_head(c)}</th>" for c in g.cols)
    body = []
    for row in g.rows:
        tds = []
        for col in g.cols:
            e = g.cells.get((row, col))
            tds.append(f"<td>{_cell_button(e)}</td>" if e else "<td class=empty></td>")
        label = "none <small>driver API</small>" if row == "none" else html_text(row)
        body.append(f"<tr><th scope=row>{label}</th>{''.join(tds)}</tr>")
    state = "all-good" if g.all_as_expected else "attention"
    return (
        f'<section class="grid-block {state}"><h3>{html_text(g.title)} <span class=counts>{counts}</span></h3>'
        f'<div class=scroll><table class=grid><thead><tr><th class=corner>runtime</th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div></section>"
    )


def _fmt(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _chart(workload: str, cells: list[CellResult], index: dict[tuple[str, str | None], int], merged: bool) -> str:
    """Horizontal bars per cell: batch GB/s (with p10–p90 whisker) and loop GB/s."""
    label_w, bar_w, right_w, row_h, top = 300, 520, 90, 34, 30
    width = label_w + bar_w + right_w
    height = top + row_h * len(cells) + 10
    peak = 0.0
    for c in cells:
        t = c.timings
        for v in (t.gbps, t.loop_gbps, t.spread.max if t.spread else None, t.spread.p90 if t.spread else None):
            if v is not None:
                peak = max(peak, v)
    peak = peak or 1.0

    def x(v: float) -> float:
        return label_w + bar_w * v / peak

    parts = [
        f'<svg class=chart role=img viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'aria-label="bandwidth of workload {html_text(workload)}">'
    ]
    # gridlines at 4 even steps
    for i in range(5):
        gx = label_w + bar_w * i / 4
        parts.append(f'<line class=gl x1="{gx:.1f}" x2="{gx:.1f}" y1="{top - 6}" y2="{height - 8}"/>')
        parts.append(f'<text class=ax x="{gx:.1f}" y="{top - 12}" text-anchor=middle>{peak * i / 4:.1f}</text>')
    parts.append(f'<text class=ax x="{label_w + bar_w + 6}" y="{top - 12}">GB/s · speedup</text>')
    for n, c in enumerate(cells):
        y = top + n * row_h
        t = c.timings
        a = c.axes
        label = f"{a.get('variant', '?')} h{a.get('build', '?')} · {a.get('runtime', '?')} · {a.get('driver', '?')}"
        if merged and c.host:
            label += f" · {c.host}"
        idx = index.get((c.id, c.host))
        attrs = f' class=row data-idx="{idx}"' if idx is not None else ""
        parts.append(f"<g{attrs}><title>{html_text(c.id)}</title>")
        parts.append(f'<rect class=hit x="0" y="{y}" width="{width}" height="{row_h - 2}"/>')
        parts.append(f'<text class=lab x="{label_w - 8}" y="{y + 15}" text-anchor=end>{html_text(label)}</text>')
        if t.gbps is not None:
            parts.append(f'<rect class=batch x="{label_w}" y="{y + 4}" width="{x(t.gbps) - label_w:.1f}" height="11"/>')
        if t.spread and t.spread.p10 is not None and t.spread.p90 is not None:
            y0 = y + 9.5
            parts.append(
                f'<path class=wh d="M{x(t.spread.p10):.1f} {y0 - 4}v8M{x(t.spread.p10):.1f} {y0}H{x(t.spread.p90):.1f}'
                f'M{x(t.spread.p90):.1f} {y0 - 4}v8"/>'
            )
        if t.loop_gbps is not None:
            parts.append(
                f'<rect class=loop x="{label_w}" y="{y + 17}" width="{x(t.loop_gbps) - label_w:.1f}" height="9"/>'
            )
        value = f"{_fmt(t.gbps)} / {_fmt(t.loop_gbps)}"
        speed = f"{t.speedup:.2f}×" if t.speedup is not None else ""
        parts.append(f'<text class=val x="{label_w + bar_w + 6}" y="{y + 13}">{html_text(value)}</text>')
        parts.append(f'<text class=spd x="{label_w + bar_w + 6}" y="{y + 27}">{html_text(speed)}</text>')
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _meta(run: RunData) -> str:
    head = run.header
    fp = head.host_fingerprint
    rows: list[tuple[str, str]] = [
        ("matrix", f"{head.matrix}"),
        ("sha256", head.matrix_sha256[:16]),
        ("started", run.started or "—"),
        ("finished", run.finished or ("— (interrupted)" if run.interrupted else "—")),
        ("cumatrix", head.harness_version or "—"),
        ("backend", head.backend or "—"),
    ]
    if run.merged:
        rows.append(("hosts", ", ".join(run.hosts)))
    else:
        if fp.get("driver_string"):
            rows.append(("driver", str(fp["driver_string"])))
        gpus = fp.get("gpus")
        if isinstance(gpus, list) and gpus:
            names = sorted({str(g.get("name", "?")) for g in gpus if isinstance(g, dict)})
            rows.append(("GPU", f"{len(gpus)}× " + ", ".join(names)))
        if fp.get("hostname"):
            rows.append(("host", str(fp["hostname"])))
    return "".join(f"<div><dt>{html_text(k)}</dt><dd>{html_text(v)}</dd></div>" for k, v in rows)


def _select(name: str, label: str, values: list[str], shown: dict[str, str] | None = None) -> str:
    opts = ['<option value="">all</option>']
    for v in values:
        opts.append(f'<option value="{html_text(v)}">{html_text((shown or {}).get(v, v))}</option>')
    return f'<label>{html_text(label)} <select id="f-{name}" data-key="{name}">{"".join(opts)}</select></label>'


def _uniq(values: list[str]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


def to_html(run: RunData) -> str:
    """The ``index.html`` text of a run."""
    items = entries(run)
    gs = grids(run, items)
    c = run.counts
    css = _asset("page.css")
    js = _asset("page.js")
    csp = (
        f"default-src 'none'; style-src {_csp_hash(css)}; script-src {_csp_hash(js)}; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )
    verdict = run.verdict
    line = verdict_line(run).split("** — ", 1)[-1]

    stats = "".join(
        f'<button type=button class="stat c-{cat}" data-cat="{cat}"><b>{n}</b> {NAMES[cat]}</button>'
        for cat, n in (
            ("ok", sum(1 for e in items if e.category == "ok")),
            ("expected", sum(1 for e in items if e.category == "expected")),
            ("fail", c.failed),
            ("skip", c.skipped),
            ("not-run", c.not_run),
        )
    )
    failed = [e for e in items if e.category == "fail"]
    attention = ""
    if failed:
        lis = []
        for e in failed:
            assert e.cell is not None  # category "fail" only comes from a record
            where = f" <span class=host>on {html_text(e.host)}</span>" if e.host else ""
            lis.append(
                f'<li><button type=button class="link" data-idx="{e.index}"><code>{html_text(e.id)}</code></button>{where} '
                f"observed <b>{html_text(e.label)}</b>, expected {html_text(' | '.join(sorted(e.cell.expected.outcomes)))}"
                f"<div class=why>{html_text(e.cell.mismatch or '')}</div></li>"
            )
        attention = f"<section id=attention><h2>Needs attention ({len(failed)})</h2><ol>{''.join(lis)}</ol></section>"
    warnings = ""
    if run.warnings:
        warnings = "<ul class=warnings>" + "".join(f"<li>{html_text(w)}</li>" for w in run.warnings) + "</ul>"

    filters = [
        _select("cat", "status", [k for k in CATEGORIES], NAMES),
        _select("outcome", "outcome", sorted(_uniq([e.label for e in items]))),
        _select("driver", "driver", _uniq([e.axes.get("driver", "") for e in items])),
        _select("runtime", "runtime", _uniq([e.axes.get("runtime", "") for e in items])),
    ]
    if run.merged:
        filters.append(_select("host", "host", _uniq([e.host or "" for e in items])))
    legend = "".join(
        f'<span class="lg c-{cat}"><span class=g>{GLYPHS[cat]}</span> {html_text(LEGEND[cat])}</span>' for cat in CATEGORIES
    )

    index = {(e.id, e.host if run.merged else None): e.index for e in items}
    charts = []
    for workload, cells in timed(run).items():
        keyed = {(cell.id, cell.host if run.merged else None): index[(cell.id, cell.host if run.merged else None)] for cell in cells}
        charts.append(
            f"<figure><figcaption>workload <b>{html_text(workload)}</b>"
            f'<span class=key><i class="sw batch"></i>batch copy (p10–p90 whisker)<i class="sw loop"></i>one copy per block</span>'
            f"</figcaption>{_chart(workload, cells, keyed, run.merged)}</figure>"
        )
    chart_section = (
        "<section id=charts><h2>Bandwidth: batch copy vs one copy per block</h2>"
        "<p class=note>GB/s counts bytes copied once; median of the repetitions. Click a row for its cell.</p>"
        + "".join(charts)
        + "</section>"
        if charts
        else ""
    )
    grid_section = (
        "".join(_grid_html(g) for g in gs)
        if gs
        else "<p class=empty-run>This run has no cells: the matrix selection was empty.</p>"
    )
    extra = ""
    if run.extra:
        kinds = sorted({str(e.get("type", "?")) for e in run.extra})
        extra = f"<p class=note>Also recorded: {len(run.extra)} record(s) of type {html_text(', '.join(kinds))} (see results.json).</p>"

    data = {"cells": [_entry_json(e) for e in items], "merged": run.merged}
    title = f"cumatrix {verdict} — {clean(run.header.matrix)}"
    return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8>
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name=viewport content="width=device-width, initial-scale=1">
<title>{html_text(title)}</title>
<style>{css}</style>
</head><body>
<header class="top v-{verdict}">
<div class=headline><h1>cumatrix <span class=verdict>{verdict}</span></h1><p class=vline>{html_text(line)}</p></div>
<div class=stats>{stats}</div>
<dl class=meta>{_meta(run)}</dl>
{warnings}
</header>
<main>
{attention}
<section id=outcomes><h2>Outcomes</h2>
<div class=filters>{"".join(filters)}<label>find <input id=f-text type=search placeholder="cell id contains…"></label>
<button type=button id=f-reset>reset</button><span id=shown aria-live=polite></span></div>
<div class=legend>{legend}</div>
{grid_section}
</section>
{chart_section}
{extra}
</main>
<aside id=panel hidden aria-label="cell details"><button type=button id=close aria-label=close>×</button><div id=detail></div></aside>
<script type="application/json" id=cumatrix-data>{_json_for_script(data)}</script>
<script>{js}</script>
</body></html>
"""


def write_html(run: RunData, path: Path) -> Path:
    """Write ``index.html`` and return its path."""
    path.write_text(to_html(run), encoding="utf-8")
    return path

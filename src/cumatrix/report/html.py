"""``index.html``: one self-contained page (inline CSS and JS; no network fetches).

The page is rendered from the jinja2 template ``page.html.j2`` with autoescaping on, so
every piece of cell text that reaches the markup is escaped by the template engine; only
the page's own CSS and JS and the JSON data blocks (escaped below) are marked safe.

It scales to tens of thousands of cells by loading lazily: the headline, counts, filters
and the list of mismatches are plain HTML; the cells travel as a compact JSON index (one
short array per cell, repeated strings interned once), and the script draws a grid only
when it scrolls into view.  What the details panel shows (stderr, fingerprint, timings)
sits in a second JSON block that is parsed the first time a cell is opened.  The detail
panel and the grids write with ``textContent`` only, and a Content-Security-Policy allows
exactly the page's own style and script (by hash) and no network at all, so even text
that slipped escaping could neither run nor fetch.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import jinja2
from markupsafe import Markup

from cumatrix.report.grid import LEGEND, Entry, Grid, entries, glossary, grids, timed
from cumatrix.report.headline import headline
from cumatrix.report.meta import chosen_by, gpu_names
from cumatrix.report.since import html_data
from cumatrix.report.text import clean
from cumatrix.report.untested import html_data as untested_html
from cumatrix.results.records import CATEGORIES, CellResult, RunData, Timings

#: Glyphs the page uses per category (present in common fonts, no emoji font needed).
GLYPHS = {"ok": "✓", "expected": "◎", "fail": "✗", "skip": "–", "not-run": "○"}
NAMES = {"ok": "ok", "expected": "expected failure", "fail": "mismatch", "skip": "skipped", "not-run": "not run"}
#: Category codes in the JSON index (its order is the script's CATS array).
_CAT_CODE = {cat: n for n, cat in enumerate(CATEGORIES)}


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    return env.from_string(_asset("page.html.j2"))


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def _json_for_script(obj: object) -> Markup:
    # Inside <script> only "</script" or "<!--" could end or change the block; escaping
    # every <, > and & keeps the JSON valid and the block inert.
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


class _Strings:
    """Interns repeated strings (labels, reasons, fingerprints) so each travels once."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.table: list[str] = []

    def __call__(self, text: str | None) -> int:
        if text is None:
            return -1
        n = self.index.get(text)  # keyed by the raw text: a repeated string is cleaned once
        if n is None:
            n = self.index[text] = len(self.table)
            self.table.append(clean(text))
        return n


def _timings(t: Timings) -> list[object] | None:
    """[gbps, loop_gbps, p10, p90, speedup, repetitions, bytes, wall_s, min, max] or None."""
    s = t.spread
    values: list[object] = [t.gbps, t.loop_gbps, s.p10 if s else None, s.p90 if s else None, t.speedup, t.repetitions,
              t.bytes, t.wall_s, s.min if s else None, s.max if s else None]
    return values if any(v is not None for v in values) else None


def _detail(cell: CellResult, s: _Strings) -> dict[str, object]:
    """What the details panel shows of one cell, with short keys and interned strings."""
    o = cell.observed
    out: dict[str, object] = {
        "e": s(" | ".join(sorted(cell.expected.outcomes))),
        "r": s(cell.expected.reason),
        "u": s(cell.expected.rule),
        "a": s(json.dumps(dict(cell.axes), sort_keys=True)),
        "f": s(json.dumps(dict(cell.fingerprint), sort_keys=True, default=str)),
    }
    optional: dict[str, object] = {
        "m": clean(cell.mismatch) if cell.mismatch else None,
        "n": clean(o.error_name) if o.error_name else None,
        "d": clean(o.detail) if o.detail else None,
        "x": o.exit_status,
        "se": clean(cell.stderr_tail) if cell.stderr_tail else None,
        "so": clean(cell.stdout_tail) if cell.stdout_tail else None,
        "t": _timings(cell.timings),
        "du": cell.duration_s,
        "st": s(cell.started) if cell.started else None,
    }
    out.update({k: v for k, v in optional.items() if v is not None})
    return out


#: The width (CSS px) a grid's table may take and still show whole at a 1400 px window (the
#: page's margins, the block's padding and a scroll bar take the rest).
GRID_BUDGET_PX = 1240
#: What the page's monospace label costs a character at 11.5 px, and a cell's glyph, gaps,
#: padding and border spacing around it: estimates on the generous side (the layout only
#: chooses an orientation and an order with them); tests/integration/test_report_layout_browser.py
#: checks the result in headless Chromium at 1400 px.
_CHAR_PX = 7.2
_CELL_PAD_PX = 40
_MIN_CELL_PX = 84


def _head_px(text: str) -> float:
    name, _, build = text.partition(" h")
    return max(len(name), len(build) + 8) * 7.0 + 16


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """How the page draws one grid: which way round, which lines are folded, in what order.

    ``transposed``: the grid's columns (cases, variants) run down the page and the runtimes
    across, chosen when that is narrower (a matrix of 50 cases and 3 runtimes).  ``folded_*``:
    the lines of the drawn grid whose every cell is a neutral skip, hidden until asked for.
    ``col_order``: the drawn columns, those holding a mismatch or a predicted failure first when
    the grid is still wider than :data:`GRID_BUDGET_PX`, so the cells that matter are in view.
    """

    rows: tuple[str, ...]
    cols: tuple[str, ...]
    transposed: bool
    folded_rows: tuple[int, ...]
    folded_cols: tuple[int, ...]
    col_order: tuple[int, ...]


def _matters(at: dict[tuple[int, int], Entry], rows: int, k: int) -> bool:
    """Whether column ``k`` holds a failure or an expected failure."""
    return any(at[(r, k)].category in ("fail", "expected") for r in range(rows) if (r, k) in at)


def layout(g: Grid) -> Layout:
    """The :class:`Layout` of grid ``g`` (see there)."""
    def lines(transposed: bool) -> tuple[tuple[str, ...], tuple[str, ...], dict[tuple[int, int], Entry]]:
        rows, cols = (g.cols, g.rows) if transposed else (g.rows, g.cols)
        ri = {r: n for n, r in enumerate(rows)}
        ci = {c: n for n, c in enumerate(cols)}
        at = {}
        for (row, col), e in g.cells.items():
            r, c = (col, row) if transposed else (row, col)
            at[(ri[r], ci[c])] = e
        return rows, cols, at

    def folded(n: int, other: int, at: dict[tuple[int, int], Entry], by_row: bool) -> tuple[int, ...]:
        if g.all_skipped:
            return ()  # the whole grid is folded instead
        out = []
        for k in range(n):
            es = [at[(k, j) if by_row else (j, k)] for j in range(other) if ((k, j) if by_row else (j, k)) in at]
            if es and all(e.category == "skip" for e in es):
                out.append(k)
        return tuple(out)

    def width(rows: tuple[str, ...], cols: tuple[str, ...], at: dict[tuple[int, int], Entry],
              hidden: tuple[int, ...]) -> float:
        total = max((_head_px(r) for r in rows), default=60.0)
        for k, col in enumerate(cols):
            if k in hidden:
                continue
            labels = [at[(r, k)].label for r in range(len(rows)) if (r, k) in at]
            total += max([_head_px(col), _MIN_CELL_PX, *(len(lb) * _CHAR_PX + _CELL_PAD_PX for lb in labels)]) + 3
        return total

    best: tuple[float, Layout] | None = None
    for transposed in (False, True):
        rows, cols, at = lines(transposed)
        fr = folded(len(rows), len(cols), at, by_row=True)
        fc = folded(len(cols), len(rows), at, by_row=False)
        w = width(rows, cols, at, fc)
        order = tuple(range(len(cols)))
        if w > GRID_BUDGET_PX:
            # The columns with a failure first, each part in matrix order.
            hot = [k for k in order if _matters(at, len(rows), k)]
            order = (*hot, *(k for k in order if k not in hot))
        lay = Layout(rows=rows, cols=cols, transposed=transposed, folded_rows=fr, folded_cols=fc, col_order=order)
        if best is None or w < best[0] - 1e-6:
            best = (w, lay)
    assert best is not None
    return best[1]


def _page_data(run: RunData, items: list[Entry], gs: list[Grid]) -> tuple[dict[str, object], list[object]]:
    """(the index every grid is drawn from, the per-cell details) as JSON-ready values."""
    s = _Strings()
    grid_json, where = _grid_index(gs)
    cells: list[list[object]] = []
    details: list[object] = []
    for e in items:
        gi, ri, ci = where[e.index]
        cells.append([clean(e.id), _CAT_CODE[e.category], s(e.label), gi, ri, ci, s(e.host)])
        details.append(_detail(e.cell, s) if e.cell is not None else None)
    data = {"strings": s.table, "grids": grid_json, "cells": cells, "charts": _charts(run, items), "merged": run.merged,
            "cats": list(CATEGORIES), "names": NAMES, "glyphs": GLYPHS}
    return data, details


def _grid_index(gs: list[Grid]) -> tuple[list[dict[str, object]], dict[int, tuple[int, int, int]]]:
    """(each grid as the script draws it, ``{entry index: (grid, line, column)}``)."""
    where: dict[int, tuple[int, int, int]] = {}
    grid_json = []
    for gi, g in enumerate(gs):
        lay = layout(g)
        rows = {r: n for n, r in enumerate(lay.rows)}
        cols = {c: n for n, c in enumerate(lay.cols)}
        for (row, col), e in g.cells.items():
            line, across = (col, row) if lay.transposed else (row, col)
            where[e.index] = (gi, rows[line], cols[across])
        grid_json.append({"title": g.title, "driver": g.driver, "rows": list(lay.rows), "cols": list(lay.cols),
                          "t": lay.transposed, "fr": list(lay.folded_rows), "fc": list(lay.folded_cols),
                          "co": list(lay.col_order), "skip": g.all_skipped,
                          "n": {cat: g.count(cat) for cat in CATEGORIES if g.count(cat)}})
    return grid_json, where


def _charts(run: RunData, items: list[Entry]) -> list[dict[str, object]]:
    """One bandwidth chart per workload: a row per timed cell, naming it by its entry index."""
    index = {(e.id, e.host): e.index for e in items}
    charts: list[dict[str, object]] = []
    for workload, tcells in timed(run).items():
        chart_rows: list[list[object]] = []
        for c in tcells:
            t = c.timings
            sp = t.spread
            chart_rows.append([index[(c.id, c.host if run.merged else None)], t.gbps, t.loop_gbps,
                         sp.p10 if sp else None, sp.p90 if sp else None, t.speedup])
        charts.append({"workload": clean(workload), "rows": chart_rows})
    return charts


def _meta(run: RunData) -> list[tuple[str, str]]:
    rows = _run_meta(run)
    chosen = chosen_by(run)
    if chosen is not None:  # a covering plan's cells, not every cell
        rows.append(("cells chosen by", chosen))
    return rows + (_hosts_meta(run) if run.merged else _host_meta(run))


def _run_meta(run: RunData) -> list[tuple[str, str]]:
    """The run header's rows: which matrix ran, when, and with what."""
    head = run.header
    return [
        ("matrix", head.matrix),
        ("sha256", head.matrix_sha256[:16]),
        ("started", run.started or "—"),
        ("finished", run.finished or ("— (interrupted)" if run.interrupted else "—")),
        ("cumatrix", head.harness_version or "—"),
        ("backend", head.backend or "—"),
        ("sandbox", head.sandbox or "—"),
    ]


def _hosts_meta(run: RunData) -> list[tuple[str, str]]:
    """A merge's hosts, and the planned hosts it has no run from."""
    rows = [("hosts", ", ".join(run.hosts))]
    if run.missing_hosts:
        rows.append(("no run from", ", ".join(run.missing_hosts)))
    return rows


def _host_meta(run: RunData) -> list[tuple[str, str]]:
    """One host's driver, GPUs and name, as its fingerprint names them."""
    fp = run.header.host_fingerprint
    rows: list[tuple[str, str]] = []
    if fp.get("driver_string"):
        rows.append(("driver", str(fp["driver_string"])))
    gpus = gpu_names(run)
    if gpus is not None:
        count, names = gpus
        rows.append(("GPU", f"{count}× " + ", ".join(names)))
    if fp.get("hostname"):
        rows.append(("host", str(fp["hostname"])))
    return rows


def _uniq(values: list[str]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


def _filters(run: RunData, items: list[Entry]) -> list[Mapping[str, object]]:
    filters: list[Mapping[str, object]] = [
        {"key": "cat", "label": "status", "options": [(k, NAMES[k]) for k in CATEGORIES]},
        {"key": "outcome", "label": "outcome", "options": _choices(sorted(_uniq([e.label for e in items])))},
        {"key": "driver", "label": "driver", "options": _choices(_uniq([e.axes.get("driver", "") for e in items]))},
        {"key": "runtime", "label": "runtime", "options": _choices(_uniq([e.axes.get("runtime", "") for e in items]))},
    ]
    if run.merged:
        filters.append({"key": "host", "label": "host", "options": _choices(_uniq([e.host or "" for e in items]))})
    return filters


def _choices(values: list[str]) -> list[tuple[str, str]]:
    """A filter's options where each value is shown as itself."""
    return [(v, v) for v in values]


def _failed(items: list[Entry]) -> list[Mapping[str, object]]:
    out: list[Mapping[str, object]] = []
    for e in items:
        if e.category != "fail" or e.cell is None:
            continue
        out.append({"index": e.index, "id": clean(e.id), "host": clean(e.host) if e.host else "",
                    "label": clean(e.label), "expected": " | ".join(sorted(e.cell.expected.outcomes)),
                    "why": clean(e.cell.mismatch or "")})
    return out


def to_html(run: RunData) -> str:
    """The ``index.html`` text of a run."""
    items = entries(run)
    gs = grids(run, items)
    c = run.counts
    css, js = _asset("page.css"), _asset("page.js")
    csp = (
        f"default-src 'none'; style-src {_csp_hash(css)}; script-src {_csp_hash(js)}; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )
    verdict, _, line = headline(run).partition(" — ")
    verdict = verdict.removeprefix("cumatrix: ")
    data, details = _page_data(run, items, gs)
    extra_kinds = sorted({str(e.get("type", "?")) for e in run.extra})
    return _template().render(
        csp=Markup(csp), css=Markup(css), js=Markup(js), verdict=verdict, line=line,
        title=f"cumatrix {verdict} — {run.header.matrix}",
        stats=_stats(items),
        meta=_meta(run), warnings=list(run.warnings), failed=_failed(items), filters=_filters(run, items),
        legend=[(cat, GLYPHS[cat], LEGEND[cat]) for cat in CATEGORIES],
        words=glossary([e.label for e in items]),
        grids=[_grid_head(n, g) for n, g in enumerate(gs)],
        charts=[str(ch["workload"]) for ch in data["charts"]],  # type: ignore[attr-defined]
        extra_count=len(run.extra), extra_kinds=", ".join(extra_kinds),
        data=_json_for_script(data), details=_json_for_script(details), total=c.total,
        since=_since(run), untested=untested_html(run.untested) if run.untested is not None else None,
    )


def _stats(items: list[Entry]) -> list[tuple[str, int, str]]:
    """``(category, how many cells, its name)`` of the headline's counts: ok and mismatch always."""
    per_cat = dict.fromkeys(CATEGORIES, 0)
    for e in items:
        per_cat[e.category] += 1
    return [(cat, per_cat[cat], NAMES[cat]) for cat in CATEGORIES if per_cat[cat] or cat in ("ok", "fail")]


def _grid_head(n: int, g: Grid) -> dict[str, object]:
    """What the page's markup says of grid ``n`` before the script draws it."""
    return {"index": n, "title": g.title, "attention": g.count("fail") > 0, "folded": g.all_skipped,
            "skips": g.skip_reasons() if g.all_skipped else "",
            "counts": [(cat, GLYPHS[cat], g.count(cat)) for cat in CATEGORIES if g.count(cat)],
            "rows": len(g.rows)}


def _since(run: RunData) -> dict[str, object] | None:
    if run.since is None:
        return None
    return html_data(run.since)


def write_html(run: RunData, path: Path) -> Path:
    """Write ``index.html`` and return its path."""
    path.write_text(to_html(run), encoding="utf-8")
    return path

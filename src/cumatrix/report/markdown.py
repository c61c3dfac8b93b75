"""``summary.md``: the table a person reads in a CI step summary.

Order: a one-line verdict with counts, the mismatches with their reasons, one grid per
driver (and workload), then batch-vs-loop bandwidth.  Grids in which every cell met its
expectation are folded into ``<details>`` so a 300-cell matrix stays short.  Everything a
child wrote is escaped (Markdown and HTML) and stripped of terminal escapes.
"""

from __future__ import annotations

import html
from pathlib import Path

from cumatrix.report.grid import LEGEND, SYMBOLS, Grid, glossary, grids, readable, timed
from cumatrix.report.headline import headline
from cumatrix.report.meta import chosen_by, gpu_names
from cumatrix.report.since import markdown as since_markdown
from cumatrix.report.static import static_markdown, static_record
from cumatrix.report.text import clean, md_code, md_fenced, md_inline, shorten
from cumatrix.report.untested import markdown as untested_markdown
from cumatrix.results.records import CellResult, RunData, Timings

#: GitHub caps a step summary at 1 MiB; stay well under it.
_MAX_MISMATCHES_LISTED = 100
_MAX_STDERR_EXCERPTS = 30
_STDERR_EXCERPT_CHARS = 1500
_MAX_NOT_RUN_LISTED = 50


def _not_run(run: RunData) -> list[str]:
    where = run.not_run_where()
    if not where or not (run.merged or run.missing_hosts):
        return []  # a single run's unrun cells are in its grids; a merge names who should have run them
    out = [f"### ⏸ Not run ({len(where)})", ""]
    for cid, host in where[:_MAX_NOT_RUN_LISTED]:
        who = f"host {md_inline(host)}" if host else "any host"
        out.append(f"- {md_code(cid)}: not-run — {who} should have run it")
    if len(where) > _MAX_NOT_RUN_LISTED:
        out.append(f"- … and {len(where) - _MAX_NOT_RUN_LISTED} more: see results.json")
    out.append("")
    return out


def verdict_line(run: RunData) -> str:
    """The first line of the summary: verdict (bold) and counts."""
    verdict, _, tail = headline(run).partition(" — ")
    return f"**{md_inline(verdict)}** — {md_inline(tail)}"


def _gbps(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


def _meta(run: RunData) -> list[str]:
    head = run.header
    bits = [f"matrix {md_code(head.matrix)} (sha256 {md_code(head.matrix_sha256[:12])})"]
    fields = (("started", run.started), ("finished", run.finished), ("cumatrix", head.harness_version),
              ("backend", head.backend), ("sandbox", head.sandbox))
    bits += [f"{label} {md_inline(value)}" for label, value in fields if value]
    chosen = chosen_by(run)
    if chosen is not None:  # a covering plan's cells, not every cell
        bits.append(f"cells chosen by {md_inline(chosen)}")
    bits += _hosts_meta(run) if run.merged or run.missing_hosts else _host_meta(run)
    return [" · ".join(bits), *(f"> ⚠️ {md_inline(w)}" for w in run.warnings)]


def _hosts_meta(run: RunData) -> list[str]:
    """A merge's hosts, and the planned hosts it has no run from."""
    bits = ["hosts " + ", ".join(md_inline(h) for h in run.hosts)]
    if run.missing_hosts:
        bits.append("no run from " + ", ".join(md_inline(h) for h in run.missing_hosts))
    return bits


def _host_meta(run: RunData) -> list[str]:
    """One host's driver and GPUs, as its fingerprint names them."""
    fp = run.header.host_fingerprint
    bits = [f"driver {md_inline(str(fp['driver_string']))}"] if fp.get("driver_string") else []
    gpus = gpu_names(run)
    if gpus is not None:
        count, names = gpus
        bits.append(f"{count}× " + ", ".join(md_inline(n) for n in names))
    return bits


def _expected(cell: CellResult) -> str:
    return " \\| ".join(md_inline(o) for o in sorted(cell.expected.outcomes)) or "(nothing)"


def _mismatches(run: RunData) -> list[str]:
    failed = [c for c in run.cells if c.status == "fail"]
    if not failed:
        return []
    out = [f"### ❌ Mismatches ({len(failed)})", ""]
    for n, cell in enumerate(failed[:_MAX_MISMATCHES_LISTED]):
        out += _mismatch(run, cell)
        if cell.stderr_tail.strip() and n < _MAX_STDERR_EXCERPTS:
            out += _stderr_excerpt(cell)
    if len(failed) > _MAX_MISMATCHES_LISTED:
        out.append(f"- … and {len(failed) - _MAX_MISMATCHES_LISTED} more: see results.json")
    out.append("")
    return out


def _mismatch(run: RunData, cell: CellResult) -> list[str]:
    """The list item of one failed cell: what it did, what was expected, and why not."""
    where = f" on {md_inline(cell.host)}" if run.merged and cell.host else ""
    line = (f"- {md_code(cell.id)}{where}: observed **{md_inline(readable(cell.outcome_label))}**, "
            f"expected {_expected(cell)} — {md_inline(cell.mismatch or 'no reason recorded')}")
    out = [line]
    if cell.expected.reason:
        out.append(f"  <br>prediction: {md_inline(cell.expected.reason)}")
    not_used = cell.fingerprint.get("runtime_not_used")
    if isinstance(not_used, str):  # a fact on a failed cell: it failed with a runtime not the cell's
        out.append(f"  <br>the cell's runtime was not used: {md_inline(not_used)}")
    return out


def _stderr_excerpt(cell: CellResult) -> list[str]:
    excerpt = shorten(clean(cell.stderr_tail).strip(), _STDERR_EXCERPT_CHARS)
    # A fenced block no output can close, indented into the list item: the child's
    # blank lines, links, images and headings stay text (an HTML <pre> ends at a
    # blank line and lets Markdown render what follows).
    return ["", "  <details><summary>stderr</summary>", "", *md_fenced(excerpt, "  "), "", "  </details>", ""]


def _other_runtime(run: RunData) -> list[str]:
    """Cells that met their expectation with a runtime not the cell's (a failure a rule
    predicted, judged although the cell's runtime was not used): the fact, beside each.  Failed
    ones carry it in their mismatch; skipped ones in their outcome."""
    cells = [c for c in run.cells if c.status == "pass" and isinstance(c.fingerprint.get("runtime_not_used"), str)]
    if not cells:
        return []
    out = [f"<details><summary>Judged with a runtime not the cell's ({len(cells)})</summary>", ""]
    for cell in cells[:_MAX_MISMATCHES_LISTED]:
        out.append(f"- {md_code(cell.id)}: {md_inline(readable(cell.outcome_label))} — "
                   f"{md_inline(str(cell.fingerprint['runtime_not_used']))}")
    if len(cells) > _MAX_MISMATCHES_LISTED:
        out.append(f"- … and {len(cells) - _MAX_MISMATCHES_LISTED} more: see results.json")
    return [*out, "", "</details>", ""]


def _grid_table(g: Grid) -> list[str]:
    out = ["| runtime | " + " | ".join(md_inline(c) for c in g.cols) + " |"]
    out.append("|---" * (len(g.cols) + 1) + "|")
    for row in g.rows:
        cells = []
        for col in g.cols:
            e = g.cells.get((row, col))
            cells.append("" if e is None else f"{e.symbol} {md_inline(e.label)}")
        out.append(f"| **{md_inline(row)}** | " + " | ".join(cells) + " |")
    return out


def _grid_counts(g: Grid) -> str:
    parts = [f"{g.count(cat)} {SYMBOLS[cat]}" for cat in SYMBOLS if g.count(cat)]
    return ", ".join(parts)


def _grids(run: RunData) -> list[str]:
    gs = grids(run)
    if not gs:
        return []
    out = ["### Outcomes by driver", ""]
    out.append("Legend: " + " · ".join(f"{SYMBOLS[k]} {v}" for k, v in LEGEND.items()) + ".")
    out.append("Rows are runtimes (`none`: driver-API cells that load no runtime); columns are variants with the headers they were built against, or cases.")
    words = glossary([e.label for g in gs for e in g.cells.values()])
    if words:
        out.append("Outcome words: " + " · ".join(f"`{w}`: {md_inline(m)}" for w, m in words) + ".")
    out.append("")
    for g in gs:
        n = len(g.cells)
        if g.all_skipped:  # nothing in it was tested: folded, as the gate's summary folds its passes
            out.append(f"<details><summary>{html.escape(g.title)}: {n} cells, all skipped "
                       f"({html.escape(g.skip_reasons())})</summary>")
            out.append("")
            out += _grid_table(g)
            out += ["", "</details>", ""]
        elif g.all_as_expected:
            out.append(
                f"<details><summary>{html.escape(g.title)}: {n} cells, all as expected ({_grid_counts(g)})</summary>"
            )
            out.append("")
            out += _grid_table(g)
            out += ["", "</details>", ""]
        else:
            out.append(f"#### {md_inline(g.title)} — {_grid_counts(g)}")
            out.append("")
            out += _grid_table(g)
            out.append("")
    return out


def _speed(run: RunData) -> list[str]:
    by_workload = timed(run)
    if not by_workload:
        return []
    out = ["### Bandwidth: batch copy vs one copy per block", ""]
    out.append("GB/s counts bytes copied once; median of the repetitions, spread p10–p90; speedup = batch / loop.")
    out.append("")
    for workload, cells in by_workload.items():
        opened = " open" if len(cells) <= 24 else ""
        out.append(f"<details{opened}><summary>workload {html.escape(clean(workload))} ({len(cells)} cells)</summary>")
        out.append("")
        host_col = "host | " if run.merged else ""
        out.append(f"| variant | build | runtime | driver | {host_col}GB/s | p10–p90 | loop GB/s | speedup | reps |")
        out.append("|---|---|---|---|" + ("---|" if run.merged else "") + "--:|---|--:|--:|--:|")
        out += [_speed_row(run, c) for c in cells]
        out += ["", "</details>", ""]
    return out


def _spread(t: Timings) -> str:
    """``p10–p90`` of the repetitions, or a dash where either is unknown."""
    if t.spread and t.spread.p10 is not None and t.spread.p90 is not None:
        return f"{_gbps(t.spread.p10)}–{_gbps(t.spread.p90)}"
    return "—"


def _speed_row(run: RunData, c: CellResult) -> str:
    """One timed cell's line of the bandwidth table."""
    t = c.timings
    speedup = "—" if t.speedup is None else f"{t.speedup:.2f}×"
    host = f"{md_inline(c.host or '')} | " if run.merged else ""
    a = c.axes
    return (
        f"| {md_inline(a.get('variant', '?'))} | {md_inline(a.get('build', ''))} | {md_inline(a.get('runtime', '?'))} "
        f"| {md_inline(a.get('driver', '?'))} | {host}{_gbps(t.gbps)} | {_spread(t)} | {_gbps(t.loop_gbps)} "
        f"| {speedup} | {t.repetitions if t.repetitions is not None else '—'} |"
    )


def to_markdown(run: RunData) -> str:
    """The ``summary.md`` text of a run (a gate's static findings first)."""
    static = static_record(run)
    lines = [static_markdown(static)] if static is not None else []
    lines += [verdict_line(run), ""]
    lines += _meta(run)
    lines.append("")
    if run.since is not None:  # what changed since the previous run of this matrix (history)
        lines += since_markdown(run.since)
    if run.untested is not None:  # cells no run of the history's window tested, on any host
        lines += untested_markdown(run.untested)
    lines += _mismatches(run)
    lines += _other_runtime(run)
    lines += _not_run(run)
    lines += _grids(run)
    lines += _speed(run)
    others = [e for e in run.extra if e.get("type") != "static"]
    if others:
        kinds = sorted({str(e.get("type", "?")) for e in others})
        lines.append(f"Also recorded: {len(others)} record(s) of type {', '.join(md_code(k) for k in kinds)} (see results.json).")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def write_markdown(run: RunData, path: Path) -> Path:
    """Write ``summary.md`` and return its path."""
    path.write_text(to_markdown(run), encoding="utf-8")
    return path

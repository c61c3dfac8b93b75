"""The "since the last run" section of every report, from :attr:`RunData.since`.

``summary.md`` and ``index.html`` list what changed against the previous run of the same
matrix in the history (see :mod:`cumatrix.results.historydiff`); ``results.json`` carries the same
lists under ``since_last_run``; ``junit.xml`` has their counts as suite properties and the
text as the suite's ``system-out``.  ``index.html`` also draws each swap cell's GB/s over the
stored runs as a small inline SVG (markup only: the page's policy allows no other source).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

from markupsafe import Markup

from cumatrix.report.text import clean, md_code, md_inline

if TYPE_CHECKING:
    from cumatrix.results.historydiff import Change, Diff

TITLES = {"new_failures": "New failures", "fixed": "Fixed", "changed": "Changed outcomes",
          "newly_skipped": "Newly skipped", "newly_not_run": "Newly not run"}
#: Entries listed per kind of change in summary.md and index.html; all are in results.json.
MAX_LISTED = 100
_W, _H, _PAD = 160, 36, 3


def _label(c: Change, before: bool) -> str:
    r = c.before if before else c.after
    return "not-run" if r is None else r.outcome


def _lists(d: Diff) -> list[tuple[str, str, tuple[Change, ...]]]:
    # deferred: results.historydiff (sqlite3, statistics) costs ~50 ms to import and every report
    # writer imports this module; a caller holding a Diff has it loaded already
    from cumatrix.results.historydiff import LISTS

    return [(name, TITLES[name], getattr(d, name)) for name in LISTS if getattr(d, name)]


def _against(d: Diff) -> str:
    a = d.a
    return f"run #{a.id} ({a.run_uid}, {a.started or a.recorded})"


def headline(d: Diff) -> str:
    """``2 new failures, 1 fixed, ... against run #12 (…)``, or ``no change against …``."""
    # deferred: results.historydiff (sqlite3, statistics) costs ~50 ms to import and every report
    # writer imports this module; a caller holding a Diff has it loaded already
    from cumatrix.results.historydiff import LISTS

    words = {"new_failures": ("new failure", "new failures"), "fixed": ("fixed", "fixed"),
             "changed": ("changed", "changed"), "newly_skipped": ("newly skipped", "newly skipped"),
             "newly_not_run": ("newly not run", "newly not run"), "speed": ("speed move", "speed moves"),
             "flaky": ("flaky", "flaky"), "newly_untested": ("newly untested", "newly untested")}
    counts = d.counts()
    parts = [f"{counts[k]} {words[k][counts[k] != 1]}" for k in (*LISTS, "speed", "flaky", "newly_untested")
             if counts.get(k)]
    return f"{', '.join(parts) or 'no change'} against {_against(d)}"


def markdown(d: Diff) -> list[str]:
    """The summary.md section."""
    out = ["### Since the last run", "", md_inline(headline(d)) + ".", ""]
    for _, title, changes in _lists(d):
        out += _md_changes(title, changes)
    if d.speed:
        out += _md_speed(d)
    if d.flaky:
        out.append(f"**Flaky** ({len(d.flaky)}; outcome flipped twice or more in the last {d.window} runs):")
        out += [f"- {md_code(str(f.cell))}: {f.flips} flips ({md_inline(' → '.join(f.outcomes))})"
                for f in d.flaky[:MAX_LISTED]]
        out.append("")
    if d.newly_untested:
        out += _md_untested(d)
    return out


def _md_changes(title: str, changes: tuple[Change, ...]) -> list[str]:
    """One list of changed outcomes: each cell's outcome before and after."""
    out = [f"**{title}** ({len(changes)}):"]
    out += [f"- {md_code(str(c.cell))}: {md_inline(_label(c, True))} → **{md_inline(_label(c, False))}**"
            for c in changes[:MAX_LISTED]]
    if len(changes) > MAX_LISTED:
        out.append(f"- … and {len(changes) - MAX_LISTED} more: see results.json `since_last_run`")
    out.append("")
    return out


def _md_speed(d: Diff) -> list[str]:
    out = [f"**Speed beyond run-to-run noise** ({len(d.speed)}; median and noise of up to {d.window} runs):"]
    for s in d.speed[:MAX_LISTED]:
        change = f" ({s.after / s.median - 1:+.1%})" if s.median else ""
        out.append(f"- {md_code(str(s.cell))}: {s.metric} {s.after:.4g}, median {s.median:.4g} ± {s.noise:.2g}"
                   f"{change}")
    out.append("")
    return out


def _md_untested(d: Diff) -> list[str]:
    out = [f"**Newly untested** ({len(d.newly_untested)}; tested in no run of the last {d.window}, on any host):"]
    out += [f"- {md_code(c)}" for c in d.newly_untested[:MAX_LISTED]]
    if len(d.newly_untested) > MAX_LISTED:
        out.append(f"- … and {len(d.newly_untested) - MAX_LISTED} more: see results.json `since_last_run`")
    out.append("")
    return out


def text(d: Diff) -> str:
    """Plain text of the section (junit system-out)."""
    # deferred: results.historydiff (sqlite3, statistics) costs ~50 ms to import and every report
    # writer imports this module; a caller holding a Diff has it loaded already
    from cumatrix.results.historydiff import to_text

    return to_text(d)


def junit_properties(d: Diff) -> list[tuple[str, object]]:
    """Suite properties: the run compared with, and how many cells are in each list."""
    props: list[tuple[str, object]] = [("since_last_run", headline(d)), ("since_last_run.run", d.a.run_uid)]
    props += [(f"since_last_run.{k}", str(v)) for k, v in d.counts().items()]
    return props


def sparkline(points: Sequence[tuple[int, float]], title: str) -> Markup:
    """An inline SVG of GB/s over runs (oldest left); the last point is marked.  Only numbers
    and the escaped ``title`` reach the markup."""
    values = [v for _, v in points]
    lo, hi = min(values), max(values)
    # at least 10% of the level tall, centred: a wobble of 0.5% must not fill the plot as a
    # 40% drop does
    span = max(hi - lo, 0.1 * abs(hi)) or 1.0
    lo = (lo + hi) / 2 - span / 2
    n = len(values)
    xs = [_PAD + (i * (_W - 2 * _PAD) / (n - 1) if n > 1 else (_W - 2 * _PAD) / 2) for i in range(n)]
    ys = [_H - _PAD - (v - lo) / span * (_H - 2 * _PAD) for v in values]
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys, strict=True))
    tip = html.escape(f"{title}: " + ", ".join(f"#{rid} {v:.3g}" for rid, v in points))
    return Markup(
        f'<svg class=spark viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" role="img" aria-label="{tip}">'
        f"<title>{tip}</title><polyline points=\"{pts}\" fill=\"none\" stroke=\"currentColor\" stroke-width=\"1.5\"/>"
        f'<circle cx="{xs[-1]:.1f}" cy="{ys[-1]:.1f}" r="2.5" fill="currentColor"/></svg>')


def html_data(d: Diff) -> dict[str, object]:
    """What the page's "since the last run" section shows (the template escapes every text)."""
    lists = [_html_changes(name, title, changes) for name, title, changes in _lists(d)]
    speed = [(clean(str(s.cell)), s.metric, f"{s.after:.4g}", f"{s.median:.4g} ± {s.noise:.2g}",
              f"{s.after / s.median - 1:+.1%}" if s.median else "") for s in d.speed[:MAX_LISTED]]
    flaky = [(clean(str(f.cell)), f.flips, " → ".join(clean(o) for o in f.outcomes)) for f in d.flaky[:MAX_LISTED]]
    if d.newly_untested:
        lists.append({"title": f"Newly untested (in no run of the last {d.window})", "n": len(d.newly_untested),
                      "more": max(0, len(d.newly_untested) - MAX_LISTED), "attention": False,
                      "entries": [(clean(c), "tested", "untested") for c in d.newly_untested[:MAX_LISTED]]})
    return {"headline": headline(d), "lists": lists, "speed": speed, "flaky": flaky, "window": d.window,
            "trends": _html_trends(d), "trends_more": d.trends_left_out}


def _html_changes(name: str, title: str, changes: tuple[Change, ...]) -> dict[str, object]:
    return {"title": title, "n": len(changes), "more": max(0, len(changes) - MAX_LISTED),
            "attention": name == "new_failures",
            "entries": [(clean(str(c.cell)), clean(_label(c, True)), clean(_label(c, False)))
                        for c in changes[:MAX_LISTED]]}


def _html_trends(d: Diff) -> list[dict[str, object]]:
    """A sparkline per cell of two or more stored points."""
    moved = {s.cell for s in d.speed}
    # the diff chose the cells (moved first) and the runs; drawn in that order
    return [{"cell": clean(str(k)), "svg": sparkline(pts, clean(str(k))), "last": f"{pts[-1][1]:.3g}",
             "range": f"{min(v for _, v in pts):.3g}–{max(v for _, v in pts):.3g}", "n": len(pts),
             "moved": k in moved}
            for k, pts in (d.trends or {}).items() if len(pts) >= 2]

"""The reports' "Never tested in the last N runs" section: ``summary.md``, ``index.html``,
``junit.xml`` properties and ``results.json`` ``never_tested``, from
:class:`cumatrix.results.untested.Untested`."""

from __future__ import annotations

from cumatrix.results.untested import Untested, to_text

#: Cells listed by name in summary.md and index.html (all of them are in results.json).
LISTED = 50


def title(u: Untested) -> str:
    return f"Never tested in the last {len(u.runs)} runs"


def _last(u: Untested, i: int) -> str:
    c = u.cells[i]
    if c.last_tested is None:
        return "never"
    return f"#{c.last_tested.run} {(c.last_tested.when or '')[:10]} {c.last_tested.outcome}"


def _rotation_line(u: Untested) -> str | None:
    if u.rotation is None or u.rotation.rotate is None or not u.pending:
        return None
    return (f"A rotation of {u.rotation.rotate} nights: {u.nights_seen} of them in the window; "
            f"{len(u.pending)} cells it has not reached yet are not counted.")


def summary_line(u: Untested) -> str:
    """One line: how many cells and values were never tested in the window."""
    if not u.cells:
        return f"every one of the {u.total} cells was tested at least once in {u.window_text()}, on some host"
    never = ", ".join(f"{v.axis} {v.value} (0 of {v.cells})" for v in u.never)
    return (f"{len(u.cells)} of {u.total} cells tested in no run of {u.window_text()}, on any host"
            + (f"; values never tested: {never}" if never else ""))


def markdown(u: Untested) -> list[str]:
    """The section of summary.md, as lines."""
    lines = [f"### {title(u)}", ""]
    rot = _rotation_line(u)
    if rot:
        lines += [rot, ""]
    if not u.cells:
        lines += [(f"Every one of the {u.total} cells was tested (passed or failed) at least once in "
                  f"{u.window_text()}, on some host."), ""]
        return lines
    lines += [(f"{len(u.cells)} of {u.total} cells were tested (passed or failed) in no run of "
              f"{u.window_text()}, on any host: a skip or a cell not run tests nothing."), ""]
    for v in u.never:
        lines.append(f"- **{v.axis} {v.value}**: 0 of its {v.cells} cells tested")
    if u.never:
        lines.append("")
    lines += ["| cell | last tested | since |", "|---|---|---|"]
    for i, c in enumerate(u.cells[:LISTED]):
        lines.append(f"| `{c.cell}` | {_last(u, i)} | {c.why()} |")
    if len(u.cells) > LISTED:
        lines.append(f"| … {len(u.cells) - LISTED} more (`cumatrix untested`, results.json never_tested) | | |")
    lines.append("")
    return lines


def junit_properties(u: Untested) -> list[tuple[str, object]]:
    """Suite properties: ``never_tested`` (one line), the window, the counts, each value."""
    props: list[tuple[str, object]] = [("never_tested", summary_line(u)), ("never_tested.runs", len(u.runs)),
                                       ("never_tested.cells", len(u.cells)),
                                       ("never_tested.values", len(u.never))]
    if u.pending:
        props.append(("never_tested.pending", len(u.pending)))
    props += [(f"never_tested.value.{v.axis}", f"{v.value}: 0 of {v.cells} cells") for v in u.never]
    return props


def html_data(u: Untested) -> dict[str, object]:
    """What index.html's section shows."""
    return {"title": title(u), "line": summary_line(u), "rotation": _rotation_line(u),
            "never_values": [(v.axis, v.value, v.cells) for v in u.never],
            "cell_rows": [(c.cell, _last(u, i), c.why()) for i, c in enumerate(u.cells[:LISTED])],
            "more": max(0, len(u.cells) - LISTED)}


def text(u: Untested) -> str:
    """The section as plain text (junit's system-out)."""
    return to_text(u)

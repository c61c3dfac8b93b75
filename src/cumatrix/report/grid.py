"""Arrange cells into the grids every human-facing report shows.

One grid per (host, driver) and workload: runtimes as rows, ``variant hBUILD`` as columns;
probe and command cells get their own grid per (host, driver) with the case as column.
Cells with no record are placed where their id says, as ``not run``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from cumatrix.results.records import Category, CellResult, RunData, axes_from_id

#: Short symbol per category, used by Markdown and HTML alike.
SYMBOLS: dict[Category, str] = {
    "ok": "✅",
    "expected": "🎯",
    "fail": "❌",
    "skip": "⏭",
    "not-run": "⏸",
}
LEGEND: dict[Category, str] = {
    "ok": "ran and passed as expected",
    "expected": "a predicted failure, reproduced as predicted (pass)",
    "fail": "did not meet its expectation",
    "skip": "skipped, or cannot be emulated on this host",
    "not-run": "in the matrix but never ran (run killed, or no host ran it)",
}
NO_HOST = "(no host)"

@lru_cache(maxsize=1)
def _glossary() -> dict[str, tuple[str, str]]:
    """``{outcome word or its prefix: (the word as shown, its meaning)}``, from ``glossary.json``
    (prose kept as data beside the templates), in the order a report lists them."""
    words = json.loads(resources.files(__package__).joinpath("glossary.json").read_text(encoding="utf-8"))["words"]
    return {key: (str(shown), str(meaning)) for key, (shown, meaning) in words.items()}


def readable(label: str) -> str:
    """The word a report shows for an outcome label: ``ok`` for a cell whose path does not
    apply (``ok:n/a``: commands and probes); every other label as recorded."""
    return "ok" if label == "ok:n/a" else label


def glossary(labels: list[str]) -> list[tuple[str, str]]:
    """``(word, meaning)`` for each outcome word among ``labels``, in the glossary's order."""
    known = _glossary()
    used = {label if label in known else label.split(":", 1)[0] for label in labels}
    return [shown for w, shown in known.items() if w in used]


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    """One cell as the grids show it; ``index`` is its position in :func:`entries`."""

    index: int
    id: str
    host: str | None
    axes: Mapping[str, str]
    category: Category
    label: str  # outcome label, or "not run"
    cell: CellResult | None

    @property
    def symbol(self) -> str:
        return SYMBOLS[self.category]


@dataclass(frozen=True, kw_only=True, slots=True)
class Grid:
    host: str | None
    driver: str
    workload: str | None  # None: the probe/cases grid
    rows: tuple[str, ...]
    cols: tuple[str, ...]
    cells: Mapping[tuple[str, str], Entry]

    @property
    def title(self) -> str:
        parts = [f"host {self.host}"] if self.host else []
        parts.append(f"driver {self.driver}")
        parts.append(f"workload {self.workload}" if self.workload else "probe and cases")
        return " · ".join(parts)

    @property
    def entries(self) -> list[Entry]:
        return list(self.cells.values())

    def count(self, category: Category) -> int:
        return sum(1 for e in self.cells.values() if e.category == category)

    @property
    def all_as_expected(self) -> bool:
        return all(e.category in ("ok", "expected") for e in self.cells.values())

    @property
    def all_skipped(self) -> bool:
        """Every cell a neutral skip: nothing in it was tested (folded in the reports)."""
        return bool(self.cells) and all(e.category == "skip" for e in self.cells.values())

    def skip_reasons(self) -> str:
        """``"12 skipped:no-cuda-driver"``: the skips' words with their counts."""
        n: dict[str, int] = {}
        for e in self.cells.values():
            if e.category == "skip":
                n[e.label] = n.get(e.label, 0) + 1
        return ", ".join(f"{k} {w}" for w, k in sorted(n.items(), key=lambda kv: (-kv[1], kv[0])))


def entries(run: RunData) -> list[Entry]:
    """Every cell of the run, recorded ones first, then those not run."""
    out: list[Entry] = []
    for cell in run.cells:
        out.append(
            Entry(
                index=len(out),
                id=cell.id,
                host=cell.host if run.merged else None,
                axes=cell.axes,
                category=cell.category,
                label=readable(cell.outcome_label),
                cell=cell,
            )
        )
    for cid, where in run.not_run_where():
        out.append(
            Entry(
                index=len(out),
                id=cid,
                host=(where or NO_HOST) if run.merged or where else None,
                axes=axes_from_id(cid),
                category="not-run",
                label="not run",
                cell=None,
            )
        )
    return out


def column_of(axes: Mapping[str, str]) -> tuple[str | None, str]:
    """(workload, column label) of a cell in its grid."""
    if axes.get("kind") == "swap" or "workload" in axes:
        col = axes.get("variant", "?")
        if axes.get("build"):
            col += f" h{axes['build']}"
        return axes.get("workload", "?"), col
    if axes.get("kind") == "probe":
        return None, "probe"
    return None, axes.get("case", axes.get("kind", "?"))


def grids(run: RunData, items: list[Entry] | None = None) -> list[Grid]:
    """The grids of a run, in matrix order."""
    items = entries(run) if items is None else items
    # Rows and columns are dicts used as ordered sets: a run of 10,000 cases has 10,000 columns.
    keys: dict[tuple[str | None, str, str | None], int] = {}
    rows: dict[tuple[str | None, str, str | None], dict[str, None]] = {}
    cols: dict[tuple[str | None, str, str | None], dict[str, None]] = {}
    cells: dict[tuple[str | None, str, str | None], dict[tuple[str, str], Entry]] = {}
    for e in items:
        workload, col = column_of(e.axes)
        key = (e.host, e.axes.get("driver", "?"), workload)
        if key not in cells:
            keys[key] = len(keys)
            rows[key], cols[key], cells[key] = {}, {}, {}
        row = e.axes.get("runtime", "?")
        rows[key][row] = None
        cols[key][col] = None
        cells[key][(row, col)] = e

    # (host, driver) in first-seen order; inside, probe/cases first, then workloads.
    hd_order: dict[tuple[str | None, str], int] = {}
    for host, driver, _ in keys:
        hd_order.setdefault((host, driver), len(hd_order))
    ordered = sorted(keys, key=lambda k: (hd_order[(k[0], k[1])], k[2] is not None, keys[k]))
    return [
        Grid(host=k[0], driver=k[1], workload=k[2], rows=tuple(rows[k]), cols=tuple(cols[k]), cells=cells[k])
        for k in ordered
    ]


def timed(run: RunData) -> dict[str, list[CellResult]]:
    """Cells with a batch bandwidth measurement, per workload, sorted by variant and build."""
    out: dict[str, list[CellResult]] = {}
    for cell in run.cells:
        if cell.timings.gbps is None and cell.timings.loop_gbps is None:
            continue
        out.setdefault(cell.axes.get("workload", "?"), []).append(cell)
    for cells in out.values():
        cells.sort(
            key=lambda c: (
                c.axes.get("variant", ""),
                c.axes.get("build", ""),
                c.axes.get("runtime", ""),
                c.axes.get("driver", ""),
                c.host or "",
            )
        )
    return out

"""What the history says was never tested: the cells of a matrix that no run of a window
(the last N runs, or the last D days, of that matrix) tested on any host, and the axis
values none of whose cells was tested.

A cell is *tested* in a run when it passed or failed there (it ran the code under test and
was judged); a skip (``skipped:*``, ``cannot-emulate``) or a cell not run tests nothing.  A
cell tested on one host of a night counts, whatever the others did: the history keys the
cells of a merge by host, and the runs of several hosts recorded one by one by their own
host; both are read by cell id here.

Runs that took a rotation's night (``--rotate K``) run each cell once every K nights: a
cell no run of the window took is not called untested while the window holds fewer than
the K nights of its rotation (it is *pending*).  A cell a night took and skipped is
untested: its night came and went.

Each untested cell says when it was last tested (its newest passed or failed result in the
whole history of the matrix) and what it did in the window instead (each outcome and how
many runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cumatrix.core.planned import Selection
from cumatrix.core.record import axes_from_id
from cumatrix.results.history import STATUS_CODES, History, HistoryError, StoredRun

#: Runs looked back over by default (``--runs``; the reports' section).
DEFAULT_RUNS = 30
#: The axes whose values are counted (``family`` follows from the variant and the runtime).
AXES = ("runtime", "driver", "kind", "variant", "build", "workload", "case")
_TESTED = (STATUS_CODES["pass"], STATUS_CODES["fail"])


@dataclass(frozen=True, kw_only=True, slots=True)
class LastTest:
    """A cell's newest passed or failed result."""

    run: int  # history id
    when: str | None
    host: str
    outcome: str

    def to_json(self) -> dict[str, object]:
        return {"run": self.run, "when": self.when, "host": self.host or None, "outcome": self.outcome}


@dataclass(frozen=True, kw_only=True, slots=True)
class UntestedCell:
    """A cell no run of the window tested."""

    cell: str
    last_tested: LastTest | None  # None: never, in the whole history of the matrix
    #: (outcome label, times) in the window, most frequent first: a merged night counts once per
    #: host that held the cell
    since: tuple[tuple[str, int], ...]

    def to_json(self) -> dict[str, object]:
        return {"cell": self.cell, "last_tested": self.last_tested.to_json() if self.last_tested else None,
                "since": [{"outcome": o, "times": n} for o, n in self.since]}

    def why(self) -> str:
        """``skipped:no-cuda-driver x30`` or ``not in any run of the window``."""
        if not self.since:
            return "in no run of the window (not selected)"
        return ", ".join(f"{o} x{n}" for o, n in self.since)


@dataclass(frozen=True, kw_only=True, slots=True)
class AxisValue:
    """How many cells with one axis value there are, and how many of them were tested."""

    axis: str
    value: str
    cells: int
    tested: int
    pending: int = 0  # cells a rotation has not reached yet

    def to_json(self) -> dict[str, object]:
        return {"axis": self.axis, "value": self.value, "cells": self.cells, "tested": self.tested,
                "pending": self.pending}


@dataclass(frozen=True, kw_only=True, slots=True)
class Untested:
    """The window of runs looked at, the cells it never tested and the values never tested."""

    matrix: str
    digest: str
    runs: tuple[StoredRun, ...]  # the window, oldest first
    total: int  # cells of the matrix (or seen in the window)
    cells: tuple[UntestedCell, ...]
    values: tuple[AxisValue, ...]  # every axis value, untested ones included
    #: cells a rotation has not reached yet (no run of the window took them, and the window
    #: holds fewer than the rotation's nights)
    pending: tuple[str, ...] = ()
    rotation: Selection | None = None
    nights_seen: int = 0

    @property
    def never(self) -> tuple[AxisValue, ...]:
        """Axis values none of whose cells was tested (and not every one of them pending)."""
        return tuple(v for v in self.values if v.tested == 0 and v.cells > v.pending)

    @property
    def found(self) -> bool:
        return bool(self.cells)

    def window_text(self) -> str:
        """``the last 30 runs (2026-11-01 to 2026-11-30)``."""
        n = len(self.runs)
        if not n:
            return "no run"
        first, last = self.runs[0], self.runs[-1]
        span = f" ({_day(first)} to {_day(last)})" if _day(first) != _day(last) else f" ({_day(last)})"
        return f"the last {n} run{'s' if n != 1 else ''}{span}"

    def to_json(self) -> dict[str, object]:
        """The ``untested --json`` document (and results.json ``never_tested``)."""
        return {"matrix": self.matrix, "matrix_sha256": self.digest, "runs": len(self.runs),
                "window": [r.id for r in self.runs],
                "first": self.runs[0].started or self.runs[0].recorded if self.runs else None,
                "last": self.runs[-1].started or self.runs[-1].recorded if self.runs else None,
                "total": self.total, "cells": [c.to_json() for c in self.cells],
                "never_tested_values": [v.to_json() for v in self.never],
                "values": [v.to_json() for v in self.values], "pending": list(self.pending),
                "rotation": self.rotation.to_json() if self.rotation is not None else None,
                "nights_seen": self.nights_seen}


def _day(r: StoredRun) -> str:
    return (r.started or r.recorded)[:10]


def window(hist: History, digest: str, *, runs: int | None = None, days: float | None = None,
           upto: int | None = None) -> list[StoredRun]:
    """The runs of ``digest`` looked at: the newest ``runs`` (default :data:`DEFAULT_RUNS`) up to
    run ``upto``, or those that started within ``days`` of the newest one."""
    if days is not None:
        every = hist.runs(digest=digest, upto=upto)
        if not every:
            return []
        newest = _parse(every[-1].started or every[-1].recorded)
        cut = newest - timedelta(days=days)
        return [r for r in every if _parse(r.started or r.recorded) >= cut]
    return hist.runs(digest=digest, upto=upto, limit=runs or DEFAULT_RUNS)


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text)


def find(hist: History, *, digest: str | None = None, universe: Sequence[str] | None = None,
         runs: int | None = None, days: float | None = None, upto: int | None = None,
         matrix: str | None = None) -> Untested:
    """The cells of matrix ``digest`` (default: the newest run's) that no run of the window
    tested (see the module's text).  ``universe``: every cell id of the matrix (from its file);
    without it, the cells the window's runs hold."""
    if digest is None:
        digest = _newest_digest(hist, upto)
    span = window(hist, digest, runs=runs, days=days, upto=upto)
    if not span:
        raise HistoryError(f"{hist.path}: no run of this matrix (sha256 {digest[:12]}) in the history")
    names = dict(hist.conn.execute("SELECT id, name FROM cells"))
    seen, tested, since = _read_window(hist, [r.id for r in span], names)
    every = list(dict.fromkeys(universe)) if universe is not None else sorted(seen)
    rotation, nights = _rotation(span)
    pending = _pending(every, seen, tested, rotation, nights)
    pend = set(pending)
    missed = [n for n in every if n not in tested and n not in pend]
    cells = _details(hist, digest, span, names, missed, since)
    return Untested(matrix=matrix or span[-1].matrix, digest=digest, runs=tuple(span), total=len(every),
                    cells=cells, values=_values(every, tested, pend), pending=tuple(pending), rotation=rotation,
                    nights_seen=nights)


def _newest_digest(hist: History, upto: int | None) -> str:
    """The matrix digest of the newest run (up to ``upto``) of a matrix (a gate's series is its wheels')."""
    row = hist.conn.execute("SELECT digest FROM runs WHERE kind IN ('run', 'merge') AND id <= ? "
                            "ORDER BY id DESC LIMIT 1", (upto if upto is not None else 2**62,)).fetchone()
    if row is None:
        raise HistoryError(f"{hist.path}: the history holds no run of a matrix yet")
    return str(row[0])


def _pending(every: Sequence[str], seen: set[str], tested: set[str], rotation: Selection | None,
             nights: int) -> list[str]:
    """The cells a rotation has not reached yet: in no run of the window while the window holds
    fewer of its nights than the rotation has (none without a rotation)."""
    if rotation is None or rotation.rotate is None or nights >= rotation.rotate:
        return []
    return [n for n in every if n not in tested and n not in seen]


def _read_window(hist: History, ids: Sequence[int],
                 names: dict[int, str]) -> tuple[set[str], set[str], dict[str, dict[str, int]]]:
    """The cell ids the runs ``ids`` hold, those tested in one of them (any host), and what
    each did where it was not tested (outcome label -> times)."""
    labels = hist.outcome_labels()
    marks = ",".join("?" * len(ids))
    # Three reads of the window, each cheaper than one GROUP BY of all its rows: the cells it
    # holds; the rows where a cell was not tested (few), grouped; and which of those cells
    # were tested in another run of the window (looked up by key).
    seen = {names[cid] for (cid,) in hist.conn.execute(
        f"SELECT DISTINCT cell FROM results WHERE run IN ({marks})", list(ids))}
    since: dict[str, dict[str, int]] = {}
    candidates: set[int] = set()
    for cid, outcome, n in hist.conn.execute(
            f"SELECT cell, outcome, count(*) FROM results WHERE run IN ({marks}) "
            f"AND status NOT IN ({_TESTED[0]}, {_TESTED[1]}) GROUP BY cell, outcome", list(ids)):
        candidates.add(cid)
        per = since.setdefault(names[cid], {})
        label = labels[outcome]
        per[label] = per.get(label, 0) + n
    also_tested: set[str] = set()
    # by name: a merge keys a cell by its host, and another host may have tested it
    cand_names = {names[cid] for cid in candidates}
    listed = sorted(cid for cid, n in names.items() if n in cand_names)
    for i in range(0, len(listed), 500):
        part = listed[i:i + 500]
        also_tested.update(names[cid] for (cid,) in hist.conn.execute(
            f"SELECT DISTINCT cell FROM results WHERE run IN ({marks}) AND cell IN ({','.join('?' * len(part))}) "
            f"AND status IN ({_TESTED[0]}, {_TESTED[1]})", [*ids, *part]))
    return seen, seen - (cand_names - also_tested), since


def _rotation(span: Sequence[StoredRun]) -> tuple[Selection | None, int]:
    """The rotation of the newest run of the window (None: it took no rotation's night), and
    how many of its nights the window holds."""
    sel = span[-1].selection
    if sel is None or sel.rotate is None:
        return None, 0
    same = {r.selection.slot for r in span if r.selection is not None and
            (r.selection.rotate, r.selection.strength, r.selection.seed) == (sel.rotate, sel.strength, sel.seed)}
    return sel, len(same)


def _details(hist: History, digest: str, span: Sequence[StoredRun], names: dict[int, str],
             missed: Sequence[str], since: dict[str, dict[str, int]]) -> tuple[UntestedCell, ...]:
    """For each missed cell: what it did in the window (``since``), and its last test before it."""
    if not missed:
        return ()
    last = _last_tests(hist, digest, span[0].id, names, set(missed))
    return tuple(UntestedCell(cell=n, last_tested=last.get(n),
                              since=tuple(sorted(since.get(n, {}).items(), key=lambda kv: (-kv[1], kv[0]))))
                 for n in missed)


def _last_tests(hist: History, digest: str, before: int, names: dict[int, str],
                want: set[str]) -> dict[str, LastTest]:
    """The newest passed or failed result of each of ``want`` in the runs of ``digest`` before
    run ``before``: one query per 500 cells, looked up by key (run, cell) over the older runs."""
    older = hist.runs(digest=digest, upto=before - 1)
    if not older:
        return {}
    runs = {r.id: r for r in older}
    hosts = dict(hist.conn.execute("SELECT id, host FROM cells"))
    numbers = [cid for cid, n in names.items() if n in want]
    labels = hist.outcome_labels()
    run_marks = ",".join("?" * len(older))
    found: dict[str, LastTest] = {}
    for i in range(0, len(numbers), 500):
        part = numbers[i:i + 500]
        # SQLite's max() gives the other bare columns of the row it picked: that row's outcome
        for cid, rid, outcome in hist.conn.execute(
                f"SELECT cell, max(run), outcome FROM results WHERE run IN ({run_marks}) "
                f"AND cell IN ({','.join('?' * len(part))}) AND status IN ({_TESTED[0]}, {_TESTED[1]}) "
                "GROUP BY cell", [*runs, *part]):
            n = names[cid]
            if n not in found or rid > found[n].run:
                found[n] = _last_test(runs[rid], hosts[cid], labels[outcome])
    return found


def _last_test(r: StoredRun, host: str, outcome: str) -> LastTest:
    """A cell's test in stored run ``r``: on its own host (a merge's), else the run's."""
    return LastTest(run=r.id, when=r.started or r.recorded, host=host or r.host, outcome=outcome)


def _values(every: Sequence[str], tested: set[str], pending: set[str]) -> tuple[AxisValue, ...]:
    """Per axis value: its cells, how many were tested, how many are pending."""
    counts: dict[tuple[str, str], list[int]] = {}
    for name in every:
        axes = axes_from_id(name)  # the family it adds is no axis counted here
        hit, wait = name in tested, name in pending
        for a in AXES:
            v = axes.get(a)
            if v is None:
                continue
            c = counts.setdefault((a, v), [0, 0, 0])
            c[0] += 1
            c[1] += hit
            c[2] += wait
    return tuple(AxisValue(axis=a, value=v, cells=c[0], tested=c[1], pending=c[2]) for (a, v), c in counts.items())


def to_text(u: Untested) -> str:
    """``cumatrix untested`` as a person reads it."""
    where = u.window_text()
    lines = [f"matrix {u.matrix} (sha256 {u.digest[:12]}): {u.total} cells, {len(u.cells)} never tested in {where}"
             + (" on any host" if u.cells else "")]
    if u.rotation is not None and u.rotation.rotate is not None:
        lines.append(f"rotation of {u.rotation.rotate} nights (cover {u.rotation.strength}, seed {u.rotation.seed}): "
                     f"{u.nights_seen} of its nights in the window"
                     + (f"; {len(u.pending)} cells not reached yet are not counted" if u.pending else ""))
    for v in u.never:
        lines.append(f"{v.axis} {v.value}: 0 of its {v.cells} cells tested in {where}")
    for c in u.cells:
        last = (f"last tested #{c.last_tested.run} {c.last_tested.when} ({c.last_tested.outcome}"
                + (f" on {c.last_tested.host}" if c.last_tested.host else "") + ")"
                if c.last_tested else "never tested in the history")
        lines.append(f"  {c.cell}: {last}; since: {c.why()}")
    if not u.cells:
        lines.append("every cell was tested at least once")
    return "\n".join(lines) + "\n"


def tested_in(hist: History, run_ids: Sequence[int]) -> set[str]:
    """The cell ids (any host) that passed or failed in at least one of ``run_ids``."""
    if not run_ids:
        return set()
    names = dict(hist.conn.execute("SELECT id, name FROM cells"))
    marks = ",".join("?" * len(run_ids))
    return {names[cid] for (cid,) in hist.conn.execute(
        f"SELECT DISTINCT cell FROM results WHERE run IN ({marks}) AND status IN ({_TESTED[0]}, {_TESTED[1]})",
        list(run_ids))}

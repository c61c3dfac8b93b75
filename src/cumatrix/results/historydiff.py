"""What changed between two stored runs, and which cells cannot make up their mind.

:func:`diff` compares run B with an earlier run A (by default the two newest runs of one
matrix digest) and sorts every cell that changed into one list:

* ``new_failures``: failed in B, did not fail in A (or was not in A);
* ``fixed``: failed in A, passed in B;
* ``newly_skipped``: skipped in B, ran (passed or failed) in A;
* ``newly_not_run``: not run in B (or absent from it), ran or was skipped in A;
* ``changed``: any other change of status or outcome label (``ok:batch`` -> ``ok:fallback``,
  one failure turned into another, a skipped cell that runs again).

``speed`` lists cells whose GB/s or speedup moved beyond their own run-to-run noise.  The
noise of a cell is measured on its history: the values of the metric in the last
``window`` runs of the matrix up to and including A.  With m their median and MAD the median
absolute deviation from m, noise = max(1.4826 x MAD, 2% of |m|) (1.4826 x MAD estimates a
standard deviation; the 2% floor keeps a cell that happened to repeat itself exactly from
flagging every wobble).  B's value moved when |B - m| > 4 x noise (with 10 earlier values the
MAD is itself a rough estimate; 4 keeps a year of nightlies of 10,000 cells from crying wolf).  A cell needs at least
:data:`MIN_SAMPLES` earlier values; with fewer it is not judged.

``flaky`` names the cells whose outcome label changed at least twice between consecutive
runs among the last ``window`` runs up to and including B (runs in which the cell did not
run are passed over).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cumatrix.core.sinks import one_line
from cumatrix.results.history import (
    NOT_RUN,
    STATUS_CODES,
    STATUS_NAMES,
    CellKey,
    CellKeys,
    History,
    HistoryError,
    Result,
    StoredRun,
)
from cumatrix.results.untested import tested_in

#: Runs looked back over for noise and flips (``--window``).
DEFAULT_WINDOW = 10
#: Flips within the window that make a cell flaky.
FLAKY_FLIPS = 2
#: How many noise units a value must move to be reported.
NOISE_K = 4.0
#: The noise floor, relative to the median.
NOISE_FLOOR = 0.02
#: 1.4826 x MAD estimates the standard deviation of normally distributed values.
MAD_SCALE = 1.4826
#: Runs the reports' GB/s plots reach back over, and how many cells they draw.
TREND_RUNS = 30
TREND_CELLS = 300
#: Earlier values a cell needs before its speed is judged.
MIN_SAMPLES = 3

LISTS = ("new_failures", "fixed", "changed", "newly_skipped", "newly_not_run")


@dataclass(frozen=True, kw_only=True, slots=True)
class Change:
    """A cell whose status or outcome differs between A and B."""

    cell: CellKey
    before: Result | None  # None: not in A
    after: Result | None  # None: not in B

    def to_json(self) -> dict[str, object]:
        """``{"cell", "host", "before", "after"}`` with outcome labels (``not-run`` when absent)."""
        return {"cell": self.cell.name, "host": self.cell.host or None,
                "before": _label(self.before), "after": _label(self.after),
                "status_before": self.before.status if self.before else NOT_RUN,
                "status_after": self.after.status if self.after else NOT_RUN}


@dataclass(frozen=True, kw_only=True, slots=True)
class SpeedMove:
    """A cell whose GB/s or speedup moved beyond its noise."""

    cell: CellKey
    metric: str  # gbps or speedup
    before: float | None  # A's value
    after: float
    median: float
    noise: float
    samples: int

    def to_json(self) -> dict[str, object]:
        return {"cell": self.cell.name, "host": self.cell.host or None, "metric": self.metric,
                "before": self.before, "after": self.after, "median": self.median, "noise": self.noise,
                "samples": self.samples, "change": self.after / self.median - 1 if self.median else None}


@dataclass(frozen=True, kw_only=True, slots=True)
class Flaky:
    """A cell whose outcome flipped at least :data:`FLAKY_FLIPS` times in the window."""

    cell: CellKey
    flips: int
    outcomes: tuple[str, ...]  # oldest first, over the runs in which it ran

    def to_json(self) -> dict[str, object]:
        return {"cell": self.cell.name, "host": self.cell.host or None, "flips": self.flips,
                "outcomes": list(self.outcomes)}


@dataclass(frozen=True, kw_only=True, slots=True)
class Diff:
    """Run B against run A, with the window of runs the noise and flips were measured on."""

    a: StoredRun
    b: StoredRun
    window: int
    new_failures: tuple[Change, ...] = ()
    fixed: tuple[Change, ...] = ()
    changed: tuple[Change, ...] = ()
    newly_skipped: tuple[Change, ...] = ()
    newly_not_run: tuple[Change, ...] = ()
    speed: tuple[SpeedMove, ...] = ()
    flaky: tuple[Flaky, ...] = ()
    #: per swap cell, (history id, GB/s) over the window up to B: the reports' trend plots.
    trends: Mapping[CellKey, tuple[tuple[int, float], ...]] | None = None
    #: swap cells of B with a GB/s that ``trends`` leaves out (beyond :data:`TREND_CELLS`)
    trends_left_out: int = 0
    #: cells (ids, any host) tested in a run of the window up to A and in none of the window up to B
    newly_untested: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """Nothing changed, moved or flipped."""
        return not any(getattr(self, name) for name in (*LISTS, "speed", "flaky", "newly_untested"))

    def to_json(self) -> dict[str, object]:
        """The ``diff --json`` document (and results.json ``since_last_run``)."""
        out: dict[str, object] = {"a": self.a.to_json(), "b": self.b.to_json(), "window": self.window,
                                  "same_matrix": self.a.digest == self.b.digest}
        for name in LISTS:
            out[name] = [c.to_json() for c in getattr(self, name)]
        out["speed"] = [s.to_json() for s in self.speed]
        out["flaky"] = [f.to_json() for f in self.flaky]
        out["newly_untested"] = list(self.newly_untested)
        return out

    def counts(self) -> dict[str, int]:
        """How many entries each list holds."""
        return {name: len(getattr(self, name)) for name in (*LISTS, "speed", "flaky", "newly_untested")}


def _label(r: Result | None) -> str:
    return NOT_RUN if r is None else r.outcome


def classify(before: Result | None, after: Result | None) -> str | None:
    """The list a cell's change belongs in (see the module's text), or None: unchanged."""
    sb, sa = _status(before), _status(after)
    if sb == sa and _label(before) == _label(after):
        return None
    return _list_of(sb, sa)


def _status(r: Result | None) -> str:
    return r.status if r else NOT_RUN


def _list_of(sb: str, sa: str) -> str:
    """The list of a cell whose status went from ``sb`` to ``sa`` (or whose outcome changed)."""
    if sa == "fail" and sb != "fail":
        return "new_failures"
    if sb == "fail" and sa == "pass":
        return "fixed"
    if sa == "skip" and sb in ("pass", "fail"):
        return "newly_skipped"
    if sa == NOT_RUN and sb != NOT_RUN:
        return "newly_not_run"
    return "changed"


def noise_of(values: Sequence[float]) -> tuple[float, float]:
    """(median, noise) of a cell's earlier values: noise = max(1.4826 x MAD, 2% of |median|)."""
    m = statistics.median(values)
    mad = statistics.median(abs(v - m) for v in values)
    return m, max(MAD_SCALE * mad, NOISE_FLOOR * abs(m))


def flips_of(outcomes: Sequence[str]) -> int:
    """How many times consecutive outcomes differ."""
    return sum(1 for x, y in itertools.pairwise(outcomes) if x != y)


def resolve(hist: History, a_ref: str | None, b_ref: str | None) -> tuple[StoredRun, StoredRun]:
    """Runs A and B from what the user named: none (the two newest runs of the newest run's
    matrix), B only (B and the run of its matrix before it), or both."""
    if b_ref is None and a_ref is not None:  # `diff X`: X against the run before it
        b_ref, a_ref = a_ref, None
    if b_ref is None:
        newest = hist.runs(limit=1)
        if not newest:
            raise HistoryError(f"{hist.path}: the history holds no run yet")
        b = newest[0]
    else:
        b = hist.run(b_ref)
    if a_ref is not None:
        return hist.run(a_ref), b
    earlier = hist.runs(digest=b.digest, upto=b.id - 1, limit=1)
    if not earlier:
        raise HistoryError(f"{hist.path}: run #{b.id} is the first run of its matrix ({b.matrix}) in the "
                           "history: nothing to compare it with")
    return earlier[0], b


def diff(hist: History, a: StoredRun, b: StoredRun, *, window: int = DEFAULT_WINDOW, trends: bool = False) -> Diff:
    """Compare stored runs ``a`` and ``b`` (see the module's text for every list).

    With ``trends``, also the GB/s of B's swap cells over the last :data:`TREND_RUNS` runs of
    the matrix (at most :data:`TREND_CELLS` cells: those whose speed moved first): the
    reports' plots.
    """
    if window < 2:
        raise HistoryError(f"--window {window}: must be at least 2")
    # The window: runs of B's matrix up to B (flips), and up to A (the noise).  Rows stay
    # tuples keyed by cell number; objects are made only for what is reported (a 10,000-cell
    # matrix and a window of 10 are 110,000 rows).
    span = [r.id for r in hist.runs(digest=b.digest, upto=b.id, limit=window)]
    before_a = [r.id for r in hist.runs(digest=b.digest, upto=a.id, limit=window)] if a.digest == b.digest else [a.id]
    ra, rb = hist.rows(a.id), hist.rows(b.id)
    keys: CellKeys = hist.cell_keys()
    labels = hist.outcome_labels()
    lists = _changes(ra, rb, keys, labels)
    speed = _speed(hist, before_a, ra, rb, keys)
    flaky = _flaky(hist, span, keys, labels)
    trend, left_out = _trends_of(hist, b, window, rb, keys, speed) if trends else (None, 0)
    # A cell becomes untested when the window up to B (of the same length) no longer holds a
    # run that tested it, where the window up to A did.
    untested = (tuple(sorted(tested_in(hist, before_a) - tested_in(hist, span))) if a.digest == b.digest else ())
    return Diff(a=a, b=b, window=window, **{k: tuple(v) for k, v in lists.items()}, speed=tuple(speed),
                flaky=tuple(flaky), trends=trend, trends_left_out=left_out, newly_untested=untested)


def _trends_of(hist: History, b: StoredRun, window: int, rb: Mapping[int, Row], keys: CellKeys,
               speed: Sequence[SpeedMove]) -> tuple[dict[CellKey, tuple[tuple[int, float], ...]], int]:
    """:func:`_trends` over the last runs of B's matrix, the cells whose speed moved first."""
    moved = keys.numbers(s.cell for s in speed)
    return _trends(hist, [r.id for r in hist.runs(digest=b.digest, upto=b.id, limit=max(window, TREND_RUNS))],
                   rb, keys, first=[cid for cid in rb if cid in moved])


def _changes(ra: Mapping[int, Row], rb: Mapping[int, Row], keys: CellKeys,
             labels: Mapping[int, str]) -> dict[str, list[Change]]:
    """Each cell whose status or outcome differs between A's rows and B's, by list."""

    def result(row: Row | None) -> Result | None:
        if row is None:
            return None
        return Result(status=STATUS_NAMES[row[1]], outcome=labels[row[2]], gbps=row[3], speedup=row[4])

    lists: dict[str, list[Change]] = {name: [] for name in LISTS}
    for cid in [*ra, *(c for c in rb if c not in ra)]:
        x, y = ra.get(cid), rb.get(cid)
        if x is not None and y is not None and x[1] == y[1] and x[2] == y[2]:
            continue
        before, after = result(x), result(y)
        where = classify(before, after)
        if where is not None:
            lists[where].append(Change(cell=keys[cid], before=before, after=after))
    return lists


def _flaky(hist: History, span: list[int], keys: CellKeys, labels: Mapping[int, str]) -> list[Flaky]:
    """The cells whose outcome flipped at least :data:`FLAKY_FLIPS` times in the runs ``span``."""
    flaky = []
    marks = ",".join("?" * len(span))
    # Only cells with more than one outcome among the runs of the window in which they ran
    # can have flipped: SQLite finds them; their sequences are read for those alone.
    seqs: dict[int, list[str]] = {}
    for cid, outcome in hist.conn.execute(
            f"SELECT cell, outcome FROM results WHERE run IN ({marks}) AND status != {STATUS_CODES[NOT_RUN]} "
            f"AND cell IN (SELECT cell FROM results WHERE run IN ({marks}) AND status != {STATUS_CODES[NOT_RUN]} "
            "GROUP BY cell HAVING min(outcome) != max(outcome)) ORDER BY run", [*span, *span]):
        seqs.setdefault(cid, []).append(labels[outcome])
    for cid, seq in seqs.items():
        n = flips_of(seq)
        if n >= FLAKY_FLIPS:
            flaky.append(Flaky(cell=keys[cid], flips=n, outcomes=tuple(seq)))
    flaky.sort(key=lambda f: (-f.flips, f.cell.name, f.cell.host))
    return flaky


Row = tuple[int, int, int, float | None, float | None]


def _speed(hist: History, runs: Sequence[int], ra: Mapping[int, Row], rb: Mapping[int, Row],
           keys: Mapping[int, CellKey]) -> list[SpeedMove]:
    """Cells of B (passed) whose GB/s or speedup lies beyond the noise of their earlier values."""
    passed = STATUS_CODES["pass"]
    earlier = _earlier_values(hist, runs)
    out = []
    for cid, row in rb.items():
        if row[1] != passed or cid not in earlier:
            continue
        for col, metric, values in ((3, "gbps", earlier[cid][0]), (4, "speedup", earlier[cid][1])):
            value = row[col]
            moved = _moved(value, values) if value is not None else None
            if value is not None and moved is not None:
                before = ra.get(cid)
                m, noise = moved
                out.append(SpeedMove(cell=keys[cid], metric=metric, before=before[col] if before else None,
                                     after=value, median=m, noise=noise, samples=len(values)))
    return out


def _earlier_values(hist: History, runs: Sequence[int]) -> dict[int, tuple[list[float], list[float]]]:
    """``{cell: (GB/s values, speedups)}`` of the passed cells of ``runs`` that measured either."""
    earlier: dict[int, tuple[list[float], list[float]]] = {}
    for rid in runs:
        for cid, g, sp in hist.conn.execute("SELECT cell, gbps, speedup FROM results WHERE run = ? AND status = ? "
                                            "AND (gbps IS NOT NULL OR speedup IS NOT NULL)",
                                            (rid, STATUS_CODES["pass"])):
            lists = earlier.get(cid)
            if lists is None:
                lists = earlier[cid] = ([], [])
            if g is not None:
                lists[0].append(g)
            if sp is not None:
                lists[1].append(sp)
    return earlier


def _moved(value: float, values: list[float]) -> tuple[float, float] | None:
    """``(median, noise)`` of the earlier ``values`` (sorted here) where ``value`` lies beyond
    that noise, else ``None`` (too few samples, or within the noise)."""
    n = len(values)
    if n < MIN_SAMPLES:
        return None
    values.sort()
    m = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    if abs(value - m) <= NOISE_K * NOISE_FLOOR * abs(m):
        return None  # within the floor: not moved whatever the spread (the common case, no MAD needed)
    m, noise = noise_of(values)
    if noise > 0 and abs(value - m) > NOISE_K * noise:
        return m, noise
    return None


def _trends(hist: History, span: Sequence[int], rb: Mapping[int, Row],
            keys: Mapping[int, CellKey], *,
            first: Sequence[int]) -> tuple[dict[CellKey, tuple[tuple[int, float], ...]], int]:
    """GB/s over the runs of ``span`` (oldest first) of up to :data:`TREND_CELLS` swap cells
    of B (``first``, then the others in B's order), and how many more there are."""
    chosen = _trend_cells(hist, rb, first)
    left_out = max(0, len(chosen) - TREND_CELLS)
    chosen = chosen[:TREND_CELLS]
    points: dict[int, list[tuple[int, float]]] = {cid: [] for cid in chosen}
    if chosen:  # looked up by key (run, cell): a run of 10,000 cells is not read for 300
        marks = ",".join("?" * len(chosen))
        for rid in span:
            for cid, g in hist.conn.execute(f"SELECT cell, gbps FROM results WHERE run = ? AND cell IN ({marks}) "
                                            "AND gbps IS NOT NULL", (rid, *chosen)):
                points[cid].append((rid, g))
    return {keys[cid]: tuple(pts) for cid, pts in points.items() if pts}, left_out


def _trend_cells(hist: History, rb: Mapping[int, Row], first: Sequence[int]) -> list[int]:
    """``first``, then B's swap cells that measured GB/s, in B's order, each once."""
    swap = {cid for (cid,) in hist.conn.execute("SELECT id FROM cells WHERE kind = 'swap'")}
    return list(dict.fromkeys([*first, *(cid for cid in rb if cid in swap and rb[cid][3] is not None)]))


def to_text(d: Diff) -> str:
    """``cumatrix diff`` as a person reads it."""
    a, b = d.a, d.b
    lines = [(f"run #{b.id} ({b.run_uid}, {b.started or b.recorded}) against #{a.id} ({a.run_uid}, "
              f"{a.started or a.recorded}), matrix {one_line(b.matrix)}")]
    if a.digest != b.digest:
        lines.append(f"note: the runs are of different matrices (sha256 {a.digest[:12]} and {b.digest[:12]})")
    lines += _text_changes(d)
    if d.speed:
        lines.append(f"speed beyond noise ({len(d.speed)}; noise from up to {d.window} runs):")
        lines += [_text_speed(s) for s in d.speed]
    lines += _text_flaky_untested(d)
    if d.empty:
        lines.append("no change")
    return "\n".join(lines) + "\n"


def _text_flaky_untested(d: Diff) -> list[str]:
    """The flaky cells and the newly untested ones, a cell a line."""
    lines = []
    if d.flaky:
        lines.append(f"flaky ({len(d.flaky)}; outcome flipped {FLAKY_FLIPS}+ times in the last {d.window} runs):")
        lines += [f"  {one_line(str(f.cell))}: {f.flips} flips ({one_line(' '.join(f.outcomes))})" for f in d.flaky]
    if d.newly_untested:
        lines.append(f"newly untested ({len(d.newly_untested)}; tested in no run of the last {d.window} up to "
                     f"#{d.b.id}, on any host):")
        lines += [f"  {one_line(str(c))}" for c in d.newly_untested]
    return lines


_TEXT_TITLES = {"new_failures": "new failures", "fixed": "fixed", "changed": "changed outcomes",
                "newly_skipped": "newly skipped", "newly_not_run": "newly not run"}


def _text_changes(d: Diff) -> list[str]:
    """Each non-empty list of changed outcomes, a cell a line."""
    lines = []
    for name in LISTS:
        changes = getattr(d, name)
        if changes:
            lines.append(f"{_TEXT_TITLES[name]} ({len(changes)}):")
            lines += [f"  {one_line(str(c.cell))}: {one_line(_label(c.before))} -> {one_line(_label(c.after))}"
                      for c in changes]
    return lines


def _text_speed(s: SpeedMove) -> str:
    if not s.median:
        return f"  {one_line(str(s.cell))}: {s.metric} {s.after:.4g}"
    return (f"  {one_line(str(s.cell))}: {s.metric} {s.after:.4g} (median {s.median:.4g} +- {s.noise:.2g}, "
            f"{s.after / s.median - 1:+.1%})")

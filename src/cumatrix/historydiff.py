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
flagging every wobble).  B's value moved when |B - m| > 3 x noise.  A cell needs at least
:data:`MIN_SAMPLES` earlier values; with fewer it is not judged.

``flaky`` names the cells whose outcome label changed at least twice between consecutive
runs among the last ``window`` runs up to and including B (runs in which the cell did not
run are passed over).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .history import NOT_RUN, CellKey, History, HistoryError, Result, StoredRun

#: Runs looked back over for noise and flips (``--window``).
DEFAULT_WINDOW = 10
#: Flips within the window that make a cell flaky.
FLAKY_FLIPS = 2
#: How many noise units a value must move to be reported.
NOISE_K = 3.0
#: The noise floor, relative to the median.
NOISE_FLOOR = 0.02
#: 1.4826 x MAD estimates the standard deviation of normally distributed values.
MAD_SCALE = 1.4826
#: Earlier values a cell needs before its speed is judged.
MIN_SAMPLES = 3

METRICS = ("gbps", "speedup")
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

    @property
    def sigmas(self) -> float:
        """How many noise units B lies from the median (signed)."""
        return (self.after - self.median) / self.noise

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

    @property
    def empty(self) -> bool:
        """Nothing changed, moved or flipped."""
        return not any(getattr(self, name) for name in (*LISTS, "speed", "flaky"))

    def to_json(self) -> dict[str, object]:
        """The ``diff --json`` document (and results.json ``since_last_run``)."""
        out: dict[str, object] = {"a": self.a.to_json(), "b": self.b.to_json(), "window": self.window,
                                  "same_matrix": self.a.digest == self.b.digest}
        for name in LISTS:
            out[name] = [c.to_json() for c in getattr(self, name)]
        out["speed"] = [s.to_json() for s in self.speed]
        out["flaky"] = [f.to_json() for f in self.flaky]
        return out

    def counts(self) -> dict[str, int]:
        """How many entries each list holds."""
        return {name: len(getattr(self, name)) for name in (*LISTS, "speed", "flaky")}


def _label(r: Result | None) -> str:
    return NOT_RUN if r is None else r.outcome


def _ran(r: Result | None) -> bool:
    return r is not None and r.status in ("pass", "fail")


def classify(cell: CellKey, before: Result | None, after: Result | None) -> str | None:
    """The list a cell's change belongs in (see the module's text), or None: unchanged."""
    sb = before.status if before else NOT_RUN
    sa = after.status if after else NOT_RUN
    if sb == sa and _label(before) == _label(after):
        return None
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
    return sum(1 for x, y in zip(outcomes, outcomes[1:], strict=False) if x != y)


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
    """Compare stored runs ``a`` and ``b`` (see the module's text for every list)."""
    if window < 2:
        raise HistoryError(f"--window {window}: must be at least 2")
    # The window: runs of B's matrix up to B, and those up to A for the noise.
    span = hist.runs(digest=b.digest, upto=b.id, limit=window)
    before_a = [r for r in hist.runs(digest=b.digest, upto=a.id, limit=window)] if a.digest == b.digest else [a]
    ids = sorted({r.id for r in span} | {r.id for r in before_a} | {a.id, b.id})
    res = hist.results_of(ids)
    ra, rb = res[a.id], res[b.id]
    lists: dict[str, list[Change]] = {name: [] for name in LISTS}
    for cell in [*ra, *(k for k in rb if k not in ra)]:
        where = classify(cell, ra.get(cell), rb.get(cell))
        if where is not None:
            lists[where].append(Change(cell=cell, before=ra.get(cell), after=rb.get(cell)))
    speed = []
    for cell, after in rb.items():
        for metric in METRICS:
            value = getattr(after, metric)
            if value is None or after.status != "pass":
                continue
            earlier = [v for r in before_a if (x := res[r.id].get(cell)) is not None and x.status == "pass"
                       and (v := getattr(x, metric)) is not None]
            if len(earlier) < MIN_SAMPLES:
                continue
            m, noise = noise_of(earlier)
            if noise > 0 and abs(value - m) > NOISE_K * noise:
                before = ra.get(cell)
                speed.append(SpeedMove(cell=cell, metric=metric, before=getattr(before, metric) if before else None,
                                       after=value, median=m, noise=noise, samples=len(earlier)))
    flaky = []
    for cell in rb.keys() | {k for r in span for k in res[r.id]}:
        seq = tuple(x.outcome for r in span if (x := res[r.id].get(cell)) is not None and x.status != NOT_RUN)
        n = flips_of(seq)
        if n >= FLAKY_FLIPS:
            flaky.append(Flaky(cell=cell, flips=n, outcomes=seq))
    flaky.sort(key=lambda f: (-f.flips, f.cell.name, f.cell.host))
    trend = None
    if trends:
        kinds = hist.kinds()
        trend = {cell: tuple((r.id, x.gbps) for r in span if (x := res[r.id].get(cell)) is not None
                             and x.gbps is not None)
                 for cell in rb if kinds.get(cell) == "swap"}
        trend = {k: v for k, v in trend.items() if v}
    return Diff(a=a, b=b, window=window, **{k: tuple(v) for k, v in lists.items()}, speed=tuple(speed),
                flaky=tuple(flaky), trends=trend)


def to_text(d: Diff) -> str:
    """``cumatrix diff`` as a person reads it."""
    a, b = d.a, d.b
    lines = [f"run #{b.id} ({b.run_uid}, {b.started or b.recorded}) against #{a.id} ({a.run_uid}, "
             f"{a.started or a.recorded}), matrix {b.matrix}"]
    if a.digest != b.digest:
        lines.append(f"note: the runs are of different matrices (sha256 {a.digest[:12]} and {b.digest[:12]})")
    titles = {"new_failures": "new failures", "fixed": "fixed", "changed": "changed outcomes",
              "newly_skipped": "newly skipped", "newly_not_run": "newly not run"}
    for name in LISTS:
        changes = getattr(d, name)
        if changes:
            lines.append(f"{titles[name]} ({len(changes)}):")
            lines += [f"  {c.cell}: {_label(c.before)} -> {_label(c.after)}" for c in changes]
    if d.speed:
        lines.append(f"speed beyond noise ({len(d.speed)}; noise from up to {d.window} runs):")
        for s in d.speed:
            lines.append(f"  {s.cell}: {s.metric} {s.after:.4g} (median {s.median:.4g} +- {s.noise:.2g}, "
                         f"{s.after / s.median - 1:+.1%})" if s.median else f"  {s.cell}: {s.metric} {s.after:.4g}")
    if d.flaky:
        lines.append(f"flaky ({len(d.flaky)}; outcome flipped {FLAKY_FLIPS}+ times in the last {d.window} runs):")
        lines += [f"  {f.cell}: {f.flips} flips ({' '.join(f.outcomes)})" for f in d.flaky]
    if d.empty:
        lines.append("no change")
    return "\n".join(lines) + "\n"

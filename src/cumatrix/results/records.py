"""Read ``results.jsonl`` into typed, frozen records: the one place reports see raw JSON.

The store is appended and flushed once per cell, so a killed run leaves at most one line
cut mid-write; that line is dropped with a warning.  A resumed run appends a second run
header and more cells; the later record of a cell id wins.  Record types this version does
not know (a later gate may add ``static`` findings) are carried through untouched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from cumatrix.core.errors import ConfigError, Problem
from cumatrix.core.model import Spread, Timings
from cumatrix.core.planned import PlannedCells, planned_from_json
from cumatrix.core.record import (
    CATEGORIES,
    SCHEMA_VERSION,
    Category,
    CellRecord,
    Status,
    _Reader,
    axes_from_id,
)

if TYPE_CHECKING:
    from cumatrix.results.historydiff import Diff

#: The reports' name for a cell record (the same type).
CellResult = CellRecord

__all__ = ["CATEGORIES", "SCHEMA_VERSION", "Category", "CellRecord", "CellResult", "Counts", "RunData", "RunInfo",
           "Spread", "Status", "Timings", "axes_from_id", "load_records"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RunInfo:
    """One run header (a resumed run has several), with its end record if it has one."""

    run_id: str
    matrix: str
    matrix_sha256: str
    started: str | None
    finished: str | None = None
    interrupted: bool | None = None  # None: no end record (killed, or still running)
    harness_version: str | None = None
    argv: tuple[str, ...] = ()
    backend: str | None = None
    #: How its local cells were held: ``bubblewrap``, ``off``, ``none: why`` (None: not said,
    #: a docker run or a run written before runs recorded it).
    sandbox: str | None = None
    host: str | None = None
    host_fingerprint: Mapping[str, object] = field(default_factory=dict)
    cells_total: int = 0
    cells: tuple[str, ...] = ()
    source: str = ""  # the results.jsonl it came from
    #: The cells the matrix means to run and on which host (None: a run written before runs
    #: recorded it), for a merge to name the cells that no host ran.
    plan: PlannedCells | None = None

    def to_json(self) -> dict[str, object]:
        """The header as a JSON object (``results.json`` ``runs[]``)."""
        return {
            "run_id": self.run_id,
            "matrix": self.matrix,
            "matrix_sha256": self.matrix_sha256,
            "started": self.started,
            "finished": self.finished,
            "interrupted": self.interrupted,
            "harness_version": self.harness_version,
            "argv": list(self.argv),
            "backend": self.backend,
            "sandbox": self.sandbox,
            "host": self.host,
            "host_fingerprint": dict(self.host_fingerprint),
            "cells_total": self.cells_total,
            "source": self.source,
            "plan": self.plan.to_json() if self.plan is not None else None,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Counts:
    """How many cells of a run there are, how many ran, and why the others did not."""

    total: int
    passed: int
    failed: int
    skipped: int  #: every skipped cell, whether a process of it ran or not
    not_run: int
    #: (outcome word, cells) of the skipped cells that did not run, most frequent first: why.
    skip_reasons: tuple[tuple[str, int], ...] = ()
    #: Skipped cells whose process ran (a probe that loaded its runtime, then found no driver).
    partial: int = 0
    partial_reasons: tuple[tuple[str, int], ...] = ()

    @property
    def ran(self) -> int:
        """Cells a process of which ran: judged (pass or fail), or skipped after running."""
        return self.passed + self.failed + self.partial

    @property
    def judged(self) -> int:
        return self.passed + self.failed

    @property
    def did_not_run(self) -> int:
        return self.skipped - self.partial + self.not_run


@dataclass(frozen=True, kw_only=True, slots=True)
class RunData:
    """A run (or several merged) as the reports see it.

    ``cells`` holds the latest record per cell id (per ``(id, host)`` for merged runs), in
    matrix order; ``not_run`` the ids a run header lists that no record covers.
    """

    runs: tuple[RunInfo, ...]
    cells: tuple[CellResult, ...]
    not_run: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    extra: tuple[Mapping[str, object], ...] = ()
    hosts: tuple[str, ...] = ()  # set for merged runs, in the order given
    #: The host that should have run each ``not_run`` cell (same order; None: any host, or
    #: unknown).  A cell planned on several hosts is listed once per host that did not run it.
    not_run_hosts: tuple[str | None, ...] = ()
    #: Hosts of the plan with no run at all among those merged.
    missing_hosts: tuple[str, ...] = ()
    #: The plan a merge held the runs against (``--matrix``, else the one they recorded).
    plan: PlannedCells | None = None
    #: this run against the previous run of its matrix in the history, when one is stored
    since: Diff | None = None

    def not_run_where(self) -> list[tuple[str, str | None]]:
        """``(cell id, host that should have run it)`` for every cell not run."""
        hosts = list(self.not_run_hosts) + [None] * (len(self.not_run) - len(self.not_run_hosts))
        return list(zip(self.not_run, hosts, strict=False))

    def incomplete_hosts(self) -> list[tuple[str, int, int]]:
        """``(host, planned cells not run, planned cells)`` for each host of the plan that
        left some of its cells unrun (or never ran: then both numbers are equal)."""
        missing: dict[str, int] = {}
        for _, h in self.not_run_where():
            if h is not None:
                missing[h] = missing.get(h, 0) + 1
        plan = self.plan or next((r.plan for r in self.runs if r.plan is not None), None)
        planned = {h: len(ids) for h, ids in plan.hosts if h is not None} if plan is not None else {}
        return [(h, n, planned.get(h, n)) for h, n in missing.items()]

    @property
    def header(self) -> RunInfo:
        """The first run header."""
        return self.runs[0]

    @property
    def merged(self) -> bool:
        """Runs of several hosts (or of one, with hosts of its plan missing): cells carry hosts."""
        return len(self.hosts) > 1 or bool(self.missing_hosts)

    @property
    def counts(self) -> Counts:
        passed = sum(1 for c in self.cells if c.status == "pass")
        failed = sum(1 for c in self.cells if c.status == "fail")
        reasons: dict[str, int] = {}
        partial: dict[str, int] = {}
        for c in self.cells:
            if c.status == "skip":
                into = partial if c.ran_process else reasons
                into[c.observed.outcome] = into.get(c.observed.outcome, 0) + 1
        return Counts(
            total=len(self.cells) + len(self.not_run),
            passed=passed,
            failed=failed,
            skipped=sum(reasons.values()) + sum(partial.values()),
            not_run=len(self.not_run),
            skip_reasons=tuple(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
            partial=sum(partial.values()),
            partial_reasons=tuple(sorted(partial.items(), key=lambda kv: (-kv[1], kv[0]))),
        )

    @property
    def verdict(self) -> Literal["PASS", "FAIL", "INCOMPLETE", "SKIPPED", "EMPTY"]:
        """FAIL if a cell missed its expectation, INCOMPLETE if some were not run, SKIPPED if
        none ran at all (every cell skipped: a GPU runner whose driver vanished must not
        read as a pass), EMPTY if the selection had no cells."""
        c = self.counts
        if c.failed:
            return "FAIL"
        if c.not_run:
            return "INCOMPLETE"
        if c.total == 0:
            return "EMPTY"
        if c.ran == 0:
            return "SKIPPED"
        return "PASS"

    @property
    def started(self) -> str | None:
        return min((r.started for r in self.runs if r.started), default=None)

    @property
    def finished(self) -> str | None:
        return max((r.finished for r in self.runs if r.finished), default=None)

    @property
    def interrupted(self) -> bool:
        """True when the last run segment has no end record or says it was interrupted."""
        last = self.runs[-1]
        return last.interrupted is None or last.interrupted


# --------------------------------------------------------------------------- cell ids


# --------------------------------------------------------------------------- loading


def _run_info(r: _Reader) -> RunInfo:
    total = r.integer("cells_total", r.rec)
    cells = r.strings("cells")
    return RunInfo(
        run_id=r.text("run_id") or "",
        matrix=r.text("matrix") or "",
        matrix_sha256=r.text("matrix_sha256") or "",
        started=r.text("started"),
        harness_version=r.text("harness_version"),
        argv=r.strings("argv"),
        backend=r.text("backend"),
        sandbox=r.text("sandbox"),
        host=r.text("host"),
        host_fingerprint=dict(r.obj("host_fingerprint")),
        cells_total=total if total is not None else len(cells),
        cells=cells,
        source=r.source,
        plan=planned_from_json(r.rec.get("plan")),
    )


_RUN_HEADER_RE = re.compile(r'^\s*\{.*"type"\s*:\s*"run"')


def load_records(jsonl: Path) -> RunData:
    """Read a ``results.jsonl`` into :class:`RunData`.

    A last line cut mid-write (a killed run), or a cut line directly followed by the run
    header of a resumed run, is ignored with a warning in ``RunData.warnings``.  Any other
    unreadable line, a record from a newer schema, or a file with no run header raises
    :class:`~cumatrix.core.errors.ConfigError` (exit 2) naming ``file:line:col``.
    """
    source = str(jsonl)
    try:
        f = jsonl.open("rb")  # closed below; lines end at b"\n" only
    except OSError as e:
        raise ConfigError(f"{source}: cannot read results: {e.strerror or e}") from e
    with f:
        return _read(source, _numbered(f))


def _numbered(f: Iterable[bytes]) -> Iterator[tuple[int, str, str | None]]:
    """``(line number, line, the next non-blank line or None)``: one line read ahead, so a
    file of any size is read without holding it."""
    prev: tuple[int, str] | None = None
    for i, raw in enumerate(f, start=1):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        if not line.strip():
            continue
        if prev is not None:
            yield (*prev, line)
        prev = (i, line)
    if prev is not None:
        yield (*prev, None)


def _read(source: str, numbered: Iterable[tuple[int, str, str | None]]) -> RunData:
    warnings: list[str] = []
    runs: list[RunInfo] = []
    cells: dict[str, CellResult] = {}
    extra: list[Mapping[str, object]] = []
    shared: dict[object, object] = {}

    for lineno, line, following in numbered:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            is_last = following is None
            before_resume = not is_last and _RUN_HEADER_RE.match(following or "") is not None
            if is_last or before_resume:
                warnings.append(
                    f"{source}:{lineno}: line cut mid-write (the run was killed while writing it); ignored"
                )
                continue
            raise ConfigError([Problem(source, lineno, e.colno, f"not a JSON record: {e.msg}")]) from e
        if not isinstance(rec, dict):
            raise ConfigError([Problem(source, lineno, 1, "a record must be a JSON object")])
        r = _Reader(source, lineno, rec)
        schema = rec.get("schema")
        if not isinstance(schema, int) or isinstance(schema, bool):
            raise r.fail("record has no integer 'schema' version")
        if schema > SCHEMA_VERSION:
            raise r.fail(
                f"written by a newer cumatrix (schema {schema}); upgrade cumatrix to read it "
                f"(this one reads schema {SCHEMA_VERSION})"
            )
        kind = rec.get("type")
        if kind == "run":
            runs.append(_run_info(r))
        elif kind == "cell":
            cell = CellRecord.from_json(rec, source=source, line=lineno, shared=shared)
            cells.pop(cell.id, None)  # a resumed run's record wins, placed where it ran last
            cells[cell.id] = cell
        elif kind == "end":
            if not runs:
                raise r.fail("end record before any run header")
            interrupted = rec.get("interrupted")
            runs[-1] = replace(
                runs[-1],
                finished=r.text("finished"),
                interrupted=bool(interrupted) if interrupted is not None else False,
            )
        else:
            extra.append(rec)

    if not runs:
        raise ConfigError(f"{source}: no run header in this results file (is it a cumatrix results.jsonl?)")
    return _assemble(runs, cells, warnings, extra)


def _assemble(
    runs: list[RunInfo],
    cells: dict[str, CellResult],
    warnings: list[str],
    extra: list[Mapping[str, object]],
) -> RunData:
    order: dict[str, int] = {}
    for run in runs:
        for cid in run.cells:
            order.setdefault(cid, len(order))
    for cid in cells:
        order.setdefault(cid, len(order))
    ordered = tuple(sorted(cells.values(), key=lambda c: order[c.id]))
    not_run = tuple(cid for cid in order if cid not in cells)
    return RunData(
        runs=tuple(runs),
        cells=ordered,
        not_run=not_run,
        not_run_hosts=(runs[-1].host,) * len(not_run),
        warnings=tuple(warnings),
        extra=tuple(extra),
    )

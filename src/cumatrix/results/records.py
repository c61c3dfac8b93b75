"""Read ``results.jsonl`` into typed, frozen records: the one place reports see raw JSON.

The store is appended and flushed once per cell, so a killed run leaves at most one line
cut mid-write; that line is dropped with a warning.  A resumed run appends a second run
header and more cells; the later record of a cell id wins.  Record types this version does
not know (a later gate may add ``static`` findings) are carried through untouched.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Literal

from cumatrix.core.errors import ConfigError, Problem
from cumatrix.core.model import Expected, Observed, Spread, Timings
from cumatrix.core.planned import PlannedCells, Selection, planned_from_json, selection_from_json
from cumatrix.core.record import (
    CATEGORIES,
    SCHEMA_VERSION,
    Category,
    CellRecord,
    Status,
    _Reader,
    axes_from_id,
)
from cumatrix.results import recordkey

if TYPE_CHECKING:
    from cumatrix.results.historydiff import Diff
    from cumatrix.results.untested import Untested

#: The reports' name for a cell record (the same type).
CellResult = CellRecord

__all__ = ["CATEGORIES", "SCHEMA_VERSION", "VERDICTS", "Category", "CellRecord", "CellResult", "Counts", "RunData",
           "RunInfo", "Seal", "Spread", "Status", "Timings", "Verdict", "axes_from_id", "load_records"]


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
    #: The submission of a plan this run was one host of (``cumatrix submit``); None: none.
    submission: str | None = None
    #: The covering plan or rotation night the run took its cells from; None: every cell.
    selection: Selection | None = None

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
            "submission": self.submission,
            "selection": self.selection.to_json() if self.selection is not None else None,
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
    def tested(self) -> int:
        """Cells that ran the code under test and were judged against their expectation (pass
        or fail).  A cell skipped after its process ran (a probe that loaded its runtime and
        found no driver) tested nothing: it is a skip, not a test."""
        return self.passed + self.failed

    @property
    def did_not_run(self) -> int:
        return self.skipped - self.partial + self.not_run

    @property
    def all_skip_reasons(self) -> tuple[tuple[str, int], ...]:
        """(outcome word, cells) of every skipped cell, whether a process of it ran or not,
        most frequent first."""
        merged = dict(self.skip_reasons)
        for reason, n in self.partial_reasons:
            merged[reason] = merged.get(reason, 0) + n
        return tuple(sorted(merged.items(), key=lambda kv: (-kv[1], kv[0])))


#: The verdicts of a run, as every report and the exit status name them.
Verdict = Literal["PASS", "FAIL", "INCOMPLETE", "NOTHING TESTED", "EMPTY"]
VERDICTS: tuple[Verdict, ...] = ("PASS", "FAIL", "INCOMPLETE", "NOTHING TESTED", "EMPTY")


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
    #: the cells of its matrix no run of the history's window up to this one tested, on any host
    untested: Untested | None = None

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
    def verdict(self) -> Verdict:
        """FAIL if a cell missed its expectation; EMPTY if the selection had no cells; NOTHING
        TESTED if no cell ran the code under test and met its expectation (every cell skipped
        or not run: a GPU runner whose driver vanished must not read as a pass); INCOMPLETE if
        some were tested and passed but others were not run; else PASS."""
        c = self.counts
        if c.failed:
            return "FAIL"
        if c.total == 0:
            return "EMPTY"
        if c.passed == 0:
            return "NOTHING TESTED"
        if c.not_run:
            return "INCOMPLETE"
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


# --------------------------------------------------------------------------- loading


@dataclass(frozen=True, kw_only=True, slots=True)
class Seal:
    """What a run's own results must show to be taken as they are: every cell record carries
    the harness's signature (:mod:`cumatrix.results.recordkey`) and, where the run's writer
    says what it wrote (``written``: cell id -> signature of the latest record it holds of
    that cell), is that very record.  A record that fails is refused: the cell is reported as
    ``harness-error`` with the reason, never as what the record claimed.

    A cell of an unsandboxed run can write its own run's ``results.jsonl``: a forged ``pass``
    carries no signature; a sealed record of an earlier run, replayed, is not what this run
    wrote; a record taken out is missing from what this run wrote.
    """

    written: Mapping[str, str] | None = None


#: The reason a refused record's cell gives, before what was wrong with it.
REFUSED = "record edited"


def _refused(cell_id: str, reason: str, was: CellRecord | None = None) -> CellRecord:
    """The record of a cell whose stored record was refused: a failure of the run, with why.

    Not the judge's decision to make again: what it would judge (the expectation, the
    observation) is what the refused record claims, and a forged expectation of
    ``harness-error`` would pass.  A record the harness did not write is a failure."""
    claimed = f"; it claimed {was.status} ({was.observed.outcome})" if was is not None else ""
    why = f"{REFUSED}: results.jsonl holds no record of this cell that the harness wrote: {reason}{claimed}"
    return CellRecord(
        id=cell_id,
        axes=was.axes if was is not None else axes_from_id(cell_id),
        host=was.host if was is not None else None,
        expected=was.expected if was is not None else Expected(outcomes=frozenset(), reason=""),
        observed=Observed(outcome="harness-error", detail=why),
        status="fail",
        mismatch=why,
    )


def _sealed(seal: Seal, raw: str, rec: Mapping[str, object], cell: CellRecord) -> CellRecord:
    """``cell``, or the record that refuses it when its line does not carry what ``seal`` asks."""
    problem = recordkey.line_problem(raw.encode("utf-8"), rec)
    if problem is None and seal.written is not None:
        mine = seal.written.get(cell.id)
        if mine is None:
            problem = "this run did not write it (a record put there from elsewhere)"
        elif mine != rec.get(recordkey.FIELD):
            problem = "it is not the record this run wrote of the cell (an earlier record, put back)"
    return cell if problem is None else _refused(cell.id, problem, cell)


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
        submission=r.text("submission"),
        selection=selection_from_json(r.rec.get("selection")),
    )


_RUN_HEADER_RE = re.compile(r'^\s*\{.*"type"\s*:\s*"run"')

#: The most a ``results.jsonl`` may hold, per line (a record: a cell's stderr tail is kept to a
#: few kilobytes, so a real record is far smaller) and per file (10,000 cells of the largest
#: records real runs write fit many times over).  A file from another host's directory is
#: untrusted: past either bound it is refused (exit 2, naming the file) before more of it is
#: read, instead of being read whole into memory.
MAX_LINE_BYTES = 16 * 1024 * 1024
MAX_FILE_BYTES = 2 * 1024 * 1024 * 1024


def load_records(jsonl: Path, *, seal: Seal | None = None) -> RunData:
    """Read a ``results.jsonl`` into :class:`RunData`.

    ``seal``: the run that wrote the file reads it back; every cell record is checked as
    :class:`Seal` says, and one that fails is refused (``harness-error``, with the reason).

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
        size = os.fstat(f.fileno()).st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(f"{source}: {size} bytes, more than a results file may hold ({MAX_FILE_BYTES} bytes); "
                              "not read (is it a cumatrix results.jsonl?)")
        return _read(source, _numbered(_bounded_lines(source, f)), seal)


def is_blank(jsonl: Path) -> bool:
    """Whether ``jsonl`` holds nothing but white space (a run killed as it started), read a
    block at a time up to the first other byte: a file of any size is not read whole."""
    with jsonl.open("rb") as f:
        if os.fstat(f.fileno()).st_size > MAX_FILE_BYTES:
            return False  # not blank: load_records refuses it, naming it
        while block := f.read(65536):
            if block.strip():
                return False
    return True


def _bounded_lines(source: str, f: BinaryIO) -> Iterator[bytes]:
    """The lines of ``f``, none read past :data:`MAX_LINE_BYTES`, nor the file past
    :data:`MAX_FILE_BYTES` (a file that grows while it is read)."""
    total = 0
    for lineno in itertools.count(1):
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        total += len(raw)
        if len(raw) > MAX_LINE_BYTES:
            raise ConfigError([Problem(source, lineno, 1, f"a line of more than {MAX_LINE_BYTES} bytes: not a "
                                                          "cumatrix record; the file is not read further")])
        if total > MAX_FILE_BYTES:
            raise ConfigError(f"{source}: more than a results file may hold ({MAX_FILE_BYTES} bytes); "
                              "not read further")
        yield raw


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


def _read(source: str, numbered: Iterable[tuple[int, str, str | None]], seal: Seal | None = None) -> RunData:
    warnings: list[str] = []
    runs: list[RunInfo] = []
    cells: dict[str, CellResult] = {}
    extra: list[Mapping[str, object]] = []
    shared: dict[object, object] = {}

    for lineno, line, following in numbered:
        rec = _record(source, lineno, line, following, warnings)
        if rec is None:
            continue
        r = _Reader(source, lineno, rec)
        kind = rec.get("type")
        if kind == "run":
            runs.append(_run_info(r))
        elif kind == "cell":
            cell = CellRecord.from_json(rec, source=source, line=lineno, shared=shared)
            if seal is not None:
                cell = _sealed(seal, line, rec, cell)
            cells.pop(cell.id, None)  # a resumed run's record wins, placed where it ran last
            cells[cell.id] = cell
        elif kind == "end":
            if not runs:
                raise r.fail("end record before any run header")
            runs[-1] = _ended(runs[-1], r, rec)
        else:
            extra.append(rec)

    if not runs:
        raise ConfigError(f"{source}: no run header in this results file (is it a cumatrix results.jsonl?)")
    if seal is not None:
        _taken_out(seal, cells)
    return _assemble(runs, cells, warnings, extra)


def _ended(run: RunInfo, r: _Reader, rec: Mapping[str, object]) -> RunInfo:
    """``run`` with what its end record says: when it finished, whether it was interrupted."""
    interrupted = rec.get("interrupted")
    return replace(run, finished=r.text("finished"),
                   interrupted=bool(interrupted) if interrupted is not None else False)


def _record(source: str, lineno: int, line: str, following: str | None, warnings: list[str]) -> dict[str, object] | None:
    """Line ``lineno`` as a record of a schema this cumatrix reads; None for a line cut mid-write
    (the last one, or one a resumed run's header follows), which ``warnings`` then names."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        is_last = following is None
        before_resume = not is_last and _RUN_HEADER_RE.match(following or "") is not None
        if is_last or before_resume:
            warnings.append(
                f"{source}:{lineno}: line cut mid-write (the run was killed while writing it); ignored"
            )
            return None
        raise ConfigError([Problem(source, lineno, e.colno, f"not a JSON record: {e.msg}")]) from e
    if not isinstance(rec, dict):
        raise ConfigError([Problem(source, lineno, 1, "a record must be a JSON object")])
    schema = rec.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise _Reader(source, lineno, rec).fail("record has no integer 'schema' version")
    if schema > SCHEMA_VERSION:
        raise _Reader(source, lineno, rec).fail(
            f"written by a newer cumatrix (schema {schema}); upgrade cumatrix to read it "
            f"(this one reads schema {SCHEMA_VERSION})"
        )
    return rec


def _taken_out(seal: Seal, cells: dict[str, CellResult]) -> None:
    """A cell whose record the run wrote but the file no longer holds is refused too."""
    for cid in seal.written or ():
        if cid not in cells:
            cells[cid] = _refused(cid, "the record this run wrote was taken out of the file")


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

"""Read ``results.jsonl`` into typed, frozen records: the one place reports see raw JSON.

The store is appended and flushed once per cell, so a killed run leaves at most one line
cut mid-write; that line is dropped with a warning.  A resumed run appends a second run
header and more cells; the later record of a cell id wins.  Record types this version does
not know (a later gate may add ``static`` findings) are carried through untouched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from ..errors import ConfigError, Problem
from ..model import NO_RUNTIME, VARIANT_FAMILIES, Expected, Observed

#: The results schema version this cumatrix writes and the newest it reads.
SCHEMA_VERSION = 1

Status = Literal["pass", "fail", "skip"]
#: How a cell is shown: passed with ``ok``, passed by reproducing a predicted failure,
#: failed, skipped (``skipped:*`` / ``cannot-emulate``), or never run.
Category = Literal["ok", "expected", "fail", "skip", "not-run"]
CATEGORIES: tuple[Category, ...] = ("ok", "expected", "fail", "skip", "not-run")

_STATUSES = ("pass", "fail", "skip")


@dataclass(frozen=True, kw_only=True, slots=True)
class Spread:
    """Spread of the repeated GB/s measurements of one swap cell."""

    min: float | None = None
    p10: float | None = None
    p90: float | None = None
    max: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Timings:
    """Timings of a cell; only ``wall_s`` for cells that are not swaps."""

    wall_s: float | None = None
    gbps: float | None = None
    loop_gbps: float | None = None
    speedup: float | None = None
    repetitions: int | None = None
    spread: Spread | None = None
    bytes: int | None = None

    def to_json(self) -> dict[str, object]:
        """The timings as a JSON object, leaving out what was not measured."""
        out: dict[str, object] = {}
        for name in ("wall_s", "gbps", "loop_gbps", "speedup", "repetitions", "bytes"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.spread is not None:
            out["spread"] = {
                k: getattr(self.spread, k)
                for k in ("min", "p10", "p90", "max")
                if getattr(self.spread, k) is not None
            }
        return out


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
    host: str | None = None
    host_fingerprint: Mapping[str, object] = field(default_factory=dict)
    cells_total: int = 0
    cells: tuple[str, ...] = ()
    source: str = ""  # the results.jsonl it came from

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
            "host": self.host,
            "host_fingerprint": dict(self.host_fingerprint),
            "cells_total": self.cells_total,
            "source": self.source,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class CellResult:
    """The latest record of one cell (on one host, for merged runs)."""

    id: str
    axes: Mapping[str, str]
    host: str | None
    expected: Expected
    observed: Observed
    status: Status
    mismatch: str | None = None
    timings: Timings = Timings()
    fingerprint: Mapping[str, object] = field(default_factory=dict)
    stderr_tail: str = ""
    stdout_tail: str = ""
    started: str | None = None
    duration_s: float | None = None
    extra: Mapping[str, object] = field(default_factory=dict)  # keys this version does not know

    @property
    def category(self) -> Category:
        """How the reports colour this cell."""
        if self.status == "fail":
            return "fail"
        if self.status == "skip":
            return "skip"
        return "ok" if self.observed.outcome == "ok" else "expected"

    @property
    def outcome_label(self) -> str:
        """``ok:batch`` for ok with a path, else the outcome word."""
        o = self.observed
        if o.outcome == "ok" and o.path:
            return f"ok:{o.path}"
        return o.outcome

    def to_json(self) -> dict[str, object]:
        """Everything known about the cell as a JSON object (``results.json`` ``cells[]``)."""
        o = self.observed
        out: dict[str, object] = {
            "id": self.id,
            "host": self.host,
            "axes": dict(self.axes),
            "expected": {
                "outcomes": sorted(self.expected.outcomes),
                "reason": self.expected.reason,
                "rule": self.expected.rule,
            },
            "observed": {
                "outcome": o.outcome,
                "path": o.path,
                "error_name": o.error_name,
                "detail": o.detail,
                "exit_status": o.exit_status,
            },
            "status": self.status,
            "mismatch": self.mismatch,
            "timings": self.timings.to_json(),
            "fingerprint": dict(self.fingerprint),
            "stderr_tail": self.stderr_tail,
            "stdout_tail": self.stdout_tail,
            "started": self.started,
            "duration_s": self.duration_s,
        }
        if o.data:
            out["observed"]["data"] = dict(o.data)  # type: ignore[index]
        if self.extra:
            out["extra"] = dict(self.extra)
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Counts:
    """How many cells of a run there are, how many ran, and why the others did not."""

    total: int
    passed: int
    failed: int
    skipped: int
    not_run: int
    #: (outcome word, cells) of the skipped cells, most frequent first: why they did not run.
    skip_reasons: tuple[tuple[str, int], ...] = ()

    @property
    def ran(self) -> int:
        """Cells that ran and were judged (pass or fail); skipped and not-run cells did not."""
        return self.passed + self.failed

    @property
    def did_not_run(self) -> int:
        return self.skipped + self.not_run


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

    @property
    def header(self) -> RunInfo:
        """The first run header."""
        return self.runs[0]

    @property
    def merged(self) -> bool:
        return len(self.hosts) > 1

    @property
    def counts(self) -> Counts:
        passed = sum(1 for c in self.cells if c.status == "pass")
        failed = sum(1 for c in self.cells if c.status == "fail")
        reasons: dict[str, int] = {}
        for c in self.cells:
            if c.status == "skip":
                reasons[c.observed.outcome] = reasons.get(c.observed.outcome, 0) + 1
        return Counts(
            total=len(self.cells) + len(self.not_run),
            passed=passed,
            failed=failed,
            skipped=sum(reasons.values()),
            not_run=len(self.not_run),
            skip_reasons=tuple(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
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


def axes_from_id(cell_id: str) -> dict[str, str]:
    """Axes of a cell from its id alone (for cells with no record: ``not run``)."""
    parts = cell_id.split("/")
    if len(parts) < 3:
        return {"runtime": parts[0] if parts else "", "driver": parts[1] if len(parts) > 1 else ""}
    out = {"runtime": parts[0], "driver": parts[1]}
    if len(parts) == 3:
        if parts[2] == "probe":
            out["kind"] = "probe"
        else:
            out["kind"] = "command"
            out["case"] = parts[2]
        return out
    out["kind"] = "swap"
    out["variant"] = parts[2]
    families = VARIANT_FAMILIES.get(parts[2], ())
    if families:
        out["family"] = "driver" if parts[0] == NO_RUNTIME or families == ("driver",) else "runtime"
    if len(parts) >= 4 and parts[3].startswith("h"):
        out["build"] = parts[3][1:]
    if len(parts) >= 5:
        out["workload"] = "/".join(parts[4:])
    return out


# --------------------------------------------------------------------------- loading


class _Reader:
    """Typed access to one record, raising ConfigError at ``file:line:1``."""

    def __init__(self, source: str, line: int, rec: Mapping[str, object]) -> None:
        self.source, self.line, self.rec = source, line, rec

    def fail(self, message: str) -> ConfigError:
        return ConfigError([Problem(self.source, self.line, 1, message)])

    def obj(self, key: str, within: Mapping[str, object] | None = None) -> Mapping[str, object]:
        src = self.rec if within is None else within
        value = src.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(f"{key!r} must be an object, got {type(value).__name__}")
        return value

    def text(self, key: str, within: Mapping[str, object] | None = None, *, required: bool = False) -> str | None:
        src = self.rec if within is None else within
        value = src.get(key)
        if value is None:
            if required:
                raise self.fail(f"record has no {key!r}")
            return None
        if not isinstance(value, str):
            raise self.fail(f"{key!r} must be a string, got {type(value).__name__}")
        return value

    def num(self, key: str, within: Mapping[str, object]) -> float | None:
        value = within.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(f"{key!r} must be a number, got {type(value).__name__}")
        return float(value) if isinstance(value, float) else value

    def integer(self, key: str, within: Mapping[str, object]) -> int | None:
        value = self.num(key, within)
        if value is None:
            return None
        if not float(value).is_integer():
            raise self.fail(f"{key!r} must be an integer, got {value!r}")
        return int(value)

    def strings(self, key: str, within: Mapping[str, object] | None = None) -> tuple[str, ...]:
        src = self.rec if within is None else within
        value = src.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(f"{key!r} must be a list of strings")
        return tuple(value)


_CELL_KEYS = frozenset(
    {
        "schema", "type", "id", "axes", "host", "expected", "observed", "status", "mismatch",
        "timings", "fingerprint", "stderr_tail", "stdout_tail", "started", "duration_s",
    }
)  # fmt: skip


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
        host=r.text("host"),
        host_fingerprint=dict(r.obj("host_fingerprint")),
        cells_total=total if total is not None else len(cells),
        cells=cells,
        source=r.source,
    )


def _timings(r: _Reader) -> Timings:
    t = r.obj("timings")
    s = r.obj("spread", t)
    spread = (
        Spread(min=r.num("min", s), p10=r.num("p10", s), p90=r.num("p90", s), max=r.num("max", s))
        if s
        else None
    )
    return Timings(
        wall_s=r.num("wall_s", t),
        gbps=r.num("gbps", t),
        loop_gbps=r.num("loop_gbps", t),
        speedup=r.num("speedup", t),
        repetitions=r.integer("repetitions", t),
        spread=spread,
        bytes=r.integer("bytes", t),
    )


def _cell(r: _Reader) -> CellResult:
    cell_id = r.text("id", required=True)
    assert cell_id is not None  # required=True raised otherwise
    status = r.text("status", required=True)
    if status not in _STATUSES:
        raise r.fail(f"status {status!r} is not one of {', '.join(_STATUSES)}")
    exp = r.obj("expected")
    obs = r.obj("observed")
    outcome = r.text("outcome", obs, required=True)
    assert outcome is not None
    axes_raw = r.obj("axes")
    axes = {str(k): str(v) for k, v in axes_raw.items()} if axes_raw else axes_from_id(cell_id)
    data = r.obj("data", obs)
    return CellResult(
        id=cell_id,
        axes=axes,
        host=r.text("host"),
        expected=Expected(
            outcomes=frozenset(r.strings("outcomes", exp)),
            reason=r.text("reason", exp) or "",
            rule=r.text("rule", exp) or "",
        ),
        observed=Observed(
            outcome=outcome,
            path=r.text("path", obs),
            error_name=r.text("error_name", obs),
            detail=r.text("detail", obs) or "",
            exit_status=r.integer("exit_status", obs),
            data=dict(data),
        ),
        status=status,  # type: ignore[arg-type]  # checked against _STATUSES above
        mismatch=r.text("mismatch"),
        timings=_timings(r),
        fingerprint=dict(r.obj("fingerprint")),
        stderr_tail=r.text("stderr_tail") or "",
        stdout_tail=r.text("stdout_tail") or "",
        started=r.text("started"),
        duration_s=r.num("duration_s", r.rec),
        extra={k: v for k, v in r.rec.items() if k not in _CELL_KEYS},
    )


_RUN_HEADER_RE = re.compile(r'^\s*\{.*"type"\s*:\s*"run"')


def load_records(jsonl: Path) -> RunData:
    """Read a ``results.jsonl`` into :class:`RunData`.

    A last line cut mid-write (a killed run), or a cut line directly followed by the run
    header of a resumed run, is ignored with a warning in ``RunData.warnings``.  Any other
    unreadable line, a record from a newer schema, or a file with no run header raises
    :class:`~cumatrix.errors.ConfigError` (exit 2) naming ``file:line:col``.
    """
    source = str(jsonl)
    try:
        text = jsonl.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ConfigError(f"{source}: cannot read results: {e.strerror or e}") from e
    lines = text.split("\n")
    numbered = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
    warnings: list[str] = []
    runs: list[RunInfo] = []
    cells: dict[str, CellResult] = {}
    extra: list[Mapping[str, object]] = []

    for pos, (lineno, line) in enumerate(numbered):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            is_last = pos == len(numbered) - 1
            before_resume = not is_last and _RUN_HEADER_RE.match(numbered[pos + 1][1]) is not None
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
            cell = _cell(r)
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
        warnings=tuple(warnings),
        extra=tuple(extra),
    )

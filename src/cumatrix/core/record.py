"""The record of a finished cell, and its one JSON form.

:class:`CellRecord` is what the judge (:mod:`cumatrix.judge.verdict`) produces; the results store,
the transport between pytest-xdist workers, every report writer, ``merge``, ``gate`` and
``repro`` read and write it through :meth:`CellRecord.to_json` and
:meth:`CellRecord.from_json` alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cumatrix.core.errors import ConfigError, Problem
from cumatrix.core.model import (
    NO_RUNTIME,
    OUTCOME_RE,
    VARIANT_FAMILIES,
    Expected,
    Observed,
    Spread,
    Timings,
    is_ok,
)

#: The results schema version this cumatrix writes and the newest it reads.
SCHEMA_VERSION = 1

Status = Literal["pass", "fail", "skip"]
#: How a cell is shown: passed with ``ok``, passed by reproducing a predicted failure,
#: failed, skipped (``skipped:*`` / ``cannot-emulate``), or never run.
Category = Literal["ok", "expected", "fail", "skip", "not-run"]
CATEGORIES: tuple[Category, ...] = ("ok", "expected", "fail", "skip", "not-run")

STATUSES = ("pass", "fail", "skip")


@dataclass(frozen=True, kw_only=True, slots=True)
class CellRecord:
    """Everything known about one finished cell: the judge makes it, every stage after reads it.

    One ``to_json``/``from_json`` pair serves the results store, the transport between
    pytest-xdist workers, every report writer, ``merge``, ``gate`` and ``repro``.
    """

    id: str
    axes: Mapping[str, str]
    host: str | None
    expected: Expected
    observed: Observed
    status: Status
    mismatch: str | None = None
    timings: Timings = field(default_factory=Timings)
    fingerprint: Mapping[str, object] = field(default_factory=dict)
    stderr_tail: str = ""
    stdout_tail: str = ""
    started: str | None = None
    duration_s: float | None = None
    #: The plan that chose this cell when the run took less than every cell of its matrix
    #: (``cover 2, seed 0``, ``rotation 3 of 7, cover 2, seed 0``); None: every cell ran.
    chosen_by: str | None = None
    extra: Mapping[str, object] = field(default_factory=dict)  # keys this version does not know

    @property
    def category(self) -> Category:
        """How the reports colour this cell."""
        if self.status == "fail":
            return "fail"
        if self.status == "skip":
            return "skip"
        return "ok" if is_ok(self.observed.outcome) else "expected"

    @property
    def ran_process(self) -> bool:
        """Whether a process of the cell ran (a probe that loaded its runtime and then skipped
        its GPU part did; a cell skipped before it started did not)."""
        fp = self.fingerprint
        return (self.observed.exit_status is not None or bool(fp.get("trace")) or bool(fp.get("containment"))
                or bool(fp.get("image")))

    @property
    def outcome_label(self) -> str:
        """``ok:batch`` for ok with a path, else the outcome word."""
        o = self.observed
        if is_ok(o.outcome) and o.path:
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
        if self.chosen_by is not None:
            out["chosen_by"] = self.chosen_by
        if self.extra:
            out["extra"] = dict(self.extra)
        return out

    def to_store(self) -> dict[str, object]:
        """The ``results.jsonl`` line of this cell."""
        return {"schema": SCHEMA_VERSION, "type": "cell", **self.to_json()}

    @classmethod
    def from_json(cls, rec: Mapping[str, object], *, source: str = "<record>", line: int = 1,
                  shared: dict[object, Any] | None = None) -> CellRecord:
        """Read a record written by :meth:`to_json` or :meth:`to_store`.

        ``shared``: a memo kept across the records of one file, so that the axes, the
        expectation and the fingerprint that thousands of cells have in common are held once.
        Raises :class:`~cumatrix.core.errors.ConfigError` naming ``source:line`` for a record
        that is not a cell record of a schema this cumatrix reads.
        """
        return _cell(_Reader(source, line, rec), {} if shared is None else shared)


def axes_from_id(cell_id: str) -> dict[str, str]:
    """Axes of a cell from its id alone (for cells with no record: ``not run``)."""
    parts = cell_id.split("/")
    if len(parts) < 3:
        return {"runtime": parts[0] if parts else "", "driver": parts[1] if len(parts) > 1 else ""}
    out = {"runtime": parts[0], "driver": parts[1]}
    if len(parts) == 3:
        return out | ({"kind": "probe"} if parts[2] == "probe" else {"kind": "command", "case": parts[2]})
    return out | _swap_axes(parts)


def _swap_axes(parts: list[str]) -> dict[str, str]:
    """The axes after runtime and driver of a swap cell's id (its parts, four or more)."""
    out = {"kind": "swap", "variant": parts[2]}
    families = VARIANT_FAMILIES.get(parts[2], ())
    if families:
        out["family"] = "driver" if parts[0] == NO_RUNTIME or families == ("driver",) else "runtime"
    if parts[3].startswith("h"):
        out["build"] = parts[3][1:]
    if len(parts) >= 5:
        out["workload"] = "/".join(parts[4:])
    return out


# --------------------------------------------------------------------------- reading


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

    def need_text(self, key: str, within: Mapping[str, object] | None = None) -> str:
        value = self.text(key, within, required=True)
        if value is None:
            raise self.fail(f"record has no {key!r}")
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
        "timings", "fingerprint", "stderr_tail", "stdout_tail", "started", "duration_s", "chosen_by",
    }
)  # fmt: skip


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


def _one(shared: dict[object, Any], key: object, value: Any) -> Any:
    """The value ``shared`` already holds under ``key``, else ``value`` (now held)."""
    return shared.setdefault(key, value)


def _status(r: _Reader) -> str:
    status = r.text("status", required=True)
    if status not in STATUSES:
        raise r.fail(f"status {status!r} is not one of {', '.join(STATUSES)}")
    return status


def _outcome(r: _Reader, obs: Mapping[str, object]) -> str:
    outcome = r.need_text("outcome", obs)
    if not OUTCOME_RE.match(outcome):  # the reports take it apart (is_ok): refuse what is not an outcome
        raise r.fail(f"outcome {outcome!r} is not an outcome word")
    return outcome


def _axes(r: _Reader, cell_id: str, shared: dict[object, Any]) -> dict[str, str]:
    """The record's axes (from its id where it has none), held once in ``shared``."""
    axes_raw = r.obj("axes")
    axes = {str(k): str(v) for k, v in axes_raw.items()} if axes_raw else axes_from_id(cell_id)
    held: dict[str, str] = _one(shared, ("axes", *sorted(axes.items())), axes)
    return held


def _expected(r: _Reader, exp: Mapping[str, object]) -> Expected:
    return Expected(outcomes=frozenset(r.strings("outcomes", exp)), reason=r.text("reason", exp) or "",
                    rule=r.text("rule", exp) or "")


def _cell(r: _Reader, shared: dict[object, Any]) -> CellRecord:
    cell_id = r.need_text("id")
    status = _status(r)
    exp = r.obj("expected")
    obs = r.obj("observed")
    outcome = _outcome(r, obs)
    axes = _axes(r, cell_id, shared)
    data = r.obj("data", obs)
    fingerprint = dict(r.obj("fingerprint"))
    fingerprint = _one(shared, ("fingerprint", json.dumps(fingerprint, sort_keys=True, default=str)), fingerprint)
    expected = _expected(r, exp)
    return CellRecord(
        id=cell_id,
        axes=axes,
        host=r.text("host"),
        expected=_one(shared, expected, expected),
        observed=Observed(
            outcome=outcome,
            path=r.text("path", obs),
            error_name=r.text("error_name", obs),
            detail=r.text("detail", obs) or "",
            exit_status=r.integer("exit_status", obs),
            data=dict(data),
        ),
        status=status,  # type: ignore[arg-type]  # checked against STATUSES above
        mismatch=r.text("mismatch"),
        timings=_timings(r),
        fingerprint=fingerprint,
        stderr_tail=r.text("stderr_tail") or "",
        stdout_tail=r.text("stdout_tail") or "",
        started=r.text("started"),
        duration_s=r.num("duration_s", r.rec),
        chosen_by=r.text("chosen_by"),
        extra={k: v for k, v in r.rec.items() if k not in _CELL_KEYS},
    )

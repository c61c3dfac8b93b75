"""Nights of a small matrix, written as real ``results.jsonl`` files: what the history tests
feed to ``cumatrix merge`` (and to :meth:`History.append`) when no GPU runs swap cells.

Each cell is a :class:`CellRecord` written with ``to_store``; the run header and end record
are those a run writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cumatrix.core.model import Expected, Observed, Timings
from cumatrix.core.record import CellRecord
from cumatrix.report import load_records
from cumatrix.results.records import RunData

DIGEST = "ab" * 32
FINGERPRINT = {"hostname": "nightly-host", "driver_string": "NVIDIA driver 580.159.04 (NVML)"}


@dataclass(frozen=True)
class State:
    """What one cell did one night: status, outcome word, path, GB/s (swap cells)."""

    status: str  # pass, fail, skip, or "not-run" (listed in the header, no record)
    outcome: str = "ok"
    path: str | None = "n/a"
    gbps: float | None = None
    speedup: float | None = None

    @property
    def label(self) -> str:
        if self.status == "not-run":
            return "not-run"
        return f"ok:{self.path}" if self.outcome == "ok" and self.path else self.outcome


def record(cell_id: str, s: State, started: str) -> CellRecord:
    """The record of a cell that did ``s``."""
    swap = s.gbps is not None
    axes = ({"runtime": "cu12.9", "driver": "host", "kind": "swap", "variant": "loop", "build": "12.9",
             "workload": cell_id.rsplit("/", 1)[-1]} if swap else
            {"runtime": "cu12.9", "driver": "host", "kind": "command", "case": cell_id.rsplit("/", 1)[-1]})
    expected = Expected(outcomes=frozenset({"ok:batch", "ok:fallback"} if swap else {"ok"}), reason="a nightly",
                        rule="test")
    return CellRecord(
        id=cell_id, axes=axes, host=None, expected=expected,
        observed=Observed(outcome=s.outcome, path=s.path if s.outcome == "ok" else None,
                          detail="" if s.status == "pass" else f"{s.outcome} tonight",
                          exit_status=0 if s.outcome == "ok" else 1),
        status=s.status,  # type: ignore[arg-type]
        mismatch=None if s.status != "fail" else f"expected ok, observed {s.outcome}",
        timings=Timings(wall_s=0.5, gbps=s.gbps, loop_gbps=(s.gbps / s.speedup) if s.gbps and s.speedup else None,
                        speedup=s.speedup, repetitions=20 if swap else None),
        fingerprint=dict(FINGERPRINT), stderr_tail="" if s.status == "pass" else "it broke\n",
        started=started, duration_s=0.5)


def write_night(d: Path, night: int, states: dict[str, State], *, digest: str = DIGEST) -> Path:
    """``d/results.jsonl`` of one night (day ``night`` of a month); returns ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    started = f"2026-11-{night + 1:02d}T02:00:00Z"
    header = {"schema": 1, "type": "run", "run_id": f"night{night:02d}abcd", "matrix": "nightly.yaml",
              "matrix_sha256": digest, "started": started, "harness_version": "0.1.0", "argv": [],
              "backend": "local", "host": None, "host_fingerprint": FINGERPRINT, "cells": list(states),
              "cells_total": len(states)}
    lines = [json.dumps(header)]
    lines += [json.dumps(record(cid, s, started).to_store()) for cid, s in states.items() if s.status != "not-run"]
    lines.append(json.dumps({"schema": 1, "type": "end", "finished": started, "interrupted": False}))
    (d / "results.jsonl").write_text("\n".join(lines) + "\n")
    return d


def night_run(tmp: Path, night: int, states: dict[str, State], **kw: str) -> RunData:
    """One night as :class:`RunData`, read back from its results.jsonl as a report reads it."""
    return load_records(write_night(tmp / f"night-{night:02d}", night, states, **kw) / "results.jsonl")

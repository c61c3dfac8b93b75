"""A run reads its records back against the harness's seal: a line is taken only as the harness
wrote it, and only when the run wrote it (``records.Seal``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cumatrix.results import recordkey
from cumatrix.results.digests import dumps
from cumatrix.results.records import Seal, load_records

HEADER = {"schema": 1, "type": "run", "run_id": "r1", "matrix": "m.yaml", "matrix_sha256": "a" * 64,
          "cells": ["cu12.9/host/a", "cu12.9/host/b"]}


@pytest.fixture(autouse=True)
def own_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    recordkey._KEYS.clear()
    yield
    recordkey._KEYS.clear()


def _cell(cid: str, status: str = "fail", outcome: str = "exit:1") -> dict[str, object]:
    return recordkey.sign({"schema": 1, "type": "cell", "id": cid, "axes": {"runtime": "cu12.9", "driver": "host"},
                           "status": status, "expected": {"outcomes": ["ok"], "reason": "", "rule": ""},
                           "observed": {"outcome": outcome}, "fingerprint": {"gpu_name": "x"},
                           "digest": "d" * 64})


def _line(rec: dict[str, object]) -> bytes:
    return dumps(rec).encode()


def test_a_line_as_the_harness_wrote_it_carries_its_seal() -> None:
    rec = _cell("cu12.9/host/a")
    assert recordkey.line_problem(_line(rec), rec) is None


@pytest.mark.parametrize("how", ["edited", "re-encoded", "unsealed", "mac-nested"])
def test_a_line_the_harness_did_not_write_as_it_stands_is_refused(how: str) -> None:
    rec = _cell("cu12.9/host/a")
    if how == "edited":
        rec = {**rec, "status": "pass", "observed": {"outcome": "ok"}}
        line = _line(rec)
    elif how == "re-encoded":  # the same content, other bytes: not what the harness wrote
        line = json.dumps(rec).encode()
    elif how == "unsealed":
        rec = {k: v for k, v in rec.items() if k != "mac"}
        line = _line(rec)
    else:  # the seal copied into a nested object as well: what is left still holds a top-level mac
        rec = {**rec, "fingerprint": {"gpu_name": "x", "mac": rec["mac"]}}
        line = _line(rec)
    assert recordkey.line_problem(line, json.loads(line)) is not None


def _write(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_bytes(b"".join(_line(r) + b"\n" for r in records))
    return path


def test_a_run_refuses_what_it_did_not_write_and_misses_what_was_taken_out(tmp_path: Path) -> None:
    earlier_pass = _cell("cu12.9/host/a", status="pass", outcome="ok")  # sealed, but another run's
    now = _cell("cu12.9/host/a")
    b = _cell("cu12.9/host/b", status="pass", outcome="ok")
    jsonl = _write(tmp_path / "results.jsonl", [HEADER, earlier_pass])
    written = {"cu12.9/host/a": str(now["mac"]), "cu12.9/host/b": str(b["mac"])}
    run = load_records(jsonl, seal=Seal(written=written))
    cells = {c.id: c for c in run.cells}
    assert cells["cu12.9/host/a"].observed.outcome == "harness-error"
    assert "not the record this run wrote" in (cells["cu12.9/host/a"].mismatch or "")
    assert "it claimed pass (ok)" in (cells["cu12.9/host/a"].mismatch or "")
    assert cells["cu12.9/host/b"].status == "fail"
    assert "taken out" in (cells["cu12.9/host/b"].mismatch or "")
    assert run.verdict == "FAIL"
    # Without a seal (reports rebuilt elsewhere, merges) the file is read as it is.
    assert load_records(jsonl).verdict != "FAIL"
    # What the run wrote, as it wrote it, stands.
    _write(jsonl, [HEADER, now, b])
    assert {c.id: c.status for c in load_records(jsonl, seal=Seal(written=written)).cells} == {
        "cu12.9/host/a": "fail", "cu12.9/host/b": "pass"}

"""``results.json``: the whole run as one versioned JSON document (schema: ``schema.json``)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from .. import __version__
from .records import SCHEMA_VERSION, RunData, axes_from_id


def dumps(obj: object) -> str:
    """The JSON encoding every report uses: sorted keys, two-space indent, UTF-8 text."""
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def schema() -> dict[str, object]:
    """The JSON Schema (draft 2020-12) of ``results.json`` shipped with this package."""
    text = resources.files(__package__).joinpath("schema.json").read_text(encoding="utf-8")
    loaded: dict[str, object] = json.loads(text)
    return loaded


def to_json(run: RunData) -> dict[str, object]:
    """The ``results.json`` document of a run."""
    head = run.header
    c = run.counts
    return {
        "schema": SCHEMA_VERSION,
        "generator": f"cumatrix {__version__}",
        "verdict": run.verdict,
        "counts": {
            "total": c.total,
            "pass": c.passed,
            "fail": c.failed,
            "skip": c.skipped,
            "not_run": c.not_run,
        },
        "run": {
            "run_id": head.run_id,
            "matrix": head.matrix,
            "matrix_sha256": head.matrix_sha256,
            "started": run.started,
            "finished": run.finished,
            "interrupted": run.interrupted,
            "harness_version": head.harness_version,
            "argv": list(head.argv),
            "backend": head.backend,
            "host": head.host,
            "host_fingerprint": dict(head.host_fingerprint),
            "cells_total": c.total,
        },
        "runs": [r.to_json() for r in run.runs],
        "hosts": list(run.hosts),
        "cells": [cell.to_json() for cell in run.cells],
        "not_run": [{"id": cid, "axes": axes_from_id(cid)} for cid in run.not_run],
        "warnings": list(run.warnings),
        "extra": [dict(e) for e in run.extra],
    }


def write_json(run: RunData, path: Path) -> Path:
    """Write ``results.json`` and return its path."""
    path.write_text(dumps(to_json(run)), encoding="utf-8")
    return path

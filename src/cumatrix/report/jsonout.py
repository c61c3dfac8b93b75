"""``results.json``: the whole run as one versioned JSON document (schema: ``schema.json``).

Written as a stream: the document's keys in sorted order with two-space indent, and each
cell on a line of its own (compact, keys sorted), so a run of 10,000 cells is neither held
as one string nor encoded by Python's slow indenting encoder; ``grep`` finds a cell's line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import TextIO

from cumatrix import __version__
from cumatrix.report.headline import headline
from cumatrix.results.records import SCHEMA_VERSION, RunData, axes_from_id


def dumps(obj: object) -> str:
    """The JSON encoding every report uses: sorted keys, two-space indent, UTF-8 text."""
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def schema() -> dict[str, object]:
    """The JSON Schema (draft 2020-12) of ``results.json`` shipped with this package."""
    text = resources.files(__package__).joinpath("schema.json").read_text(encoding="utf-8")
    loaded: dict[str, object] = json.loads(text)
    return loaded


def to_json(run: RunData) -> dict[str, object]:
    """The ``results.json`` document of a run (as :func:`write_json` writes it, in memory)."""
    return {**_head(run), "cells": [cell.to_json() for cell in run.cells]}


def _since(run: RunData) -> dict[str, object]:
    """``since_last_run``: the run against the previous one of its matrix, when the history has one."""
    return {} if run.since is None else {"since_last_run": run.since.to_json()}


def _head(run: RunData) -> dict[str, object]:
    """Every key of the document but ``cells``."""
    head = run.header
    c = run.counts
    return {
        "schema": SCHEMA_VERSION,
        "generator": f"cumatrix {__version__}",
        "verdict": run.verdict,
        "headline": headline(run),
        "counts": {
            "total": c.total,
            "pass": c.passed,
            "fail": c.failed,
            "skip": c.skipped,
            "not_run": c.not_run,
            "tested": c.tested,  # pass + fail: the cells that ran the code under test and were judged
            "ran": c.ran,  # pass + fail + the skipped cells a process of which ran
            "skipped_after_running": c.partial,
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
            "sandbox": head.sandbox,
            "host": head.host,
            "host_fingerprint": dict(head.host_fingerprint),
            "cells_total": c.total,
        },
        "runs": [r.to_json() for r in run.runs],
        "hosts": list(run.hosts),
        "not_run": [{"id": cid, "axes": axes_from_id(cid), "outcome": "not-run", "host": host}
                    for cid, host in run.not_run_where()],
        "missing_hosts": list(run.missing_hosts),
        "warnings": list(run.warnings),
        "extra": [dict(e) for e in run.extra],
        **_since(run),
        **({"never_tested": run.untested.to_json()} if run.untested is not None else {}),
    }


def _write_cells(f: TextIO, cells: Iterable[dict[str, object]]) -> None:
    f.write("[")
    sep = "\n"
    for cell in cells:
        f.write(sep + "    " + json.dumps(cell, sort_keys=True, ensure_ascii=False))
        sep = ",\n"
    f.write("\n  ]" if sep == ",\n" else "]")


def write_json(run: RunData, path: Path) -> Path:
    """Write ``results.json`` (streamed, see the module's text) and return its path."""
    head = _head(run)
    keys = sorted([*head, "cells"])
    with path.open("w", encoding="utf-8") as f:
        f.write("{")
        for i, key in enumerate(keys):
            f.write(("," if i else "") + "\n  " + json.dumps(key) + ": ")
            if key == "cells":
                _write_cells(f, (cell.to_json() for cell in run.cells))
            else:
                text = json.dumps(head[key], sort_keys=True, indent=2, ensure_ascii=False)
                f.write(text.replace("\n", "\n  "))
        f.write("\n}\n")
    return path

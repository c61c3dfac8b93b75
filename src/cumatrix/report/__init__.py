"""Reports of a run: ``results.json``, ``junit.xml``, ``summary.md`` and ``index.html``.

All four are rebuilt from ``results.jsonl`` alone, so a killed run can still be reported::

    run = load_records(out_dir / "results.jsonl")
    write_all(run, out_dir)
"""

from __future__ import annotations

import os
from pathlib import Path

from cumatrix.core.private import replace_new
from cumatrix.report.html import write_html
from cumatrix.report.jsonout import dumps, write_json
from cumatrix.report.junit import write_junit
from cumatrix.report.markdown import verdict_line, write_markdown
from cumatrix.report.merge import merge_runs
from cumatrix.report.progress import progress_line
from cumatrix.report.static import static_record
from cumatrix.results.records import (
    SCHEMA_VERSION,
    CellResult,
    Counts,
    RunData,
    RunInfo,
    Spread,
    Timings,
    axes_from_id,
    load_records,
)

__all__ = [
    "REPORT_FILES",
    "SCHEMA_VERSION",
    "CellResult",
    "Counts",
    "RunData",
    "RunInfo",
    "Spread",
    "Timings",
    "axes_from_id",
    "load_records",
    "merge_runs",
    "progress_line",
    "verdict_line",
    "write_all",
]

#: File names :func:`write_all` writes, in order.
REPORT_FILES = ("results.json", "junit.xml", "summary.md", "index.html")


def write_all(run: RunData, out_dir: Path) -> list[Path]:
    """Write ``results.json``, ``junit.xml``, ``summary.md`` and ``index.html`` into ``out_dir``.

    Each file is written to a temporary name and renamed, so a reader never sees half a
    report.  Returns the paths written, in that order.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    writers = (write_json, write_junit, write_markdown, write_html)
    written: list[Path] = []
    for name, writer in zip(REPORT_FILES, writers, strict=True):
        final = out_dir / name
        tmp = out_dir / f".{name}.tmp"
        os.close(replace_new(tmp))  # a new file of ours: the writer never follows a planted link
        writer(run, tmp)
        tmp.replace(final)
        written.append(final)
    static = static_record(run)
    if static is not None:  # a gate's static audit, as it recorded it
        final = out_dir / "static.json"
        tmp = out_dir / ".static.json.tmp"
        os.close(replace_new(tmp))
        tmp.write_text(dumps(dict(static)), encoding="utf-8")
        tmp.replace(final)
        written.append(final)
    return written

"""The headline of a run and its exit status: one function each, used by every front end
(``run``, the pytest plugin, ``merge``, ``report``) and every report (the terminal,
``summary.md``, ``junit.xml``, ``results.json``, ``index.html``).

The first line says what was tested: how many cells ran the code under test and were judged
against their expectation, how many were skipped (and the largest reason why), and how many
were not run.  A run is PASS only when at least one cell was tested and met its expectation;
a run in which every cell was skipped or not run is ``NOTHING TESTED``, never a pass.
"""

from __future__ import annotations

from cumatrix.core.errors import EXIT_NOTHING_RAN
from cumatrix.results.records import Counts, RunData

#: What a skip reason means for the reader of a headline: what was not tested, and why.
SKIP_MEANINGS: dict[str, str] = {
    "skipped:no-cuda-driver": "no CUDA driver, the GPU cells were not tested",
    "skipped:no-compiler": "no gcc, the reference variants were not built",
    "cannot-emulate": "the real driver cannot stand in for the emulated one there",
    "skipped:runtime-not-used": "the program succeeded without using the cell's runtime",
    "skipped:no-nvrtc": "no NVRTC to build the copy kernel",
    "skipped:unsupported-pairing": "pairings NVIDIA does not support",
    "skipped:needs-docker": "container runtimes, which need --backend docker",
    "skipped:wheel-not-for-this-python": "the wheel is not for this Python",
}


def _cells(n: int) -> str:
    return "cell" if n == 1 else "cells"


def largest_skip(c: Counts) -> str:
    """``282 skipped:no-cuda-driver: no CUDA driver ...; 18 cannot-emulate: ...``: every reason
    for skips, the largest first, each with its count and what it means.  None is folded into
    "other reasons": a reader who sees 30 cells skipped must see why (without gcc, the GPU cells
    beside the uncompiled ones)."""
    parts = []
    for word, n in c.all_skip_reasons:
        meaning = SKIP_MEANINGS.get(word)
        parts.append(f"{n} {word}" + (f": {meaning}" if meaning else ""))
    return "; ".join(parts)


def not_run_by_host(run: RunData) -> str:
    """Which host of the plan left cells unrun: ``host a100-550 never ran (12 cells)``."""
    out = []
    for host, n, planned in run.incomplete_hosts():
        if host in run.missing_hosts:
            out.append(f"host {host} never ran its {n} planned cells")
        else:
            out.append(f"host {host} did not run {n} of its {planned} planned cells")
    return "; ".join(out)


def not_run_cause(run: RunData) -> str:
    """Why the cells not run were not: the hosts that left them, or an interruption."""
    by_host = not_run_by_host(run) if run.merged or run.missing_hosts else ""
    return by_host or ("the run was interrupted first" if run.interrupted else "no host ran them")


def why_not_run(run: RunData) -> str:
    """Why the cells that were not tested were not: ``264 skipped:no-cuda-driver, 18 cannot-emulate``."""
    c = run.counts
    parts = [f"{n} {reason}" for reason, n in c.all_skip_reasons]
    if c.not_run:
        parts.append(f"{c.not_run} not run ({not_run_cause(run)})")
    return ", ".join(parts)


def headline(run: RunData) -> str:
    """The verdict and what was tested, as one line of plain text::

        cumatrix: PASS — 18 of 300 cells tested: all met expectations; 282 skipped (282
        skipped:no-cuda-driver: no CUDA driver, the GPU cells were not tested); 0 not run

    Every report's first line is this one (``summary.md`` in bold, ``junit.xml`` as the
    suite's ``headline`` property, ``results.json`` as ``headline``)."""
    c = run.counts
    v = run.verdict
    if v == "EMPTY":
        return "cumatrix: EMPTY — the matrix selection has no cells; nothing ran"
    tested = f"{c.tested} of {c.total} {_cells(c.total)} tested"
    if c.failed:
        tested += f": {c.failed} did not meet expectations"
    elif c.tested:
        tested += ": all met expectations"
    skip = largest_skip(c)
    skipped = f"{c.skipped} skipped" + (f" ({skip})" if skip else "")
    not_run = f"{c.not_run} not run" + (f" ({not_run_cause(run)})" if c.not_run else "")
    return f"cumatrix: {v} — {tested}; {skipped}; {not_run}"


def exit_status(run: RunData, *, allow_empty: bool = False) -> int:
    """The exit status of a run (or a merge of runs), from the same records as its headline:
    1 when a cell missed its expectation or planned cells were not run; 5 when nothing was
    tested (every cell skipped or not run, or none selected), 0 with ``allow_empty``; else 0."""
    v = run.verdict
    if v in ("FAIL", "INCOMPLETE") or (run.merged and run.counts.not_run):
        return 1  # a planned host that left cells unrun fails a merge whatever else is true
    if v in ("NOTHING TESTED", "EMPTY"):
        return 0 if allow_empty else EXIT_NOTHING_RAN
    return 0

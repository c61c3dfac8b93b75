"""``cumatrix report`` and ``cumatrix merge``: the reports of runs rebuilt from their
``results.jsonl``, one run's or several hosts' together, and the merge's exit status."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cumatrix.core.errors import EXIT_NOTHING_RAN, UsageError
from cumatrix.front.history_cli import check_history, record, since_for
from cumatrix.front.run_cmd import matrix_arg
from cumatrix.load import matrix as _matrix


def cmd_report(args: argparse.Namespace) -> int:
    """``cumatrix report DIR``: the reports of a run rebuilt from its results.jsonl."""
    # deferred: cumatrix.report costs ~110 ms and ~85 modules (jinja2); only the commands that write reports
    from cumatrix.report import load_records, write_all
    from cumatrix.report.headline import headline

    d = Path(args.dir)
    if not (d / "results.jsonl").is_file():
        raise UsageError(f"{d}: no results.jsonl here (a run's --out directory holds one)")
    run = load_records(d / "results.jsonl")
    for w in getattr(run, "warnings", ()):
        print(f"cumatrix: warning: {w}", file=sys.stderr)
    for p in write_all(since_for(args, run), d):
        print(p)
    print(headline(run), file=sys.stderr)
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    """``cumatrix merge DIR...``: one report of several hosts' runs; returns :func:`merge_status`."""
    # deferred: cumatrix.report costs ~110 ms and ~85 modules (jinja2); only the commands that write reports
    from cumatrix.report import write_all
    from cumatrix.report.headline import headline
    from cumatrix.report.merge import merge_runs

    dirs = _runs_to_merge(args)
    if not dirs:
        print("cumatrix: merge: no run to merge: every results.jsonl given is empty", file=sys.stderr)
        return 1
    plan = _merge_plan(args.matrix, dirs)
    check_history(args)
    merged = merge_runs(dirs, host_names=None, plan=plan, submission=args.submission, notes=args.notes)
    for w in merged.warnings:
        if " not-run: " in w or " not verifiable here " in w:
            print(f"cumatrix: merge: {w}", file=sys.stderr)
    run = record(args, merged, kind="merge")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for p in write_all(run, out):
        print(p)
    print(headline(run), file=sys.stderr)
    return merge_status(run, allow_empty=bool(getattr(args, "allow_empty", False)))


def _runs_to_merge(args: argparse.Namespace) -> list[Path]:
    """The run directories given that hold records (exit 2 for one without results.jsonl);
    an empty results.jsonl is said and left out."""
    # deferred: the records' module, with the report's above
    from cumatrix.results.records import is_blank

    dirs = [Path(d) for d in args.dirs]
    if args.submission is not None:
        _matrix.check_name(args.submission, "--submission")
    for d in dirs:
        if not (d / "results.jsonl").is_file():
            raise UsageError(f"{d}: no results.jsonl here (merge takes the --out directories of runs)")
    # A run killed as it started (a scheduler's task cancelled, a runner lost) leaves an empty
    # results.jsonl: its host ran nothing, which the merge reports; it is not bad input.
    empty = [d for d in dirs if is_blank(d / "results.jsonl")]
    for d in empty:
        print(f"cumatrix: merge: {d}/results.jsonl is empty (the run was stopped before it began); "
              "its host ran nothing", file=sys.stderr)
    return [d for d in dirs if d not in empty]


def _merge_plan(matrix: str | None, dirs: list[Path]) -> Any:
    """``--matrix``: the cells the runs were meant to run (of the selection they recorded);
    ``None`` without it."""
    if not matrix:
        return None
    # deferred: plan costs ~45 ms and ~35 modules; only merge --matrix
    from cumatrix.front.plan import planned_cells, recorded_selection

    return planned_cells(_matrix.load(matrix_arg(matrix)), selection=recorded_selection(dirs))


def merge_status(run: Any, *, allow_empty: bool = False) -> int:
    """The merge's exit status, as ``run``'s comes from its records (:func:`exit_status`): 1
    when a cell missed its expectation or a planned cell was not run, naming each host that
    left cells unrun; 5 when no cell was tested (0 with ``--allow-empty``); else 0."""
    # deferred: cumatrix.report costs ~110 ms and ~85 modules (jinja2); only the commands that write reports
    from cumatrix.report.headline import exit_status, not_run_by_host

    who = not_run_by_host(run)
    if who:
        print(f"cumatrix: merge incomplete: {who}", file=sys.stderr)
    status = exit_status(run, allow_empty=allow_empty)
    if status == EXIT_NOTHING_RAN:
        print("cumatrix: merge: no cell was tested: exit 5; --allow-empty makes it 0", file=sys.stderr)
    return status

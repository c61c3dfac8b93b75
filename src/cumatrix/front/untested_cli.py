"""``cumatrix untested``: the cells of a matrix no run of the last N runs (or D days) tested on
any host, the axis values never tested, and why (:mod:`cumatrix.results.untested`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cumatrix.core.errors import ConfigError, UsageError
from cumatrix.results.history import History, default_path
from cumatrix.results.untested import DEFAULT_RUNS, Untested, find, to_text

EPILOG = """\
examples:
  cumatrix untested                       # the newest run's matrix, its last 30 runs
  cumatrix untested matrix.yaml --days 30 # every cell of matrix.yaml, the runs of its last 30 days
  cumatrix untested --fail                # exit 1 when a cell or a value was never tested (CI)
  cumatrix untested --json                # machine-readable

exit: 0 (with --fail: nothing untested); 1 with --fail, some cell untested; 2 bad input (no
history, no run of the matrix, --runs below 1).
"""


def universe_of(matrix: Path | str | None, digest: str | None = None) -> tuple[list[str] | None, str | None]:
    """Every cell id of the matrix file and its digest; (None, None) without a file, or where
    ``digest`` is given and the file no longer has it (edited since the run)."""
    if matrix is None or not Path(matrix).is_file():
        return None, None
    # deferred: the matrix loader costs ~30 ms; only where a matrix file is named or found
    from cumatrix.load import matrix as _matrix

    try:
        m = _matrix.load(matrix)
    except ConfigError:
        if digest is None:
            raise
        return None, None
    if digest is not None and m.sha256 != digest:
        return None, None
    return [c.id for c in _matrix.cells(m)], m.sha256


def cmd_untested(args: argparse.Namespace) -> int:
    """``cumatrix untested [MATRIX] [--runs N | --days D] [--fail] [--json]``."""
    _check_options(args)
    universe, digest = universe_of(args.matrix)
    path = Path(args.history) if args.history else default_path()
    with History.open(path, create=False) as hist:
        found = find(hist, digest=digest, universe=universe, runs=args.runs, days=args.days,
                     matrix=str(args.matrix) if args.matrix else None)
    if args.json:
        print(json.dumps({"history": str(path), **found.to_json()}, indent=2, sort_keys=True))
    else:
        print(to_text(found), end="")
    return 1 if args.fail and _any(found) else 0


def _check_options(args: argparse.Namespace) -> None:
    """A window of at least one run or some days, and a matrix file that is there: else exit 2."""
    if args.runs is not None and args.runs < 1:
        raise UsageError(f"--runs {args.runs}: must be at least 1")
    if args.days is not None and not args.days > 0:
        raise UsageError(f"--days {args.days}: must be more than 0")
    if args.matrix is not None and not Path(args.matrix).is_file():
        raise UsageError(f"{args.matrix}: no such matrix file")


def _any(u: Untested) -> bool:
    return bool(u.cells or u.never)


def add_untested_parser(sub: Any) -> None:
    """Register ``untested``."""
    p = sub.add_parser("untested", help="cells and axis values no run of the last N runs tested, on any host",
                       description="The cells of a matrix that no run of the window (the last --runs runs, or the "
                                   "runs of the last --days days) tested on any host (passed or failed: a skip or a "
                                   "cell not run tests nothing), each with its last test and what it did since; and "
                                   "the axis values none of whose cells was tested. A rotation's cells (--rotate) "
                                   "are not counted before the window holds its nights.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("matrix", nargs="?", metavar="MATRIX",
                   help="the matrix file: every one of its cells is looked for, those no run took included "
                        "(default: the newest run's matrix in the history, and the cells its runs hold)")
    p.add_argument("--history", metavar="FILE", help="the history file (default $CUMATRIX_HISTORY, else "
                                                     "$XDG_DATA_HOME/cumatrix/history.sqlite)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--runs", type=int, metavar="N", help=f"the last N runs of the matrix (default {DEFAULT_RUNS})")
    g.add_argument("--days", type=float, metavar="D", help="the runs of the last D days (before the newest run)")
    p.add_argument("--fail", action="store_true", help="exit 1 when a cell or an axis value was never tested (CI)")
    p.add_argument("--json", action="store_true", help="machine-readable")
    p.set_defaults(func=cmd_untested)


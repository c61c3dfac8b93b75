"""``cumatrix history`` and ``cumatrix diff``, and the ``--history`` / ``--no-history``
options by which ``run``, ``merge`` and ``gate`` append to the history."""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cumatrix.core.errors import UsageError
from cumatrix.front.flags import count_arg, days_arg
from cumatrix.front.untested_cli import add_untested_parser, universe_of
from cumatrix.results.history import (
    BUSY_TIMEOUT_S,
    ENV,
    History,
    HistoryError,
    HistoryLocked,
    StoredRun,
    default_path,
    git_commit,
    is_lock,
    lock_text,
)
from cumatrix.results.historydiff import DEFAULT_WINDOW, diff, resolve, to_text
from cumatrix.results.untested import Untested
from cumatrix.results.untested import find as find_untested

if TYPE_CHECKING:
    from cumatrix.results.records import RunData

EPILOG_HISTORY = """\
examples:
  cumatrix history                        # every stored run, newest last
  cumatrix history --json                 # the same, machine-readable
  cumatrix history --prune --keep 90      # keep the newest 90 runs of each matrix
  cumatrix history --prune --older-than 180
"""
EPILOG_DIFF = """\
examples:
  cumatrix diff                 # the newest run against the run of its matrix before it
  cumatrix diff 41              # run #41 against the run of its matrix before it
  cumatrix diff 12 41 --json    # run #41 against #12 (history ids or run ids)
"""


def add_history_options(p: argparse.ArgumentParser) -> None:
    """``--history FILE`` and ``--no-history`` on a command that records its run."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--history", metavar="FILE",
                   help="append the run to this history (default $CUMATRIX_HISTORY, else "
                        "$XDG_DATA_HOME/cumatrix/history.sqlite)")
    g.add_argument("--no-history", action="store_true", help="do not record the run in the history")


def history_path(args: argparse.Namespace) -> Path | None:
    """The history the command records to, or None with ``--no-history``."""
    if getattr(args, "no_history", False):
        return None
    given = getattr(args, "history", None)
    return Path(given) if given else default_path()


#: How long the check before a run waits for a locked history: the run does not wait on it
#: (it records itself at the end, when the lock has gone).
CHECK_WAIT_S = 2.0


def check_history(args: argparse.Namespace) -> None:
    """Open (create, migrate) the history before any work: a bad file is exit 2 up front.  A
    locked one is a warning naming the lock: the run goes on and records itself at its end,
    when the lock has been released (else the record is reported as skipped)."""
    path = history_path(args)
    if path is not None and getattr(args, "history", None):
        # The history the run records to is what the cells' sandbox masks ($CUMATRIX_HISTORY,
        # read for each cell, by pytest-xdist's workers too): a --history FILE inside the
        # project is then no more readable to a cell than the default one.
        os.environ[ENV] = str(path.absolute())
    if path is not None:
        try:
            with History.open(path, busy_timeout=CHECK_WAIT_S):
                pass
        except HistoryLocked as e:
            print(f"cumatrix: warning: {e}; the run goes on and is recorded at its end once the lock is released",
                  file=sys.stderr)


def record(args: argparse.Namespace, run: RunData, *, kind: str, series: str | None = None) -> RunData:
    """Append ``run`` to the history; returns it with ``since`` set when a previous run of its
    series (its matrix, or ``series``: :meth:`History.append`) is stored.  A history that cannot be written is a warning, not the run's failure:
    the cells ran and their reports must still be written."""
    path = history_path(args)
    if path is None:
        return run
    try:
        with History.open(path) as hist:
            rid = hist.append(run, kind=kind, commit=git_commit(), series=series)
            b = hist.run(str(rid))
            if kind != "gate":  # a gate's series is its wheels', not a matrix's cells
                run = replace(run, untested=untested_of(hist, run, b))
            earlier = hist.runs(digest=b.digest, upto=rid - 1, limit=1)
            if not earlier:
                return run
            return replace(run, since=diff(hist, earlier[0], b, trends=True))
    except HistoryLocked as e:
        print(f"cumatrix: warning: run not recorded in the history (skipped): {e}", file=sys.stderr)
        return run
    except sqlite3.Error as e:
        why = lock_text(path, BUSY_TIMEOUT_S) if is_lock(e) else str(e)
        print(f"cumatrix: warning: run not recorded in the history {path} (skipped): {why}", file=sys.stderr)
        return run
    except (HistoryError, OSError) as e:
        print(f"cumatrix: warning: run not recorded in the history {path}: {e}", file=sys.stderr)
        return run


def since_for(args: argparse.Namespace, run: RunData) -> RunData:
    """For ``cumatrix report``: the stored run of this results file (by run id), compared with
    the one before it, read-only; the run as it is when the history has neither."""
    path = history_path(args)
    if path is None or not path.is_file() or not run.runs:
        return run
    try:
        with History.open(path, create=False, busy_timeout=CHECK_WAIT_S) as hist:  # a comparison is not worth a wait
            uid = run.header.run_id  # as append stores it: a resumed run keeps its first id
            row = hist.conn.execute("SELECT max(id) FROM runs WHERE run_uid = ?", (uid,)).fetchone()[0]
            if row is None:
                return run
            b = hist.run(str(row))
            run = replace(run, untested=untested_of(hist, run, b))
            earlier = hist.runs(digest=b.digest, upto=b.id - 1, limit=1)
            return replace(run, since=diff(hist, earlier[0], b, trends=True)) if earlier else run
    except (HistoryError, sqlite3.Error) as e:
        print(f"cumatrix: warning: history {path} not read: {e}", file=sys.stderr)
        return run


def untested_of(hist: History, run: RunData, b: StoredRun) -> Untested:
    """The reports' "never tested in the last N runs": the cells of the run's matrix (every
    cell of its file, where the file is still the one that ran) no run of the window up to
    ``b`` tested on any host."""
    universe, _ = universe_of(run.header.matrix, b.digest)
    return find_untested(hist, digest=b.digest, universe=universe, upto=b.id, matrix=run.header.matrix)


# --------------------------------------------------------------------------- commands


def _require_file(args: argparse.Namespace) -> Path:
    path = history_path(args)
    if path is None:
        raise UsageError("--no-history: this command reads the history")
    return path


def cmd_history(args: argparse.Namespace) -> int:
    """``cumatrix history [--prune ...] [--json]``."""
    _check_prune_options(args)
    path = _require_file(args)
    with History.open(path, create=False) as hist:
        if args.prune:
            _prune(hist, path, args)
            return 0
        runs = hist.runs(limit=args.limit)
    if args.json:
        print(json.dumps({"history": str(path), "runs": [r.to_json() for r in runs]}, indent=2, sort_keys=True))
        return 0
    if not runs:
        print(f"{path}: no runs stored yet")
        return 0
    print(f"{'id':>5}  {'run id':12}  {'time':20}  {'kind':5}  {'matrix (sha256)':34}  {'host':16}  "
          f"{'pass':>5} {'fail':>5} {'skip':>5} {'n/r':>5}  verdict")
    for r in runs:
        matrix = f"{Path(r.matrix).name} ({r.digest[:8]})"
        print(f"{r.id:>5}  {r.run_uid:12}  {(r.started or r.recorded):20}  {r.kind:5}  {matrix[:34]:34}  "
              f"{r.host[:16]:16}  {r.passed:>5} {r.failed:>5} {r.skipped:>5} {r.not_run:>5}  {r.verdict}")
    return 0


def _check_prune_options(args: argparse.Namespace) -> None:
    limited = args.keep is not None or args.older_than is not None
    if limited and not args.prune:
        raise UsageError("--keep and --older-than go with --prune")
    if args.prune and not limited:
        raise UsageError("--prune needs --keep N or --older-than DAYS")
    _check_prune_limits(args)


def _check_prune_limits(args: argparse.Namespace) -> None:
    """--keep and --older-than hold values prune can use."""
    if args.keep is not None and args.keep < 1:
        raise UsageError(f"--keep {args.keep}: must be at least 1")
    if args.older_than is not None and not args.older_than >= 0:
        raise UsageError(f"--older-than {args.older_than}: must be a number of days, 0 or more")


def _prune(hist: History, path: Path, args: argparse.Namespace) -> None:
    gone = hist.prune(keep=args.keep, older_than_days=args.older_than)
    if args.json:
        print(json.dumps({"history": str(path), "deleted": gone}, indent=2))
    else:
        print(f"{path}: deleted {len(gone)} run{'s' if len(gone) != 1 else ''}"
              + (f" ({', '.join(f'#{i}' for i in gone)})" if 0 < len(gone) <= 20 else ""))


def cmd_diff(args: argparse.Namespace) -> int:
    """``cumatrix diff [A] [B] [--json] [--window N]``."""
    if args.window < 2:
        raise UsageError(f"--window {args.window}: must be at least 2")
    path = _require_file(args)
    with History.open(path, create=False) as hist:
        a, b = resolve(hist, args.a, args.b)
        d = diff(hist, a, b, window=args.window)
    if args.json:
        print(json.dumps(d.to_json(), indent=2, sort_keys=True))
    else:
        print(to_text(d), end="")
    return 0


def add_history_parsers(sub: Any) -> None:
    """Register ``history`` and ``diff``."""
    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("history", help="list the runs stored in the history; prune it",
                       description="List the runs stored in the history file (id, time, matrix, host, counts), "
                                   "or delete old ones with --prune.",
                       epilog=EPILOG_HISTORY, formatter_class=raw)
    p.add_argument("--history", metavar="FILE", help="the history file (default $CUMATRIX_HISTORY, else "
                                                     "$XDG_DATA_HOME/cumatrix/history.sqlite)")
    p.add_argument("--json", action="store_true", help="machine-readable")
    p.add_argument("--limit", type=count_arg, metavar="N", help="only the newest N runs")
    p.add_argument("--prune", action="store_true", help="delete runs (with --keep or --older-than)")
    p.add_argument("--keep", type=count_arg, metavar="N", help="with --prune: keep the newest N runs of each matrix")
    p.add_argument("--older-than", type=days_arg, metavar="DAYS", help="with --prune: delete runs older than DAYS")
    p.set_defaults(func=cmd_history)

    p = sub.add_parser("diff", help="what changed between two stored runs; flaky cells",
                       description="Compare run B with run A: new failures, fixes, changed outcomes, cells newly "
                                   "skipped or not run, GB/s and speedups beyond their run-to-run noise, and cells "
                                   "whose outcome flipped at least twice in the last --window runs (flaky).",
                       epilog=EPILOG_DIFF, formatter_class=raw)
    p.add_argument("a", nargs="?", metavar="A", help="the earlier run (history id or run id)")
    p.add_argument("b", nargs="?", metavar="B", help="the later run (default: the newest)")
    p.add_argument("--history", metavar="FILE", help="the history file (default as for `cumatrix history`)")
    p.add_argument("--json", action="store_true", help="machine-readable")
    p.add_argument("--window", type=count_arg, default=DEFAULT_WINDOW, metavar="N",
                   help=f"runs looked back over for noise and flaky cells (default {DEFAULT_WINDOW})")
    p.set_defaults(func=cmd_diff)
    add_untested_parser(sub)

"""The sandbox's flags, on the CLI's subcommands (``--sandbox``, ...) and on pytest
(``--cumatrix-sandbox``, ...): their names, help and parsing.  What they mean is
:func:`cumatrix.core.options.sandbox_policy`'s to decide, through
:class:`~cumatrix.core.options.RunOptions`."""

from __future__ import annotations

import argparse
from typing import Any

from cumatrix.core.options import SANDBOX_MODES, check_write_limit


def add_cli_options(parser: argparse.ArgumentParser, *, default: str | None) -> None:
    """``--sandbox`` / ``--no-sandbox`` / ``--require-sandbox`` and ``--pass-env NAME`` on a
    subcommand's parser.

    ``default`` is ``auto`` for ``gate`` (bubblewrap where it runs) and None for ``run`` (the
    matrix's ``sandbox:``, else ``$CUMATRIX_SANDBOX``, else bubblewrap where it runs).
    """
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--sandbox", dest="sandbox", action="store_const", const="on", default=default,
                   help="run each cell under bubblewrap: no network, a read-only root, a private /tmp, "
                        "the GPU's device nodes, nothing of the harness's own state; a cell fails where "
                        "bubblewrap cannot run (by default each cell is sandboxed where bubblewrap runs, "
                        "and the run says so in one line where it cannot)")
    g.add_argument("--require-sandbox", dest="sandbox", action="store_const", const="on",
                   help="as --sandbox, and a host that cannot sandbox is an error before any cell runs "
                        "(exit 3; for CI)")
    g.add_argument("--no-sandbox", dest="sandbox", action="store_const", const="off",
                   help="run cells without bubblewrap, as the harness's own user (environment allowlist "
                        "and limits still apply; also `sandbox: false` in the matrix)")
    parser.add_argument("--pass-env", action="append", default=[], metavar="NAME",
                        help="also give cells this variable of the harness's environment (repeatable; "
                             "a glob such as 'MYAPP_*' works)")
    parser.add_argument("--sandbox-write-limit", type=size_arg, default=None, metavar="SIZE",
                        help="what a sandboxed cell may write: the size of its /tmp and /dev/shm each and "
                             "of any file (default 1G; 4K to 1T; $CUMATRIX_SANDBOX_WRITE_LIMIT)")


def size_arg(text: str) -> int:
    """``--sandbox-write-limit``: a size within the accepted range (argparse and pytest: exit 2)."""
    try:
        return check_write_limit(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_pytest_options(group: Any) -> None:
    """The same options for ``pytest matrix.yaml`` (a pytest option group)."""
    group.addoption("--cumatrix-sandbox", choices=SANDBOX_MODES, default=None,
                    help="bubblewrap per cell: auto (default: where it runs; or the matrix's sandbox:, or "
                         "$CUMATRIX_SANDBOX), off, on (required)")
    group.addoption("--cumatrix-pass-env", action="append", default=[], metavar="NAME",
                    help="also give cells this variable of the harness's environment (repeatable)")
    group.addoption("--cumatrix-sandbox-write-limit", type=size_arg, default=None, metavar="SIZE",
                    help="what a sandboxed cell may write (default 1G; 4K to 1T)")


COVER_HELP = ("run a covering plan, not every cell: 2 every pair of axis values (runtime, driver, variant, "
              "build, workload, case, kind) in at least one cell, 3 every triple, all every cell (default); "
              "docs/pr-and-nightly.md")


def add_cover_options(parser: argparse.ArgumentParser) -> None:
    """``--cover``, ``--seed``, ``--rotate``, ``--night`` on a subcommand (run, plan, submit)."""
    parser.add_argument("--cover", metavar="2|3|all", default=None, help=COVER_HELP)
    parser.add_argument("--seed", type=int, default=None, metavar="N",
                        help="--cover, --rotate: the seed that breaks ties between cells (default 0); the same "
                             "matrix and seed give the same plan")
    parser.add_argument("--rotate", type=int, default=None, metavar="K",
                        help="spread the matrix over K nights: each night a covering plan (--cover, default 2), "
                             "the K nights together every cell; with --night")
    parser.add_argument("--night", type=int, default=None, metavar="I",
                        help="--rotate: the night to run, taken modulo K (a day number works: "
                             "$(( $(date +%%s) / 86400 )))")


def cover_args(args: argparse.Namespace) -> list[str]:
    """The ``--cover ...`` words of ``args`` as given, for the runs a plan's scripts start."""
    out: list[str] = []
    for flag, value in (("--cover", args.cover), ("--seed", args.seed), ("--rotate", args.rotate),
                        ("--night", args.night)):
        if value is not None:
            out += [flag, str(value)]
    return out


def add_cover_pytest_options(group: Any) -> None:
    """The same options for ``pytest matrix.yaml``."""
    group.addoption("--cumatrix-cover", default=None, metavar="2|3|all", help=COVER_HELP)
    group.addoption("--cumatrix-seed", type=int, default=None, metavar="N",
                    help="--cumatrix-cover, --cumatrix-rotate: the seed that breaks ties (default 0)")
    group.addoption("--cumatrix-rotate", type=int, default=None, metavar="K",
                    help="spread the matrix over K nights, each a covering plan, together every cell")
    group.addoption("--cumatrix-night", type=int, default=None, metavar="I",
                    help="--cumatrix-rotate: the night to run (modulo K)")
#: The largest count a command-line option takes: more than any run, history or window holds,
#: and within what SQLite's integers and Python's indices take.
MAX_COUNT = 10**9


def count_arg(text: str) -> int:
    """An argparse ``type`` for a count (``--limit``, ``--keep``, ``-n``): a whole number from 1
    to :data:`MAX_COUNT` (a number past it is bad input, exit 2, never a crash further on)."""
    s = text.strip()
    if not (s.isascii() and s.isdigit() and len(s) <= 10) or not 1 <= int(s) <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: want a whole number, at least 1 and at most {MAX_COUNT:,}")
    return int(s)


def days_arg(text: str) -> float:
    """An argparse ``type`` for a number of days: finite and not negative."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: want a number of days, e.g. 30") from None
    if not 0 <= v <= 100_000:  # nan fails both comparisons
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: want a number of days from 0 to 100,000")
    return v

"""``cumatrix repro``: its parser (:mod:`.args`), the command (:mod:`.cli`), the native side of a
crashed cell (:mod:`.native`: gdb backtrace, mapped libraries) and the Markdown reports
(:mod:`.report`).

:func:`add_parser` is the entry point the CLI registers.  The command itself is imported only
when repro runs, so ``cumatrix --help`` builds the parser without the orchestrator, the
provisioning and the catalog; the arrow runs one way (this module to :mod:`.cli`), never back.
"""

from __future__ import annotations

import argparse
from typing import Any

from cumatrix.front.repro.args import add_repro_parser

__all__ = ["add_parser", "main"]


def main(args: argparse.Namespace) -> int:
    """Run ``cumatrix repro`` for parsed ``args``."""
    # deferred: repro (orchestrator, provisioning, catalog, reports) costs ~340 ms and ~190
    # modules, which --help and every other command do without
    from cumatrix.front.repro.cli import cmd_repro

    return cmd_repro(args)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``cumatrix repro`` on the CLI's subparsers, :func:`main` its command."""
    p = add_repro_parser(sub)
    p.set_defaults(func=main)
    return p

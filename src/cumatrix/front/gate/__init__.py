"""``cumatrix gate``: its parser (:mod:`.args`), the command (:mod:`.cli`: the static audit, then
the dynamic stage) and the dynamic stage (:mod:`.dynamic`).

:func:`add_parser` is the entry point the CLI registers.  The command itself is imported only
when the gate runs, so ``cumatrix --help`` builds the parser without the audit and the dynamic
stage; the arrow runs one way (this module to :mod:`.cli`, :mod:`.cli` to :mod:`.args`), never back.
"""

from __future__ import annotations

import argparse

from cumatrix.front.gate.args import add_gate_parser

__all__ = ["add_parser", "main"]


def main(args: argparse.Namespace) -> int:
    """Run ``cumatrix gate`` for parsed ``args``."""
    # deferred: the gate (static audit with pyelftools, dynamic stage with the orchestrator and the
    # reports) costs ~340 ms and ~200 modules, which --help and every other command do without
    from cumatrix.front.gate.cli import gate_main

    return gate_main(args)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``cumatrix gate`` on the CLI's subparsers, :func:`main` its command."""
    p = add_gate_parser(subparsers)
    p.set_defaults(func=main)
    return p

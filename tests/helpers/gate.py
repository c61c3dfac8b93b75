"""``cumatrix gate`` run in this process, its output captured."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from cumatrix.front.gate.cli import add_gate_parser, gate_main


@dataclass(frozen=True)
class Ran:
    rc: int
    out: str
    err: str


def gate(*argv: str | Path, capsys: pytest.CaptureFixture[str]) -> Ran:
    """Run ``cumatrix gate ARGV`` through its own argument parser and ``gate_main``."""
    parser = argparse.ArgumentParser(prog="cumatrix")
    add_gate_parser(parser.add_subparsers())
    try:
        rc = gate_main(parser.parse_args(["gate", *map(str, argv)]))
    except SystemExit as e:  # argparse rejects a malformed option with status 2
        rc = int(e.code or 0)
    cap = capsys.readouterr()
    return Ran(rc, cap.out, cap.err)

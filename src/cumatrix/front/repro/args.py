"""The ``cumatrix repro`` argument parser, apart from the command so that building it (every
``cumatrix --help``) does not import the orchestrator, the provisioning and the catalog."""

from __future__ import annotations

import argparse
from typing import Any

from cumatrix.core.options import BACKENDS, DEFAULT_BACKEND, DEFAULT_MATRIX, DEFAULT_OUT


def add_repro_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``cumatrix repro`` on the CLI's subparsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "repro", help="re-run one cell, or a known real-world bug, and write a bug report",
        description="Re-run one cell of a matrix alone (or a catalog entry: a bad cell that must show a known "
                    "bug's signature and a good cell that must pass), and write a Markdown bug report with a "
                    "standalone command.",
        epilog="examples:\n  cumatrix repro cu12.9/host/driver-dispatch/h12.8/kv-16k-d2h\n"
               "  cumatrix repro --list\n  cumatrix repro --bug vllm-cuda13-build --out reports/repro\n"
               "  cumatrix repro --all --out reports/repro\n\n"
               "exit: 0 reproduced / as predicted; 1 not reproduced / not as predicted (--all: or an entry could not\n"
               "run here, unless --allow-missing); 2 bad input, or a cell that did not run here; 3 --bug: this host\n"
               "cannot run the entry (the report is a skeleton with the command to run on a host that can)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cell_id", nargs="?", metavar="CELL_ID", help="a cell id of the matrix")
    p.add_argument("--matrix", metavar="M",
                   help=f"matrix file (default: ./{DEFAULT_MATRIX}, else the default matrix bundled with cumatrix, as run)")
    p.add_argument("--bug", metavar="ID", help="run a catalog entry (see --list)")
    p.add_argument("--list", action="store_true", help="print the catalog of known bugs")
    p.add_argument("--all", action="store_true", help="run every catalog entry, one report each")
    p.add_argument("--allow-missing", action="store_true",
                   help="--all: exit 0 even when some entries could not run on this host")
    p.add_argument("--backend", choices=BACKENDS, default=DEFAULT_BACKEND)
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"reports go here (default: {DEFAULT_OUT}/)")
    p.add_argument("--wheel-dir", metavar="DIR", help="take runtime wheels from DIR; no network")
    return p

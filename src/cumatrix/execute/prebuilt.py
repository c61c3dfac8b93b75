"""The compiled parts a wheel carries, and what a run lacks without them.

A platform wheel's build (``setup.py``) compiles ``csrc/spawn*.c`` and ``csrc/audit.c`` into
``cumatrix/libexec/``; a host without a compiler then has the same evidence as a checkout, which
compiles them into the cache at first use.  The prebuilt driver interposer beside them
(``libcumatrix_cuda.so``) is found by :mod:`cumatrix.provision.prebuilt_driver`, a stage below
this one.  Where neither is to be had,
:func:`cumatrix.execute.cellaudit.missing_evidence` names what every cell of the run goes without.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Where the wheel's build puts the compiled files, inside the package.
LIBEXEC = Path(__file__).resolve().parents[1] / "libexec"
SPAWN = "cumatrix-spawn"
AUDIT = "libcumatrix_audit.so"


def prebuilt(name: str) -> Path | None:
    """``cumatrix/libexec/NAME`` when the installed package carries it (a platform wheel)."""
    p = LIBEXEC / name
    return p if os.access(p, os.R_OK) and p.is_file() else None

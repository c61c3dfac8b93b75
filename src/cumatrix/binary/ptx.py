"""PTX ISA versions: the one table of which CUDA release (and so which driver) first accepts
each, and the ``.version`` directive read from PTX text.

The table is data (``cumatrix/data/ptx_isa.json``, from NVIDIA's PTX ISA release notes), read
once.  The gate's PTX check (:mod:`cumatrix.audit.checks`), the emulated driver's JIT ceiling
(:mod:`cumatrix.provision.drivers`, compiled into the interposer) and the oracle's
explanations all read it here, so they cannot disagree.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources

__all__ = ["DATA_FILE", "isa_table", "ptx_ceiling", "ptx_isa_cuda", "ptx_version"]

DATA_FILE = "data/ptx_isa.json"

# The directive that opens every PTX module ("PTX ISA", "PTX Module Directives: .version"):
# only comments and blank lines may come before it.
_VERSION_RE = re.compile(rb"^\s*\.version\s+(\d+)\.(\d+)", re.MULTILINE)


def _pair(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


@cache
def isa_table() -> dict[tuple[int, int], tuple[int, int]]:
    """PTX ISA version -> the CUDA release (major, minor) that introduced it."""
    data = json.loads(resources.files("cumatrix").joinpath(DATA_FILE).read_text())
    return {_pair(isa): _pair(cuda) for isa, cuda in data["isa_first_cuda"].items()}


def ptx_isa_cuda(isa: tuple[int, int]) -> tuple[int, int] | None:
    """The CUDA version (major, minor) whose driver first accepts PTX ISA ``isa``; ``None``
    when the version is newer than the table (then no known driver accepts it)."""
    return isa_table().get(isa)


def ptx_ceiling(driver: int) -> tuple[int, int] | None:
    """The newest PTX ISA a driver of CUDA version ``driver`` (``12080``) compiles; ``None``
    for a driver older than the table."""
    major, minor = driver // 1000, (driver % 1000) // 10
    known = [isa for isa, cuda in isa_table().items() if cuda <= (major, minor)]
    return max(known) if known else None


def ptx_version(text: bytes) -> tuple[int, int] | None:
    """The ``.version`` of PTX source ``text`` (the first 64 KiB are read), or ``None``."""
    m = _VERSION_RE.search(text[:65536])
    return (int(m.group(1)), int(m.group(2))) if m else None

"""One detector of a statically linked CUDA runtime, for the gate's static audit and for what
a cell's processes mapped.

nvcc links the runtime statically by default, and so do many wheels (cuda-bindings' runtime
module, CuPy's extension modules): such a process maps no ``libcudart.so`` at all, yet uses a
runtime of one CUDA major.  Every static ``libcudart`` carries its objects' names
(``libcudart_static_<sha1>``, in ``.symtab``, gone once stripped), its error-name table
(``cudaErrorCudartUnloading``, the one error only the runtime itself reports) and the names
of its ~300 functions (its ``cudaGetDriverEntryPoint`` and profiler tables): the last two
survive stripping.  Its major, and the newest CUDA version it knows, come from those names:
the newest major that at least three of them were first exported in (one name is not enough).
:mod:`cumatrix.audit.static` judges a wheel's files with it, :mod:`cumatrix.execute.observe`
the files a cell's processes mapped.
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from cumatrix.binary.elf import elf_strings
from cumatrix.core.witness import cell_file_sha256, open_cell_file

MARK = "libcudart_static_"
ERROR_NAME = "cudaErrorCudartUnloading"
#: Known runtime function names a file must carry (beside the error name) to hold a runtime.
MIN_NAMES = 100
MAJOR_EVIDENCE = 3  # names of one major that date a static runtime to it
#: The hidden driver interface only the runtime's code resolves (its tables alone, as in a
#: Python wrapper of the runtime API, do not make a runtime).
EXPORT_TABLE = "cuGetExportTable"

_RUNTIME_BASE_RE = re.compile(r"^(cuda\w+?)(?:_v\d+)?(?:_pt(?:ds|sz))?$")


def _runtime_intro(sym: str, intros: Mapping[str, int]) -> int | None:
    if sym in intros:
        return intros[sym]
    m = _RUNTIME_BASE_RE.match(sym)
    return intros.get(m.group(1)) if m else None


def is_static_runtime(names: AbstractSet[str], cuda: AbstractSet[str], intros: Mapping[str, int]) -> bool:
    """Whether a file carries a copy of libcudart, judged by its own content.

    ``names``: the identifiers found in its data (``elf_strings(elf, ("cu", MARK))``),
    ``cuda``: those starting with ``cuda``.  Its objects' names (``libcudart_static_<sha1>``,
    gone once stripped), else the runtime's error-name table and function-name table together
    with what only the runtime's code holds: the name of the hidden driver interface it
    resolves (``cuGetExportTable``).  A Python wrapper of the runtime API (cuda-bindings'
    ``runtime`` module, whose docstrings name every function and error) has the tables but not
    the code; its sibling that links the runtime (``_bindings/cyruntime``) has both.
    (``libcuda.so.1`` is no mark: libnvjpeg 12.4 packs it behind a fixed-size message array,
    with no NUL before it.)
    """
    if any(t.startswith(MARK) for t in names):
        return True
    return (ERROR_NAME in cuda and EXPORT_TABLE in names
            and sum(t in intros for t in cuda) >= MIN_NAMES)


def runtime_major(strings: AbstractSet[str], intros: Mapping[str, int]) -> int | None:
    """The CUDA major of a statically linked runtime, from its own table of function names:
    the newest major that at least ``MAJOR_EVIDENCE`` of the names it carries were first
    exported in (one name is not enough: a stray name of a newer runtime does not make one).
    ``None`` when no name is known."""
    per_major: dict[int, int] = {}
    for s in strings:
        v = _runtime_intro(s, intros)
        if v is not None:
            per_major[v // 1000] = per_major.get(v // 1000, 0) + 1
    if not per_major:
        return None
    strong = [m for m, n in per_major.items() if n >= MAJOR_EVIDENCE]
    return max(strong) if strong else min(per_major)


def runtime_floor(strings: AbstractSet[str], intros: Mapping[str, int], major: int) -> int | None:
    """The newest CUDA version (``12080``) that first exported a name the runtime of ``major`` carries."""
    got = [v for s in strings if (v := _runtime_intro(s, intros)) is not None and v // 1000 == major]
    return max(got) if got else None


@dataclass(frozen=True, kw_only=True, slots=True)
class StaticRuntime:
    """A statically linked runtime found in one file."""

    file: str
    sha256: str
    major: int | None
    version: int | None  # the newest CUDA version its names date from (CUDA encoding)
    evidence: str

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "sha256": self.sha256, "major": self.major, "version": self.version,
                "evidence": self.evidence}


_NEEDLES = (MARK.encode(), ERROR_NAME.encode())


def _may_hold_runtime(path: str) -> bool:
    """A fast look for either marker's bytes (hashing and a full ELF read only where one is
    there), once per file version (device, inode, size, mtime): every cell maps libc."""
    try:
        st = Path(path).stat()
    except OSError:
        return False
    return _has_marker(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=16384)
def _has_marker(path: str, dev: int, ino: int, size: int, mtime_ns: int) -> bool:  # noqa: ARG001
    # dev, ino, size and mtime_ns are the cache key: a changed file is looked at again.
    return has_bytes(path, _NEEDLES)


def has_bytes(path: str, needles: tuple[bytes, ...]) -> bool:
    """Whether the file holds any of ``needles`` (memory-mapped, no copy)."""
    try:
        # The paths looked into are a cell's mapped files: opened as a cell's (no FIFO waited on).
        with open_cell_file(path, links=True) as f:
            if os.fstat(f.fileno()).st_size < 64:
                return False
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                return any(m.find(n) >= 0 for n in needles)
    except (OSError, ValueError):
        return False


_BY_HASH: dict[str, StaticRuntime | None] = {}


def static_runtime_in(path: str, intros: Callable[[], Mapping[str, int]]) -> StaticRuntime | None:
    """The static runtime ``path`` carries, or None; decided once per file content (sha256).

    ``intros`` gives the runtime functions' first-export versions (asked only for a file that
    carries a marker; :func:`cumatrix.audit.static.runtime_introductions` gives them).
    """
    if not _may_hold_runtime(path):
        return None
    try:
        digest = cell_file_sha256(path)
    except OSError:
        return None
    if digest in _BY_HASH:
        hit = _BY_HASH[digest]
        return None if hit is None else StaticRuntime(file=path, sha256=digest, major=hit.major,
                                                      version=hit.version, evidence=hit.evidence)
    _BY_HASH[digest] = found = _inspect(path, digest, intros)
    return found


def _inspect(path: str, digest: str, intros: Callable[[], Mapping[str, int]]) -> StaticRuntime | None:
    try:
        with open_cell_file(path, links=True) as fh:
            names = elf_strings(ELFFile(fh), ("cu", MARK))
    except (OSError, ELFError, ValueError):
        return None
    cuda = {t for t in names if t.startswith("cuda")}
    table = intros()
    if not is_static_runtime(names, cuda, table):
        return None
    major = runtime_major(cuda, table)
    floor = runtime_floor(cuda, table, major) if major is not None else None
    why = ("its object names (libcudart_static_*)" if any(t.startswith(MARK) for t in names)
           else f"its error-name table ({ERROR_NAME}) and {sum(t in table for t in cuda)} runtime function names")
    return StaticRuntime(file=path, sha256=digest, major=major, version=floor,
                         evidence=f"a statically linked CUDA runtime, from {why}")

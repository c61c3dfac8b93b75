"""Validated matrices kept in the user's cache, read back instead of parsed again.

A large matrix, once validated, is kept in the user's cache as the :class:`Matrix` it built,
under the digest of its name (its messages name the file), the directory its cases start in
(the file's, where a case names no other), its text and the code that validates it:
``validate`` then ``run``, every pytest-xdist worker and every rerun of a nightly read it back
instead of parsing 10,000 cases again (0.07 s to unpickle them, against 0.5 s and more to
parse and check them).  Only valid matrices are kept; any doubt about an entry means
parsing.  ``CUMATRIX_NO_MATRIX_CACHE=1`` turns it off.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from importlib import resources
from pathlib import Path

from cumatrix import __version__
from cumatrix.core.cache import cache_root
from cumatrix.core.model import Matrix

_SAVE_ABOVE = 32 * 1024  # bytes of YAML; smaller files parse in a few milliseconds
_SAVED_KEEP = 16
#: What a validated matrix depends on: the packages the loader may import (the import-linter
#: contract keeps this stage to itself and core), the schemas, and the YAML and schema libraries.
_CODE_DIRS = ("load", "core")


def _version(dist: str) -> str:
    from importlib import metadata  # deferred: only a large matrix's cache entry needs it

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def _code_digest() -> hashlib._Hash | None:
    # The libraries' versions from their metadata: importing PyYAML (25 ms) is what reading a
    # matrix back saves.
    libs = "\n".join(_version(d) for d in ("pyyaml", "fastjsonschema", "jsonschema"))
    h = hashlib.sha256(f"{__version__}\n{libs}\n".encode())
    try:
        root = resources.files("cumatrix")
        sources = [f for d in _CODE_DIRS for f in root.joinpath(d).iterdir() if f.name.endswith(".py")]
        sources += [f for f in root.joinpath("data").iterdir() if f.name.endswith(".schema.json")]
        for source in sorted(sources, key=str):
            h.update(source.name.encode() + b"\0" + source.read_bytes())
    except OSError:
        return None
    return h


def _path(raw: bytes, sha: str, name: str, home: str | None) -> Path | None:
    if len(raw) < _SAVE_ABOVE or os.environ.get("CUMATRIX_NO_MATRIX_CACHE"):
        return None
    h = _code_digest()
    if h is None:
        return None
    # The directory its cases start in (the file's, absolute): the same name and text read
    # from another directory is another matrix.
    h.update(f"{sha}\n{name}\n{home}\n".encode())
    return cache_root() / "matrix" / f"{h.hexdigest()[:32]}.pickle"


def read(raw: bytes, sha: str, name: str, home: str | None) -> Matrix | None:
    """The matrix kept for this text (SHA-256 ``sha``) under this name whose cases start in
    ``home`` where they name no ``cwd:``, or None."""

    where = _path(raw, sha, name, home)
    if where is None:
        return None
    try:
        with where.open("rb") as f:
            got = pickle.load(f)
    except Exception:  # noqa: BLE001 - absent, cut short, or from another layout: parse instead
        return None
    return got if isinstance(got, Matrix) and got.sha256 == sha and got.path == name else None


def write(raw: bytes, sha: str, m: Matrix, home: str | None) -> None:
    """Keep a validated matrix (when its text is large enough to be worth it) whose cases
    start in ``home`` where they name no ``cwd:``; never fails."""

    where = _path(raw, sha, m.path, home)
    if where is None or any(c.cwd != home for c in m.cases):
        # A directory a case's cwd: names is checked against the filesystem when the file is
        # read, which the key (name, text, the file's directory) cannot stand for: such a matrix
        # is parsed each time.  The file's own directory exists while the file does.
        return
    try:
        where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = where.with_name(f".{where.name}.{os.getpid()}")
        with tmp.open("wb") as f:
            pickle.dump(m, f, protocol=pickle.HIGHEST_PROTOCOL)
        tmp.replace(where)
        for old in sorted(where.parent.glob("*.pickle"), key=lambda p: p.stat().st_mtime)[:-_SAVED_KEEP]:
            old.unlink(missing_ok=True)
    except OSError:
        return  # a read-only or full cache costs speed, never the run



"""Where cumatrix keeps what it fetches and builds (honours ``XDG_CACHE_HOME``), and where
it takes wheels from when offline (``--wheel-dir``, else ``$CUMATRIX_WHEEL_DIR``)."""

from __future__ import annotations

import os
from pathlib import Path

from cumatrix.core.errors import UsageError
from cumatrix.core.private import hold_cache, private_dir

#: Stands for ``--wheel-dir`` wherever a command or an API takes one and none is given.
WHEEL_DIR_ENV = "CUMATRIX_WHEEL_DIR"


def cache_location() -> Path:
    """``$CUMATRIX_CACHE``, else ``$XDG_CACHE_HOME/cumatrix``, else ``~/.cache/cumatrix`` (unchecked)."""
    explicit = os.environ.get("CUMATRIX_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "cumatrix"


def cache_root() -> Path:
    """The cache directory (:func:`cache_location`), created 0700 and checked to be this user's
    alone (:class:`cumatrix.core.private.SharedDirectory`, exit 3, where another user owns or may
    write it)."""
    return private_dir(cache_location())


def cache_dir(*parts: str) -> Path:
    """A directory in the cache, created; the process holds the cache (``clean`` waits)."""
    root = cache_root()
    hold_cache(root)
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def wheel_dir(explicit: Path | str | None = None) -> Path | None:
    """The directory offline wheels come from: ``explicit``, else ``$CUMATRIX_WHEEL_DIR``, else None.

    ``None`` means: fetch from the package index.  A directory named by the variable that
    does not exist is a usage error, not a silent fall-back to the network.
    """
    if explicit:
        return Path(explicit)
    env = os.environ.get(WHEEL_DIR_ENV, "").strip()
    if not env:
        return None
    path = Path(env)
    if not path.is_dir():
        raise UsageError(f"{WHEEL_DIR_ENV}={env}: no such directory (unset it, or fill it with `cumatrix fetch "
                         f"MATRIX --dest {env}`)")
    return path


def default_table() -> Path:
    """The calibration table: where ``cumatrix calibrate`` writes by default, and where ``cumatrix run`` looks."""
    return cache_dir("calibration") / "kvswap-calibration.txt"
def temp_prefix(what: str) -> str:
    """The ``mkdtemp`` prefix of a cumatrix temporary directory: it names this process, so
    ``cumatrix clean`` can tell a dead run's leftover from a live run's directory."""
    return f"cumatrix-{what}-{os.getpid()}-"

"""Where cumatrix keeps what it fetches and builds (honours ``XDG_CACHE_HOME``)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$CUMATRIX_CACHE``, else ``$XDG_CACHE_HOME/cumatrix``, else ``~/.cache/cumatrix``."""
    explicit = os.environ.get("CUMATRIX_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "cumatrix"


def cache_dir(*parts: str) -> Path:
    path = cache_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path

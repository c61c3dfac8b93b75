"""A case's working directory: the one its ``cwd:`` names, else the matrix file's own.

A relative path is read from the matrix file's directory, not from wherever ``cumatrix run``
happens to start, and a case that names none starts in that directory: the file and the
directories it names travel together, and the same matrix reads the same files whoever runs
it from wherever.  The result is absolute, so every backend starts the command in the same
place (the docker backend mounts it read-only at the same path).  The one exception is the
default matrix bundled with cumatrix: its cases start where the run started, since its
directory is the package's own (``site-packages``, or a checkout's top).
"""

from __future__ import annotations

import os
from pathlib import Path

from cumatrix.core.options import DEFAULT_MATRIX


def bundled_candidates() -> tuple[Path, Path]:
    """Where the default matrix bundled with cumatrix is, first match wins: the copy
    ``setup.py`` puts in package data (``cumatrix/data/matrix.yaml``), else ``matrix.yaml`` at
    the top of the source tree the package runs from."""
    package = Path(__file__).resolve().parents[1]  # cumatrix/, this file being cumatrix/load/workdir.py
    # The installed copy first: a wheel installed into a venv inside some checkout must not pick
    # up whatever matrix.yaml happens to sit three directories above site-packages.
    return package / "data" / DEFAULT_MATRIX, package.parents[1] / DEFAULT_MATRIX


def bundled() -> Path | None:
    """The default matrix bundled with cumatrix; None where the installation lacks it."""
    return next((c for c in bundled_candidates() if c.is_file()), None)


def default_dir(matrix_file: str | Path) -> str | None:
    """The directory a case with no ``cwd:`` starts in: the matrix file's, absolute and
    normalised (symbolic links kept, as :func:`case_dir` keeps them); None for the bundled
    default matrix, whose cases start where the run started."""
    here = bundled()
    if here is not None and os.path.realpath(matrix_file) == os.path.realpath(here):
        return None
    return os.path.normpath(Path(matrix_file).absolute().parent)


def case_dir(matrix_file: str, raw: str) -> str:
    """``raw`` as an absolute, normalised directory; :class:`ValueError` saying why where it is none."""
    # Not resolved: the path as written (symbolic links kept) is the one both backends show.
    path = Path(os.path.normpath(Path(matrix_file).absolute().parent / raw))
    if not path.exists():
        raise ValueError(f"{raw!r} does not exist ({path}; a relative path is read from the matrix file's directory)")
    if not path.is_dir():
        raise ValueError(f"{raw!r} is not a directory ({path})")
    return str(path)

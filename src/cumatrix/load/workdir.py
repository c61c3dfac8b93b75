"""A case's working directory (``cwd:``), as the matrix file names it.

A relative path is read from the matrix file's directory, not from wherever ``cumatrix run``
happens to start: the file and the directories it names travel together.  The result is
absolute, so both backends start the command in the same place (the docker backend mounts
it read-only at the same path).
"""

from __future__ import annotations

import os
from pathlib import Path


def case_dir(matrix_file: str, raw: str) -> str:
    """``raw`` as an absolute, normalised directory; :class:`ValueError` saying why where it is none."""
    # Not resolved: the path as written (symbolic links kept) is the one both backends show.
    path = Path(os.path.normpath(Path(matrix_file).absolute().parent / raw))
    if not path.exists():
        raise ValueError(f"{raw!r} does not exist ({path}; a relative path is read from the matrix file's directory)")
    if not path.is_dir():
        raise ValueError(f"{raw!r} is not a directory ({path})")
    return str(path)

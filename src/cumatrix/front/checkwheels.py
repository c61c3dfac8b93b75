"""``cumatrix validate --check-wheels``: every wheel requirement of a matrix resolved against
the package index (or ``--wheel-dir``), so a version that does not exist fails validation at
its place in the file instead of at the first cell of a nightly run.

- ``wheel: NAME==VERSION`` runtimes are fetched as a run fetches them
  (:func:`cumatrix.runtimes.fetch_wheel`: the wheel directory, the cache, else
  ``pip download --no-deps --only-binary=:all:``, which runs no code of the package), so a
  validated matrix's runtimes are in the cache for its run;
- ``requirements:`` of an environment runtime are looked up by name with
  ``pip index versions`` (nothing downloaded: an environment's pins can be large), and a
  pinned ``==VERSION`` must be among the versions listed; with ``--wheel-dir`` the pinned
  wheel must be in that directory.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from cumatrix.core.errors import CumatrixError, Problem
from cumatrix.core.model import Matrix
from cumatrix.provision import runtimes

_PIN_RE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*(?:==\s*(?P<version>[0-9][0-9A-Za-z.+!-]*))?")


def _place(m: Matrix, where: str) -> tuple[str, int, int]:
    """``(file, line, col)`` from a runtime's ``file:line:col``."""
    parts = where.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return parts[0], int(parts[1]), int(parts[2])
    return m.path, 1, 1


def index_versions(name: str) -> tuple[list[str] | None, str]:
    """The versions of ``name`` the configured index lists (``pip index versions``), or
    ``None`` and pip's last line when it lists none."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", "--disable-pip-version-check", name]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    for line in proc.stdout.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()], ""
    tail = (proc.stderr or proc.stdout).strip().splitlines()
    return None, tail[-1] if tail else f"pip exited {proc.returncode}"


def check_wheels(m: Matrix, *, wheel_dir: Path | None = None) -> list[Problem]:
    """A :class:`Problem` for every wheel requirement of ``m`` that does not resolve."""
    problems: list[Problem] = []
    for rt in m.runtimes:
        file, line, col = _place(m, rt.where)
        if rt.requirement:
            try:
                runtimes.fetch_wheel(rt.requirement, wheel_dir=wheel_dir)
            except CumatrixError as e:
                problems.append(Problem(file, line, col, f"runtimes: {rt.name}: {e}"))
        for req in rt.requirements:
            m_ = _PIN_RE.match(req.strip())
            if m_ is None:
                continue  # the loader checked the requirement's form already
            name, version = m_.group("name"), m_.group("version")
            if wheel_dir is not None:
                if version and runtimes.find_wheel(wheel_dir, name, version) is None:
                    problems.append(Problem(file, line, col, f"runtimes: {rt.name}: {req}: no matching wheel in "
                                                             f"{wheel_dir}"))
                continue
            listed, why = index_versions(name)
            if listed is None:
                problems.append(Problem(file, line, col, f"runtimes: {rt.name}: {req}: the package index has no "
                                                         f"{name} ({why})"))
            elif version and version not in listed:
                near = ", ".join(listed[:8])
                problems.append(Problem(file, line, col, f"runtimes: {rt.name}: {req}: no version {version} of "
                                                         f"{name} on the package index (newest: {near})"))
    return problems

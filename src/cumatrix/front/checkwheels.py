"""``cumatrix validate --check-wheels``: every wheel requirement of a matrix resolved against
the package index (or ``--wheel-dir``), so a version that does not exist fails validation at
its place in the file instead of at the first cell of a nightly run.

- ``wheel: NAME==VERSION`` runtimes are fetched as a run fetches them
  (:func:`cumatrix.runtimes.fetch_wheel`: the wheel directory, the cache, else
  ``pip download --no-deps --only-binary=:all:``, which runs no code of the package), so a
  validated matrix's runtimes are in the cache for its run;
- ``requirements:`` of an environment runtime are read as PEP 508 reads them
  (:class:`packaging.requirements.Requirement`: extras, markers, ``===``, any spacing) and
  looked up by name with ``pip index versions`` (nothing downloaded: an environment's pins can
  be large); some listed version must satisfy the requirement's specifier; with
  ``--wheel-dir`` some wheel of that directory must.  A requirement whose marker is false for
  this interpreter is not checked: ``pip index versions`` answers for this interpreter, and
  the environment is built for it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from cumatrix.core.errors import CumatrixError, Problem
from cumatrix.core.model import Matrix
from cumatrix.core.wheelname import maybe_wheel_name
from cumatrix.provision import runtimes


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


def satisfied(req: Requirement, versions: Iterable[str]) -> bool:
    """Some version of ``versions`` meets ``req``'s specifier (PEP 440: ``==1.0`` is ``1.0.0``,
    ``==1.0.*`` a prefix, ``===`` the text); pre-releases count, since a pin may name one."""
    return any(req.specifier.contains(v, prereleases=True) for v in versions)


def dir_versions(wheel_dir: Path, name: str) -> list[str]:
    """The versions of project ``name`` that ``wheel_dir`` holds a wheel of (names compared
    normalised: ``Foo_Bar`` is ``foo-bar``)."""
    want = canonicalize_name(name)
    found = (maybe_wheel_name(w) for w in sorted(wheel_dir.glob("*.whl")))
    return [str(w.version) for w in found if w is not None and w.name == want]


def _requirement_problem(req_text: str, wheel_dir: Path | None) -> str | None:
    """Why ``req_text`` (an environment's requirement) does not resolve, or None."""
    try:
        req = Requirement(req_text)
    except InvalidRequirement as e:  # the loader refuses these; a hand-made Matrix may not have
        return f"not a requirement ({e})"
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        return None  # not installed for this interpreter (see the module's docstring)
    if wheel_dir is not None:
        return None if satisfied(req, dir_versions(wheel_dir, req.name)) else f"no matching wheel in {wheel_dir}"
    return _index_problem(req)


def _index_problem(req: Requirement) -> str | None:
    """Why the package index holds no version meeting ``req``, or None."""
    listed, why = index_versions(req.name)
    if listed is None:
        return f"the package index has no {req.name} ({why})"
    if satisfied(req, listed):
        return None
    pins = [s.version for s in req.specifier if s.operator in ("==", "===")]
    spec = f" {req.specifier}" if req.specifier else ""
    what = f"version {pins[0]}" if len(pins) == 1 and len(req.specifier) == 1 else f"version{spec}"
    return f"no {what} of {req.name} on the package index (newest: {', '.join(listed[:8])})"


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
            why = _requirement_problem(req, wheel_dir)
            if why is not None:
                problems.append(Problem(file, line, col, f"runtimes: {rt.name}: {req}: {why}"))
    return problems

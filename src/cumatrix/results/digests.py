"""What a result depends on: the digest of every input of a cell, and the one JSON encoding.

A record is reused on ``--resume`` only where the digest of its cell's inputs is unchanged:
its definition, the runtime and driver entries it uses (a wheel runtime with the sha256 of
its wheel, an environment runtime with the sha256 of every wheel resolved into it), the
wheel its headers come from, the ``expect`` overrides that select it, and the harness
version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cumatrix.core.cache import cache_dir
from cumatrix.core.cache import wheel_dir as default_wheel_dir
from cumatrix.core.errors import CumatrixError
from cumatrix.core.model import NO_RUNTIME, Cell, Matrix
from cumatrix.core.witness import file_sha256


def dumps(record: Any) -> str:
    """The one JSON encoding of every record and report (and of any part of one): stable, sorted,
    one line."""
    return json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _headers_source(matrix: Matrix, cell: Cell) -> str | None:
    """The wheel whose headers build this cell (as ``runtimes.headers_for`` picks it)."""
    if cell.build is None:
        return None
    # deferred: packaging's requirement parser, only for built cells
    from cumatrix.load.requirements import KNOWN_WHEELS, matrix_headers_wheel

    found = matrix_headers_wheel(cell.build, matrix.runtimes)
    if found is not None:
        return found[1]
    return KNOWN_WHEELS.get(str(cell.build))


def cell_digest(matrix: Matrix, cell: Cell, harness_version: str, *, wheel_dir: Path | None = None) -> str:
    """SHA-256 of every input of a cell's result.

    Its definition (kind, case or workload, variant, build), the runtime and driver
    entries it uses, the wheel its headers come from, the ``expect`` overrides that
    select it, and the harness version.  Places in the file (line numbers) are left out:
    moving a line does not invalidate a result.  Wheels are hashed from ``wheel_dir`` (else
    ``$CUMATRIX_WHEEL_DIR``), then the cache.
    """
    return _digest(matrix, cell, harness_version, {}, wheel_dir)


def _digest(matrix: Matrix, cell: Cell, harness_version: str, shared: dict[tuple[str, str], str],
            wheel_dir: Path | None) -> str:
    """:func:`cell_digest`, with the runtime and driver entries (the same for many cells) in ``shared``."""
    rkey, dkey = ("runtime", cell.runtime), ("driver", cell.driver)
    if rkey not in shared:
        shared[rkey] = dumps(_runtime_entry(matrix, cell, wheel_dir))
    if dkey not in shared:
        shared[dkey] = dumps(_plain(matrix.driver(cell.driver)))
    expect = [{"select": list(ov.selector.values), "outcomes": sorted(ov.outcomes), "reason": ov.reason}
              for ov in matrix.expect if ov.selector.matches(cell)]
    # dumps() of {"cell", "driver", "expect", "harness", "headers", "runtime"}, written out in
    # its key order so that the entries many cells share are encoded once.
    text = (f'{{"cell":{dumps(_plain(cell))},"driver":{shared[dkey]},"expect":{dumps(expect)},'
            f'"harness":{dumps(harness_version)},"headers":{dumps(_headers_source(matrix, cell))},'
            f'"runtime":{shared[rkey]}}}')
    return hashlib.sha256(text.encode()).hexdigest()


def _runtime_entry(matrix: Matrix, cell: Cell, wheel_dir: Path | None) -> Any:
    """The cell's runtime entry as its digest sees it (its place in the file left out), with the
    bytes of the wheels it comes from; ``None`` for a cell that loads no runtime."""
    if cell.runtime == NO_RUNTIME:
        return None
    runtime = matrix.runtime(cell.runtime)
    entry = _plain(dataclasses.replace(runtime, where=""))
    if runtime.requirement:
        # The wheel's bytes, not only its name and version: a wheel rebuilt or replaced
        # under the same name is another input.
        return {"entry": entry, "wheel_sha256": wheel_sha256(runtime.requirement, wheel_dir)}
    if runtime.requirements:
        # An environment runtime: keyed by the bytes of the wheels it resolves to.
        return {"entry": entry, "environment": _environment_key(runtime.requirements, wheel_dir)}
    return entry


def _plain(value: Any) -> Any:
    """``dataclasses.asdict`` as JSON sees it (no copies: the result is only encoded)."""
    if value is None or isinstance(value, str | int | float):
        return value
    names = _field_names(type(value))
    if names is not None:
        return {f: _plain(getattr(value, f)) for f in names}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    return value


def _field_names(cls: type) -> tuple[str, ...] | None:
    """The fields of a dataclass type; None for any other type."""
    if cls not in _FIELDS:
        _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None
    return _FIELDS[cls]


_FIELDS: dict[type, tuple[str, ...] | None] = {}


def wheel_sha256(requirement: str, wheel_dir: Path | None = None) -> str | None:
    """The sha256 of the local wheel ``requirement`` resolves to (``wheel_dir``, else
    ``$CUMATRIX_WHEEL_DIR``, then the cache; nothing is fetched); None where there is none yet."""
    # deferred: provisioning (and its ELF reader) is loaded only for a matrix with wheel runtimes
    from cumatrix.provision.runtimes import find_wheel, parse_requirement

    try:
        name, version = parse_requirement(requirement)
    except CumatrixError:
        return None
    for d in [x for x in (default_wheel_dir(wheel_dir), cache_dir("wheels")) if x]:
        found = find_wheel(Path(d), name, version)
        if found is not None:
            try:
                return file_sha256(found)
            except OSError:
                return None
    return None


def _environment_key(requirements: tuple[str, ...], wheel_dir: Path | None) -> dict[str, Any] | None:
    """The key of an environment runtime's environment and the sha256 of every wheel resolved
    into it (dependencies included); None where it cannot be resolved yet."""
    # deferred: provisioning is loaded only for a matrix with environment runtimes
    from cumatrix.provision.environments import environment_hash, resolve_wheels

    try:
        wheel_dir = default_wheel_dir(wheel_dir)
        resolved = resolve_wheels(requirements, wheel_dir)
        return {"key": environment_hash(requirements, wheel_dir=wheel_dir, resolved=resolved),
                "wheels": sorted(w.sha256 for w in resolved)}
    except (OSError, CumatrixError):
        return None


def cell_digests(matrix: Matrix, cells: Iterable[Cell], harness_version: str, *,
                 wheel_dir: Path | None = None) -> dict[str, str]:
    """``{cell id: cell_digest}`` for the cells of a run."""
    shared: dict[tuple[str, str], str] = {}
    return {c.id: _digest(matrix, c, harness_version, shared, wheel_dir) for c in cells}


class LazyDigests:
    """``cell id -> cell_digest`` for the cells of a run, each computed when its record is
    stored: 10,000 of them cost 0.4 s, which a run would otherwise spend before its first cell."""

    def __init__(self, harness_version: str, *, wheel_dir: Path | None = None) -> None:
        self.version = harness_version
        self.wheel_dir = wheel_dir
        self._cells: dict[str, tuple[Matrix, Cell, dict[tuple[str, str], str]]] = {}

    def add(self, matrix: Matrix, cells: Iterable[Cell]) -> None:
        shared: dict[tuple[str, str], str] = {}
        for c in cells:
            self._cells[c.id] = (matrix, c, shared)

    def get(self, cell_id: str) -> str | None:
        got = self._cells.get(cell_id)
        return _digest(got[0], got[1], self.version, got[2], self.wheel_dir) if got is not None else None

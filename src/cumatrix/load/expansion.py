"""The cells of a matrix: every pairing of its runtimes and drivers with its probe, cases and
swap variants, in a stable order, ``exclude`` applied; the last few matrices' cells kept.

:mod:`cumatrix.load.matrix` builds the :class:`~cumatrix.core.model.Matrix` and offers these
functions as its own (``matrix.expand``, ``matrix.cells``).
"""

from __future__ import annotations

from collections.abc import Iterator

from cumatrix.core.model import NO_RUNTIME, VARIANT_FAMILIES, Cell, Matrix

#: How many matrices' cells are kept (as many as :mod:`cumatrix.load.matrix` keeps parsed).
_CELLS_SIZE = 16


def expand(m: Matrix, *, apply_exclude: bool = True) -> Iterator[Cell]:
    """Every cell of the matrix, in a stable order (driver, runtime, kind, variant, build, workload)."""
    for drv in m.drivers:
        for rt in m.runtimes:
            cells: list[Cell] = []
            if m.probe:
                cells.append(Cell(kind="probe", runtime=rt.name, driver=drv.name))
            cells += [Cell(kind="command", runtime=rt.name, driver=drv.name, case=c) for c in m.cases]
            cells += _swap_cells(m, "runtime", rt.name, drv.name)
            yield from _keep(m, cells, apply_exclude)
        yield from _keep(m, _swap_cells(m, "driver", NO_RUNTIME, drv.name), apply_exclude)


def _swap_cells(m: Matrix, family: str, runtime: str, driver: str) -> list[Cell]:
    """The swap cells of one family on one runtime and driver: each of its variants, per build and workload."""
    return [Cell(kind="swap", runtime=runtime, driver=driver, variant=variant, family=family, build=b, workload=w)
            for variant in m.variants if family in VARIANT_FAMILIES[variant]
            for b in m.builds for w in m.workloads]


def _keep(m: Matrix, cells: list[Cell], apply_exclude: bool) -> Iterator[Cell]:
    for c in cells:
        if not apply_exclude or not any(s.matches(c) for s in m.exclude):
            yield c


#: The cells of the last matrices expanded: pytest's collection and the controller's selection
#: both ask, each for 10,000 Cell objects at 10,000 cells.  load() hands each caller its own
#: copy of a Matrix (its path as that caller named it) with the same sections: those are what
#: the cells come from, so they are the key, compared by identity.
_CELLS: dict[str, tuple[tuple[object, ...], tuple[Cell, ...]]] = {}


def _sections(m: Matrix) -> tuple[object, ...]:
    return (m.runtimes, m.drivers, m.builds, m.variants, m.workloads, m.cases, m.exclude, m.probe)


def cells(m: Matrix) -> list[Cell]:
    """Every cell of the matrix after ``exclude`` (:func:`expand`), expanded once per matrix."""
    hit = _CELLS.get(m.sha256)
    if hit is None or any(a is not b for a, b in zip(hit[0], _sections(m), strict=True)):
        if len(_CELLS) >= _CELLS_SIZE:
            _CELLS.pop(next(iter(_CELLS)))
        hit = _CELLS[m.sha256] = (_sections(m), tuple(expand(m)))
    return list(hit[1])

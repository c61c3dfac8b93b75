"""Which cells a pytest session of matrix files runs, and in which order: ``-k`` of ``cumatrix
run`` (``--cumatrix-keyword``), ``--host`` of a plan, ``--lf``/``--ff`` and ``--resume``.

The controller works the selection out once, from the matrix files (:func:`selected`); an
xdist worker, which collects every cell, applies it to its items (:func:`select_cells`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from cumatrix.core.errors import ConfigError
from cumatrix.core.model import Cell, Matrix
from cumatrix.core.options import DEFAULT_OUT, RunOptions
from cumatrix.front import schedule as _schedule
from cumatrix.front.plan import PlannedCells, planned_cells
from cumatrix.load import matrix as _matrix
from cumatrix.load.keyword import KeywordExpression
from cumatrix.results.store import Store


class CellItem(pytest.Item):
    """What selection reads of a cell's item: its cell.  The item that runs it
    (:class:`cumatrix.front.pytest_plugin.hooks.CellItem`) derives from this, so selection
    needs nothing of the hooks module, which imports this one."""

    cell: Cell

MATRIX_SUFFIXES = (".yaml", ".yml")
#: The run's options, built once per process from its pytest options (pytest_configure).
OPTIONS = pytest.StashKey[RunOptions]()
#: ``(cell id, provision key)`` of every selected cell, in run order (for xdist scheduling).
SELECTED = pytest.StashKey[list[tuple[str, str]]]()
#: The cells whose records ``--cumatrix-resume`` keeps (the controller decided them).
REUSE = pytest.StashKey[frozenset[str]]()
_PLANS = pytest.StashKey[dict[str, "PlannedCells | None"]]()
_COVERS = pytest.StashKey[dict[str, "frozenset[str] | None"]]()


def options(config: pytest.Config) -> RunOptions:
    """This session's options (built as it was configured)."""
    return config.stash[OPTIONS]


def matrix_args(config: pytest.Config) -> list[Path]:
    """The matrix files named on the command line."""
    return [p for p in (Path(a.split("::")[0]) for a in config.args)
            if p.suffix in MATRIX_SUFFIXES and p.is_file()]


def keyword(config: pytest.Config) -> KeywordExpression | None:
    """``--cumatrix-keyword``, else pytest's own ``-k``, compiled (None: neither)."""
    text = options(config).keyword or config.getoption("keyword") or ""
    return KeywordExpression.compile(text) if text else None


def plan_of(config: pytest.Config, path: Path) -> PlannedCells | None:
    """The plan of the matrix at ``path`` (every cell, or its ``hosts:`` assignment), once per
    process; None when the matrix cannot be planned (``cumatrix run`` said so before)."""
    found = config.stash.setdefault(_PLANS, {})
    key = str(path)
    if key not in found:
        try:
            found[key] = planned_cells(_matrix.load(path), selection=options(config).selection)
        except ConfigError:
            found[key] = None
    return found[key]


def plan_json(config: pytest.Config, m: Matrix) -> dict[str, object] | None:
    """The plan of matrix ``m`` as the run header records it."""
    plans = config.stash.get(_PLANS, {})
    plan = plans.get(m.path) if m.path in plans else plan_of(config, Path(m.path))
    return plan.to_json() if plan is not None else None


def host_share(config: pytest.Config, path: Path) -> frozenset[str] | None:
    """--host naming a host of the matrix's plan: the cell ids the plan gives it (else None)."""
    host = options(config).host
    plan = plan_of(config, path) if host else None
    ids = plan.for_host(host) if plan is not None and host else None
    return frozenset(ids) if ids is not None else None


def cover_share(config: pytest.Config, path: Path, m: Matrix | None = None,
                every: list[Cell] | None = None) -> frozenset[str] | None:
    """``--cumatrix-cover``/``--cumatrix-rotate``: the ids of the cells the plan chooses of the
    matrix at ``path`` (once per process; the choice is the same in every process, for the same
    matrix and seed); None when the run takes every cell."""
    sel = options(config).selection
    if sel.full:
        return None
    found = config.stash.setdefault(_COVERS, {})
    key = str(path)
    if key not in found:
        # deferred: the covering plans and the build rules they read, only for a run that asks
        from cumatrix.front.cover import choose

        try:
            m = _matrix.load(path) if m is None else m
        except ConfigError:
            found[key] = None
            return None
        found[key] = frozenset(c.id for c in choose(m, every, sel))
    return found[key]


def id_file(path: Path | None) -> frozenset[str] | None:
    """The cell ids listed in a file (``--cumatrix-only``/``--cumatrix-first``), one a line."""
    if path is None:
        return None
    return frozenset(ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip())


def _keep(config: pytest.Config, items: list[pytest.Item], chosen: list[pytest.Item]) -> None:
    """``items`` becomes ``chosen``; the others are reported deselected."""
    if len(chosen) < len(items):
        kept = {id(it) for it in chosen}
        config.hook.pytest_deselected(items=[it for it in items if id(it) not in kept])
        items[:] = chosen


def select_cells(config: pytest.Config, items: list[pytest.Item], cell_type: type[CellItem]) -> None:
    """The cells this process runs, in the order it runs them (``items`` is changed in place)."""
    opts = options(config)
    only = id_file(opts.only)
    if only is not None:
        _keep(config, items, [it for it in items if not isinstance(it, cell_type) or it.cell.id in only])
    first = id_file(opts.first)
    if first:
        # A stable sort: the previously failed cells keep their matrix order, ahead of the rest.
        items.sort(key=lambda it: not (isinstance(it, cell_type) and it.cell.id in first))
    _select_by_name(config, items, cell_type)
    _skip_finished(config, items, cell_type)


@dataclass(frozen=True, kw_only=True, slots=True)
class _CellFilter:
    """What a cell of one matrix file must pass to run: ``-k``, its host's share of the plan,
    the covering plan's choice and ``--lf``'s ids (``None``: that one takes every cell)."""

    expr: KeywordExpression | None = None
    share: frozenset[str] | None = None
    cover: frozenset[str] | None = None
    only: frozenset[str] | None = None

    def admits(self, cell_id: str, filename: str) -> bool:
        """Whether the cell ``cell_id`` of the matrix file named ``filename`` runs."""
        if not all(ids is None or cell_id in ids for ids in (self.share, self.cover, self.only)):
            return False
        return self.expr is None or self.expr.matches(cell_id, filename)


def _select_by_name(config: pytest.Config, items: list[pytest.Item], cell_type: type[CellItem]) -> None:
    """``--cumatrix-keyword`` and ``--host``'s share of a plan."""
    filters = _name_filters(config, {it.path for it in items if isinstance(it, cell_type)})
    if filters is None:
        return
    # The controller matched every cell already (selected); a worker matches them here.
    ids = {cid for cid, _ in config.stash[SELECTED]} if SELECTED in config.stash else None

    def wanted(it: CellItem) -> bool:
        if ids is not None:
            return it.cell.id in ids
        return filters[it.path].admits(it.cell.id, it.path.name)

    _keep(config, items, [it for it in items if not isinstance(it, cell_type) or wanted(it)])


def _name_filters(config: pytest.Config, paths: set[Path]) -> dict[Path, _CellFilter] | None:
    """Each matrix file's filter of ``-k``, ``--host`` and the covering plan; ``None`` when
    none of them is given (every cell runs)."""
    opts = options(config)
    expr = keyword(config) if opts.keyword else None
    shares = {p: host_share(config, p) for p in paths} if opts.host else {}
    covers = _covers(config, paths)
    if expr is None and all(s is None for s in shares.values()) and not covers:
        return None
    return {p: _CellFilter(expr=expr, share=shares.get(p), cover=covers.get(p)) for p in paths}


def _skip_finished(config: pytest.Config, items: list[pytest.Item], cell_type: type[CellItem]) -> None:
    """``--cumatrix-resume``: the cells whose records the controller kept do not run again."""
    out = out_dir(config)
    if not (options(config).resume and out):
        return
    # The controller has compacted results.jsonl to the records whose inputs are unchanged
    # (Store.resume); every process (xdist workers too) skips exactly those cells.
    reuse = config.stash.get(REUSE, None)
    done = reuse if reuse is not None else Store(out).finished_ids()
    _keep(config, items, [it for it in items if not (isinstance(it, cell_type) and it.cell.id in done)])


def out_dir(config: pytest.Config) -> Path | None:
    """Where results go: ``--cumatrix-out``, else ``out/`` when a matrix file is run."""
    out = options(config).out
    if out is not None:
        return out
    return Path(DEFAULT_OUT) if matrix_args(config) else None


def _covers(config: pytest.Config, paths: set[Path]) -> dict[Path, frozenset[str] | None]:
    """Each matrix file's cells the covering plan chooses; empty when the run takes every cell."""
    if options(config).selection.full:
        return {}
    return {p: cover_share(config, p) for p in paths}


def selected(config: pytest.Config) -> list[tuple[Matrix, list[Cell]]]:
    """The cells this run intends, computed in the controller (xdist workers collect)."""
    out = []
    chosen: list[tuple[str, str]] = []
    expr = keyword(config)
    only = id_file(options(config).only)
    for p in matrix_args(config):
        try:
            m = _matrix.load(p)
        except ConfigError:
            continue
        every = _matrix.cells(m)
        plan = cover_share(config, p, m, every)
        _plan_once(config, p, m, every if plan is None else [c for c in every if c.id in plan])
        keep = _CellFilter(expr=expr, share=host_share(config, p), cover=plan, only=only)  # the share: of that plan
        cells = [c for c in every if keep.admits(c.id, p.name)]
        chosen += [(c.id, _schedule.provision_key(c)) for c in cells]
        out.append((m, cells))
    config.stash[SELECTED] = chosen
    return out


def _plan_once(config: pytest.Config, p: Path, m: Matrix, cells: list[Cell]) -> None:
    """The plan of matrix ``m`` (file ``p``), from the cells at hand (those the covering plan
    takes): a matrix is expanded once; ``None`` when it cannot be planned."""
    plans = config.stash.setdefault(_PLANS, {})
    try:
        plans[str(p)] = plans[m.path] = planned_cells(m, cells)
    except ConfigError:
        plans[str(p)] = plans[m.path] = None

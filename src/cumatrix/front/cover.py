"""Covering plans: the fewest cells that still hold every pair (or triple) of axis values.

A matrix's cells are rows of ``(axis, value)`` pairs (a probe cell has fewer axes than a swap
cell).  A plan of strength *t* holds, for every *t*-tuple of values that some cell of the
matrix holds together, at least one cell that holds it too: all-pairs testing for *t* = 2.  A
cell with fewer than *t* values is its own tuple (a probe cell is kept for its runtime and
driver under ``--cover 3``).

The algorithm is greedy set cover with lazy evaluation (the cells are the sets, the tuples
their elements), then a pass that drops any chosen cell whose every tuple another chosen cell
also holds.  Greedy set cover is what AETG and PICT do with a candidate pool; here the pool is
the matrix itself, so a plan holds only cells the matrix has, its excludes already applied.
It covers every tuple by construction: it stops only when none is left uncovered, and each
tuple came from a cell it may choose (:func:`missing` checks a plan; the property test in
``tests/unit/test_cover.py`` checks it on random matrices with excludes).  Ties between cells
of equal gain are broken by a permutation drawn from ``seed``: the plan is the same for the
same matrix and seed.

allpairspy was weighed and not taken: it generates rows from a product of parameter lists and
honours excludes only through a filter callback, which leaves pairs uncovered (its README's own
filtering example lacks pairs: thombashi/allpairspy issue 2, open, its fix in pull request 10
not merged), and it has no notion of cells with different axes (probes, commands and swaps of
one matrix).

A rotation (``--rotate K``) is K plans, each a covering plan of the whole matrix, that
prefer cells no earlier night took; the cells no night's plan took are then dealt to the
nights with the fewest, so the union of the K nights is every cell.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Hashable, Iterable, Sequence

from cumatrix.core.model import Cell, Matrix
from cumatrix.core.planned import Selection
from cumatrix.load import matrix as _matrix
from cumatrix.predict.oracle import build_failure

#: The axes of a cell a covering plan pairs, in the order of a cell id's parts.
AXES = ("kind", "runtime", "driver", "variant", "family", "build", "workload", "case")

Row = Sequence[tuple[str, Hashable]]


def cell_row(cell: Cell) -> tuple[tuple[str, str], ...]:
    """The ``(axis, value)`` pairs of a cell that a plan covers."""
    axes = cell.axes()
    return tuple((a, axes[a]) for a in AXES if a in axes)


def tuples_of(row: Row, strength: int) -> list[tuple[tuple[str, Hashable], ...]]:
    """The tuples of values ``row`` holds: its ``strength``-subsets, or itself when it has
    fewer values."""
    items = tuple(sorted(row, key=lambda kv: kv[0]))
    return list(itertools.combinations(items, min(strength, len(items)))) if items else []


def _encoded(rows: Sequence[Row], strength: int) -> list[list[tuple[int, ...]]]:
    """Each row's tuples, its values numbered first (tuples of small ints hash fast); a row's
    tuples are distinct, since its axes are."""
    ids: dict[tuple[str, Hashable], int] = {}
    out = []
    for row in rows:
        values = sorted(ids.setdefault(kv, len(ids)) for kv in row)
        out.append(list(itertools.combinations(values, min(strength, len(values)))) if values else [])
    return out


def _greedy(tups: Sequence[Sequence[tuple[int, ...]]], uncovered: set[tuple[int, ...]], rank: Sequence[int],
            candidates: Iterable[int]) -> list[int]:
    """Greedy set cover of ``uncovered`` (changed in place) by rows of ``candidates``: the row
    holding the most uncovered tuples first, ties to the lower ``rank``.  Lazy: a row's gain
    only falls as others are chosen, so a stale gain (at first, all its tuples) is an upper
    bound, refreshed when it tops the heap."""
    heap = [(-len(tups[i]), rank[i], i) for i in candidates]
    heapq.heapify(heap)
    chosen: list[int] = []
    while heap and uncovered:
        neg, r, i = heapq.heappop(heap)
        gain = len(uncovered.intersection(tups[i]))
        if gain == 0:
            continue
        if gain != -neg:
            heapq.heappush(heap, (-gain, r, i))
            continue
        chosen.append(i)
        uncovered.difference_update(tups[i])
    return chosen


def _prune(tups: Sequence[Sequence[tuple[int, ...]]], chosen: list[int]) -> list[int]:
    """Drop chosen rows whose every tuple another chosen row holds (the latest chosen first:
    the greedy's last picks are its least useful)."""
    held: dict[tuple[int, ...], int] = {}
    for i in chosen:
        for t in tups[i]:
            held[t] = held.get(t, 0) + 1
    dropped = set()
    for i in reversed(chosen):
        if all(held[t] > 1 for t in tups[i]):
            dropped.add(i)
            for t in tups[i]:
                held[t] -= 1
    return [i for i in chosen if i not in dropped]


def _rank(n: int, seed: int) -> list[int]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    rank = [0] * n
    for pos, i in enumerate(order):
        rank[i] = pos
    return rank


def cover(rows: Sequence[Row], strength: int, seed: int = 0) -> list[int]:
    """The indices (ascending) of a covering plan of strength ``strength`` of ``rows``."""
    tups = _encoded(rows, strength)
    uncovered = {t for ts in tups for t in ts}
    chosen = _greedy(tups, uncovered, _rank(len(rows), seed), range(len(rows)))
    return sorted(_prune(tups, chosen))


def rotation(rows: Sequence[Row], nights: int, strength: int, seed: int = 0,
             also: Sequence[int] = ()) -> list[list[int]]:
    """``nights`` plans (indices, ascending), each covering every ``strength``-tuple of
    ``rows[i]`` for ``i`` not in ``also``, whose union is every index of ``rows``.

    ``also``: rows no plan needs for its tuples (cells that cannot be built) that must still run
    on some night."""
    skip = set(also)
    tups = _encoded(rows, strength)
    every = {t for i, ts in enumerate(tups) if i not in skip for t in ts}
    rank = _rank(len(rows), seed)
    runnable = [i for i in range(len(rows)) if i not in skip]
    taken: set[int] = set()
    plans: list[list[int]] = []
    for _ in range(nights):
        uncovered = set(every)
        fresh = [i for i in runnable if i not in taken]
        # the cells no earlier night ran first, then any cell for what they leave uncovered
        chosen = _greedy(tups, uncovered, rank, fresh)
        chosen += _greedy(tups, uncovered, rank, runnable)
        plan = sorted(_prune(tups, chosen))
        taken.update(plan)
        plans.append(plan)
    _spread(plans, rank)
    return [sorted(p) for p in plans]


def _spread(plans: list[list[int]], rank: Sequence[int]) -> None:
    """Add each index of ``rank`` that no plan holds yet, in ``rank`` order, to the night with
    the fewest cells then, the earliest of equals."""
    taken = {i for p in plans for i in p}
    for i in sorted((i for i in range(len(rank)) if i not in taken), key=lambda i: rank[i]):
        j = min(range(len(plans)), key=lambda n: (len(plans[n]), n))
        plans[j].append(i)


def missing(rows: Sequence[Row], chosen: Sequence[int], strength: int) -> set[tuple[tuple[str, Hashable], ...]]:
    """The tuples of ``rows`` no row of ``chosen`` holds (empty: ``chosen`` covers them)."""
    need = {t for row in rows for t in tuples_of(row, strength)}
    for i in chosen:
        need.difference_update(tuples_of(rows[i], strength))
    return need


def buildable(cell: Cell) -> bool:
    """Whether the cell's program can be built at all (a direct-link variant cannot compile
    against headers that lack or redefine its call: it fails the same on every host, so it
    pairs with nothing)."""
    return build_failure(cell) is None


def choose(m: Matrix, cells: Sequence[Cell] | None, sel: Selection) -> list[Cell]:
    """The cells of ``m`` (``cells``: its expansion, when at hand) that ``sel`` runs, in matrix
    order: every cell, a covering plan of the cells that can be built, or one night of a
    rotation (whose nights together run every cell)."""
    every = list(_matrix.cells(m) if cells is None else cells)
    if sel.full:
        return every
    strength = sel.strength or 2
    if sel.rotate is not None:
        return _night(every, sel.rotate, sel.slot or 0, strength, sel.seed)
    pool = [c for c in every if buildable(c)]
    return [pool[i] for i in cover([cell_row(c) for c in pool], strength, sel.seed)]


def _night(every: list[Cell], nights: int, slot: int, strength: int, seed: int) -> list[Cell]:
    """Night ``slot`` of a rotation over ``nights`` of ``every`` (cells that cannot be built run
    on some night but pair with nothing)."""
    rows = [cell_row(c) for c in every]
    unbuilt = [i for i, c in enumerate(every) if not buildable(c)]
    plans = rotation(rows, nights, strength, seed, also=unbuilt)
    return [every[i] for i in plans[slot]]


def packing_bound(rows: Sequence[Row], strength: int) -> int:
    """A lower bound on the size of any covering plan of ``rows``: a set of tuples no row holds
    two of (each needs a row of its own), grown greedily from the tuples the fewest rows hold."""
    tups = _encoded(rows, strength)
    holders: dict[tuple[int, ...], list[int]] = {}
    for i, ts in enumerate(tups):
        for t in ts:
            holders.setdefault(t, []).append(i)
    used: set[int] = set()
    n = 0
    for t in sorted(holders, key=lambda t: (len(holders[t]), t)):
        if not any(i in used for i in holders[t]):
            used.update(holders[t])
            n += 1
    return n

"""pytest-xdist scheduling by units of :func:`cumatrix.front.schedule.plan`.

:class:`CellUnitScheduling` implements xdist's public scheduler protocol
(``xdist.scheduler.Scheduling``, what ``pytest_xdist_make_scheduler`` returns) on its own,
using only the public calls of a worker controller (``send_runtest_some``, ``shutdown``,
``shutting_down``).  It hands a unit (the cells that provision the same things) to one
worker as a whole, largest units first, as xdist's ``loadscope --loadscope-reorder`` does
with scopes; a worker is topped up when two or fewer of its cells are left.  A crashed
worker's cell is reported by xdist as failed and the rest of its units go back to the queue:
no other cell's result is lost.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

#: A worker is given its next unit when this many of its cells (or fewer) are left.
LOW_WATER = 2


class CellUnitScheduling:
    """Scheduling by unit: every cell of a unit runs on the one worker the unit is given."""

    def __init__(self, config: pytest.Config, log: Any, units: Mapping[str, str]) -> None:
        self.config = config
        self.log = log
        self.units = units
        self.numnodes = len(config.getoption("tx") or ())
        self.collection: list[str] | None = None
        self.workqueue: dict[str, dict[str, bool]] = {}
        self.assigned: dict[Any, dict[str, dict[str, bool]]] = {}
        self.collections: dict[Any, list[str]] = {}

    # ------------------------------------------------------------------ the protocol's state

    @property
    def nodes(self) -> list[Any]:
        """Every worker still taking cells."""
        return list(self.assigned)

    @property
    def collection_is_completed(self) -> bool:
        """Every worker started has reported what it collected."""
        return len(self.collections) >= self.numnodes

    @property
    def tests_finished(self) -> bool:
        """Every unit handed out, and no worker with more than its last cells to run."""
        if not self.collection_is_completed or self.workqueue:
            return False
        return all(_pending(work) < LOW_WATER for work in self.assigned.values())

    @property
    def has_pending(self) -> bool:
        """A cell waits, in the queue or on a worker."""
        return bool(self.workqueue) or any(_pending(work) for work in self.assigned.values())

    def unit_of(self, nodeid: str) -> str:
        """A cell's unit; an item that is no cell (or was not planned) is a unit of its own."""
        unit = self.units.get(nodeid.rpartition("::")[2])
        return nodeid if unit is None else unit

    # ------------------------------------------------------------------ workers

    def add_node(self, node: Any) -> None:
        """A worker is up: it takes units from now on."""
        self.assigned[node] = {}

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        """What a worker collected; a late worker whose collection differs gets nothing."""
        if self.collection_is_completed and self.collection is not None and list(collection) != self.collection:
            self.log(f"{getattr(node.gateway, 'id', node)} collected other items: not used")
            return
        self.collections[node] = list(collection)

    def remove_node(self, node: Any) -> str | None:
        """A worker ended (done, or crashed); returns the cell it was running when it crashed.
        Its cells not yet run go back to the queue, in their units."""
        work = self.assigned.pop(node)
        crashed = next(_not_done(work), None)
        if crashed is None:
            return None
        for unit, cells in work.items():
            left = {nid: False for nid, done in cells.items() if not done and nid != crashed}
            if left:
                self.workqueue[unit] = left
        self._top_up_all()
        return crashed

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:  # noqa: ARG002
        """A worker finished a cell (how long it took does not change where the next unit goes)."""
        nodeid = self.collections[node][item_index]
        self.assigned[node][self.unit_of(nodeid)][nodeid] = True
        self._top_up(node)

    def mark_test_pending(self, item: str) -> None:
        """Not used by xdist's ``--dist load`` family; refused as xdist's scope scheduler does."""
        raise NotImplementedError

    def remove_pending_tests_from_node(self, node: Any, indices: Sequence[int]) -> None:
        """Work stealing only; refused as xdist's scope scheduler does."""
        raise NotImplementedError

    # ------------------------------------------------------------------ handing out units

    def schedule(self) -> None:
        """Build the queue of units (largest first) once every worker has collected, and give
        each worker its first units; later calls only top workers up."""
        if self.collection is not None:
            self._top_up_all()
            return
        collection = self._take_collection()
        if not collection:
            return
        units: dict[str, dict[str, bool]] = {}
        for nodeid in collection:
            units.setdefault(self.unit_of(nodeid), {})[nodeid] = False
        self.workqueue = dict(sorted(units.items(), key=lambda kv: -len(kv[1])))
        for _ in range(max(0, len(self.nodes) - len(self.workqueue))):  # more workers than units
            idle, _work = self.assigned.popitem()
            idle.shutdown()
        for node in self.nodes:
            self._give(node)
        self._top_up_all()
        if not self.workqueue:
            for node in self.nodes:
                node.shutdown()

    def _take_collection(self) -> list[str]:
        """The collection every worker made, kept as the run's; empty (nothing to hand out)
        when the workers differ or collected nothing."""
        collections = list(self.collections.values())
        if any(c != collections[0] for c in collections[1:]):
            self.log("**Different tests collected, aborting run**")
            return []
        self.collection = collections[0]
        return self.collection

    def _top_up_all(self) -> None:
        for node in self.nodes:
            self._top_up(node)

    def _give(self, node: Any) -> None:
        unit = next(iter(self.workqueue))
        cells = self.workqueue.pop(unit)
        self.assigned[node][unit] = cells
        index = {nid: i for i, nid in enumerate(self.collections[node])}
        node.send_runtest_some([index[nid] for nid, done in cells.items() if not done])

    def _top_up(self, node: Any) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if _pending(self.assigned[node]) <= LOW_WATER:
            self._give(node)


def _not_done(work: Mapping[str, Mapping[str, bool]]) -> Iterator[str]:
    """The cells of ``work`` a worker has not finished, in the order it was given them."""
    return (nid for unit in work.values() for nid, done in unit.items() if not done)


def _pending(work: Mapping[str, Mapping[str, bool]]) -> int:
    return sum(1 for unit in work.values() for done in unit.values() if not done)

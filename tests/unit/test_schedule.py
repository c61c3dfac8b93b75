"""Which cells share an xdist worker: grouped by what they provision, never starving a worker."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from cumatrix.front.schedule import GROUPS_PER_WORKER, plan, provision_key
from cumatrix.load import matrix as _matrix


def _cells(groups: dict[str, int]) -> list[tuple[str, str]]:
    return [(f"{key}/c{i}", key) for key, n in groups.items() for i in range(n)]


def test_one_group_is_plain_load() -> None:
    p = plan(_cells({"rt|-|host": 1000}), workers=2)
    assert p.units is None
    assert "plain load" in p.reason


def test_too_few_groups_for_the_workers_is_plain_load() -> None:
    groups = {f"rt{g}|-|host": 10 for g in range(GROUPS_PER_WORKER * 2 - 1)}
    assert plan(_cells(groups), workers=2).units is None
    assert plan(_cells(groups), workers=1).units is None


def test_enough_groups_keep_each_group_together() -> None:
    groups = {f"rt{g}|-|host": 10 for g in range(GROUPS_PER_WORKER * 2)}
    cells = _cells(groups)
    p = plan(cells, workers=2)
    assert p.units is not None
    assert set(p.units) == {cid for cid, _ in cells}
    assert all(p.units[cid] == key for cid, key in cells)


def test_a_big_group_is_cut_so_no_worker_waits_long() -> None:
    groups = {"big|12.8|host": 900, **{f"rt{g}|12.8|emulated-12.4": 5 for g in range(GROUPS_PER_WORKER * 2)}}
    cells = _cells(groups)
    workers = 2
    p = plan(cells, workers=workers)
    assert p.units is not None
    cap = math.ceil(len(cells) / (GROUPS_PER_WORKER * workers))
    sizes = Counter(p.units.values())
    assert max(sizes.values()) <= cap  # a worker's idle tail is at most one unit
    keys = dict(cells)
    for unit in sizes:  # a unit never mixes what its cells provision
        assert len({keys[cid] for cid, u in p.units.items() if u == unit}) == 1
    assert sum(1 for u in sizes if u.startswith("big|")) == math.ceil(900 / cap)


def test_provision_key_of_matrix_cells(write_matrix: Callable[..., Path]) -> None:
    path = write_matrix("""
runtimes:
  a: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
  b: {wheel: nvidia-cuda-runtime-cu12==12.8.90}
drivers: [host, emulated-12.4]
probe: false
cases:
  - {name: one, argv: ["true"]}
  - {name: two, argv: ["true"]}
""")
    cells = {c.id: provision_key(c) for c in _matrix.cells(_matrix.load(path))}
    assert cells["a/host/one"] == cells["a/host/two"]  # the case is not provisioned
    assert cells["a/host/one"] != cells["b/host/one"]  # the runtime is
    assert cells["a/host/one"] != cells["a/emulated-12.4/one"]  # so is an emulated driver

"""Which cells run on the same pytest-xdist worker.

A worker provisions what its cells need once per process (a runtime's library and
version, the headers of a build, an emulated driver's interposer), so cells that share
what they provision are best kept on one worker.  Keeping them together costs balance:
xdist hands out a group as one unit, so a worker can sit idle while another finishes a
big group.  The rule, as data:

* fewer than :data:`GROUPS_PER_WORKER` groups per worker: no grouping (plain ``load``
  scheduling); every worker provisions every group, and neither starves;
* otherwise one unit per group, a group larger than ``cells / (GROUPS_PER_WORKER x
  workers)`` cut into consecutive units of at most that size.  Units are handed out
  largest first as workers free up, so a worker's idle tail is at most one unit:
  ``1 / GROUPS_PER_WORKER`` of its share of the run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cumatrix.core.model import Cell

#: Groups (units) per worker below which grouping could starve a worker; also the bound on
#: a unit's size (a worker's share / this), and so on the idle tail (a quarter of a share).
GROUPS_PER_WORKER = 4


@dataclass(frozen=True, slots=True)
class Plan:
    """Where cells go: ``units`` maps a cell id to its unit; ``None``: plain load scheduling."""

    units: Mapping[str, str] | None
    reason: str


def provision_key(cell: Cell) -> str:
    """What a cell provisions in its worker: runtime, build headers, driver (emulated or host)."""
    return f"{cell.runtime}|{cell.build or '-'}|{cell.driver}"


def plan(cells: Iterable[tuple[str, str]], workers: int) -> Plan:
    """Units for ``cells`` (``(cell id, provision key)`` in run order) on ``workers`` workers."""
    members: dict[str, list[str]] = {}
    total = 0
    for cid, key in cells:
        members.setdefault(key, []).append(cid)
        total += 1
    if workers < 2:
        return Plan(None, "one worker")
    if len(members) < GROUPS_PER_WORKER * workers:
        return Plan(None, f"{len(members)} provisioning group(s) for {workers} workers: plain load "
                          f"(grouping needs {GROUPS_PER_WORKER * workers})")
    cap = max(1, math.ceil(total / (GROUPS_PER_WORKER * workers)))
    units: dict[str, str] = {}
    for key, ids in members.items():
        for i, cid in enumerate(ids):
            units[cid] = key if len(ids) <= cap else f"{key}#{i // cap}"
    n_units = len(set(units.values()))
    return Plan(units, f"{len(members)} provisioning groups in {n_units} units of at most {cap} cells")

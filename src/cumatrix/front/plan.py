"""Spread one matrix over the hosts it names, for a CI system's own matrix feature.

Cells on the ``host`` driver run on every host: each host's real driver is a different
data point.  Each emulated driver runs once, on the host with the oldest real driver
that can emulate it (an interposer can only hide what the real driver has).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cumatrix.core.errors import ConfigError, Problem
from cumatrix.core.model import Cell, CudaVersion, Host, Matrix
from cumatrix.core.planned import PlannedCells, Selection, planned_from_json, selection_from_json
from cumatrix.load import matrix as _matrix
from cumatrix.predict.oracle import cuda_for_driver

__all__ = ["PlannedCells", "assign", "github_matrix", "host_cuda", "plan", "planned_cells", "planned_from_json",
           "recorded_selection", "selection_args"]


def host_cuda(h: Host) -> CudaVersion:
    """The newest CUDA the host's driver supports (its ``cuda:`` key, else NVIDIA's table)."""
    return h.cuda or cuda_for_driver(h.driver)


def assign(m: Matrix, path: Path | str, cells: list[Cell] | None = None) -> list[tuple[Host, list[str]]]:
    """Each host of ``m.hosts`` (oldest driver first) with the drivers it runs.

    Raises :class:`ConfigError` when the matrix has no hosts, a driver no host can emulate,
    or a host that would run nothing.
    """
    if not m.hosts:
        raise ConfigError([Problem(str(path), 1, 1, "plan needs a `hosts:` section (name: {driver: '580.159', label: RUNNER})")])
    drivers_used = {c.driver for c in (_matrix.cells(m) if cells is None else cells)}
    hosts = sorted(m.hosts, key=lambda h: (host_cuda(h), h.name))
    chosen = _drivers_of_hosts(m, hosts, drivers_used, path)
    idle = [h.name for h in hosts if not chosen[h.name]]
    if idle:
        raise ConfigError([Problem(str(path), 1, 1, f"host {n!r} runs no cell of this matrix: remove it, or add drivers it should run")
                           for n in idle])
    return [(h, chosen[h.name]) for h in hosts]


def _drivers_of_hosts(m: Matrix, hosts: list[Host], drivers_used: set[str], path: Path | str) -> dict[str, list[str]]:
    """Each host's drivers (``hosts`` oldest first): ``host`` on every one, each emulated
    driver of the cells on the oldest host that can emulate it."""
    chosen: dict[str, list[str]] = {h.name: [] for h in hosts}
    if "host" in drivers_used:
        for h in hosts:
            chosen[h.name].append("host")
    for d in m.drivers:
        if d.emulated is None or d.name not in drivers_used:
            continue
        able = [h for h in hosts if host_cuda(h) >= d.emulated]
        if not able:
            raise ConfigError([Problem(str(path), 1, 1, f"no host can emulate {d.name}: every host's driver is older")])
        chosen[able[0].name].append(d.name)
    return chosen


def _selected(m: Matrix, cells: list[Cell] | None, selection: Selection | None) -> list[Cell]:
    """The cells of ``m`` a run with ``selection`` takes (every cell without one)."""
    cells = _matrix.cells(m) if cells is None else cells
    if selection is None or selection.full:
        return cells
    # deferred: the covering plans and the build rules they read, only for a run that asks
    from cumatrix.front.cover import choose

    return choose(m, cells, selection)


def plan(path: Path, selection: Selection | None = None) -> dict[str, Any]:
    """Which drivers and how many cells each host of the matrix at ``path`` runs (of the cells
    ``selection`` takes: a covering plan or a rotation's night; every cell without one)."""
    m = _matrix.load(path)
    cells = _selected(m, None, selection)
    entries = []
    for h, ds in assign(m, path, cells):
        ids = [c.id for c in cells if c.driver in ds]
        k = " or ".join(f"/{d}/" for d in ds)
        entries.append({"host": h.name, "runner": h.label, "driver": h.driver, "cuda": str(host_cuda(h)),
                        "drivers": ds, "k": k, "cells": len(ids),
                        **({"partition": h.partition} if h.partition else {}),
                        **({"constraint": h.constraint} if h.constraint else {})})
    out: dict[str, Any] = {"matrix": str(path), "matrix_sha256": m.sha256, "hosts": entries, "cells_total": len(cells)}
    if selection is not None and not selection.full:
        out["selection"] = selection.to_json()
        out["args"] = " ".join(selection_args(selection))
        out["cells_in_matrix"] = len(_matrix.cells(m))
    return out


def selection_args(selection: Selection) -> list[str]:
    """The ``cumatrix run`` words that take ``selection`` (empty for every cell)."""
    if selection.full:
        return []
    out = ["--cover", str(selection.strength), "--seed", str(selection.seed)]
    if selection.rotate is not None:
        out += ["--rotate", str(selection.rotate), "--night", str(selection.night)]
    return out


def planned_cells(m: Matrix, cells: list[Cell] | None = None, selection: Selection | None = None) -> PlannedCells:
    """The plan of ``m`` (its ``hosts:`` assignment), or every cell for any host when it has none;
    of the cells ``selection`` takes, when given (a covering plan leaves the others unplanned,
    not unrun)."""
    cells = _selected(m, cells, selection)
    if not m.hosts:
        return PlannedCells(matrix_sha256=m.sha256, hosts=((None, tuple(c.id for c in cells)),))
    return PlannedCells(matrix_sha256=m.sha256,
                        hosts=tuple((h.name, tuple(c.id for c in cells if c.driver in ds))
                                          for h, ds in assign(m, m.path, cells)))


def github_matrix(data: dict[str, Any]) -> dict[str, Any]:
    """The JSON for ``strategy.matrix`` (``fromJSON``): one include entry per host."""
    more = {"args": data["args"]} if data.get("args") else {}  # --cover ...: for the action's `args:`
    return {"include": [{"host": e["host"], "runner": e["runner"], "k": e["k"], "cuda": e["cuda"], **more}
                        for e in data["hosts"]]}


def recorded_selection(dirs: list[Path]) -> Selection | None:
    """The selection the runs in ``dirs`` recorded (their first run header's), for a merge that
    holds them against a matrix: the cells a covering plan left out are not cells unrun."""
    for d in dirs:
        try:
            with (d / "results.jsonl").open("rb") as f:
                head = json.loads(f.readline(1 << 20) or b"null")
        except (OSError, ValueError):
            continue
        if isinstance(head, dict) and head.get("type") == "run":
            sel = selection_from_json(head.get("selection"))
            if sel is not None:
                return sel
    return None

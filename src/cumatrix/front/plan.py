"""Spread one matrix over the hosts it names, for a CI system's own matrix feature.

Cells on the ``host`` driver run on every host: each host's real driver is a different
data point.  Each emulated driver runs once, on the host with the oldest real driver
that can emulate it (an interposer can only hide what the real driver has).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cumatrix.load import matrix as _matrix
from cumatrix.core.errors import ConfigError, Problem
from cumatrix.core.model import CudaVersion, Host
from cumatrix.predict.oracle import cuda_for_driver


def host_cuda(h: Host) -> CudaVersion:
    return h.cuda or cuda_for_driver(h.driver)


def plan(path: Path) -> dict[str, Any]:
    m = _matrix.load(path)
    if not m.hosts:
        raise ConfigError([Problem(str(path), 1, 1, "plan needs a `hosts:` section (name: {driver: '580.159', label: RUNNER})")])
    cells = _matrix.cells(m)
    drivers_used = {c.driver for c in cells}
    hosts = sorted(m.hosts, key=lambda h: (host_cuda(h), h.name))
    assign: dict[str, list[str]] = {h.name: [] for h in hosts}
    if "host" in drivers_used:
        for h in hosts:
            assign[h.name].append("host")
    for d in m.drivers:
        if d.emulated is None or d.name not in drivers_used:
            continue
        able = [h for h in hosts if host_cuda(h) >= d.emulated]
        if not able:
            raise ConfigError([Problem(str(path), 1, 1, f"no host can emulate {d.name}: every host's driver is older")])
        assign[able[0].name].append(d.name)
    idle = [h.name for h in hosts if not assign[h.name]]
    if idle:
        raise ConfigError([Problem(str(path), 1, 1, f"host {n!r} runs no cell of this matrix: remove it, or add drivers it should run")
                           for n in idle])
    entries = []
    for h in hosts:
        ds = assign[h.name]
        ids = [c.id for c in cells if c.driver in ds]
        k = " or ".join(f"/{d}/" for d in ds)
        entries.append({"host": h.name, "runner": h.label, "driver": h.driver, "cuda": str(host_cuda(h)),
                        "drivers": ds, "k": k, "cells": len(ids)})
    return {"matrix": str(path), "matrix_sha256": m.sha256, "hosts": entries, "cells_total": len(cells)}


def github_matrix(data: dict[str, Any]) -> dict[str, Any]:
    """The JSON for ``strategy.matrix`` (``fromJSON``): one include entry per host."""
    return {"include": [{"host": e["host"], "runner": e["runner"], "k": e["k"], "cuda": e["cuda"]} for e in data["hosts"]]}

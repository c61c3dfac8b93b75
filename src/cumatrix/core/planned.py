"""The cells a matrix means to run, and on which host: the plan a run records in its header.

The type crosses stages (the plugin writes it, the reports and a merge read it back); how a
plan is made from a matrix's ``hosts:`` is :mod:`cumatrix.front.plan`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannedCells:
    """The cells a matrix means to run, and where: what a run records so that a merge can
    tell a cell nobody ran from a cell nobody meant to run.

    ``hosts`` holds ``(host name, cell ids)`` per host of the plan, or one ``(None, every
    cell id)`` for a matrix without a ``hosts:`` section (any host may run them).
    """

    matrix_sha256: str
    hosts: tuple[tuple[str | None, tuple[str, ...]], ...]

    def to_json(self) -> dict[str, object]:
        """The ``plan`` object of a run header."""
        return {"matrix_sha256": self.matrix_sha256, "plan_id": self.plan_id,
                "hosts": [{"host": h, "cells": list(ids)} for h, ids in self.hosts]}

    @property
    def plan_id(self) -> str:
        """The plan's identity: the first 16 hex digits of the sha256 of its matrix digest and
        its host-to-cells assignment.  Two runs recorded the same plan exactly when their ids are
        equal, whatever else the matrix file holds."""
        body = json.dumps([self.matrix_sha256, [[h, list(ids)] for h, ids in self.hosts]], separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def for_host(self, name: str) -> tuple[str, ...] | None:
        """The cell ids the plan gives host ``name``; None when it names no such host."""
        return next((ids for h, ids in self.hosts if h == name), None)

    @property
    def host_names(self) -> tuple[str, ...]:
        return tuple(h for h, _ in self.hosts if h is not None)


def _is_host_entry(e: object) -> bool:
    """Whether ``e`` is one host's part of a plan: ``{"host": str | None, "cells": [str, ...]}``."""
    return (isinstance(e, dict) and (e.get("host") is None or isinstance(e.get("host"), str))
            and isinstance(e.get("cells"), list) and all(isinstance(c, str) for c in e["cells"]))


def planned_from_json(obj: object) -> PlannedCells | None:
    """A run header's ``plan`` object read back; None when it is absent or not of that shape."""
    if not isinstance(obj, dict) or not isinstance(obj.get("matrix_sha256"), str) or not isinstance(obj.get("hosts"), list):
        return None
    hosts = []
    for e in obj["hosts"]:
        if not _is_host_entry(e):
            return None
        hosts.append((e.get("host"), tuple(e["cells"])))
    return PlannedCells(matrix_sha256=obj["matrix_sha256"], hosts=tuple(hosts))

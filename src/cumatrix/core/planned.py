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


@dataclass(frozen=True, kw_only=True, slots=True)
class Selection:
    """Which cells of a matrix a run takes: every cell (the default), a covering plan
    (``--cover T``: every T-tuple of axis values in at least one cell), or night ``night``
    of a rotation of ``rotate`` such plans whose union is every cell (``--rotate K --night I``).

    ``night`` is kept as given; the plan is night ``night % rotate`` (so a day number works).
    """

    strength: int | None = None  # None: every cell
    seed: int = 0
    rotate: int | None = None
    night: int | None = None

    @property
    def full(self) -> bool:
        """Every cell of the matrix (no covering plan, no rotation)."""
        return self.strength is None and self.rotate is None

    @property
    def slot(self) -> int | None:
        """The rotation's plan this night runs (0 to rotate-1); None without a rotation."""
        return None if self.rotate is None or self.night is None else self.night % self.rotate

    def label(self) -> str:
        """How a record names the plan that chose its cell: ``cover 2, seed 0`` or
        ``rotation 3 of 7, cover 2, seed 0``."""
        if self.full:
            return "all"
        head = f"rotation {self.slot} of {self.rotate}, " if self.rotate is not None else ""
        return f"{head}cover {self.strength}, seed {self.seed}"

    def to_json(self) -> dict[str, object]:
        """The ``selection`` object of a run header (and of the history's runs)."""
        return {"cover": self.strength if self.strength is not None else "all", "seed": self.seed,
                "rotate": self.rotate, "night": self.night, "slot": self.slot, "label": self.label()}


def _whole(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _none_or_whole(v: object) -> bool:
    return v is None or _whole(v)


def _int_or_none(v: object) -> int | None:
    return int(str(v)) if v is not None else None


def selection_from_json(obj: object) -> Selection | None:
    """A run header's ``selection`` read back; None when absent or not of that shape."""
    if not isinstance(obj, dict):
        return None
    cover, seed, rotate, night = obj.get("cover"), obj.get("seed", 0), obj.get("rotate"), obj.get("night")
    if not (cover == "all" or _whole(cover)) or not _whole(seed) or not _none_or_whole(rotate) \
            or not _none_or_whole(night):
        return None
    return Selection(strength=None if cover == "all" else int(str(cover)), seed=int(str(seed)),
                     rotate=_int_or_none(rotate), night=_int_or_none(night))


def parse_selection(cover: str | None, seed: int | None, rotate: int | None, night: int | None) -> Selection:
    """``--cover``, ``--seed``, ``--rotate``, ``--night`` as given (None: not given) into a
    :class:`Selection`; :class:`ValueError` with the message for bad input."""
    strength = _strength(cover)
    if rotate is not None:
        _check_rotation(cover, rotate, night)
        strength = 2 if strength is None else strength
    elif night is not None:
        raise ValueError("--night goes with --rotate K")
    if seed is not None and seed < 0:
        raise ValueError(f"--seed {seed}: must be 0 or more")
    return Selection(strength=strength, seed=seed or 0, rotate=rotate, night=night)


def _strength(cover: str | None) -> int | None:
    """``--cover`` as given: None for every cell (not given, or ``all``)."""
    if cover is None or cover == "all":
        return None
    try:
        strength = int(cover)
    except ValueError:
        raise ValueError(f"--cover {cover}: give 2 (every pair of axis values), 3 (triples), any "
                         "whole number of 1 or more, or all") from None
    if strength < 1:
        raise ValueError(f"--cover {cover}: must be 1 or more, or all")
    return strength


def _check_rotation(cover: str | None, rotate: int, night: int | None) -> None:
    """ValueError where ``--rotate`` goes with a ``--night`` and ``--cover`` it cannot run."""
    if rotate < 1:
        raise ValueError(f"--rotate {rotate}: must be 1 or more (the nights a full matrix is spread over)")
    if night is None:
        raise ValueError(f"--rotate {rotate} needs --night I: the night of the rotation to run "
                         "(taken modulo the rotation, so a day number works)")
    if night < 0:
        raise ValueError(f"--night {night}: must be 0 or more")
    if cover == "all":
        raise ValueError("--rotate with --cover all: each night of a rotation is a covering plan; "
                         "give --cover 2 or 3 (2 is the default with --rotate)")

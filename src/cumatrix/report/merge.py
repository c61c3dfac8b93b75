"""Combine the runs of several hosts over one matrix into one report."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cumatrix.core.errors import ConfigError
from cumatrix.report.records import CellResult, RunData, RunInfo, load_records


def merge_runs(dirs: list[Path], *, host_names: list[str] | None = None) -> RunData:
    """Merge the ``results.jsonl`` of each directory into one :class:`RunData`.

    Every run must be of the same matrix (by sha256), else :class:`ConfigError` naming
    both files and hashes.  Each cell is tagged with its host: ``host_names[i]`` when
    given, else the run header's ``host``, else the directory name.  A cell run by several
    hosts keeps one record per host; a cell of the matrix that no host ran is ``not run``.
    """
    if not dirs:
        raise ConfigError("merge: no run directories given")
    if host_names is not None and len(host_names) != len(dirs):
        raise ConfigError(f"merge: {len(host_names)} host names for {len(dirs)} run directories")

    loaded = [_load(d, host_names[i] if host_names else None) for i, d in enumerate(dirs)]
    _check_same_matrix(loaded)
    _check_distinct_hosts(loaded)
    return _combine(loaded)


def _load(d: Path, host: str | None) -> tuple[Path, RunData, str]:
    jsonl = d / "results.jsonl"
    if not jsonl.is_file():
        raise ConfigError(f"{d}: no results.jsonl here (is it a cumatrix --out directory?)")
    run = load_records(jsonl)
    return jsonl, run, host or run.header.host or d.resolve().name


def _check_same_matrix(loaded: list[tuple[Path, RunData, str]]) -> None:
    first_file, first, _ = loaded[0]
    for jsonl, run, _ in loaded:
        for info in run.runs:
            if info.matrix_sha256 != first.header.matrix_sha256:
                raise ConfigError(
                    "merge: runs of different matrices cannot be merged: "
                    f"{first_file} ran {first.header.matrix} (sha256 {first.header.matrix_sha256}), "
                    f"{jsonl} ran {info.matrix} (sha256 {info.matrix_sha256}); "
                    "merge only runs of the same matrix file"
                )


def _check_distinct_hosts(loaded: list[tuple[Path, RunData, str]]) -> None:
    seen: dict[str, Path] = {}
    for jsonl, _, host in loaded:
        if host in seen:
            raise ConfigError(f"merge: {seen[host]} and {jsonl} are both host {host!r}; name the hosts apart")
        seen[host] = jsonl


def _combine(loaded: list[tuple[Path, RunData, str]]) -> RunData:
    runs: list[RunInfo] = []
    cells: list[CellResult] = []
    order: dict[str, int] = {}
    ran: set[str] = set()
    warnings: list[str] = []
    extra = []
    for _, run, host in loaded:
        runs += [replace(info, host=host) for info in run.runs]
        for cid in (c for info in run.runs for c in info.cells):
            order.setdefault(cid, len(order))
        for cell in run.cells:
            order.setdefault(cell.id, len(order))
            ran.add(cell.id)
            cells.append(replace(cell, host=host))
        warnings += run.warnings
        extra += list(run.extra)
    hosts = [h for _, _, h in loaded]
    cells.sort(key=lambda c: (order[c.id], hosts.index(c.host or "")))
    return RunData(runs=tuple(runs), cells=tuple(cells), not_run=tuple(cid for cid in order if cid not in ran),
                   warnings=tuple(warnings), extra=tuple(extra), hosts=tuple(hosts))

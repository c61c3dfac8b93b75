"""Combine the runs of several hosts over one matrix into one report."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from cumatrix.core.errors import ConfigError, CumatrixError
from cumatrix.core.planned import PlannedCells
from cumatrix.results import recordkey
from cumatrix.results.records import CellResult, RunData, RunInfo, load_records


def merge_runs(dirs: list[Path], *, host_names: list[str] | None = None,
               plan: PlannedCells | None = None, submission: str | None = None,
               notes: Mapping[str, str] | None = None) -> RunData:
    """Merge the ``results.jsonl`` of each directory into one :class:`RunData`.

    Every run must be of the same matrix (by sha256), else :class:`ConfigError` naming
    both files and hashes.  Each cell is tagged with its host: ``host_names[i]`` when
    given, else the run header's ``host``, else the directory name.  A cell run by several
    hosts keeps one record per host.

    What should have run comes from ``plan`` (``merge --matrix``), else from the plan the
    runs recorded, else from the cells their headers list.  Every planned cell that its host
    did not run is ``not run``, with that host; a host of the plan with no run among ``dirs``
    is in ``missing_hosts``.

    ``submission`` (``merge --submission``): only runs that recorded that submission id (and,
    with ``plan``, that plan's id) are merged; a directory that holds another submission's
    results (last night's, left where tonight's task failed before it wrote any) is left out,
    its host not-run with the reason in the warnings, after its note in ``notes`` (``{host:
    what the scheduler says of its task}``).  :class:`NothingToMerge` when no run is left.
    """
    _check_arguments(dirs, host_names)
    loaded = [_load(d, host_names[i] if host_names else None) for i, d in enumerate(dirs)]
    refused = _refused(loaded, plan, submission, notes or {})
    loaded = [entry for entry in loaded if entry[2] not in refused]
    if not loaded:
        raise NothingToMerge("merge: no run to merge: " + "; ".join(f"host {h}: {why}" for h, why in refused.items()))
    _check_same_matrix(loaded)
    _check_distinct_hosts(loaded)
    run = _combine(loaded, _plan_of(loaded, plan))
    return replace(run, warnings=tuple(f"host {h} not-run: {why}" for h, why in refused.items()) + run.warnings)


def _check_arguments(dirs: list[Path], host_names: list[str] | None) -> None:
    if not dirs:
        raise ConfigError("merge: no run directories given")
    if host_names is not None and len(host_names) != len(dirs):
        raise ConfigError(f"merge: {len(host_names)} host names for {len(dirs)} run directories")


def _plan_of(loaded: list[tuple[Path, RunData, str]], plan: PlannedCells | None) -> PlannedCells | None:
    """The plan of the merge: ``plan`` (``merge --matrix``), which must be of the matrix the runs
    ran, else the first plan a run recorded, else none."""
    if plan is None:
        return next((info.plan for _, run, _ in loaded for info in run.runs if info.plan is not None), None)
    if plan.matrix_sha256 != loaded[0][1].header.matrix_sha256:
        first_file, first, _ = loaded[0]
        raise ConfigError(f"merge: --matrix has sha256 {plan.matrix_sha256}, but {first_file} ran {first.header.matrix} "
                          f"(sha256 {first.header.matrix_sha256}): name the matrix file these runs ran")
    return plan


class NothingToMerge(CumatrixError):
    """Every run given belongs to another submission or to a host that did not run: exit 1,
    each host named with its reason."""

    exit_code = 1


def _refused(loaded: list[tuple[Path, RunData, str]], plan: PlannedCells | None, submission: str | None,
             notes: Mapping[str, str]) -> dict[str, str]:
    """``{host: reason}`` of the runs that are not of this submission of this plan."""
    refused: dict[str, str] = {}
    for jsonl, run, host in loaded:
        why = _foreign(jsonl, run, plan, submission) if submission is not None else None
        if why is not None:
            refused[host] = f"{notes[host]}; {why}" if host in notes else why
    return refused


def _foreign(jsonl: Path, run: RunData, plan: PlannedCells | None, submission: str) -> str | None:
    for info in run.runs:
        if info.submission != submission:
            theirs = f"submission {info.submission}" if info.submission else "a run of no submission"
            return (f"{jsonl} holds the results of {theirs} (started {info.started or 'at an unknown time'}), "
                    f"not of submission {submission}")
        if plan is not None and info.plan is not None and info.plan.plan_id != plan.plan_id:
            return f"{jsonl} ran plan {info.plan.plan_id}, not this submission's plan {plan.plan_id}"
    return None


def _load(d: Path, host: str | None) -> tuple[Path, RunData, str]:
    jsonl = d / "results.jsonl"
    if not jsonl.is_file():
        raise ConfigError(f"{d}: no results.jsonl here (is it a cumatrix --out directory?)")
    run = load_records(jsonl)
    _check_names(jsonl, run)
    name = host or run.header.host or d.resolve().name
    _check_name(jsonl, "its host's name (the directory's)", name)
    unverified = _verify_seals(jsonl, name)
    if unverified:
        run = replace(run, warnings=(*run.warnings, unverified))
    return jsonl, run, name


def _verify_seals(jsonl: Path, host: str) -> str | None:
    """Verify every cell record of ``jsonl`` sealed with a key this user holds (its ``key_id``):
    one whose seal does not match is refused (:class:`ConfigError`, its line named).  Records
    sealed with another key (another machine's, another user's) or with none cannot be verified
    here: the warning returned says so, naming the host and the keys, for every report to show."""
    mine = recordkey.key_id()
    others: dict[str, int] = {}
    for n, line, rec in _cell_lines(jsonl):
        kid = rec.get(recordkey.KEY_ID_FIELD)
        if kid == mine:
            problem = recordkey.line_problem(line, rec)
            if problem is not None:
                cid = rec.get("id")
                raise ConfigError(f"{jsonl}:{n}: the record of cell {cid!r} names this user's key, but {problem}: "
                                  "refused; run the host's cells again")
            continue
        shown = _shown_key(kid)
        others[shown] = others.get(shown, 0) + 1
    if not others:
        return None
    n = sum(others.values())
    keys = ", ".join(f"{k} ({v})" for k, v in sorted(others.items()))
    return (f"host {host}: {n} record{'s' if n != 1 else ''} not verifiable here (sealed with key {keys}; this "
            f"user's key is {mine}): taken as the host wrote them")


def _cell_lines(jsonl: Path) -> Iterator[tuple[int, bytes, dict[str, object]]]:
    """``(line number, line, record)`` of each cell record of ``jsonl``."""
    with jsonl.open("rb") as f:
        for n, raw in enumerate(f, 1):
            line = raw.rstrip(b"\n")
            try:
                rec = json.loads(line)
            except ValueError:  # a line the loader read past (a run killed mid-write): nothing to verify
                continue
            if isinstance(rec, dict) and rec.get("type") == "cell":
                yield n, line, rec


def _shown_key(kid: object) -> str:
    """A record's key id as a warning names it."""
    if kid is None:
        return "none"
    return kid if isinstance(kid, str) and recordkey.KEY_ID_RE.fullmatch(kid) else "an unreadable key id"


#: A control character (C0, DEL, C1: a newline, a carriage return, a terminal escape) in a name.
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")


def _check_name(jsonl: Path, what: str, value: object) -> None:
    """A name from another host's results (a cell id, a host, a run id, an outcome word) goes
    into a Markdown table, a terminal line and an HTML page as one line: one that holds a
    newline or a control character is refused, named with the record that holds it."""
    if isinstance(value, str) and _CONTROL_RE.search(value):
        shown = repr(value if len(value) <= 100 else value[:100] + "...")
        raise ConfigError(f"{jsonl}: {what} {shown} holds a newline or a control character: refused (names in "
                          "results are one line of text; was the file written by cumatrix?)")


def _check_names(jsonl: Path, run: RunData) -> None:
    """Every name :func:`_check_name` guards, in the run headers and the cell records of ``jsonl``."""
    for info in run.runs:
        what = f"the run header of run {info.run_id!r}:"
        for field, value in (("run_id", info.run_id), ("host", info.host), ("matrix", info.matrix),
                             ("submission", info.submission), ("backend", info.backend), ("sandbox", info.sandbox),
                             ("started", info.started), ("harness_version", info.harness_version)):
            _check_name(jsonl, f"{what} {field}", value)
        for cid in info.cells:
            _check_name(jsonl, f"{what} the cell id", cid)
        for planned_host, ids in (info.plan.hosts if info.plan is not None else ()):
            _check_name(jsonl, f"{what} the planned host", planned_host)
            for cid in ids:
                _check_name(jsonl, f"{what} the planned cell id", cid)
    for cell in run.cells:
        what = f"the record of cell {cell.id!r}:"
        _check_name(jsonl, "the record of a cell: its id", cell.id)
        _check_name(jsonl, f"{what} host", cell.host)
        _check_name(jsonl, f"{what} observed outcome", cell.observed.outcome)
        for k, v in cell.axes.items():
            _check_name(jsonl, f"{what} axis", k)
            _check_name(jsonl, f"{what} axis {k}", v)
        for word in cell.expected.outcomes:
            _check_name(jsonl, f"{what} expected outcome", word)


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


def _combine(loaded: list[tuple[Path, RunData, str]], plan: PlannedCells | None) -> RunData:
    runs: list[RunInfo] = []
    cells: list[CellResult] = []
    order = _planned_order(plan)
    ran: set[tuple[str, str]] = set()
    warnings: list[str] = []
    extra = []
    for _, run, host in loaded:
        runs += [replace(info, host=host) for info in run.runs]
        _extend_order(order, run)
        for cell in run.cells:
            ran.add((cell.id, host))
            cells.append(replace(cell, host=host))
        warnings += run.warnings
        extra += list(run.extra)
    hosts = [h for _, _, h in loaded]
    cells.sort(key=lambda c: (order[c.id], hosts.index(c.host or "")))
    if plan is not None and plan.host_names:
        not_run, missing = _not_run_by_host(plan, hosts, ran, warnings)
    else:
        not_run, missing = _not_run_anywhere(loaded, plan, order, ran), []
    not_run.sort(key=lambda p: order[p[0]])
    return RunData(runs=tuple(runs), cells=tuple(cells), not_run=tuple(cid for cid, _ in not_run),
                   not_run_hosts=tuple(h for _, h in not_run), missing_hosts=tuple(missing), plan=plan,
                   warnings=tuple(warnings), extra=tuple(extra), hosts=tuple(hosts))


def _planned_hosts(plan: PlannedCells | None) -> tuple[tuple[str | None, tuple[str, ...]], ...]:
    """``(host, cell ids)`` of the plan; none without one."""
    return plan.hosts if plan is not None else ()


def _planned_order(plan: PlannedCells | None) -> dict[str, int]:
    """``{cell id: place}``: the merged cells are ordered as the plan lists them, then as the runs do."""
    order: dict[str, int] = {}
    for _, ids in _planned_hosts(plan):
        for cid in ids:
            order.setdefault(cid, len(order))
    return order


def _extend_order(order: dict[str, int], run: RunData) -> None:
    """Places for the cells ``run`` names that ``order`` has none for: its headers' cells, then its records'."""
    for cid in (c for info in run.runs for c in info.cells):
        order.setdefault(cid, len(order))
    for cell in run.cells:
        order.setdefault(cell.id, len(order))


def _not_run_by_host(plan: PlannedCells, hosts: list[str], ran: set[tuple[str, str]],
                     warnings: list[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """A plan that names hosts: each planned ``(cell, host)`` that host did not run, and the
    hosts of the plan with no run at all (a host outside the plan is warned of, in ``warnings``)."""
    planned_hosts = plan.host_names
    for h in hosts:
        if h not in planned_hosts:
            warnings.append(f"host {h!r} is not a host of the plan ({', '.join(planned_hosts)}); its cells are "
                            "merged as they are")
    missing = [h for h in planned_hosts if h not in hosts]
    not_run: list[tuple[str, str | None]] = []
    for planned_host, ids in plan.hosts:
        not_run += [(cid, planned_host) for cid in ids if (cid, planned_host or "") not in ran]
    return not_run, missing


def _not_run_anywhere(loaded: list[tuple[Path, RunData, str]], plan: PlannedCells | None, order: dict[str, int],
                      ran: set[tuple[str, str]]) -> list[tuple[str, str | None]]:
    """No hosts planned: each cell planned, or named by a run's header, that no host ran."""
    ran_ids = {cid for cid, _ in ran}
    any_host = {cid for _, ids in _planned_hosts(plan) for cid in ids}
    headers = {c for _, run, _ in loaded for info in run.runs for c in info.cells}
    wanted = any_host | headers
    return [(cid, None) for cid in order if cid not in ran_ids and cid in wanted]

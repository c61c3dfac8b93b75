"""The history of runs: one SQLite file that ``run``, ``merge`` and ``gate`` append to.

What ``cumatrix diff`` compares and the reports' "since the last run" section read.  One
file per user by default (:func:`default_path`), shared by every matrix: runs are told
apart by the digest of their matrix file.

Layout, kept small because a nightly of 10,000 cells is stored every night:

* ``runs``: one row per run (its run id, when, matrix and digest, host, harness version,
  the git commit of the checkout it ran from, pass/fail counts);
* ``cells`` and ``outcomes``: each cell id (with its host, for merged runs) and each outcome
  label stored once, referred to by number;
* ``results``: one short row per cell and run (status, outcome, GB/s, speedup);
* ``records``: the full :class:`~cumatrix.core.record.CellRecord` (its ``to_json``, zlib) only
  where it is news: a failed cell, or a cell whose status or outcome differs from its
  previous run of that matrix.  A cell that passes as it did last time, or passes in the first
  run of its matrix, keeps its short row; its full record is in that run's results.json.

Writers are serialised by SQLite itself: WAL mode, a busy timeout, and each append (or
prune, or migration) is one ``BEGIN IMMEDIATE`` transaction, so xdist controllers, several
merges and gates may append at once.  The schema is versioned with ``PRAGMA user_version``
and upgraded by the steps of :data:`MIGRATIONS`, in order.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from cumatrix.core.errors import UsageError
from cumatrix.core.planned import Selection, selection_from_json
from cumatrix.core.record import CellRecord, axes_from_id


class _HeaderToStore(Protocol):
    @property
    def run_id(self) -> str: ...
    @property
    def matrix(self) -> str: ...
    @property
    def matrix_sha256(self) -> str: ...
    @property
    def harness_version(self) -> str | None: ...
    @property
    def host(self) -> str | None: ...
    @property
    def host_fingerprint(self) -> Mapping[str, object]: ...
    @property
    def selection(self) -> Selection | None: ...


class RunToStore(Protocol):
    """What :meth:`History.append` reads of a run: :class:`cumatrix.results.records.RunData`
    has it all.  A protocol, not that class, because the records module names a history diff
    (:class:`cumatrix.results.historydiff.Diff`), which reads this module: importing it here
    would close a circle."""

    @property
    def header(self) -> _HeaderToStore: ...
    @property
    def hosts(self) -> tuple[str, ...]: ...
    @property
    def merged(self) -> bool: ...
    @property
    def cells(self) -> tuple[CellRecord, ...]: ...
    @property
    def started(self) -> str | None: ...
    @property
    def finished(self) -> str | None: ...
    @property
    def verdict(self) -> str: ...
    def not_run_where(self) -> list[tuple[str, str | None]]: ...

ENV = "CUMATRIX_HISTORY"
#: Seconds a writer waits for another's transaction before giving up.
BUSY_TIMEOUT_S = 60.0

#: Status codes of ``results.status``.
STATUS_CODES = {"pass": 0, "fail": 1, "skip": 2, "not-run": 3}
STATUS_NAMES = {v: k for k, v in STATUS_CODES.items()}
NOT_RUN = "not-run"

#: Schema steps; step ``n`` (1-based) takes a database of ``user_version`` n-1 to n.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE runs(
        id INTEGER PRIMARY KEY,
        run_uid TEXT NOT NULL,
        kind TEXT NOT NULL,
        recorded TEXT NOT NULL,
        started TEXT,
        finished TEXT,
        matrix TEXT NOT NULL,
        digest TEXT NOT NULL,
        host TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        harness_version TEXT,
        git_commit TEXT,
        verdict TEXT NOT NULL,
        n_pass INTEGER NOT NULL, n_fail INTEGER NOT NULL, n_skip INTEGER NOT NULL, n_not_run INTEGER NOT NULL);
    CREATE INDEX runs_by_digest ON runs(digest, id);
    CREATE TABLE cells(id INTEGER PRIMARY KEY, name TEXT NOT NULL, host TEXT NOT NULL, kind TEXT NOT NULL,
                       UNIQUE(name, host));
    CREATE TABLE outcomes(id INTEGER PRIMARY KEY, label TEXT NOT NULL UNIQUE);
    CREATE TABLE results(run INTEGER NOT NULL, cell INTEGER NOT NULL, status INTEGER NOT NULL,
                         outcome INTEGER NOT NULL, gbps REAL, speedup REAL,
                         PRIMARY KEY(run, cell)) WITHOUT ROWID;
    CREATE TABLE records(run INTEGER NOT NULL, cell INTEGER NOT NULL, body BLOB NOT NULL,
                         PRIMARY KEY(run, cell));
    """,
    # 2: the cells a run took of its matrix (a covering plan, a rotation's night; NULL: every
    # cell), so that `cumatrix untested` knows a rotation's cells are not due before its nights.
    """
    ALTER TABLE runs ADD COLUMN selection TEXT;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


class HistoryError(UsageError):
    """The history file cannot be used: not a history database, newer schema, unknown run (exit 2)."""


class HistoryLocked(HistoryError):
    """Another process holds the history's write lock past the busy timeout.  Not bad input:
    a run goes on without it (a warning), and records itself when the lock is released."""


def is_lock(e: sqlite3.Error) -> bool:
    return getattr(e, "sqlite_errorname", "") in ("SQLITE_BUSY", "SQLITE_LOCKED") or "locked" in str(e)


def lock_text(path: Path, waited: float) -> str:
    """What holds ``path``, as far as its side files tell: a rollback journal is a writer in
    rollback-journal mode mid-transaction; a WAL file, a writer in WAL mode."""
    journal, wal = path.with_name(path.name + "-journal"), path.with_name(path.name + "-wal")
    if journal.exists():
        holder = f"a writer in rollback-journal mode holds it (its journal {journal} is there)"
    elif wal.exists():
        holder = "another process holds its write lock (WAL mode)"
    else:
        holder = "another process holds a lock on it"
    return f"{path}: the history database is locked: {holder}; waited {waited:g} s"


def default_path() -> Path:
    """``$CUMATRIX_HISTORY``, else ``$XDG_DATA_HOME/cumatrix/history.sqlite``, else
    ``~/.local/share/cumatrix/history.sqlite``."""
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "cumatrix" / "history.sqlite"


def git_commit(cwd: Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the checkout ``cwd`` is in; None when it is none (or no git)."""
    try:
        p = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10,
                           check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    out = p.stdout.strip()
    return out if p.returncode == 0 and out else None


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredRun:
    """One row of ``runs``."""

    id: int
    run_uid: str
    kind: str
    recorded: str
    started: str | None
    finished: str | None
    matrix: str
    digest: str
    host: str
    fingerprint: Mapping[str, object]
    harness_version: str | None
    git_commit: str | None
    verdict: str
    passed: int
    failed: int
    skipped: int
    not_run: int
    #: The covering plan or rotation night the run took its cells from; None: every cell.
    selection: Selection | None = None

    def to_json(self) -> dict[str, object]:
        """The run as ``history --json`` and ``diff --json`` show it."""
        return {"id": self.id, "run_id": self.run_uid, "kind": self.kind, "recorded": self.recorded,
                "started": self.started, "finished": self.finished, "matrix": self.matrix,
                "matrix_sha256": self.digest, "host": self.host, "harness_version": self.harness_version,
                "git_commit": self.git_commit, "verdict": self.verdict,
                "counts": {"pass": self.passed, "fail": self.failed, "skip": self.skipped, "not_run": self.not_run},
                "selection": self.selection.to_json() if self.selection is not None else None}


@dataclass(frozen=True, kw_only=True, slots=True)
class CellKey:
    """A cell as the history names it: its id, and its host in merged runs ('' otherwise)."""

    name: str
    host: str = ""

    def __str__(self) -> str:
        return f"{self.name} on {self.host}" if self.host else self.name


class CellKeys(Mapping[int, CellKey]):
    """Cell number -> :class:`CellKey`, each made when first asked for (a diff names a few
    cells of thousands)."""

    def __init__(self, names: dict[int, tuple[str, str]]) -> None:
        self._names = names
        self._made: dict[int, CellKey] = {}

    def __getitem__(self, cid: int) -> CellKey:
        key = self._made.get(cid)
        if key is None:
            name, host = self._names[cid]
            key = self._made[cid] = CellKey(name=name, host=host)
        return key

    def __iter__(self) -> Iterator[int]:
        return iter(self._names)

    def numbers(self, keys: Iterable[CellKey]) -> set[int]:
        """The numbers of these cells (those stored)."""
        wanted = {(k.name, k.host) for k in keys}
        return {cid for cid, nh in self._names.items() if nh in wanted} if wanted else set()

    def __len__(self) -> int:
        return len(self._names)


@dataclass(frozen=True, kw_only=True, slots=True)
class Result:
    """One cell of one stored run."""

    status: str  # pass, fail, skip, not-run
    outcome: str  # the outcome label (ok:batch, crash:SIGSEGV, ...), "not-run"
    gbps: float | None
    speedup: float | None


_RUN_COLUMNS = ("id, run_uid, kind, recorded, started, finished, matrix, digest, host, fingerprint, "
                "harness_version, git_commit, verdict, n_pass, n_fail, n_skip, n_not_run, selection")


def _stored_run(row: tuple[Any, ...]) -> StoredRun:
    (rid, uid, kind, recorded, started, finished, matrix, digest, host, fp, version, commit, verdict,
     n_pass, n_fail, n_skip, n_not_run, selection) = row
    return StoredRun(id=int(rid), run_uid=str(uid), kind=str(kind), recorded=str(recorded), started=started,
                     finished=finished, matrix=str(matrix), digest=str(digest), host=str(host),
                     fingerprint=json.loads(str(fp)), harness_version=version, git_commit=commit, verdict=str(verdict),
                     passed=int(n_pass), failed=int(n_fail), skipped=int(n_skip), not_run=int(n_not_run),
                     selection=selection_from_json(json.loads(selection)) if selection else None)


class History:
    """An open history file.  Use :meth:`open` (a context manager)."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self.conn = conn

    @classmethod
    @contextmanager
    def open(cls, path: Path, *, create: bool = True, busy_timeout: float = BUSY_TIMEOUT_S) -> Iterator[History]:
        """Open (and create, migrate) the history at ``path``.

        :class:`HistoryError` (exit 2) for a path that is a directory, a file that is not a
        history database, or one written by a newer cumatrix; with ``create=False``, for a
        file that does not exist.  :class:`HistoryLocked` when another process holds it
        locked for longer than ``busy_timeout`` seconds, naming the lock.
        """
        if path.is_dir():
            raise HistoryError(f"--history {path}: is a directory; name a file")
        if not path.exists():
            if not create:
                raise HistoryError(f"{path}: no history here yet (run `cumatrix run` first, or name it with "
                                   f"--history or ${ENV})")
            _make_parent(path)
        try:
            conn = sqlite3.connect(str(path), timeout=busy_timeout, isolation_level=None)
        except sqlite3.Error as e:
            raise HistoryError(f"{path}: cannot open the history: {e}") from e
        try:
            hist = cls(path, conn)
            hist._setup(busy_timeout)
            yield hist
        finally:
            conn.close()

    def _setup(self, busy_timeout: float) -> None:
        try:
            self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            if self._version() < SCHEMA_VERSION:  # a reader of an up-to-date file takes no write lock
                with self._write():
                    version = self._version()  # again, under the lock: another process may have migrated
                    if version == 0 and self.conn.execute(
                            "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchone()[0]:
                        raise HistoryError(f"{self.path}: an SQLite file that is not a cumatrix history; "
                                           "name another file with --history")
                    for step in MIGRATIONS[version:]:
                        for statement in step.split(";"):
                            if statement.strip():
                                self.conn.execute(statement)
                    self.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            # WAL: readers (a report, a diff) never wait for a writer, and a writer's commit
            # is one append to the log.  Persistent, set once, outside a transaction.
            if self.conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.DatabaseError as e:
            if is_lock(e):  # a lock is not a sign of a foreign file: say what holds it
                raise HistoryLocked(lock_text(self.path, busy_timeout)) from e
            raise HistoryError(f"{self.path}: not a cumatrix history database ({e}); "
                               "name another file with --history") from e

    def _version(self) -> int:
        version = int(self.conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise HistoryError(f"{self.path}: written by a newer cumatrix (history schema {version}); "
                               f"this one reads schema {SCHEMA_VERSION}: upgrade cumatrix")
        return version

    @contextmanager
    def _write(self) -> Iterator[None]:
        """One writer's transaction: taken at once (IMMEDIATE), so two appends never both
        read then both write; the busy timeout makes the second wait its turn."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # ------------------------------------------------------------------ writing

    def append(self, run: RunToStore, *, kind: str, commit: str | None, recorded: str | None = None,
               series: str | None = None) -> int:
        """Store ``run`` (a :class:`~cumatrix.results.records.RunData`); returns its history id.

        ``series``: the digest that keys the run's series (default: its matrix's sha256); the
        gate keys each wheel's runs apart, so one wheel's cells are never another's history."""
        head = run.header
        host = ", ".join(run.hosts) if run.merged else (head.host or str(head.host_fingerprint.get("hostname") or ""))
        now = recorded or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        rows = _rows_of(run)
        passed, failed, skipped, not_run = _counts(rows)
        with self._write():
            cur = self.conn.execute(
                "INSERT INTO runs(run_uid, kind, recorded, started, finished, matrix, digest, host, fingerprint, "
                "harness_version, git_commit, verdict, n_pass, n_fail, n_skip, n_not_run, selection) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (head.run_id, kind, now, run.started, run.finished, head.matrix, series or head.matrix_sha256, host,
                 json.dumps(dict(head.host_fingerprint), sort_keys=True, default=str), head.harness_version, commit,
                 run.verdict, passed, failed, skipped, not_run,
                 json.dumps(head.selection.to_json(), sort_keys=True) if head.selection is not None else None))
            run_id = int(cur.lastrowid or 0)
            self._insert_results(run_id, head.matrix_sha256, rows)
        return run_id

    def _insert_results(self, run_id: int, digest: str, rows: list[tuple[CellKey, str, CellRecord | None]]) -> None:
        """Each cell's status, outcome and timings; its whole record only where it failed or
        changed against the previous run of ``digest`` (so the history stays small)."""
        cell_ids = self._ids_of_cells([(k, kind_) for k, kind_, _ in rows])
        labels = {cell.outcome_label if cell else NOT_RUN for _, _, cell in rows}
        outcome_ids = self._ids_of_outcomes(labels)
        before = self._previous_outcomes(run_id, digest)
        results = []
        records = []
        for key, _, cell in rows:
            cid = cell_ids[key]
            status = STATUS_CODES[cell.status] if cell else STATUS_CODES[NOT_RUN]
            outcome = outcome_ids[cell.outcome_label if cell else NOT_RUN]
            results.append((run_id, cid, status, outcome, *_speed_of(cell)))
            if _keeps_record(cell, before.get(cid), (status, outcome)):
                assert cell is not None  # _keeps_record is false without one
                records.append((run_id, cid, _compressed(cell)))
        self.conn.executemany("INSERT OR REPLACE INTO results VALUES (?,?,?,?,?,?)", results)
        self.conn.executemany("INSERT OR REPLACE INTO records VALUES (?,?,?)", records)

    def _previous_outcomes(self, run_id: int, digest: str) -> dict[int, tuple[int, int]]:
        """``{cell: (status, outcome)}`` of the run of ``digest`` stored before ``run_id``."""
        prev = self.conn.execute("SELECT max(id) FROM runs WHERE digest = ? AND id < ?",
                                 (digest, run_id)).fetchone()[0]
        if prev is None:
            return {}
        return {c: (s, o) for c, s, o in self.conn.execute(
            "SELECT cell, status, outcome FROM results WHERE run = ?", (prev,))}

    def _ids_of_cells(self, keys: Sequence[tuple[CellKey, str]]) -> dict[CellKey, int]:
        known = {CellKey(name=n, host=h): i for i, n, h in self.conn.execute("SELECT id, name, host FROM cells")}
        missing = [(k.name, k.host, kind) for k, kind in dict(keys).items() if k not in known]
        if missing:
            self.conn.executemany("INSERT OR IGNORE INTO cells(name, host, kind) VALUES (?,?,?)", missing)
            known = {CellKey(name=n, host=h): i for i, n, h in self.conn.execute("SELECT id, name, host FROM cells")}
        return known

    def _ids_of_outcomes(self, labels: set[str]) -> dict[str, int]:
        known = {label: i for i, label in self.conn.execute("SELECT id, label FROM outcomes")}
        missing = [(label,) for label in labels if label not in known]
        if missing:
            self.conn.executemany("INSERT OR IGNORE INTO outcomes(label) VALUES (?)", missing)
            known = {label: i for i, label in self.conn.execute("SELECT id, label FROM outcomes")}
        return known

    def prune(self, *, keep: int | None = None, older_than_days: float | None = None,
              now: datetime | None = None) -> list[int]:
        """Delete runs: all but the newest ``keep`` of each matrix, and/or those recorded more
        than ``older_than_days`` ago.  Returns the ids deleted."""
        with self._write():
            doomed: set[int] = set()
            if keep is not None:
                doomed |= {int(r) for (r,) in self.conn.execute(
                    "SELECT id FROM (SELECT id, row_number() OVER (PARTITION BY digest ORDER BY id DESC) AS n "
                    "FROM runs) WHERE n > ?", (keep,))}
            if older_than_days is not None:
                cut = ((now or datetime.now(UTC)) - timedelta(days=older_than_days)).strftime("%Y-%m-%dT%H:%M:%SZ")
                # a run's age is that of its start (the run's own clock), else of its recording
                doomed |= {int(r) for (r,) in self.conn.execute(
                    "SELECT id FROM runs WHERE coalesce(started, recorded) < ?", (cut,))}
            ids = sorted(doomed)
            for table, column in (("results", "run"), ("records", "run"), ("runs", "id")):
                self.conn.executemany(f"DELETE FROM {table} WHERE {column} = ?", [(i,) for i in ids])
            if ids:  # cells no remaining run mentions
                self.conn.execute("DELETE FROM cells WHERE id NOT IN (SELECT DISTINCT cell FROM results)")
        return ids

    # ------------------------------------------------------------------ reading

    def runs(self, *, digest: str | None = None, limit: int | None = None, upto: int | None = None) -> list[StoredRun]:
        """Stored runs, oldest first: all, or of one matrix digest; the newest ``limit``;
        with ``upto``, only runs up to that id."""
        where: list[str] = []
        params: list[object] = []
        if digest is not None:
            where.append("digest = ?")
            params.append(digest)
        if upto is not None:
            where.append("id <= ?")
            params.append(upto)
        sql = (f"SELECT {_RUN_COLUMNS} FROM runs" + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY id DESC")
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_stored_run(r) for r in reversed(self.conn.execute(sql, params).fetchall())]

    def run(self, ref: str) -> StoredRun:
        """A run by its history id (``12``) or its run id (or a prefix of at least 4 characters)."""
        ref = ref.strip().lstrip("#")
        rows = []
        if ref.isdigit():
            rows = self.conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (int(ref),)).fetchall()
        if not rows and len(ref) >= 4:
            rows = self.conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_uid LIKE ? ESCAPE '\\' ORDER BY id",
                                     (ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",)
                                     ).fetchall()
        if not rows:
            raise HistoryError(f"{self.path}: no run {ref!r} in the history (`cumatrix history` lists them)")
        if len({r[1] for r in rows}) > 1:
            raise HistoryError(f"{self.path}: run id {ref!r} is ambiguous: "
                               + ", ".join(f"#{r[0]} {r[1]}" for r in rows) + "; give more of it")
        return _stored_run(rows[-1])

    def results(self, run_id: int) -> dict[CellKey, Result]:
        """Every cell of a stored run."""
        return self.results_of([run_id])[run_id]

    def results_of(self, run_ids: Sequence[int]) -> dict[int, dict[CellKey, Result]]:
        """Every cell of each of ``run_ids``, by run."""
        cells = {i: CellKey(name=n, host=h) for i, n, h in self.conn.execute("SELECT id, name, host FROM cells")}
        labels = dict(self.conn.execute("SELECT id, label FROM outcomes").fetchall())
        out: dict[int, dict[CellKey, Result]] = {}
        for rid in run_ids:
            out[rid] = {cells[c]: Result(status=STATUS_NAMES[s], outcome=labels[o], gbps=g, speedup=sp)
                        for c, s, o, g, sp in self.conn.execute(
                            "SELECT cell, status, outcome, gbps, speedup FROM results WHERE run = ?", (rid,))}
        return out

    def cell_keys(self) -> CellKeys:
        """Every stored cell by its number."""
        return CellKeys({i: (n, h) for i, n, h in self.conn.execute("SELECT id, name, host FROM cells")})

    def outcome_labels(self) -> dict[int, str]:
        """Every stored outcome label by its number."""
        return dict(self.conn.execute("SELECT id, label FROM outcomes"))

    def rows(self, run_id: int) -> dict[int, tuple[int, int, int, float | None, float | None]]:
        """A run's cells as stored: cell number -> (cell, status code, outcome number, GB/s,
        speedup); what :mod:`cumatrix.results.historydiff` works on, without building objects per row."""
        return {r[0]: r for r in self.conn.execute(
            "SELECT cell, status, outcome, gbps, speedup FROM results WHERE run = ?", (run_id,))}

    def kinds(self) -> dict[CellKey, str]:
        """Each cell's kind (swap, probe, command), as stored."""
        return {CellKey(name=n, host=h): k for n, h, k in self.conn.execute("SELECT name, host, kind FROM cells")}

    def records(self, run_id: int) -> dict[CellKey, CellRecord]:
        """The full records a run kept (see the module's text: where they were news)."""
        out: dict[CellKey, CellRecord] = {}
        shared: dict[object, object] = {}
        for name, host, body in self.conn.execute(
                "SELECT c.name, c.host, r.body FROM records r JOIN cells c ON c.id = r.cell WHERE r.run = ?",
                (run_id,)):
            rec = json.loads(zlib.decompress(body))
            out[CellKey(name=name, host=host)] = CellRecord.from_json(rec, source=f"{self.path}#run{run_id}",
                                                                      shared=shared)
        return out


def _kind_of(cell_id: str) -> str:
    return axes_from_id(cell_id).get("kind", "")


def _make_parent(path: Path) -> None:
    """The directory of a new history: made private (0700), since run ids, commits and host
    names are the user's own."""
    parent = path.parent
    if parent.is_dir():
        return
    try:
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise HistoryError(f"--history {path}: cannot create {parent}: {e.strerror or e}") from e


def _rows_of(run: RunToStore) -> list[tuple[CellKey, str, CellRecord | None]]:
    """``(cell key, kind, record)`` of each cell of ``run``; None for a cell not run.  In a merge
    a cell is keyed by its host (for one not run, the host that should have run it)."""
    rows: list[tuple[CellKey, str, CellRecord | None]] = []
    for rec in run.cells:
        rows.append((CellKey(name=rec.id, host=(rec.host or "") if run.merged else ""), rec.axes.get("kind", ""),
                     rec))
    for name, where in run.not_run_where():
        rows.append((CellKey(name=name, host=(where or "") if run.merged else ""), _kind_of(name), None))
    return rows


def _counts(rows: Sequence[tuple[CellKey, str, CellRecord | None]]) -> tuple[int, int, int, int]:
    """``(passed, failed, skipped, not run)`` of the rows stored: the run's own counts (every
    skipped cell, whether a process of it ran or not), counted from what the history keeps."""
    statuses = [cell.status if cell else NOT_RUN for _, _, cell in rows]
    return statuses.count("pass"), statuses.count("fail"), statuses.count("skip"), statuses.count(NOT_RUN)


def _speed_of(cell: CellRecord | None) -> tuple[float | None, float | None]:
    """``(GB/s, speedup)`` of a cell's timings, each ``None`` where not measured or not run."""
    t = cell.timings if cell else None
    return (t.gbps if t else None, t.speedup if t else None)


def _compressed(cell: CellRecord) -> bytes:
    """A cell's whole record as the ``records`` table keeps it: sorted compact JSON, zlib."""
    body = json.dumps(cell.to_json(), sort_keys=True, separators=(",", ":"), default=str)
    return zlib.compress(body.encode("utf-8"), 6)


def _keeps_record(cell: CellRecord | None, was: tuple[int, int] | None, now: tuple[int, int]) -> bool:
    """A cell's whole record is kept where it failed, or where its status or outcome changed."""
    return cell is not None and (cell.status == "fail" or (was is not None and was != now))

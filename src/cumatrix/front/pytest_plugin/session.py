"""The controller's side of a pytest session of matrix files: the results store, a progress
line per cell, the run's end record and its reports.

:class:`RunSession` is a plugin object, one per session, registered on its config by
:func:`cumatrix.front.pytest_plugin.hooks.pytest_configure`: what it holds (the store, the progress) is the
session's, never the module's.  ``cumatrix run`` hands pytest a :class:`ReportsLeft` to learn
which ``--out`` directory's reports the session left to it.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from cumatrix import __version__
from cumatrix.core.errors import ConfigError, CumatrixError
from cumatrix.core.options import SandboxPolicy
from cumatrix.core.record import STATUSES, CellRecord
from cumatrix.execute import driverview, sandbox
from cumatrix.front.pytest_plugin.selection import REUSE, options, out_dir, plan_json, selected
from cumatrix.orchestrate import Orchestrator, end_record, run_header
from cumatrix.results.records import RunData, Seal
from cumatrix.results.store import LazyDigests, Store, cell_digests

#: The attribute of a pytest report that carries a cell's record (JSON) across workers.
REPORT_ATTR = "cumatrix_record"
#: What REPORT_ATTR holds once the controller has stored the record: pytest's terminal
#: reporter keeps every report to the end of the run, so the record must not stay on it.
STORED = "stored"
#: The --out directory whose reports a ``--cumatrix-reports-after`` session left to its caller.
PENDING_OUT = pytest.StashKey[Path]()
#: What the session's writer wrote (cell id -> signature), to read the results back against.
WRITTEN = pytest.StashKey[dict[str, str]]()


class ReportsLeft:
    """A plugin ``cumatrix run`` passes to ``pytest.main``: after the session, ``out`` is the
    directory whose reports it left to the caller (``--cumatrix-reports-after``), or None, and
    ``seal`` what the results there must show (the records this session wrote)."""

    def __init__(self) -> None:
        self.out: Path | None = None
        self.seal: Seal | None = None

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.out = config.stash.get(PENDING_OUT, None)
        written = config.stash.get(WRITTEN, None)
        self.seal = Seal(written=written) if written is not None else None


@dataclass(slots=True)
class _Progress:
    total: int
    t0: float
    done: int = 0


def _terminate_as_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


class RunSession:
    """The controller's store and progress for one pytest session."""

    def __init__(self, config: pytest.Config, orchestrator_for: Any) -> None:
        self.config = config
        self.orchestrator_for = orchestrator_for
        self.store: Store | None = None
        self.digests: LazyDigests | None = None
        self.progress: _Progress | None = None
        self.headline: str | None = None
        self._said: set[str] = set()

    def _write(self, line: str) -> None:
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.ensure_newline()
            tr.write_line(line)

    def _open_store(self, out: Path) -> Store:
        try:
            return Store.open(out, fresh=not options(self.config).resume)
        except CumatrixError as e:  # another run holds --out, or it cannot be written: say so, run nothing
            pytest.exit(f"cumatrix: {e}", returncode=e.exit_code)

    def pytest_sessionstart(self) -> None:
        config = self.config
        out = out_dir(config)
        if out is None:
            return
        # SIGTERM (a CI job cancelled, `timeout`, a scheduler) ends the run as Ctrl-C does:
        # the end record and the reports are still written.
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)
        store = self.store = self._open_store(out)
        opts = options(config)
        digests = LazyDigests(__version__, wheel_dir=opts.wheel_dir)
        fp = None
        for m, cells in selected(config):
            orch: Orchestrator = self.orchestrator_for(config, m)
            fp = fp or orch.host_fingerprint()
            digests.add(m, cells)
            if opts.resume:  # every digest now: they decide what runs
                plan = store.resume(cell_digests(m, cells, __version__, wheel_dir=opts.wheel_dir))
                config.stash[REUSE] = config.stash.get(REUSE, frozenset()) | plan.reuse
                for w in plan.warnings:
                    self._write(f"cumatrix: warning: {w}")
            held = self._sandbox_said(opts.backend, opts.for_matrix(m.sandbox))
            if driverview.emulation_header(opts.backend, held, any(d.emulated for d in m.drivers)):
                self._write(f"cumatrix: {driverview.SEARCH_PATH_ONLY}")
            store.append(run_header(m, [c.id for c in cells], backend=opts.backend, sandbox=held,
                                    argv=list(config.invocation_params.args), host=opts.host,
                                    fingerprint=fp, run_id=uuid.uuid4().hex[:12], plan=plan_json(config, m),
                                    submission=opts.submission,
                                    selection=None if opts.selection.full else opts.selection.to_json()))
            self.progress = _Progress(total=len(cells), t0=time.monotonic())
        self.digests = digests

    def _sandbox_said(self, backend: str, policy: SandboxPolicy) -> str | None:
        """How this run's local cells are held (its header says), and the one line, once,
        where a sandbox was wanted and this host cannot give one."""
        if backend != "local":
            return None  # a container per cell (docker's own boundary)
        held, line = sandbox.describe(policy)
        if line is not None and line not in self._said:
            self._said.add(line)
            self._write(line)
        return held

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        raw = getattr(report, REPORT_ATTR, None)
        if raw is None or raw == STORED:
            return
        # A worker's record arrives as the JSON of its to_store(): it is stored as it came, not
        # rebuilt into a CellRecord and back (under -n the controller shares the cores with the
        # workers, and that round trip cost it about a millisecond a cell).
        stored = raw.to_store() if isinstance(raw, CellRecord) else from_worker(raw, report.nodeid)
        cell_id = str(stored["id"])
        if self.store is not None:
            self.store.append(stored, digest=self.digests.get(cell_id) if self.digests is not None else None)
        # Stored: what stays on the report (kept by pytest to the end of the run) is a marker,
        # so that the controller's memory does not grow with the cells it has run.
        setattr(report, REPORT_ATTR, STORED)
        prog = self.progress
        if prog is None:
            return
        prog.done += 1
        quiet = self.config.get_verbosity() < -1  # -qq (cumatrix run -q): failures only
        if not quiet or stored["status"] == "fail":
            self._write(progress_text(prog.done, prog.total, prog.t0, stored))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        out = out_dir(self.config)
        store = self.store
        if out is None or store is None:
            return
        try:
            store.append(end_record(interrupted=int(exitstatus) == int(pytest.ExitCode.INTERRUPTED)))
        finally:
            store.close()
        if options(self.config).reports_after:
            self.config.stash[PENDING_OUT] = out
            self.config.stash[WRITTEN] = dict(store.sealed)
            return
        # deferred: cumatrix.report costs ~55 ms and ~35 modules (jinja2), paid by every pytest process that loads the plugin
        from cumatrix.report.headline import headline

        try:
            run = write_reports(out, Seal(written=dict(store.sealed)))
        except CumatrixError as e:
            self.headline = f"cumatrix: reports not written, no headline: {e}"
            return
        self.headline = headline(run)
        if run.verdict == "FAIL" and exitstatus == pytest.ExitCode.OK:
            # The records, read back, hold a failure pytest's items did not (a record refused):
            # the exit status says what the reports say.
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """The run's headline last: how many cells were tested, skipped and not run."""
        if self.headline is not None:
            terminalreporter.write_line(self.headline)


def from_worker(raw: str, nodeid: str) -> dict[str, Any]:
    """A record a worker sent, checked for what the controller reads of it."""
    try:
        rec = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"report of {nodeid}: the cell's record is not JSON: {e}") from None
    obs = rec.get("observed") if isinstance(rec, dict) else None
    if not (isinstance(obs, dict) and rec.get("type") == "cell" and isinstance(rec.get("id"), str)
            and rec.get("status") in STATUSES and isinstance(obs.get("outcome"), str)):
        raise ConfigError(f"report of {nodeid}: not a cell record")
    checked: dict[str, Any] = rec
    return checked


def write_reports(out: Path, seal: Seal | None = None) -> RunData:
    """Every report of the run in ``out``, from its ``results.jsonl`` read once (checked
    against ``seal``); returns the run as read, for the headline and the exit status."""
    # deferred: cumatrix.report costs ~55 ms and ~35 modules (jinja2), paid by every pytest process that loads the plugin
    from cumatrix.report import load_records, write_all

    run = load_records(out / "results.jsonl", seal=seal)
    write_all(run, out)
    return run


def progress_text(done: int, total: int, t0: float, stored: Mapping[str, Any]) -> str:
    """The progress line of a cell, from its ``results.jsonl`` record."""
    # deferred: cumatrix.report costs ~55 ms and ~35 modules (jinja2), paid by every pytest process that loads the plugin
    from cumatrix.report import progress_line

    obs = stored["observed"]
    path = obs.get("path")
    outcome = obs["outcome"] + (f" [{path}]" if path and path != "n/a" else "")
    return progress_line(done, max(total, done), time.monotonic() - t0, stored["id"], stored["status"], outcome)

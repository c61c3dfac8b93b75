"""pytest plugin: ``pytest matrix.yaml`` collects one item per cell.

Each item runs its cell through :class:`~cumatrix.orchestrate.Orchestrator`.  The finished
:class:`~cumatrix.core.record.CellRecord` crosses pytest-xdist workers inside pytest's own
serialisable report (an extra attribute that survives xdist's round trip), so the
controller alone writes the results store (:mod:`.session`) and JUnit works
unchanged.  A crashed cell is a failed report, never a lost one: cells run in their own
child process.  The session's options are parsed once (:class:`~cumatrix.core.options.RunOptions`)
and kept in ``config.stash``; the plugin holds no state of its own between sessions.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cumatrix.core.errors import ConfigError, UsageError
from cumatrix.core.model import Cell, Matrix
from cumatrix.core.options import BACKENDS, DEFAULT_BACKEND, DEFAULT_OUT, DEFAULT_TIMEOUT, RunOptions
from cumatrix.core.record import CellRecord
from cumatrix.execute import spawn
from cumatrix.front import schedule as _schedule
from cumatrix.front.flags import add_cover_pytest_options, add_pytest_options
from cumatrix.front.pytest_plugin import selection as _selection
from cumatrix.front.pytest_plugin.selection import (
    MATRIX_SUFFIXES,
    OPTIONS,
    SELECTED,
    options,
    select_cells,
)
from cumatrix.front.pytest_plugin.session import REPORT_ATTR, RunSession
from cumatrix.front.xdist_units import CellUnitScheduling
from cumatrix.load import gcpause
from cumatrix.load import matrix as _matrix
from cumatrix.orchestrate import Orchestrator
from cumatrix.results.store import dumps

_ORCHESTRATORS = pytest.StashKey[dict[str, Orchestrator]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("cumatrix", "cumatrix: run native CUDA code across a runtime x driver matrix")
    g.addoption("--cumatrix-out", metavar="DIR", default=None,
                help=f"write results.jsonl (per cell, as it finishes) and the reports here "
                     f"(default when a matrix file is run: {DEFAULT_OUT}/)")
    g.addoption("--cumatrix-resume", action="store_true", default=False,
                help="run only the cells that --cumatrix-out/results.jsonl does not hold yet")
    g.addoption("--cumatrix-wheel-dir", metavar="DIR", default=None,
                help="take runtime wheels from DIR (no network); default $CUMATRIX_WHEEL_DIR")
    g.addoption("--cumatrix-backend", choices=BACKENDS, default=DEFAULT_BACKEND,
                help="local: one child process per cell; docker: one container per cell")
    g.addoption("--cumatrix-timeout", type=float, default=None, metavar="S",
                help=f"seconds before a cell's process group is killed (default {DEFAULT_TIMEOUT:.0f})")
    g.addoption("--cumatrix-base-image", default=None, metavar="IMAGE",
                help="base image for runtime images (docker backend)")
    g.addoption("--cumatrix-host", default=None, metavar="NAME",
                help="tag every result with this host name (for merging runs of many hosts)")
    g.addoption("--cumatrix-submission", default=None, metavar="ID",
                help="record this submission id in the run header (a merge of that submission takes "
                     "only runs that carry it)")
    g.addoption("--cumatrix-require-gpu", action="store_true", default=False,
                help="a cell skipped for want of a GPU fails (nightly jobs on GPU runners); "
                     "also CUMATRIX_REQUIRE_GPU=1")
    g.addoption("--cumatrix-keyword", metavar="EXPR", default=None,
                help="only cells whose id matches EXPR (-k's syntax, matched by this plugin alone: "
                     "pytest's -k builds every item's keywords, a second per 10,000 cells)")
    g.addoption("--cumatrix-only", metavar="FILE", default=None,
                help="only the cells whose ids FILE lists, one a line (cumatrix run --lf)")
    g.addoption("--cumatrix-first", metavar="FILE", default=None,
                help="run the cells whose ids FILE lists first, then the rest (cumatrix run --ff)")
    g.addoption("--cumatrix-reports-after", action="store_true", default=False,
                help="leave the reports to the caller (cumatrix run writes them once pytest has "
                     "freed the run's memory)")
    add_pytest_options(g)
    add_cover_pytest_options(g)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def orchestrator_for(config: pytest.Config, m: Matrix) -> Orchestrator:
    """The process's orchestrator of matrix ``m`` (one per matrix file)."""
    found = config.stash.setdefault(_ORCHESTRATORS, {})
    if m.path not in found:
        opts = options(config)
        found[m.path] = Orchestrator(matrix=m, backend=opts.backend, wheel_dir=opts.wheel_dir,
                                     timeout=opts.timeout, base_image=opts.base_image, host_label=opts.host,
                                     require_gpu=opts.require_gpu, policy=opts.for_matrix(m.sandbox))
    return found[m.path]


# --------------------------------------------------------------------------- collection


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    # Only files named on the command line: a test suite's fixture YAML is not a matrix.
    if file_path.suffix in MATRIX_SUFFIXES and parent.session.isinitpath(file_path):
        return MatrixFile.from_parent(parent, path=file_path)
    return None


class MatrixError(Exception):
    """A matrix file that does not load: its message is the collection error."""


class MatrixFile(pytest.File):
    """A matrix file: one :class:`CellItem` per cell."""

    def collect(self) -> Generator[CellItem, None, None]:
        try:
            m = _matrix.load(self.path)
        except ConfigError as e:
            raise MatrixError(str(e)) from None
        lines = _runtime_lines(self.path, [r.name for r in m.runtimes])
        for cell in _matrix.cells(m):
            yield CellItem.from_parent(self, name=cell.id, cell=cell, matrix=m, line=lines.get(cell.runtime, 0))

    # Node's signature; a Collector's own repr_failure takes no style.
    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:  # noqa: ARG002
        if isinstance(excinfo.value, MatrixError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


def _runtime_lines(path: Path, names: list[str]) -> dict[str, int]:
    """0-based line where each runtime is declared in the matrix file (where its cells' skips point)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return {}
    out: dict[str, int] = {}
    for name in names:
        key = re.compile(rf"(?:^|[\s{{,]){re.escape(name)}\s*:")
        out[name] = next((n for n, line in enumerate(lines) if key.search(line)), 0)
    return out


class CellMismatch(Exception):
    """A cell that did not do what was expected of it."""

    def __init__(self, record: CellRecord) -> None:
        super().__init__(record.mismatch)
        self.record = record


class CellItem(_selection.CellItem):
    """One cell of a matrix."""

    def __init__(self, *, cell: Cell, matrix: Matrix, line: int = 0, **kw: Any) -> None:
        super().__init__(**kw)
        self.cell = cell
        self.matrix = matrix
        self.line = line
        self.record: CellRecord | None = None
        self.then: Cell | None = None  # the cell this process runs next, when pytest knows it

    def runtest(self) -> None:
        then, self.then = self.then, None
        record = orchestrator_for(self.config, self.matrix).run(self.cell, then=then).record
        sel = options(self.config).selection
        if not sel.full:  # the record says which plan chose its cell
            record = replace(record, chosen_by=sel.label())
        self.record = record
        obs = record.observed
        if not _lean(self.config):  # for pytest's --junitxml (cumatrix's own reports read the record)
            self.user_properties += [("outcome", obs.outcome), ("path", obs.path or ""),
                                     ("expected", " | ".join(sorted(record.expected.outcomes)))]
            if record.timings.speedup is not None:
                self.user_properties.append(("speedup", f"{record.timings.speedup:.3f}"))
        if record.status == "fail":
            raise CellMismatch(record)
        if record.status == "skip":
            # deferred: cumatrix.report costs ~55 ms and ~35 modules (jinja2), paid by every pytest process that loads this plugin
            from cumatrix.report.text import clean

            first = obs.detail.splitlines()[0][:200] if obs.detail else ""
            pytest.skip(clean(f"{obs.outcome}: {first}"))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> Any:
        if isinstance(excinfo.value, CellMismatch):
            return format_failure(excinfo.value.record)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.line, f"cell {self.cell.id}"


def format_failure(rec: CellRecord) -> str:
    """A failed cell's section in pytest's report.  What the cell wrote (its stderr, the detail
    made from it) reaches the terminal without escape sequences or control characters: a
    child's OSC title or clipboard write, or a screen clear, is shown as text."""
    # deferred: cumatrix.report costs ~55 ms and ~35 modules (jinja2), paid by every pytest process that loads this plugin
    from cumatrix.report.text import clean

    obs, exp = rec.observed, rec.expected
    want = " | ".join(sorted(exp.outcomes))
    shown = obs.outcome + (f" (path {obs.path})" if obs.path and obs.outcome == "ok" else "")
    lines = [f"{rec.id}: expected {want}, observed {shown}",
             f"expected  {want}",
             f"observed  {obs.outcome}" + (f" (path {obs.path})" if obs.path else ""),
             f"reason    {exp.reason}",
             f"mismatch  {rec.mismatch}"]
    if obs.detail:
        lines.append(f"detail    {obs.detail[:1000]}")
    tail = rec.stderr_tail.strip()
    if tail:
        lines += ["----- child stderr (tail) -----", tail[-2000:], "----- end of child stderr -----"]
    return clean("\n".join(lines))


# --------------------------------------------------------------------------- running


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # The next cell of the same matrix is made ready while this one runs, and started as it
    # ends (Orchestrator.run): this cell's reporting then costs no time between the two.
    # pytest's own protocol runs the item (this hook returns None).
    if isinstance(item, CellItem) and isinstance(nextitem, CellItem) and nextitem.matrix.path == item.matrix.path:
        item.then = nextitem.cell


def _lean(config: pytest.Config) -> bool:
    """A cumatrix run whose JUnit properties nobody reads (its own reports read the record;
    pytest's own --junitxml writes a test case's properties)."""
    return options(config).reports_after and not getattr(config.option, "xmlpath", None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if isinstance(item, CellItem):
        # pytest keeps every report (three a cell) to the end of the run; a cell's keywords
        # (its name and its file's) say nothing its nodeid does not.
        report.keywords = {}
    if call.when == "call" and isinstance(item, CellItem) and item.record is not None:
        # An xdist worker sends the record inside the report, as JSON; in one process the
        # controller takes the object itself (a JSON round trip a cell saved).
        setattr(report, REPORT_ATTR, dumps(item.record.to_store()) if _is_worker(item.config) else item.record)
        item.record = None  # the report carries it now; the item lives to the end of the run
        if report.skipped and isinstance(report.longrepr, tuple):
            # Point the skip at the matrix file's line, not at this plugin.
            report.longrepr = (str(item.path), item.line + 1, report.longrepr[2])
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config,
                                  items: list[pytest.Item]) -> Generator[None, None, None]:
    select_cells(config, items, CellItem)
    cells = _hold_back_cells(config, items)
    try:
        return (yield)
    finally:
        if cells:
            items[:] = cells + items


def _hold_back_cells(config: pytest.Config, items: list[pytest.Item]) -> list[pytest.Item]:
    """The cells taken out of ``items`` while the other implementations of the hook run (put
    back ahead of the rest after them); none where the user's own selection must see them."""
    # A cumatrix run's cells use no fixtures, and the CLI passes no -k, -m or --deselect and
    # autoloads no plugin: the other implementations (pytest's fixture reordering above all,
    # 0.15 s at 10,000 cells for an order it keeps) are given the rest of the items only.
    if not options(config).reports_after or _user_selects(config):
        return []
    cells: list[pytest.Item] = [it for it in items if isinstance(it, CellItem)]
    if cells:
        items[:] = [it for it in items if not isinstance(it, CellItem)]
    return cells


def _user_selects(config: pytest.Config) -> bool:
    """Whether pytest's own -k, -m or --deselect was given."""
    return bool(config.getoption("keyword") or config.getoption("markexpr") or config.getoption("deselect"))


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, str] | None:
    # Cells get a progress line of their own; pytest's letter per item would run into it.
    if getattr(report, REPORT_ATTR, None) is not None and config.get_verbosity() <= 0:
        return report.outcome, "", report.outcome.upper()
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Cells that provision the same things on one worker, where that starves none (:mod:`.schedule`)."""
    if config.getoption("dist", None) != "load":  # what -n gives; another --dist is the user's choice
        return None
    selected = config.stash.get(SELECTED, None)
    if not selected:
        return None
    plan = _schedule.plan(selected, len(config.getoption("tx") or ()))
    if plan.units is None:
        return None
    return CellUnitScheduling(config, log, plan.units)


# --------------------------------------------------------------------------- session


def pytest_configure(config: pytest.Config) -> None:
    timeout = config.getoption("cumatrix_timeout")
    if timeout is not None:
        try:
            _matrix.check_timeout(timeout, "--cumatrix-timeout")
        except ConfigError as e:
            raise pytest.UsageError(str(e)) from None
    try:
        opts = config.stash[OPTIONS] = RunOptions.from_pytest(config)
    except UsageError as e:  # --cumatrix-cover x, --cumatrix-rotate without --cumatrix-night
        raise pytest.UsageError(str(e)) from None
    if _is_worker(config):
        spawn.die_with_parent()  # a killed controller must not leave a worker running a cell
        if opts.reports_after:  # a worker of cumatrix run (see gcpause)
            spawn.harden(opts.policy.pass_env)  # as its controller is
            gcpause.hold()
    else:
        config.pluginmanager.register(RunSession(config, orchestrator_for), "cumatrix-run-session")


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop() -> None:
    # The cells are collected (an xdist controller collects none, and runs none: it is past
    # its start-up here all the same); what start-up made lives to the end of the run: frozen,
    # not walked again, and the collector runs for what the run makes from here on.
    gcpause.release()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    for orch in session.config.stash.get(_ORCHESTRATORS, {}).values():
        orch.cancel_ahead()  # a run stopped early (-x, --maxfail, Ctrl-C) ends the cell started next


def pytest_unconfigure(config: pytest.Config) -> None:
    for orch in config.stash.get(_ORCHESTRATORS, {}).values():
        orch.close()

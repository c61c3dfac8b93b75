"""pytest plugin: ``pytest matrix.yaml`` collects one item per cell.

Each item runs its cell through :class:`~cumatrix.orchestrate.Orchestrator`.  The finished
:class:`~cumatrix.core.record.CellRecord` crosses pytest-xdist workers inside pytest's own
serialisable report (an extra attribute that survives xdist's round trip), so the
controller alone writes the results store and JUnit works unchanged.  A crashed cell is a
failed report, never a lost one: cells run in their own child process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from collections.abc import Generator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from cumatrix import __version__
from cumatrix.load import gcpause
from cumatrix.execute import sandbox
from cumatrix.load import matrix as _matrix
from cumatrix.front import schedule as _schedule
from cumatrix.core.errors import ConfigError, CumatrixError
from cumatrix.load.keyword import KeywordExpression
from cumatrix.core.model import Cell, Matrix
from cumatrix.orchestrate import Orchestrator, end_record, run_header
from cumatrix.core.record import STATUSES, CellRecord
from cumatrix.results.store import LazyDigests, Store, cell_digests, dumps
from cumatrix.front.plan import PlannedCells, planned_cells

_ORCHESTRATORS = pytest.StashKey[dict[str, Orchestrator]]()
_PROGRESS = pytest.StashKey[dict[str, Any]]()
#: ``(cell id, provision key)`` of every selected cell, in run order (for xdist scheduling).
_SELECTED = pytest.StashKey[list[tuple[str, str]]]()
_PLANS = pytest.StashKey[dict[str, "PlannedCells | None"]]()
#: The run's store, opened once by the controller (a cell's record is appended as it finishes).
_STORE = pytest.StashKey[Store]()
MATRIX_SUFFIXES = (".yaml", ".yml")
#: Where reports go when a matrix file is run and no --cumatrix-out is given.
DEFAULT_OUT = "out"
#: The attribute of a pytest report that carries a cell's record (JSON) across workers.
REPORT_ATTR = "cumatrix_record"
#: What REPORT_ATTR holds once the controller has stored the record: pytest's terminal
#: reporter keeps every report to the end of the run, so the record must not stay on it.
STORED = "stored"


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("cumatrix", "cumatrix: run native CUDA code across a runtime x driver matrix")
    g.addoption("--cumatrix-out", metavar="DIR", default=None,
                help=f"write results.jsonl (per cell, as it finishes) and the reports here "
                     f"(default when a matrix file is run: {DEFAULT_OUT}/)")
    g.addoption("--cumatrix-resume", action="store_true", default=False,
                help="run only the cells that --cumatrix-out/results.jsonl does not hold yet")
    g.addoption("--cumatrix-wheel-dir", metavar="DIR", default=None,
                help="take runtime wheels from DIR (no network); default $CUMATRIX_WHEEL_DIR")
    g.addoption("--cumatrix-backend", choices=("local", "docker"), default="local",
                help="local: one child process per cell; docker: one container per cell")
    g.addoption("--cumatrix-timeout", type=float, default=None, metavar="S",
                help="seconds before a cell's process group is killed (default 300)")
    g.addoption("--cumatrix-base-image", default=None, metavar="IMAGE",
                help="base image for runtime images (docker backend)")
    g.addoption("--cumatrix-host", default=None, metavar="NAME",
                help="tag every result with this host name (for merging runs of many hosts)")
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
                     "freed the run's memory; see plugin.PENDING_REPORTS)")
    sandbox.add_pytest_options(g)


#: The --out directory whose reports a ``--cumatrix-reports-after`` session left to its caller.
PENDING_REPORTS: dict[str, Path] = {}


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _matrix_args(config: pytest.Config) -> list[Path]:
    return [p for p in (Path(a.split("::")[0]) for a in config.args)
            if p.suffix in MATRIX_SUFFIXES and p.is_file()]


def _out(config: pytest.Config) -> Path | None:
    out = config.getoption("cumatrix_out")
    if out:
        return Path(out)
    return Path(DEFAULT_OUT) if _matrix_args(config) else None


def require_gpu(config: pytest.Config) -> bool:
    return bool(config.getoption("cumatrix_require_gpu")) or os.environ.get("CUMATRIX_REQUIRE_GPU", "") == "1"


def orchestrator_for(config: pytest.Config, m: Matrix) -> Orchestrator:
    """The process's orchestrator of matrix ``m`` (one per matrix file)."""
    found = config.stash.setdefault(_ORCHESTRATORS, {})
    if m.path not in found:
        wd = config.getoption("cumatrix_wheel_dir") or os.environ.get("CUMATRIX_WHEEL_DIR")
        if wd:
            # Where the wheels come from is where a cell's digest hashes them (results.wheel_sha256).
            os.environ["CUMATRIX_WHEEL_DIR"] = str(wd)
        found[m.path] = Orchestrator(matrix=m, backend=config.getoption("cumatrix_backend"),
                                     wheel_dir=Path(wd) if wd else None,
                                     timeout=config.getoption("cumatrix_timeout") or 300.0,
                                     base_image=config.getoption("cumatrix_base_image"),
                                     host_label=config.getoption("cumatrix_host"),
                                     require_gpu=require_gpu(config))
    return found[m.path]


# --------------------------------------------------------------------------- collection


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    # Only files named on the command line: a test suite's fixture YAML is not a matrix.
    if file_path.suffix in MATRIX_SUFFIXES and parent.session.isinitpath(file_path):
        return MatrixFile.from_parent(parent, path=file_path)
    return None


class MatrixError(Exception):
    pass


class MatrixFile(pytest.File):
    def collect(self) -> Any:
        try:
            m = _matrix.load(self.path)
        except ConfigError as e:
            raise MatrixError(str(e)) from None
        lines = _runtime_lines(self.path, [r.name for r in m.runtimes])
        for cell in _matrix.cells(m):
            yield CellItem.from_parent(self, name=cell.id, cell=cell, matrix=m,
                                       line=lines.get(cell.runtime, 0))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, MatrixError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)  # type: ignore[return-value]


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
    def __init__(self, record: CellRecord) -> None:
        super().__init__(record.mismatch)
        self.record = record


class CellItem(pytest.Item):
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
            from cumatrix.report.text import clean

            first = obs.detail.splitlines()[0][:200] if obs.detail else ""
            pytest.skip(clean(f"{obs.outcome}: {first}"))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CellMismatch):
            return format_failure(excinfo.value.record)
        return super().repr_failure(excinfo)  # type: ignore[return-value]

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.line, f"cell {self.cell.id}"


def format_failure(rec: CellRecord) -> str:
    """A failed cell's section in pytest's report.  What the cell wrote (its stderr, the detail
    made from it) reaches the terminal without escape sequences or control characters: a
    child's OSC title or clipboard write, or a screen clear, is shown as text."""
    from cumatrix.report.text import clean

    return clean(_format_failure(rec))


def _format_failure(rec: CellRecord) -> str:
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
    return "\n".join(lines)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    if not isinstance(item, CellItem):
        return None
    # The next cell of the same matrix is made ready while this one runs, and started as it
    # ends (Orchestrator.run): this cell's reporting then costs no time between the two.
    if isinstance(nextitem, CellItem) and nextitem.matrix.path == item.matrix.path:
        item.then = nextitem.cell
    if _call_and_report is None or not _lean(item.config):
        return None
    # A cell has no fixtures: its setup and teardown pass, and their two reports (logged,
    # and under -n serialised, sent and read back by the controller) would only count
    # nothing.  They are made as pytest makes them and logged only when they did not pass.
    ihook = item.ihook
    # Under -n, a worker sends the controller each logstart and logfinish as a message of its
    # own (two of a cell's four); a quiet run's controller does nothing with them (its
    # progress line comes with the cell's record), so a quiet worker does not call them.
    announce = not _is_worker(item.config) or item.config.get_verbosity() > 0
    if announce:
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    setup = _call_and_report(item, "setup", log=False)
    if not setup.passed:
        ihook.pytest_runtest_logreport(report=setup)
    else:
        _call_and_report(item, "call", log=True)
    if item.session.shouldfail or item.session.shouldstop:
        nextitem = None
    teardown = _call_and_report(item, "teardown", log=False, nextitem=nextitem)
    if not teardown.passed:
        ihook.pytest_runtest_logreport(report=teardown)
    if announce:
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _lean(config: pytest.Config) -> bool:
    """A cumatrix run whose passing setup and teardown reports nobody reads (pytest's own
    --junitxml writes a test case as its teardown report arrives)."""
    return bool(config.getoption("cumatrix_reports_after")) and not getattr(config.option, "xmlpath", None)


try:  # pytest's one-phase runner (internal, stable since pytest 3): without it, the full protocol
    from _pytest.runner import call_and_report as _call_and_report
except ImportError:  # pragma: no cover - a pytest that moved it
    _call_and_report = None  # type: ignore[assignment]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
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


def _keyword(config: pytest.Config) -> KeywordExpression | None:
    text = config.getoption("cumatrix_keyword") or config.getoption("keyword") or ""
    return KeywordExpression.compile(text) if text else None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> Generator[None, None, None]:
    _select_cells(config, items)
    # A cumatrix run's cells use no fixtures, and the CLI passes no -k, -m or --deselect and
    # autoloads no plugin: the other implementations (pytest's fixture reordering above all,
    # 0.15 s at 10,000 cells for an order it keeps) are given the rest of the items only.
    cells: list[pytest.Item] = []
    if config.getoption("cumatrix_reports_after") and not (
            config.getoption("keyword") or config.getoption("markexpr") or config.getoption("deselect")):
        cells = [it for it in items if isinstance(it, CellItem)]
        if cells:
            items[:] = [it for it in items if not isinstance(it, CellItem)]
    try:
        return (yield)
    finally:
        if cells:
            items[:] = cells + items


def _plan_of(config: pytest.Config, path: Path) -> PlannedCells | None:
    """The plan of the matrix at ``path`` (every cell, or its ``hosts:`` assignment), once per
    process; None when the matrix cannot be planned (``cumatrix run`` said so before)."""
    found = config.stash.setdefault(_PLANS, {})
    key = str(path)
    if key not in found:
        try:
            found[key] = planned_cells(_matrix.load(path))
        except ConfigError:
            found[key] = None
    return found[key]


def _host_share(config: pytest.Config, path: Path) -> frozenset[str] | None:
    """--host naming a host of the matrix's plan: the cell ids the plan gives it (else None)."""
    host = config.getoption("cumatrix_host")
    plan = _plan_of(config, path) if host else None
    ids = plan.for_host(host) if plan is not None and host else None
    return frozenset(ids) if ids is not None else None


def _id_file(config: pytest.Config, option: str) -> frozenset[str] | None:
    """The cell ids listed in the file an option names (``--cumatrix-only``/``--cumatrix-first``)."""
    name = config.getoption(option)
    if not name:
        return None
    return frozenset(ln.strip() for ln in Path(name).read_text(encoding="utf-8").splitlines() if ln.strip())


def _select_cells(config: pytest.Config, items: list[pytest.Item]) -> None:
    """-k of cumatrix run (--cumatrix-keyword), --host of a plan, --lf/--ff and --resume: the
    cells this process runs, in the order it runs them."""
    only = _id_file(config, "cumatrix_only")
    if only is not None:
        chosen = [it for it in items if not isinstance(it, CellItem) or it.cell.id in only]
        if len(chosen) < len(items):
            kept = {id(it) for it in chosen}
            config.hook.pytest_deselected(items=[it for it in items if id(it) not in kept])
            items[:] = chosen
    first = _id_file(config, "cumatrix_first")
    if first:
        # A stable sort: the previously failed cells keep their matrix order, ahead of the rest.
        items.sort(key=lambda it: not (isinstance(it, CellItem) and it.cell.id in first))
    expr = _keyword(config) if config.getoption("cumatrix_keyword") else None
    shares = {p: _host_share(config, p) for p in {it.path for it in items if isinstance(it, CellItem)}} \
        if config.getoption("cumatrix_host") else {}
    if expr is not None or any(s is not None for s in shares.values()):
        # The controller matched every cell already (_selected); a worker matches them here.
        ids = {cid for cid, _ in config.stash.get(_SELECTED, ())} if _SELECTED in config.stash else None

        def wanted(it: CellItem) -> bool:
            share = shares.get(it.path)
            return ((share is None or it.cell.id in share)
                    and (expr is None or expr.matches(it.cell.id, it.path.name)))

        chosen = [it for it in items if not isinstance(it, CellItem)
                  or (it.cell.id in ids if ids is not None else wanted(it))]
        if len(chosen) < len(items):
            kept = {id(it) for it in chosen}
            config.hook.pytest_deselected(items=[it for it in items if id(it) not in kept])
            items[:] = chosen
    out = _out(config)
    if not (config.getoption("cumatrix_resume") and out):
        return
    # The controller has compacted results.jsonl to the records whose inputs are unchanged
    # (Store.resume); every process (xdist workers too) skips exactly those cells.
    reuse = config.stash.get(_REUSE, None)
    done = reuse if reuse is not None else Store(out).finished_ids()
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for it in items:
        (drop if isinstance(it, CellItem) and it.cell.id in done else keep).append(it)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# --------------------------------------------------------------------------- controller side

_DIGESTS = pytest.StashKey[LazyDigests]()
_REUSE = pytest.StashKey[frozenset[str]]()


def _selected(config: pytest.Config) -> list[tuple[Matrix, list[Cell]]]:
    """The cells this run intends, computed in the controller (xdist workers collect)."""
    out = []
    selected: list[tuple[str, str]] = []
    expr = _keyword(config)
    only = _id_file(config, "cumatrix_only")
    for p in _matrix_args(config):
        try:
            m = _matrix.load(p)
        except ConfigError:
            continue
        every = _matrix.cells(m)
        plans = config.stash.setdefault(_PLANS, {})
        try:  # planned from the cells at hand: a matrix is expanded once
            plans[str(p)] = plans[m.path] = planned_cells(m, every)
        except ConfigError:
            plans[str(p)] = plans[m.path] = None
        share = _host_share(config, p)
        cells = [c for c in every if (expr is None or expr.matches(c.id, p.name))
                 and (share is None or c.id in share)
                 and (only is None or c.id in only)]
        selected += [(c.id, _schedule.provision_key(c)) for c in cells]
        out.append((m, cells))
    config.stash[_SELECTED] = selected
    return out


def _plan_json(config: pytest.Config, m: Matrix) -> dict[str, object] | None:
    plan = config.stash.get(_PLANS, {}).get(m.path) if m.path in config.stash.get(_PLANS, {}) \
        else _plan_of(config, Path(m.path))
    return plan.to_json() if plan is not None else None


def _terminate_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def _open_store(config: pytest.Config, out: Path) -> Store:
    try:
        return Store.open(out, fresh=not config.getoption("cumatrix_resume"))
    except CumatrixError as e:  # another run holds --out, or it cannot be written: say so, run nothing
        pytest.exit(f"cumatrix: {e}", returncode=e.exit_code)


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    out = _out(config)
    if _is_worker(config) or out is None:
        return
    # SIGTERM (a CI job cancelled, `timeout`, a scheduler) ends the run as Ctrl-C does:
    # the end record and the reports are still written.
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    store = config.stash[_STORE] = _open_store(config, out)
    digests = LazyDigests(__version__)
    fp = None
    tr = config.pluginmanager.get_plugin("terminalreporter")
    for m, cells in _selected(config):
        orch = orchestrator_for(config, m)
        fp = fp or orch.host_fingerprint()
        digests.add(m, cells)
        if config.getoption("cumatrix_resume"):  # every digest now: they decide what runs
            plan = store.resume(cell_digests(m, cells, __version__))
            config.stash[_REUSE] = config.stash.get(_REUSE, frozenset()) | plan.reuse
            for w in plan.warnings:
                if tr is not None:
                    tr.write_line(f"cumatrix: warning: {w}")
        store.append(run_header(m, [c.id for c in cells], backend=config.getoption("cumatrix_backend"),
                                argv=list(config.invocation_params.args), host=config.getoption("cumatrix_host"),
                                fingerprint=fp, run_id=uuid.uuid4().hex[:12],
                                plan=_plan_json(config, m)))
        config.stash[_PROGRESS] = {"total": len(cells), "done": 0, "t0": time.monotonic()}
    config.stash[_DIGESTS] = digests


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _store_record(report)
    if report.when != "call" and report.passed and report.nodeid.split("::", 1)[0].endswith(MATRIX_SUFFIXES):
        # pytest's terminal keeps every report to the end of the run, and those of a passed
        # setup and teardown (two a cell, under the empty category) only to count nothing:
        # 10,000 cells hold about 20 MB of them.  Logged by now, they are let go.
        config = _CONFIG.get("config")
        tr = config.pluginmanager.get_plugin("terminalreporter") if config is not None else None
        kept = tr.stats.get("") if tr is not None else None
        if kept and kept[-1] is report:
            kept.pop()


def _store_record(report: pytest.TestReport) -> None:
    raw = getattr(report, REPORT_ATTR, None)
    if raw is None or raw == STORED:
        return
    config = _CONFIG.get("config")
    if config is None or _is_worker(config):
        return
    # A worker's record arrives as the JSON of its to_store(): it is stored as it came, not
    # rebuilt into a CellRecord and back (under -n the controller shares the cores with the
    # workers, and that round trip cost it about a millisecond a cell).
    stored = raw.to_store() if isinstance(raw, CellRecord) else _from_worker(raw, report.nodeid)
    cell_id = str(stored["id"])
    store = config.stash.get(_STORE, None)
    if store is not None:
        digests = config.stash.get(_DIGESTS, None)
        store.append(stored, digest=digests.get(cell_id) if digests is not None else None)
    # Stored: what stays on the report (kept by pytest to the end of the run) is a marker,
    # so that the controller's memory does not grow with the cells it has run.
    setattr(report, REPORT_ATTR, STORED)
    prog = config.stash.get(_PROGRESS, None)
    if prog is None:
        return
    prog["done"] += 1
    quiet = config.get_verbosity() < -1  # -qq (cumatrix run -q): failures only
    if not quiet or stored["status"] == "fail":
        tr = config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.ensure_newline()
            tr.write_line(progress_text(prog, stored))


def _from_worker(raw: str, nodeid: str) -> dict[str, Any]:
    """A record a worker sent, checked for what the controller reads of it."""
    try:
        rec = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"report of {nodeid}: the cell's record is not JSON: {e}") from None
    obs = rec.get("observed") if isinstance(rec, dict) else None
    if not (isinstance(obs, dict) and rec.get("type") == "cell" and isinstance(rec.get("id"), str)
            and rec.get("status") in STATUSES and isinstance(obs.get("outcome"), str)):
        raise ConfigError(f"report of {nodeid}: not a cell record")
    return rec


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
    selected = config.stash.get(_SELECTED, None)
    if not selected:
        return None
    plan = _schedule.plan(selected, len(config.getoption("tx") or ()))
    if plan.units is None:
        return None
    return _unit_scheduler()(config, log, plan.units)


def _unit_scheduler() -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class CellUnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's scope scheduling, a scope being a unit of :func:`cumatrix.front.schedule.plan`."""

        def __init__(self, config: pytest.Config, log: Any, units: Mapping[str, str]) -> None:
            super().__init__(config, log)
            self.units = units

        def _split_scope(self, nodeid: str) -> str:
            unit = self.units.get(nodeid.rpartition("::")[2])
            return nodeid if unit is None else unit

    return CellUnitScheduling


def progress_text(prog: dict[str, Any], stored: Mapping[str, Any]) -> str:
    """The progress line of a cell, from its ``results.jsonl`` record."""
    from cumatrix.report import progress_line

    obs = stored["observed"]
    path = obs.get("path")
    outcome = obs["outcome"] + (f" [{path}]" if path and path != "n/a" else "")
    total = max(prog["total"], prog["done"])
    return progress_line(prog["done"], total, time.monotonic() - prog["t0"], stored["id"], stored["status"], outcome)


_CONFIG: dict[str, pytest.Config] = {}


#: The sandbox policy this session replaced (None: the plain default).
_PREVIOUS_POLICY = pytest.StashKey["sandbox.Policy | None"]()


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG["config"] = config
    timeout = config.getoption("cumatrix_timeout")
    if timeout is not None:
        try:
            _matrix.check_timeout(timeout, "--cumatrix-timeout")
        except ConfigError as e:
            raise pytest.UsageError(str(e)) from None
    config.stash[_PREVIOUS_POLICY] = sandbox.set_default(sandbox.policy(
        config.getoption("cumatrix_sandbox"), config.getoption("cumatrix_pass_env"),
        config.getoption("cumatrix_sandbox_write_limit")))
    if _is_worker(config):
        sandbox.die_with_parent()  # a killed controller must not leave a worker running a cell
        if config.getoption("cumatrix_reports_after"):  # a worker of cumatrix run (see gcpause)
            sandbox.harden(config.getoption("cumatrix_pass_env"))  # as its controller is
            gcpause.hold()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    # The cells are collected (an xdist controller collects none, and runs none: it is past
    # its start-up here all the same); what start-up made lives to the end of the run: frozen,
    # not walked again, and the collector runs for what the run makes from here on.
    gcpause.release()


def pytest_unconfigure(config: pytest.Config) -> None:
    _CONFIG.pop("config", None)
    if _PREVIOUS_POLICY in config.stash:  # a session run in-process leaves the policy as it found it
        sandbox.set_default(config.stash[_PREVIOUS_POLICY])
    for orch in config.stash.get(_ORCHESTRATORS, {}).values():
        orch.close()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    for orch in config.stash.get(_ORCHESTRATORS, {}).values():
        orch.cancel_ahead()  # a run stopped early (-x, --maxfail, Ctrl-C) ends the cell started next
    out = _out(config)
    store = config.stash.get(_STORE, None)
    if _is_worker(config) or out is None or store is None:
        return
    try:
        store.append(end_record(interrupted=int(exitstatus) == int(pytest.ExitCode.INTERRUPTED)))
    finally:
        store.close()
    if config.getoption("cumatrix_reports_after"):
        PENDING_REPORTS["out"] = out
        return
    try:
        write_reports(out)
    except CumatrixError as e:
        tr = config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.write_line(f"cumatrix: reports not written: {e}")


def write_reports(out: Path) -> list[Path]:
    from cumatrix.report import load_records, write_all

    run = load_records(out / "results.jsonl")
    return write_all(run, out)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The run's headline last: how many cells ran and why the others did not."""
    out = _out(config)
    if _is_worker(config) or out is None or not (out / "results.jsonl").is_file() \
            or config.getoption("cumatrix_reports_after"):
        return
    from cumatrix.report import load_records
    from cumatrix.report.markdown import headline

    try:
        terminalreporter.write_line(headline(load_records(out / "results.jsonl")))
    except CumatrixError as e:
        terminalreporter.write_line(f"cumatrix: no headline: {e}")

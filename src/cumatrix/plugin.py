"""pytest plugin: ``pytest matrix.yaml`` collects one item per cell.

Results cross pytest-xdist workers inside pytest's own serialisable reports (an extra
``cumatrix_record`` attribute survives xdist's report round trip), so the controller
alone writes the results store and JUnit works unchanged.  A crashed cell is a failed
report, never a lost one: cells run in their own child process.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from . import matrix as _matrix
from .errors import ConfigError, CumatrixError
from .model import Cell, Matrix
from .results import Store, dumps
from .session import Runner, run_header, utcnow

_RUNNERS = pytest.StashKey[dict[str, Runner]]()
_PROGRESS = pytest.StashKey[dict[str, Any]]()
MATRIX_SUFFIXES = (".yaml", ".yml")


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("cumatrix", "cumatrix: run native CUDA code across a runtime x driver matrix")
    g.addoption("--cumatrix-out", metavar="DIR", default=None,
                help="write results.jsonl (per cell, as it finishes) and the reports here")
    g.addoption("--cumatrix-resume", action="store_true", default=False,
                help="run only the cells that --cumatrix-out/results.jsonl does not hold yet")
    g.addoption("--cumatrix-wheel-dir", metavar="DIR", default=None,
                help="take runtime wheels from DIR (no network)")
    g.addoption("--cumatrix-backend", choices=("local", "docker"), default="local",
                help="local: one child process per cell; docker: one container per cell")
    g.addoption("--cumatrix-timeout", type=float, default=None, metavar="S",
                help="seconds before a cell's process group is killed (default 300)")
    g.addoption("--cumatrix-base-image", default=None, metavar="IMAGE",
                help="base image for runtime images (docker backend)")
    g.addoption("--cumatrix-host", default=None, metavar="NAME",
                help="tag every result with this host name (for merging runs of many hosts)")


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _out(config: pytest.Config) -> Path | None:
    out = config.getoption("cumatrix_out")
    return Path(out) if out else None


def runner_for(config: pytest.Config, m: Matrix) -> Runner:
    runners = config.stash.setdefault(_RUNNERS, {})
    if m.path not in runners:
        wd = config.getoption("cumatrix_wheel_dir")
        runners[m.path] = Runner(matrix=m, backend=config.getoption("cumatrix_backend"),
                                 wheel_dir=Path(wd) if wd else None,
                                 timeout=config.getoption("cumatrix_timeout") or 300.0,
                                 base_image=config.getoption("cumatrix_base_image"),
                                 host_label=config.getoption("cumatrix_host"))
    return runners[m.path]


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
        for cell in _matrix.cells(m):
            yield CellItem.from_parent(self, name=cell.id, cell=cell, matrix=m)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, MatrixError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)  # type: ignore[return-value]


class CellMismatch(Exception):
    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__(record.get("mismatch"))
        self.record = record


class CellItem(pytest.Item):
    def __init__(self, *, cell: Cell, matrix: Matrix, **kw: Any) -> None:
        super().__init__(**kw)
        self.cell = cell
        self.matrix = matrix
        self.record: dict[str, Any] | None = None

    def runtest(self) -> None:
        record = runner_for(self.config, self.matrix).run_cell(self.cell)
        self.record = record
        obs = record["observed"]
        self.user_properties += [("outcome", obs["outcome"]), ("path", obs["path"] or ""),
                                 ("expected", " | ".join(record["expected"]["outcomes"]))]
        speed = record["timings"].get("speedup")
        if speed is not None:
            self.user_properties.append(("speedup", f"{speed:.3f}"))
        if record["status"] == "fail":
            raise CellMismatch(record)
        if record["status"] == "skip":
            pytest.skip(f"{obs['outcome']}: {(obs['detail'] or '').splitlines()[0][:200] if obs['detail'] else ''}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CellMismatch):
            return format_failure(excinfo.value.record)
        return super().repr_failure(excinfo)  # type: ignore[return-value]

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"cell {self.cell.id}"


def format_failure(rec: dict[str, Any]) -> str:
    obs, exp = rec["observed"], rec["expected"]
    shown = obs["outcome"] + (f" (path {obs['path']})" if obs.get("path") and obs["outcome"] == "ok" else "")
    lines = [f"{rec['id']}: expected {' | '.join(exp['outcomes'])}, observed {shown}",
             f"expected  {' | '.join(exp['outcomes'])}",
             f"observed  {obs['outcome']}" + (f" (path {obs['path']})" if obs.get("path") else ""),
             f"reason    {exp['reason']}",
             f"mismatch  {rec['mismatch']}"]
    if obs.get("detail"):
        lines.append(f"detail    {obs['detail'][:1000]}")
    tail = (rec.get("stderr_tail") or "").strip()
    if tail:
        lines += ["----- child stderr (tail) -----", tail[-2000:], "----- end of child stderr -----"]
    return "\n".join(lines)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if call.when == "call" and isinstance(item, CellItem) and item.record is not None:
        report.cumatrix_record = dumps(item.record)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    out = _out(config)
    if not (config.getoption("cumatrix_resume") and out):
        return
    done = Store(out).finished_ids()
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for it in items:
        (drop if isinstance(it, CellItem) and it.cell.id in done else keep).append(it)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# --------------------------------------------------------------------------- controller side


def _selected_ids(config: pytest.Config) -> list[tuple[Matrix, list[str]]]:
    """The cells this run intends, computed in the controller (xdist workers collect)."""
    out = []
    kexpr = config.getoption("keyword") or ""
    for arg in config.args:
        p = Path(arg.split("::")[0])
        if p.suffix not in MATRIX_SUFFIXES or not p.is_file():
            continue
        try:
            m = _matrix.load(p)
        except ConfigError:
            continue
        ids = [c.id for c in _matrix.cells(m)]
        if kexpr:
            from _pytest.mark.expression import Expression

            expr = Expression.compile(kexpr)
            ids = [i for i in ids if expr.evaluate(_KeywordMatcher(i, p.name))]
        out.append((m, ids))
    return out


class _KeywordMatcher:
    """Matches -k words the way pytest does for an item: a substring of its names, any case."""

    def __init__(self, *names: str) -> None:
        self.names = [n.lower() for n in names]

    def __call__(self, word: str, /, **kwargs: object) -> bool:
        return any(word.lower() in n for n in self.names)


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    out = _out(config)
    if _is_worker(config) or out is None:
        return
    store = Store(out)
    if not config.getoption("cumatrix_resume") and store.path.exists():
        store.path.unlink()
    fp = None
    for m, ids in _selected_ids(config):
        if fp is None:
            fp = runner_for(config, m).host_fingerprint()
        store.append(run_header(m, ids, backend=config.getoption("cumatrix_backend"),
                                argv=list(config.invocation_params.args), host=config.getoption("cumatrix_host"),
                                fingerprint=fp, run_id=uuid.uuid4().hex[:12]))
        config.stash[_PROGRESS] = {"total": len(ids), "done": 0, "t0": time.monotonic()}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    raw = getattr(report, "cumatrix_record", None)
    if raw is None:
        return
    config = _CONFIG.get("config")
    if config is None or _is_worker(config):
        return
    record = json.loads(raw)
    out = _out(config)
    if out is not None:
        Store(out).append(record)
    prog = config.stash.get(_PROGRESS, None)
    if prog is not None:
        prog["done"] += 1
        if _progress_lines(config) or record["status"] == "fail":
            tr = config.pluginmanager.get_plugin("terminalreporter")
            if tr is not None:
                tr.write_line(progress_text(prog, record))


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, str] | None:
    # Cells get a progress line of their own; pytest's letter per item would interleave with it.
    if getattr(report, "cumatrix_record", None) is not None and _progress_lines(config):
        return report.outcome, "", report.outcome.upper()
    return None


def _progress_lines(config: pytest.Config) -> bool:
    return os.environ.get("CI", "").lower() not in ("1", "true") and config.get_verbosity() <= 0


def progress_text(prog: dict[str, Any], record: dict[str, Any]) -> str:
    from .report import progress_line

    obs = record["observed"]
    outcome = obs["outcome"] + (f" [{obs['path']}]" if obs.get("path") and obs["path"] != "n/a" else "")
    total = max(prog["total"], prog["done"])
    return progress_line(prog["done"], total, time.monotonic() - prog["t0"], record["id"], record["status"], outcome)


_CONFIG: dict[str, pytest.Config] = {}


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG["config"] = config


def pytest_unconfigure(config: pytest.Config) -> None:
    _CONFIG.pop("config", None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    out = _out(config)
    if _is_worker(config) or out is None:
        return
    store = Store(out)
    store.append({"schema": 1, "type": "end", "finished": utcnow(),
                  "interrupted": int(exitstatus) == int(pytest.ExitCode.INTERRUPTED)})
    try:
        write_reports(out)
    except CumatrixError as e:
        tr = config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.write_line(f"cumatrix: reports not written: {e}")


def write_reports(out: Path) -> list[Path]:
    from .report import load_records, write_all

    run = load_records(out / "results.jsonl")
    return write_all(run, out)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The run's headline last: how many cells ran and why the others did not."""
    out = _out(config)
    if _is_worker(config) or out is None or not (out / "results.jsonl").is_file():
        return
    from .report import load_records
    from .report.markdown import headline

    try:
        terminalreporter.write_line(headline(load_records(out / "results.jsonl")))
    except CumatrixError as e:
        terminalreporter.write_line(f"cumatrix: no headline: {e}")

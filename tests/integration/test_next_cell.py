"""The next cell started as the last one ends: cells never overlap, and a cell started ahead
that will not be reported is ended (the orchestrator in-process, and `pytest -x` through the plugin)."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from cumatrix.front.cli import _plugin_args
from cumatrix.load import matrix as _matrix
from cumatrix.orchestrate import Orchestrator
from helpers.procs import alive

pytestmark = pytest.mark.network  # the matrix's runtime comes from a real wheel (cached)

RUNTIME = "nvidia-cuda-runtime-cu12==12.9.79"
PY = sys.executable

# Each cell logs when it starts and ends (CLOCK_MONOTONIC, one clock for every process),
# whether the process the previous cell left behind was still alive when it started, and
# leaves a process of its own in a new session (outside its process group).
CELL = textwrap.dedent("""
    import os, subprocess, sys, time
    log, i = sys.argv[1], int(sys.argv[2])
    def alive(pid):
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX"
        except OSError:
            return False
    prev = f"{log}.left{i - 1}"
    left_alive = os.path.exists(prev) and alive(int(open(prev).read()))
    with open(log, "a") as f:
        f.write(f"start {i} {time.monotonic_ns()} {int(left_alive)}\\n")
    p = subprocess.Popen(["sleep", "60"], start_new_session=True)
    open(f"{log}.left{i}", "w").write(str(p.pid))
    time.sleep(0.05)
    with open(log, "a") as f:
        f.write(f"end {i} {time.monotonic_ns()}\\n")
""")


def _wait_for(path: Path, within: float = 20.0) -> str:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


def test_cells_never_overlap_and_each_ends_before_the_next(tmp_path: Path, wheel_cache: Path, cli: Any) -> None:
    log = tmp_path / "cells.log"
    (tmp_path / "cell.py").write_text(CELL)
    n = 6
    m = tmp_path / "m.yaml"
    m.write_text(f"runtimes:\n  cu12.9: {{wheel: {RUNTIME}}}\ndrivers: [host]\nprobe: false\ncases:\n"
                 + "".join(f"  - {{name: c{i}, argv: [{PY}, {tmp_path / 'cell.py'}, {log}, '{i}']}}\n" for i in range(n)))
    # Unsandboxed (the old default): the cells log to, and leave host pids in, the test's directory.
    proc = cli("run", m, "--out", tmp_path / "out", "-q", "--no-sandbox", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    starts: dict[int, tuple[int, int]] = {}
    ends: dict[int, int] = {}
    for line in log.read_text().splitlines():
        what, i, t, *rest = line.split()
        if what == "start":
            starts[int(i)] = (int(t), int(rest[0]))
        else:
            ends[int(i)] = int(t)
    assert sorted(starts) == sorted(ends) == list(range(n))
    for i in range(1, n):
        assert starts[i][0] > ends[i - 1], f"cell c{i} started before c{i - 1} ended"
        assert starts[i][1] == 0, f"what c{i - 1} left running was alive when c{i} started"
    for i in range(n):
        assert not alive(int((tmp_path / f"cells.log.left{i}").read_text()))


def _orchestrator(tmp_path: Path, cases: str) -> tuple[Orchestrator, dict[str, Any]]:
    m = tmp_path / "m.yaml"
    m.write_text(f"runtimes:\n  cu12.9: {{wheel: {RUNTIME}}}\ndrivers: [host]\nprobe: false\ncases:\n"
                 + textwrap.indent(textwrap.dedent(cases).strip("\n"), "  ") + "\n")
    mx = _matrix.load(m)
    return Orchestrator(matrix=mx), {c.case.name: c for c in _matrix.cells(mx) if c.case is not None}


def test_the_cell_started_ahead_runs_in_its_turn(tmp_path: Path, wheel_cache: Path) -> None:
    orch, cells = _orchestrator(tmp_path, f"""
        - {{name: first, argv: [{PY}, -c, "import time; time.sleep(0.3)"]}}
        - {{name: second, argv: [sh, -c, "echo $$ > {tmp_path}/second.pid; echo second-out"]}}
    """)
    try:
        first = orch.run(cells["first"], then=cells["second"]).record
        _wait_for(tmp_path / "second.pid")  # started as the first cell ended, before its own turn
        second = orch.run(cells["second"]).record
    finally:
        orch.close()
    assert (first.status, second.status) == ("pass", "pass")
    assert second.observed.outcome == "ok"
    assert "second-out" in second.stdout_tail
    # Its clock starts when its child does, not while the first cell was still running.
    assert second.duration_s is not None
    assert first.duration_s is not None
    assert second.duration_s < 0.25 < first.duration_s
    assert second.started is not None
    assert first.started is not None
    assert second.started >= first.started


@pytest.mark.parametrize("how", ["cancel", "another-cell", "close"])
def test_a_cell_started_ahead_and_not_run_is_ended(tmp_path: Path, wheel_cache: Path, how: str) -> None:
    orch, cells = _orchestrator(tmp_path, f"""
        - {{name: first, argv: ["true"]}}
        - {{name: never, argv: [sh, -c, "echo $$ > {tmp_path}/never.pid; exec sleep 60"]}}
        - {{name: other, argv: ["true"]}}
    """)
    audit_dir = None
    try:
        orch.run(cells["first"], then=cells["never"])
        pid = int(_wait_for(tmp_path / "never.pid"))
        assert alive(pid)
        assert orch._ahead is not None
        assert orch._ahead.audit is not None
        audit_dir = orch._ahead.audit.plan.log.parent  # the cell's own private directory
        if how == "cancel":
            orch.cancel_ahead()
        elif how == "another-cell":
            other = orch.run(cells["other"]).record
            assert other.status == "pass"
            assert other.id.endswith("/other")
        else:
            orch.close()
    finally:
        orch.close()
    assert not alive(pid), f"the cell started ahead still runs after {how}"
    assert audit_dir is not None, "its audit directory was left behind"
    assert not Path(audit_dir).exists(), "its audit directory was left behind"


def test_pytest_x_ends_the_cell_started_ahead(pytester: pytest.Pytester, wheel_cache: Path,
                                             monkeypatch: pytest.MonkeyPatch, cli_env: Any) -> None:
    monkeypatch.setenv("PYTHONPATH", cli_env()["PYTHONPATH"])
    monkeypatch.delenv("CI", raising=False)
    pid = pytester.path / "next.pid"
    seen = pytester.path / "seen"
    m = pytester.path / "matrix.yaml"
    # The cell after the failure records whether it was still running once pytest had
    # reported the failure and started to finish the session (the hook below).
    m.write_text(f"runtimes:\n  cu12.9: {{wheel: {RUNTIME}}}\ndrivers: [host]\nprobe: false\ncases:\n"
                 "  - {name: fails, argv: [sh, -c, 'exit 4']}\n"
                 f"  - {{name: next, argv: [sh, -c, 'echo $$ > {pid}; exec sleep 60']}}\n"
                 "  - {name: last, argv: ['true']}\n")
    pytester.makeconftest(f"""
        import os, time
        from pathlib import Path
        import pytest

        @pytest.hookimpl(trylast=True)
        def pytest_sessionfinish(session):
            pid = Path({str(pid)!r})
            end = time.monotonic() + 5
            while not pid.exists() and time.monotonic() < end:
                time.sleep(0.02)
            alive = pid.exists() and os.path.exists(f"/proc/{{pid.read_text().strip()}}/stat") and \\
                Path(f"/proc/{{pid.read_text().strip()}}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
            Path({str(seen)!r}).write_text(f"{{int(pid.exists())}} {{int(alive)}}")
    """)
    out = pytester.path / "out"
    res = pytester.runpytest_subprocess(str(m), *_plugin_args(), "-p", "no:cacheprovider", "-x",
                                        "--cumatrix-out", str(out), "--cumatrix-sandbox", "off",  # a host pid file
                                        timeout=120)
    res.assert_outcomes(failed=1)
    cells = [r["id"] for r in map(json.loads, (out / "results.jsonl").read_text().splitlines()) if r["type"] == "cell"]
    assert cells == ["cu12.9/host/fails"]
    started, alive = seen.read_text().split()
    assert started == "1", "the next cell was not started ahead (nothing to end)"
    assert alive == "0", "the cell started ahead still ran when the session finished"


@pytest.mark.parametrize("junit", [False, True])
def test_a_run_reports_every_cell_once_with_or_without_pytest_junit(tmp_path: Path, wheel_cache: Path, cli: Any,
                                                                    junit: bool) -> None:
    # Without --junitxml a run logs only the call report of a cell whose setup and teardown
    # passed; with it, pytest's full protocol (its JUnit file is written from teardown reports).
    m = tmp_path / "m.yaml"
    m.write_text(f"runtimes:\n  cu12.9: {{wheel: {RUNTIME}}}\ndrivers: [host]\nprobe: false\ncases:\n"
                 "  - {name: ok1, argv: ['true']}\n  - {name: bad, argv: [sh, -c, 'exit 3']}\n"
                 "  - {name: ok2, argv: ['true']}\n")
    xml = tmp_path / "pytest-junit.xml"
    proc = cli("run", m, "--out", tmp_path / "out", *(["--junitxml", xml] if junit else []), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed, 2 passed" in proc.stdout, proc.stdout
    lines = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in lines if r["type"] == "cell") == [f"cu12.9/host/{n}" for n in ("bad", "ok1", "ok2")]
    if junit:
        text = xml.read_text()
        assert text.count("<testcase ") == 3, text
        assert text.count("<failure ") == 1, text

"""The history through the real command: ``cumatrix run`` appends (default place, the
environment, --history, --no-history), a bad history file stops a run before any cell, and
several processes append to one file at once."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest

from history_nights import State, write_night

RUNTIME = "nvidia-cuda-runtime-cu12==12.9.79"

MATRIX = """
runtimes:
  cu12.9: {{wheel: {rt}}}
drivers: [host]
probe: false
cases:
  - {{name: a, argv: [sh, -c, "exit $(cat {d}/state-a)"]}}
  - {{name: b, argv: [true]}}
"""


@pytest.fixture
def nightly(tmp_path: Path, wheel_cache: Path) -> Path:
    """A matrix whose cell ``a`` exits with the number in ``state-a``, in a git checkout."""
    (tmp_path / "state-a").write_text("0\n")
    m = tmp_path / "m.yaml"
    m.write_text(MATRIX.format(rt=RUNTIME, d=tmp_path))
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
    for argv in (["git", "init", "-q"], ["git", "add", "m.yaml"], ["git", "commit", "-qm", "matrix"]):
        subprocess.run(argv, cwd=tmp_path, check=True, env=env)
    return m


@pytest.mark.network  # the cells provision a runtime wheel (cached after the first)
def test_run_appends_to_the_default_history_and_reports_since_the_last_run(
        nightly: Path, tmp_path: Path, cli: Callable[..., CompletedProcess[str]]) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg"), "CUMATRIX_HISTORY": ""}
    p = cli("run", nightly, "--out", tmp_path / "o1", "-q", cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    default = tmp_path / "xdg" / "cumatrix" / "history.sqlite"
    assert default.is_file()
    assert (default.parent.stat().st_mode & 0o777) == 0o700
    assert "Since the last run" not in (tmp_path / "o1" / "summary.md").read_text()  # nothing to compare yet

    (tmp_path / "state-a").write_text("3\n")
    p = cli("run", nightly, "--out", tmp_path / "o2", "-q", cwd=tmp_path, env=env)
    assert p.returncode == 1, p.stderr
    md = (tmp_path / "o2" / "summary.md").read_text()
    assert "### Since the last run" in md
    assert "<code>cu12.9/host/a</code>: ok:n/a → **exit:3**" in md
    doc = json.loads((tmp_path / "o2" / "results.json").read_text())
    assert [c["cell"] for c in doc["since_last_run"]["new_failures"]] == ["cu12.9/host/a"]

    p = cli("history", "--json", cwd=tmp_path, env=env)
    runs = json.loads(p.stdout)["runs"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True,
                          check=True).stdout.strip()
    assert [(r["kind"], r["counts"]["pass"], r["counts"]["fail"], r["git_commit"]) for r in runs] == [
        ("run", 2, 0, head), ("run", 1, 1, head)]
    assert runs[1]["run_id"] == doc["run"]["run_id"]
    assert runs[0]["matrix_sha256"] == doc["run"]["matrix_sha256"]

    # --no-history records nothing; CUMATRIX_HISTORY and --history name other files
    p = cli("run", nightly, "--out", tmp_path / "o3", "-q", "--no-history", cwd=tmp_path, env=env)
    assert p.returncode == 1
    assert len(json.loads(cli("history", "--json", cwd=tmp_path, env=env).stdout)["runs"]) == 2
    other = tmp_path / "elsewhere.sqlite"
    p = cli("run", nightly, "--out", tmp_path / "o4", "-q", cwd=tmp_path, env={**env, "CUMATRIX_HISTORY": str(other)})
    assert p.returncode == 1
    assert other.is_file()
    p = cli("diff", "--history", other, cwd=tmp_path, env=env)
    assert p.returncode == 2
    assert "first run of its matrix" in p.stderr

    # `cumatrix report` rebuilds the section from the history, read-only
    (tmp_path / "o2" / "summary.md").unlink()
    p = cli("report", tmp_path / "o2", cwd=tmp_path, env=env)
    assert p.returncode == 0
    assert "### Since the last run" in (tmp_path / "o2" / "summary.md").read_text()


@pytest.mark.network
def test_a_bad_history_stops_the_run_before_any_cell(nightly: Path, tmp_path: Path,
                                                      cli: Callable[..., CompletedProcess[str]]) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_text("this is no database " * 100)
    for bad, words in ((junk, "not a cumatrix history"), (tmp_path, "is a directory")):
        p = cli("run", nightly, "--out", tmp_path / "never", "--history", bad, "-q", cwd=tmp_path)
        assert p.returncode == 2, p.stderr
        assert words in p.stderr, p.stderr
        assert "Traceback" not in p.stderr, p.stderr
        assert not (tmp_path / "never" / "results.jsonl").exists()
    p = cli("run", nightly, "--history", junk, "--no-history", cwd=tmp_path)
    assert p.returncode == 2
    assert "not allowed with" in p.stderr


def test_history_command_bad_input(tmp_path: Path, cli: Callable[..., CompletedProcess[str]]) -> None:
    h = tmp_path / "h.sqlite"
    for argv, words in ((("history",), "no history here yet"), (("history", "--prune"), "--keep N or --older-than"),
                        (("history", "--keep", "3"), "go with --prune"),
                        (("history", "--prune", "--keep", "0"), "at least 1"),
                        (("diff", "--window", "1"), "at least 2"), (("diff",), "no history here yet")):
        p = cli(*argv, "--history", h, cwd=tmp_path)
        assert p.returncode == 2, (argv, p.stderr)
        assert words in p.stderr, (argv, p.stderr)
        assert "Traceback" not in p.stderr, (argv, p.stderr)


APPENDER = """
import sys
from pathlib import Path
from cumatrix.results.history import History
from cumatrix.report import load_records
run = load_records(Path(sys.argv[2]) / "results.jsonl")
for _ in range(int(sys.argv[3])):
    with History.open(Path(sys.argv[1])) as h:
        h.append(run, kind="run", commit=None)
"""


def test_concurrent_writers_each_get_their_own_transaction(tmp_path: Path, cli_env: Callable[..., dict[str, str]],
                                                           cli: Callable[..., CompletedProcess[str]]) -> None:
    """Six processes at once, four of them appending in a loop and two `cumatrix merge`s,
    onto one new file: every run stored whole, none lost, the file intact."""
    hist = tmp_path / "h.sqlite"
    cells = {f"cu12.9/host/c{i:03d}": State("pass") for i in range(300)}
    dirs = [write_night(tmp_path / f"n{i}", i, cells) for i in range(6)]
    procs: list[subprocess.Popen[Any]] = []
    for d in dirs[:4]:
        procs.append(subprocess.Popen([sys.executable, "-c", APPENDER, str(hist), str(d), "5"], env=cli_env(),
                                      stderr=subprocess.PIPE, text=True))
    for i, d in enumerate(dirs[4:]):
        procs.append(subprocess.Popen([sys.executable, "-m", "cumatrix", "merge", str(d), "--out",
                                       str(tmp_path / f"m{i}"), "--history", str(hist)], env=cli_env(),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    errors = [(p.communicate(timeout=300)[1], p.returncode)[::-1] for p in procs]
    assert all(rc == 0 and "warning" not in err for rc, err in errors), errors
    conn = sqlite3.connect(hist)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    per_run = conn.execute("SELECT run_uid, count(*) FROM runs GROUP BY run_uid ORDER BY run_uid").fetchall()
    assert per_run == [(f"night{i:02d}abcd", 5) for i in range(4)] + [(f"night{i:02d}abcd", 1) for i in (4, 5)]
    sizes = {n for (n,) in conn.execute("SELECT count(*) FROM results GROUP BY run")}
    assert sizes == {300}
    assert conn.execute("SELECT count(*) FROM cells").fetchone()[0] == 300
    conn.close()

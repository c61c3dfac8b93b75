"""A history database locked by a writer in rollback-journal mode (real SQLite, a real second
connection holding an exclusive transaction): `cumatrix run` starts at once with a warning
that names the lock, runs its cells, and records itself at its end once the lock is gone."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest

MATRIX = """
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
drivers: [host]
probe: false
cases: [{name: a, argv: [true]}]
"""


@pytest.mark.network  # the cell provisions a runtime wheel (cached after the first)
def test_a_locked_history_is_a_warning_and_the_run_goes_on_and_records_itself(
        tmp_path: Path, wheel_cache: Path, cli: Callable[..., CompletedProcess[str]],
        cli_env: Callable[..., dict[str, str]]) -> None:
    (tmp_path / "m.yaml").write_text(MATRIX)
    history = tmp_path / "h.sqlite"
    first = cli("run", "m.yaml", "--out", "o1", "-q", "--history", history, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    # Another tool's writer: rollback-journal mode, in the middle of an exclusive transaction.
    holder = sqlite3.connect(history, isolation_level=None)
    holder.execute("PRAGMA journal_mode = DELETE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("UPDATE runs SET host = host || ' '")  # rolled back below
    err = tmp_path / "stderr"
    t0 = time.monotonic()
    with err.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "cumatrix", "run", "m.yaml", "--out", "o2", "-q", "--history",
                                 str(history)], cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL, stderr=f)
    try:
        while "the history database is locked" not in err.read_text() and time.monotonic() - t0 < 30:
            assert proc.poll() is None, err.read_text()
            time.sleep(0.2)
        text = err.read_text()
        assert "the history database is locked" in text, text
        assert "a writer in rollback-journal mode holds it" in text
        assert f"{history}-journal" in text
        assert "the run goes on" in text
        assert time.monotonic() - t0 < 30  # not the 60 s busy timeout
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert proc.wait(timeout=300) == 0, err.read_text()
    assert "not a cumatrix history" not in err.read_text()
    assert (tmp_path / "o2" / "results.json").is_file()
    with sqlite3.connect(history) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 2

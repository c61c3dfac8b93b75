"""The sandbox is the default: a cell of a plain ``cumatrix run`` is hostile and tries what the
harness's own user could do (issue: "the sandbox is the default").  Unsandboxed, it read the
``--resume`` signing key, rewrote the history and edited its own run's records; every one of
these now fails from inside the cell, and the run's header and reports say how cells were held.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cumatrix.execute.sandbox import SANDBOXED
from helpers.sandbox import require_bwrap

CU129 = "nvidia-cuda-runtime-cu12==12.9.79"

pytestmark = pytest.mark.network  # the cells provision a real runtime wheel (cached after the first)

#: The hostile cell: each attack says what it got; exit 0 either way (the test judges).
ATTACK = r"""
import os, sqlite3, sys
state, hist, out, cache = (os.environ[k] for k in ("STATE", "HIST", "OUT", "CACHE"))
def attempt(name, fn):
    try:
        print(name, "GOT", fn())
    except Exception as e:
        print(name, "refused", type(e).__name__)
attempt("key", lambda: open(os.path.join(state, "cumatrix", "key"), "rb").read().hex())
def rewrite():
    db = sqlite3.connect(hist)
    n = db.execute("select count(*) from sqlite_master").fetchone()[0]
    db.executescript("pragma writable_schema=1; delete from sqlite_master; pragma writable_schema=0;")
    db.commit()
    return n
attempt("history", rewrite)
def edit():
    with open(os.path.join(out, "results.jsonl"), "a") as f:
        f.write('{"type":"cell","id":"forged"}\n')
    return "appended"
attempt("records", edit)
attempt("cache", lambda: os.listdir(cache))
"""


def _env(tmp_path: Path) -> dict[str, str]:
    return {"XDG_STATE_HOME": str(tmp_path / "state"), "CUMATRIX_HISTORY": str(tmp_path / "hist" / "history.sqlite")}


def _matrix(tmp_path: Path, extra: str = "") -> Path:
    # The run's directory as a checkout's is (pytest makes it 0700): a root harness's cells run
    # as nobody, which must enter it to start there.
    tmp_path.chmod(0o755)
    (tmp_path / "attack.py").write_text(ATTACK)
    (tmp_path / "attack.py").chmod(0o644)
    m = tmp_path / "m.yaml"
    env = _env(tmp_path)
    cache = os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")) + "/cumatrix"
    m.write_text(textwrap.dedent(f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: fine, argv: [python3, -c, pass]}}
          - name: attack
            argv: [python3, {tmp_path / 'attack.py'}]
            env: {{STATE: {env['XDG_STATE_HOME']}, HIST: {env['CUMATRIX_HISTORY']}, OUT: {tmp_path / 'out'},
                  CACHE: {cache}}}
        """).lstrip("\n") + extra)
    return m


def _said(out: Path) -> dict[str, str]:
    """What the hostile cell got: attack name -> 'GOT ...' or 'refused ...'."""
    for line in (out / "results.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("id", "").endswith("/attack"):
            return {w.split(" ", 1)[0]: w.split(" ", 1)[1] for w in rec["stdout_tail"].splitlines() if " " in w}
    raise AssertionError("no record of the attacking cell")


def _run_twice(cli: Any, tmp_path: Path, *args: str) -> tuple[Any, dict[str, str]]:
    """A first run makes the key and the history; the second's cell attacks them."""
    m = _matrix(tmp_path)
    env = _env(tmp_path)
    first = cli("run", m, "--out", tmp_path / "first", "-q", *args, cwd=tmp_path, env=env, timeout=180)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (tmp_path / "state" / "cumatrix" / "key").is_file()
    proc = cli("run", m, "--out", tmp_path / "out", "-q", *args, cwd=tmp_path, env=env, timeout=180)
    return proc, _said(tmp_path / "out")


def _history_runs(tmp_path: Path) -> int:
    db = sqlite3.connect(tmp_path / "hist" / "history.sqlite")
    try:
        return int(db.execute("select count(*) from runs").fetchone()[0])
    finally:
        db.close()


def test_a_default_runs_cell_reaches_none_of_what_the_harness_keeps(tmp_path: Path, cli: Any,
                                                                   wheel_cache: Path) -> None:
    """Attacks, from a cell of a default ``cumatrix run``: read the ``--resume`` key (to sign a
    forged pass), rewrite the history (so that ``diff`` says no change), append to its own
    run's ``results.jsonl``, list the cache's wheels.  Before: each worked (the cell ran as the harness's
    user).  Now: each is refused inside the cell, and the harness's files are intact."""
    require_bwrap()
    key = (tmp_path / "state" / "cumatrix" / "key")
    proc, said = _run_twice(cli, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert said["key"].startswith("refused"), said
    assert key.read_bytes().hex() not in (tmp_path / "out" / "results.jsonl").read_text()
    assert said["history"].startswith("refused"), said
    assert _history_runs(tmp_path) == 2  # both runs recorded, nothing of them deleted
    assert said["records"].startswith("refused"), said
    assert "forged" not in (tmp_path / "out" / "results.jsonl").read_text()
    # Of the cache, the cell sees only what its own job names (its runtime, the audit library),
    # read-only: not the wheels and builds of the rest.
    assert (wheel_cache / "wheels").is_dir()
    assert "wheels" not in said["cache"], said
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_the_header_and_every_report_say_the_cells_were_sandboxed(tmp_path: Path, cli: Any,
                                                                  wheel_cache: Path) -> None:
    require_bwrap()
    m = _matrix(tmp_path)
    proc = cli("run", m, "--out", tmp_path / "out", "-q", "-k", "fine", cwd=tmp_path, env=_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "out"
    header = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert header["type"] == "run"
    assert header["sandbox"] in SANDBOXED
    assert json.loads((out / "results.json").read_text())["run"]["sandbox"] in SANDBOXED
    assert f"sandbox {header['sandbox']}" in (out / "summary.md").read_text()
    assert f'name="sandbox" value="{header["sandbox"]}"' in (out / "junit.xml").read_text()
    assert header["sandbox"] in (out / "index.html").read_text()
    assert "WITHOUT a sandbox" not in proc.stdout + proc.stderr


def test_no_sandbox_and_the_matrix_setting_turn_it_off(tmp_path: Path, cli: Any, wheel_cache: Path) -> None:
    """``--no-sandbox`` runs cells as the harness's user again (the key then within reach:
    the user asked for it), and says so; ``sandbox: false`` in the matrix does the same."""
    require_bwrap()
    proc, said = _run_twice(cli, tmp_path, "--no-sandbox")
    assert said["key"].startswith("GOT"), said
    header = json.loads((tmp_path / "out" / "results.jsonl").read_text().splitlines()[0])
    assert header["sandbox"] == "off"
    m = _matrix(tmp_path, "sandbox: false\n")
    proc = cli("run", m, "--out", tmp_path / "off", "-q", "-k", "fine", cwd=tmp_path, env=_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "off" / "results.json").read_text())["run"]["sandbox"] == "off"
    proc = cli("run", m, "--out", tmp_path / "on", "-q", "-k", "fine", "--sandbox", cwd=tmp_path, env=_env(tmp_path))
    assert json.loads((tmp_path / "on" / "results.json").read_text())["run"]["sandbox"] in SANDBOXED


def _refusing_bwrap(tmp_path: Path) -> Path:
    """A stand-in for a bubblewrap the host refuses (Ubuntu 24.04's AppArmor restriction of
    unprivileged user namespaces answers this way), since this host's own one runs."""
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    return fake


def test_where_the_host_cannot_sandbox_the_run_says_so_in_one_line(tmp_path: Path, cli: Any,
                                                                  wheel_cache: Path) -> None:
    m = _matrix(tmp_path)
    env = {**_env(tmp_path), "CUMATRIX_BWRAP": str(_refusing_bwrap(tmp_path))}
    proc = cli("run", m, "--out", tmp_path / "out", "-q", "-k", "fine", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "WITHOUT a sandbox" in ln]
    assert len(lines) == 1, proc.stdout + proc.stderr
    assert "Permission denied" in lines[0]
    assert "fix:" in lines[0]
    assert "--no-sandbox" in lines[0]
    header = json.loads((tmp_path / "out" / "results.jsonl").read_text().splitlines()[0])
    assert header["sandbox"].startswith("none: ")
    assert "sandbox none: " in (tmp_path / "out" / "summary.md").read_text()


def test_require_sandbox_makes_it_an_error(tmp_path: Path, cli: Any, wheel_cache: Path) -> None:
    m = _matrix(tmp_path)
    env = {**_env(tmp_path), "CUMATRIX_BWRAP": str(_refusing_bwrap(tmp_path))}
    proc = cli("run", m, "--out", tmp_path / "out", "-q", "--require-sandbox", cwd=tmp_path, env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "--require-sandbox" in proc.stderr
    assert "fix:" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_under_bubblewrap_a_working_directory_nobody_cannot_enter_is_a_harness_error_that_names_the_fixes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bubblewrap runs a root harness's cells as nobody and cannot show them a private
    directory (the fork server can: ``test_private_project.py``)."""
    if os.geteuid() != 0:
        pytest.skip("only a root harness runs its cells as another uid")
    require_bwrap()
    monkeypatch.setenv("CUMATRIX_FORK_SERVER", "off")
    # deferred: the rest of this module drives the CLI; this one case asks the local backend
    from cumatrix.core.jobs import Job
    from cumatrix.execute.local import HARNESS_PROBLEM, run_local
    from cumatrix.execute.sandbox import Policy

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    res = run_local(Job(cell_id="c", kind="command", timeout=30, argv=("true",)), cwd=str(private),
                    policy=Policy(sandbox="on"))
    problem = res.extra[HARNESS_PROBLEM]
    assert str(private) in problem
    assert "chmod o+rx" in problem
    assert "cwd:" in problem
    assert res.returncode is None

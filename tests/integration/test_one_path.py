"""Every child goes one way: spawned by the execute stage, judged by the judge.

``repro``'s gdb run is contained like a cell (a process it leaves behind is killed, its timeout
kills it, under ``--sandbox`` it runs in bubblewrap as the sandbox's user), and ``calibrate``'s
measuring child passes only when the judge says so.  Real gdb, real bubblewrap, real children.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cumatrix.core.jobs import Job
from cumatrix.execute import sandbox
from cumatrix.execute.local import DEBUGGER_EVIDENCE
from cumatrix.execute.sandbox import SANDBOXED
from cumatrix.front.calibrate import _measure
from cumatrix.front.repro.native import gdb_backtrace
from cumatrix.orchestrate import run_child
from cumatrix.predict.oracle import expect_tool
from cumatrix.provision.cell import PACKAGE_PARENT
from helpers.sandbox import require_bwrap

GDB = shutil.which("gdb")
needs_gdb = pytest.mark.skipif(GDB is None and os.environ.get("CUMATRIX_REQUIRE_GDB") != "1",
                               reason="gdb is not installed")
PYTHON = shutil.which("python3") or sys.executable


def _alive(token: str) -> list[int]:
    """Processes whose command line carries ``token`` (none of this test's own)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.append(int(entry.name))
    return found


@pytest.fixture
def token() -> Iterator[str]:
    """A word no other process carries; whatever still carries it afterwards is killed (and fails the test)."""
    word = f"cumatrix-onepath-{uuid.uuid4().hex}"
    yield word
    for pid in _alive(word):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def _crash_job(token: str, before: str = "", timeout: float = 60.0) -> Job:
    """A command cell's job: run ``before``, then read address 0 (SIGSEGV)."""
    code = f"import ctypes, os, subprocess, sys\n{before}\nctypes.string_at(0)\n"
    return Job(cell_id=f"cu12.9/host/{token}", kind="command", argv=(PYTHON, "-c", code, token), timeout=timeout)


@needs_gdb
def test_the_debugger_run_kills_what_the_cell_left(token: str) -> None:
    # The cell starts a sleeper in a session of its own (out of gdb's process group), then crashes.
    sleeper = (f"subprocess.Popen([{PYTHON!r}, '-c', 'import time; time.sleep(300)', {token!r}], "
               "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)")
    native = gdb_backtrace(_crash_job(token, sleeper))
    assert "Program received signal SIGSEGV" in native.backtrace, native.note
    assert native.spawn is not None
    assert native.spawn["evidence"] == DEBUGGER_EVIDENCE
    assert native.spawn.get("killed_after") == 1, native.spawn  # the sleeper, killed when the run ended
    assert _alive(token) == []


@needs_gdb
def test_the_debugger_run_has_a_timeout(token: str) -> None:
    job = _crash_job(token, "import time; time.sleep(600)", timeout=2.0)
    t0 = time.monotonic()
    native = gdb_backtrace(job, extra_s=3.0)
    took = time.monotonic() - t0
    assert native.backtrace == ""
    assert native.note.startswith("gdb did not finish within 5 s"), native.note
    assert took < 60, took
    assert _alive(token) == []  # gdb and the program it ran are gone


@needs_gdb
def test_the_debugger_run_is_sandboxed(token: str, tmp_path: Path) -> None:
    require_bwrap()
    secret = tmp_path / "host-secret"
    secret.write_text("not for the cell")
    probe = (f"print('uid=%d visible=%s' % (os.getuid(), os.path.exists({str(secret)!r})), flush=True)")
    native = gdb_backtrace(_crash_job(token, probe), policy=sandbox.Policy(sandbox="on"))
    assert native.spawn is not None
    assert native.spawn["sandbox"] in SANDBOXED, native
    assert "Program received signal SIGSEGV" in native.backtrace, native.note
    uid = sandbox.Policy().uid if os.geteuid() == 0 else os.geteuid()
    assert f"uid={uid} visible=False" in native.log, native.log
    assert _alive(token) == []


# --------------------------------------------------------------------------- calibrate's verdict


def _harness_child(code: str) -> Job:
    return Job(cell_id="calibrate", kind="calibrate", reports_verdict=True, timeout=60,
               env=(("PYTHONPATH", PACKAGE_PARENT),), mounts=(PACKAGE_PARENT,),
               argv=(sys.executable, "-c", "from cumatrix.child import channel\n" + code))


def test_a_measuring_child_passes_only_on_the_judges_word() -> None:
    expected = expect_tool("calibrate")
    ok = run_child(_harness_child("channel.emit({'outcome': 'ok', 'path': 'n/a', 'data': {'table': [1]}})"),
                   expected)
    assert (ok.status, ok.observed.outcome, dict(ok.observed.data)) == ("pass", "ok", {"table": [1]})
    # A result printed on stdout is log, never a verdict: the child reported nothing.
    forged = run_child(_harness_child("print(channel.encode({'outcome': 'ok', 'data': {}}).decode())"), expected)
    assert (forged.status, forged.observed.outcome) == ("fail", "harness-error")
    assert "without a verdict" in forged.observed.detail
    # A verdict from a child a signal then ended is not taken.
    killed = run_child(_harness_child("import os, signal\nchannel.emit({'outcome': 'ok', 'data': {}})\n"
                                      "os.kill(os.getpid(), signal.SIGKILL)"), expected)
    assert (killed.status, killed.observed.outcome) == ("fail", "crash:SIGKILL")
    assert killed.mismatch is not None
    assert "expected ok" in killed.mismatch


def test_calibrate_reports_the_judged_outcome_of_its_child(tmp_path: Path) -> None:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this host has an NVIDIA driver: the child would measure")
    spec = {"library": str(tmp_path / "libkvswap.so"), "directions": ["d2h"], "sizes": [4096], "counts": [64],
            "repetitions": 1}
    got = _measure(spec)
    assert isinstance(got, str)
    assert got.startswith("the measuring child ended with skipped:no-cuda-driver: "), got


# --------------------------------------------------------------------------- the gate's installer


def test_the_installer_is_contained_and_timed(token: str, tmp_path: Path) -> None:
    from cumatrix.execute.installer import run_installer

    # An "installer" that leaves a helper behind in its group and then hangs.
    code = (f"import subprocess, time\nsubprocess.Popen([{PYTHON!r}, '-c', 'import time; time.sleep(300)', "
            f"{token!r}])\ntime.sleep(600)")
    t0 = time.monotonic()
    rc, why = run_installer([PYTHON, "-c", code, token], target=tmp_path / "site", inputs=[], wheel_dir=None, policy=None,
                            sandboxable=False, timeout=2)
    assert rc == 124
    assert why.startswith("pip install did not finish in "), why
    assert time.monotonic() - t0 < 60
    assert _alive(token) == []

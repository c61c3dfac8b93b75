"""Nothing of a cell reaches another through the kernel's state: each attack of
``helpers.kernel_state`` run by a root harness and by an ordinary user's, the cells held the
default way (the fork server).

- a port one cell leaves in ``TIME_WAIT`` is free to the next cell's plain ``bind`` (a network
  namespace of its own, made new);
- a key a cell adds to its user keyring or its session keyring is found by no later cell, nor
  in the harness's own session keyring (a user namespace of the cell's own; a session keyring
  of its own);
- a POSIX message queue and System V IPC objects a cell holds are not found by a cell beside it
  (an IPC namespace of its own);
- a cell holding every inotify instance the kernel gives a uid, or many processes under
  ``RLIMIT_NPROC``, takes none from a cell beside it (a root harness gives each cell alive a uid
  of its own; an ordinary user's cells count against their own user namespace's limits).

Real cells through the real server.  The ordinary user is a second local user made with
``useradd`` (skipped where none can be made, or where that user may not make user namespaces).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from helpers.kernel_state import fields
from helpers.sandbox import require_bwrap
from helpers.users import local_user

TESTS = str(Path(__file__).resolve().parents[1])
PACKAGE = str(Path(__import__("cumatrix").__file__).resolve().parents[1])


@pytest.fixture(params=["root", "user"])
def harness(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    require_bwrap()
    monkeypatch.delenv("CUMATRIX_FORK_SERVER", raising=False)
    if request.param == "root" and os.geteuid() != 0:
        pytest.skip("a root harness needs root")
    return str(request.param)


def attack(name: str, harness: str, *, held: str = "namespaces", fork_server: str | None = None
           ) -> dict[str, dict[str, object]]:
    """What the scenario's cells saw, run by a root harness or by a second local user's, held
    as ``held`` says (the fork server's ``namespaces``; ``fork_server="off"``: ``bubblewrap``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CUMATRIX_"))}
    if fork_server is not None:
        env["CUMATRIX_FORK_SERVER"] = fork_server
    # The harness's own dependencies stay reachable where they come from PYTHONPATH (an offline GPU host).
    env["PYTHONPATH"] = os.pathsep.join([TESTS, PACKAGE, *filter(None, [os.environ.get("PYTHONPATH")])])
    argv = [sys.executable, "-m", "helpers.kernel_state", name]
    with tempfile.TemporaryDirectory() as home:
        if harness == "user":
            user = local_user("cmxcells", system=False)
            os.chown(home, user.pw_uid, user.pw_gid)
            env.update(HOME=home, XDG_CACHE_HOME=f"{home}/cache", XDG_STATE_HOME=f"{home}/state",
                       XDG_DATA_HOME=f"{home}/data", TMPDIR=home)
            argv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", *argv]
        proc = subprocess.run(argv, env=env, cwd=home, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for side in ("first", "second"):
        if got[side]["sandbox"] != held:
            if harness == "user" and os.environ.get("CUMATRIX_REQUIRE_BWRAP") != "1":
                pytest.skip(f"an ordinary user's cells are not held as {held} here: {got[side]}")
            pytest.fail(f"the cells were not held as {held}: {got[side]}")
    return got


def test_a_port_left_in_time_wait_is_free_to_the_next_cell(harness: str) -> None:
    got = attack("time-wait", harness)
    assert str(got["first"]["out"]).startswith("time-wait "), got
    assert got["first"]["out"] != "time-wait 0", got  # the first cell did leave one
    assert "bound" in str(got["second"]["out"]), got
    assert "sockets 1" in str(got["second"]["out"]), got  # its own listener, and nothing else
    # Served, the cells are traced whole by a tracer that sees them from the host's side.
    assert got["second"]["traced"] is True, got
    assert str(got["second"]["exe"]).startswith("/usr/bin/python3") or "python" in str(got["second"]["exe"]), got


ENOSYS = -38


def test_no_key_a_cell_stores_is_found_by_a_later_cell_or_the_harness(harness: str) -> None:
    got = attack("keys", harness)
    # The kernel's keyrings are refused to a cell: a key is shown to every process of its host
    # uid until the kernel collects it, and an ordinary user's cells all have that uid.
    assert got["first"]["out"] == f"user {ENOSYS} session {ENOSYS}", got
    for looked in ("second", "later"):  # beside the first cell, then after it
        assert got[looked]["out"].splitlines() == [f"user {ENOSYS} session {ENOSYS}", "listed False"], got
    assert got["harness"] is False, "a cell's key landed in the harness's session keyring"


def test_no_abi_of_the_kernel_lets_a_cell_reach_a_keyring(harness: str) -> None:
    got = attack("key-roads", harness)
    host = fields(str(got["unsandboxed"]["out"]))
    assert int(host["native"]) > 0, got  # the road exists here: the user keyring's serial number
    for side in ("first", "second"):
        cell = fields(str(got[side]["out"]))
        assert cell["native"] == str(ENOSYS), got
        # x32's numbers and i386's int 0x80 are refused too where the kernel runs them at all
        # (a kernel without them answers ENOSYS, or ends an int 0x80 with a signal).
        for road in ("x32", "i386"):
            # Refused by the filter, or (int 0x80 where the kernel has no ia32 emulation) ended
            # with a signal in the cell as outside it.
            assert cell[road] == str(ENOSYS) or (cell[road].startswith("signal") and host[road].startswith("signal")), \
                (road, got)
    opened = [road for road in ("x32", "i386") if host[road].isdigit() and int(host[road]) > 0]
    print("roads the kernel runs unsandboxed:", ["native", *opened])


def test_a_cell_bubblewrap_holds_reaches_no_keyring_either(harness: str) -> None:
    # bubblewrap per cell (the fork server off, or a cell too large for it): the spawn helper
    # puts the same filter in place before bubblewrap starts.
    got = attack("key-roads", harness, held="bubblewrap", fork_server="off")
    host = fields(str(got["unsandboxed"]["out"]))
    assert int(host["native"]) > 0, got
    for side in ("first", "second"):
        cell = fields(str(got[side]["out"]))
        assert cell["native"] == str(ENOSYS), got
        assert cell["i386"] == str(ENOSYS) or (cell["i386"].startswith("signal") and host["i386"].startswith("signal")), got


def test_a_message_queue_a_cell_holds_is_not_found_beside_it(harness: str) -> None:
    got = attack("mqueue", harness)
    assert got["first"]["out"].startswith("made True"), got
    assert got["second"]["out"] == "not found 2", got


def test_system_v_ipc_a_cell_holds_is_not_found_beside_it(harness: str) -> None:
    got = attack("sysv", harness)
    assert got["first"]["out"] == "made True True True", got
    assert got["second"]["out"] == "found False False False", got


def test_a_cell_holding_every_inotify_instance_takes_none_from_the_cell_beside_it(harness: str) -> None:
    if harness == "user":
        # One uid is all an ordinary user has to give: the kernel counts its cells' inotify
        # instances against it, above their own namespaces (docs/threat-model.md says so).
        pytest.skip("an ordinary user's cells share its uid's inotify limit")
    got = attack("inotify", harness)
    held = int(str(got["first"]["out"]).split()[1])
    limit = int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    assert 0 < held <= limit, got
    assert int(str(got["second"]["out"]).split()[1]) >= min(held, limit // 2), got


def test_processes_of_one_cell_do_not_count_against_the_next_cells_rlimit_nproc(harness: str) -> None:
    got = attack("nproc", harness)
    assert got["first"]["out"] == "forked 30 error 0", got
    assert got["second"]["out"] == "forked 10 error 0", got


#: The first cell of a default run: a port left in TIME_WAIT, a try at a key in its user keyring.
LEAVE = r"""
import ctypes, socket, sys, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", int(sys.argv[1]))); srv.listen()
cli = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
conn, _ = srv.accept(); conn.close(); time.sleep(0.2); cli.close(); srv.close()
libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long
r = libc.syscall(248, b"user", sys.argv[2].encode(), b"secret", 6, -4)
print("key", r if r >= 0 else -ctypes.get_errno())
"""

#: The second: a plain bind of that port, and a search for that key.
FIND = r"""
import ctypes, socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1]))); print("bound")
except OSError as e:
    print("bind failed", e.errno)
libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long
print("key found", libc.syscall(250, 10, -4, b"user", sys.argv[2].encode(), 0) >= 0)
"""


@pytest.mark.network  # the cells provision a real runtime wheel (cached after the first)
def test_in_a_default_run_a_later_cell_finds_nothing_the_cell_before_left(tmp_path: Path, cli: Any,
                                                                          wheel_cache: Path) -> None:
    """The same attacks from the cells of a plain ``cumatrix run`` (one after the other, as a
    serial run holds them: the next made ready while one runs)."""
    require_bwrap()
    tmp_path.chmod(0o755)
    (tmp_path / "leave.py").write_text(LEAVE)
    (tmp_path / "find.py").write_text(FIND)
    port, desc = str(20000 + os.getpid() % 20000), f"cmxrun{os.getpid()}"
    m = tmp_path / "m.yaml"
    m.write_text(textwrap.dedent(f"""
        runtimes: {{cu12.9: {{wheel: nvidia-cuda-runtime-cu12==12.9.79}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: a-leave, argv: [python3, {tmp_path / 'leave.py'}, "{port}", {desc}]}}
          - {{name: b-find, argv: [python3, {tmp_path / 'find.py'}, "{port}", {desc}]}}
        """).lstrip("\n"))
    proc = cli("run", m, "--out", tmp_path / "out", "-q", cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = {json.loads(line).get("id", "").rsplit("/", 1)[-1]: json.loads(line)
           for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()}
    assert f"key {ENOSYS}" in out["a-leave"]["stdout_tail"], out["a-leave"]  # no keyring in a cell
    assert "bound" in out["b-find"]["stdout_tail"], out["b-find"]
    assert "key found False" in out["b-find"]["stdout_tail"], out["b-find"]

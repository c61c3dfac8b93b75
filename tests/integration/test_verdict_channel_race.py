"""Attack: reach a harness child's verdict channel in the window before it makes itself private.

A harness child (probe, swap cell) holds its verdict channel from its ``exec`` on, and is
dumpable until its first statement runs ``prctl(PR_SET_DUMPABLE, 0)``.  With a pipe, any
process of the same user could open ``/proc/PID/fd/N`` in that window and write a verdict
line of its own.  The channel is now a connected Unix socket, which ``/proc`` cannot open at
all.  Here a separate process of the same user races many harness children, each made to
stay dumpable for its whole life (the window at its widest), through the real cell path
(spawn helper, tracer); a control shows the same attacker opening a pipe held the same way.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cumatrix.core.jobs import Job
from cumatrix.execute.local import run_local

#: The attacker: for ``seconds``, find every process whose environment names a verdict
#: descriptor, open that descriptor through /proc and write a forged verdict into it.  Only
#: processes carrying this test's mark are attacked: other runs on the machine are left alone.
ATTACKER = r"""
import errno, json, os, sys, time
until = time.monotonic() + float(sys.argv[1])
mark = ("CUMATRIX_RACE_MARK=" + sys.argv[2]).encode()
me = os.getpid()
found, opened, refused = set(), set(), {}
while time.monotonic() < until:
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        items = env.split(b"\0")
        if mark not in items:
            continue
        for item in items:
            if not item.startswith(b"CUMATRIX_VERDICT_FD="):
                continue
            found.add(name)
            fd = item.split(b"=", 1)[1].decode()
            try:
                w = os.open(f"/proc/{name}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                refused[errno.errorcode.get(e.errno, str(e.errno))] = refused.get(
                    errno.errorcode.get(e.errno, str(e.errno)), 0) + 1
                continue
            try:
                os.write(w, b'CUMATRIX-RESULT {"outcome": "ok", "detail": "forged"}\n')
                opened.add(name)
            except OSError:
                pass
            finally:
                os.close(w)
print(json.dumps({"found": sorted(found), "opened": sorted(opened), "refused": refused}))
"""

#: A harness child that never makes itself private: dumpable, its channel open, for 0.4 s.
CHILD = ("import time; time.sleep(0.4); from cumatrix.child import channel; "
         "channel.emit({'outcome': 'ok', 'detail': 'mine'}, environ=channel.take_channel())")


MARK = secrets.token_hex(8)


def _attacker(seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", ATTACKER, str(seconds), MARK], stdout=subprocess.PIPE, text=True)


def test_a_racing_process_cannot_write_a_harness_childs_verdict(tmp_path: Path) -> None:
    tries = 12
    attacker = _attacker(tries * 0.9 + 5)
    time.sleep(0.3)
    env = (("PYTHONPATH", str(Path(__file__).resolve().parents[2] / "src")), ("CUMATRIX_RACE_MARK", MARK))
    results = []
    for i in range(tries):
        res = run_local(Job(cell_id=f"race-{i}", kind="probe", timeout=30, env=env, reports_verdict=True,
                            argv=(sys.executable, "-c", CHILD)))
        results.append(res)
    out, _ = attacker.communicate(timeout=60)
    seen = json.loads(out)
    for res in results:
        assert res.verdict is not None, (res.verdict_error, res.stderr_tail)
        assert res.verdict_error is None, res.verdict_error
        assert res.verdict.detail == "mine", res.verdict
    # The race was run: the attacker found the children while their channel was open ...
    assert len(seen["found"]) >= tries // 2, seen
    # ... and could open none of them: /proc refuses to open a socket.
    assert seen["opened"] == [], seen
    assert seen["refused"].get("ENXIO", 0) >= tries, seen  # (ENOENT: the child had closed it)


def test_the_same_attacker_opens_a_pipe_held_the_same_way() -> None:
    """Control: the attacker above is real.  A process of the same user holding a pipe's write
    end under the same variable has it opened and written by the attacker."""
    r, w = os.pipe()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"], pass_fds=(w,),
                              env={**os.environ, "CUMATRIX_VERDICT_FD": str(w), "CUMATRIX_RACE_MARK": MARK})
    os.close(w)
    try:
        attacker = _attacker(1.5)
        out, _ = attacker.communicate(timeout=60)
    finally:
        holder.kill()
        holder.wait()
    seen = json.loads(out)
    if str(holder.pid) not in seen["found"]:
        pytest.skip(f"the attacker could not read the holder's environment here: {seen}")
    assert str(holder.pid) in seen["opened"], seen
    os.set_blocking(r, False)
    assert b'"forged"' in os.read(r, 4096)
    os.close(r)

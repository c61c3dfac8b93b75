"""The fork server's own promises, attacked: cells held at once cannot reach each other, a
network namespace handed from one cell to the next carries nothing, a cell cannot reach the
server, another local user cannot either, a cell whose tracer is lost has no outcome, and a
cell made ready ahead of its turn runs nothing of its program before it.

Real processes through the real server (a root harness with cgroups, or an ordinary user's
from the server's own user namespace; skipped where neither holds cells).  The boundary tests of
bubblewrap's sandbox run against the server too (``test_sandbox_boundary.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cumatrix.core.jobs import Job
from cumatrix.execute import forkserver
from cumatrix.execute.local import HARNESS_PROBLEM, ready_local, run_local, start_local
from cumatrix.execute.sandbox import Policy
from cumatrix.execute.spawn import spawn_shim
from cumatrix.judge.classify import classify
from helpers.sandbox import require_bwrap
from helpers.users import local_user

PY = sys.executable
ON = Policy(sandbox="on")


@pytest.fixture(autouse=True)
def served(monkeypatch: pytest.MonkeyPatch) -> None:
    require_bwrap()
    monkeypatch.delenv(forkserver.ENV_SWITCH, raising=False)
    probe = run_local(Job(cell_id="p", kind="command", timeout=30, argv=("true",)), policy=ON)
    if probe.extra.get("sandbox") != "namespaces":
        if os.geteuid() == 0 and os.environ.get("CUMATRIX_REQUIRE_BWRAP") == "1":
            pytest.fail(f"a root harness with bubblewrap did not use the fork server: {probe.extra}, "
                        f"{forkserver.why_not()}")
        pytest.skip(f"cells are not held by the fork server here: {probe.extra.get('sandbox')}")


def job(code: str, *args: str, timeout: float = 60) -> Job:
    return Job(cell_id="t", kind="command", timeout=timeout, argv=(PY, "-c", code, *args))


LISTENER = """
import os, socket, sys, time
a = socket.socket(socket.AF_UNIX); a.bind("\\0cumatrix-held-a"); a.listen()
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("127.0.0.1", int(sys.argv[1]))); t.listen()
open(sys.argv[2], "w").write("up") if len(sys.argv) > 2 else None
print("pid", os.getpid(), flush=True)
time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 6)
print("alive at the end", flush=True)
"""

PROBE = """
import os, signal, socket, sys
mine = {int(p) for p in os.listdir("/proc") if p.isdigit()}
print("procs", len(mine))
for addr, fam in (("\\0cumatrix-held-a", socket.AF_UNIX), (("127.0.0.1", int(sys.argv[1])), socket.AF_INET)):
    s = socket.socket(fam); s.settimeout(2)
    try:
        s.connect(addr); print("connected", addr)
    except OSError as e:
        print("refused", e.errno)
try:
    os.kill(-1, signal.SIGKILL) if len(sys.argv) > 2 else None
except OSError as e:
    print("kill -1", e.errno)
"""


def test_cells_held_at_once_cannot_see_reach_or_signal_each_other(tmp_path: Path) -> None:
    port = 40000 + os.getpid() % 20000
    ready = tmp_path / "ready"  # the listener says it is up in the one host file it may write
    ready.touch()
    ready.chmod(0o666)
    a = start_local(Job(cell_id="a", kind="command", timeout=60, argv=(PY, "-c", LISTENER, str(port), str(ready)),
                        writable=(str(ready),)), policy=ON)
    deadline = time.monotonic() + 20
    while not ready.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.read_text() == "up"
    b = run_local(job(PROBE, str(port)), policy=ON)
    killer = run_local(job(PROBE, str(port), "kill"), policy=ON)
    res_a = a.wait()
    assert b.extra["sandbox"] == killer.extra["sandbox"] == "namespaces"
    assert "connected" not in b.stdout_tail, b.stdout_tail
    assert b.stdout_tail.count("refused") == 2, b.stdout_tail
    # A cell sees its own processes only: the interpreter and its pid 1.
    assert "procs 2" in b.stdout_tail, b.stdout_tail
    # kill(-1) from another cell reaches nothing of the first, which ends as it meant to.
    assert res_a.returncode == 0, (res_a.stdout_tail, res_a.stderr_tail)
    assert "alive at the end" in res_a.stdout_tail


LEAVE_DAEMON = """
import os, socket, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        t.bind(("127.0.0.1", int(sys.argv[1]))); t.listen()
        a = socket.socket(socket.AF_UNIX); a.bind("\\0cumatrix-held-a"); a.listen()
        time.sleep(60)
    os._exit(0)
time.sleep(0.5)
print("left a daemon")
"""


def test_a_network_namespace_passed_on_carries_nothing_of_the_cell_before(tmp_path: Path) -> None:
    port = 40000 + (os.getpid() + 7) % 20000
    for _ in range(3):  # one cell at a time: each takes the namespace the one before gave back
        left = run_local(job(LEAVE_DAEMON, str(port)), policy=ON)
        assert "left a daemon" in left.stdout_tail, left.stderr_tail
        after = run_local(job(PROBE, str(port)), policy=ON)
        assert "connected" not in after.stdout_tail, after.stdout_tail
        assert after.stdout_tail.count("refused") == 2, after.stdout_tail


REACH_SERVER = """
import os, sys
fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
print("fds", fds)
seen = []
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            seen.append(open(f"/proc/{p}/cmdline", "rb").read().replace(b"\\0", b" ").decode())
        except OSError:
            pass
print("serve" if any("--serve" in c and "cumatrix-spawn" in c for c in seen if "python" not in c) else "no server")
print("uid", os.getuid(), os.getgid(), os.getgroups())
"""


def test_a_cell_holds_nothing_of_the_server_and_cannot_reach_it() -> None:
    res = run_local(job(REACH_SERVER), policy=ON)
    assert res.returncode == 0, res.stderr_tail
    # stdin, stdout, stderr and the descriptor its listing opened: no socket to the server.
    assert "fds [0, 1, 2, 3]" in res.stdout_tail, res.stdout_tail
    # nobody, with no group; a non-root server cannot drop its user's supplementary groups (as
    # under bubblewrap): they show as the overflow group.
    assert "uid 65534 65534 [" in res.stdout_tail, res.stdout_tail
    if os.geteuid() == 0:
        assert "uid 65534 65534 []" in res.stdout_tail, res.stdout_tail
    server = forkserver._SERVERS[os.getpid()]
    # The cell's pid 1 is a fork of the server (its command line reads the same); the server
    # itself, its socket and its other cells are in no namespace of the cell's.
    # A cell's tracer takes its mount namespace down after it has told the harness the cell
    # ended (so that the harness need not wait for it): it is gone a moment later.
    deadline = time.monotonic() + 5
    while True:
        tree = subprocess.run(["ps", "-o", "stat=", "--ppid", str(server.proc.pid)], capture_output=True, text=True,
                              check=False)
        if all(st.startswith("Z") for st in tree.stdout.split()) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert all(st.startswith("Z") for st in tree.stdout.split()), "no tracer is left running once its cell ended"
    assert not os.access(f"/proc/{server.proc.pid}/environ", os.R_OK) or os.geteuid() == 0


def test_another_local_user_cannot_reach_the_server() -> None:
    if os.geteuid() != 0:
        pytest.skip("acting as another local user needs root")
    user = local_user("cmxother")
    run_local(job("pass"), policy=ON)
    server = forkserver._SERVERS[os.getpid()].proc.pid
    script = (f"ls /proc/{server}/fd >/dev/null 2>&1 && echo fds-listed; "
              f"cat /proc/{server}/environ >/dev/null 2>&1 && echo environ-read; "
              f"kill -0 {server} 2>/dev/null && echo signalled; echo done")
    out = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
                          "sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "done", out


def _tracers(server_pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=,stat=", "--ppid", str(server_pid)], capture_output=True, text=True,
                         check=False).stdout
    return [int(line.split()[0]) for line in out.splitlines() if line.split()[1:] and not line.split()[1].startswith("Z")]


def test_a_cell_whose_tracer_is_lost_has_no_outcome() -> None:
    child = start_local(job("import time; print('started', flush=True); time.sleep(30)"), policy=ON)
    server = forkserver._SERVERS[os.getpid()].proc.pid
    deadline = time.monotonic() + 10
    while not _tracers(server) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in _tracers(server):
        os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    res = child.wait()
    assert time.monotonic() - t0 < 15, "the cell ended with its tracer"
    assert res.returncode is None
    assert res.signal is None
    assert "fork server" in res.extra[HARNESS_PROBLEM]
    assert classify(res, kind="command").outcome == "harness-error"


def test_a_server_that_ended_is_started_again() -> None:
    run_local(job("pass"), policy=ON)
    srv = forkserver._SERVERS[os.getpid()]
    srv.proc.kill()
    srv.proc.wait()
    res = run_local(job("print('again')"), policy=ON)
    assert res.returncode == 0, res.stderr_tail
    assert "again" in res.stdout_tail
    assert forkserver._SERVERS[os.getpid()].proc.pid != srv.proc.pid


def test_the_server_refuses_what_is_not_a_cell() -> None:
    helper = spawn_shim()
    assert helper is not None
    srv = forkserver.ForkServer(helper)
    try:
        st_r, st_w = os.pipe()
        srv.submit(["not-a-cell", "x"], [st_w, st_w, st_w, st_w])
        os.close(st_w)
        os.set_blocking(st_r, True)
        assert os.read(st_r, 64) == b"", "a malformed message gets no status: the harness says it was lost"
        os.close(st_r)
        assert srv.alive()
    finally:
        srv.close()


def test_a_descriptor_handed_to_the_program_at_any_number_leaves_the_cell_its_namespace(tmp_path: Path) -> None:
    """The program gets the verdict channel at the number the harness holds it; the server's
    pooled network namespaces are low numbers too, and neither may stand in the other's way.
    A fresh harness process grows the pool with cells held at once, then hands descriptors at
    every low number the pool uses."""
    script = tmp_path / "low.py"
    script.write_text("""
import os, sys, time
from pathlib import Path
from cumatrix.execute import forkserver
from cumatrix.execute.sandbox import Policy, sandbox_ops
from cumatrix.execute.spawn import spawn_shim
cell = forkserver.ServedCell(ops=sandbox_ops(cwd="/", policy=Policy(sandbox="on")), uid=65534, procs=None,
                             limits="-", cgroup=Path("/nonexistent"))
devnull = os.open(os.devnull, os.O_WRONLY)
held = [forkserver.start(cell, spawn_shim(), ["/bin/sleep", "1"], {"PATH": "/usr/bin:/bin"}, devnull, [])
        for _ in range(8)]  # eight at once: eight namespaces in the pool
for p in held:
    assert p.wait(timeout=30) == 0
    p.stdout.close(); p.stderr.close(); p.close()
bad = []
for target in range(3, 10):  # dash names one digit after >&
    r, w = os.pipe()
    try:
        os.fstat(target)
        used = True  # this process's own (the pipe just made, too)
    except OSError:
        used = False
    if used or target in (r, w):
        os.close(r)
        os.close(w)
        continue
    os.dup2(w, target)
    os.close(w)
    p = forkserver.start(cell, spawn_shim(), ["/bin/sh", "-c", f"echo through >&{target}"],
                         {"PATH": "/usr/bin:/bin"}, devnull, [target])
    os.close(target)
    rc, err, got = p.wait(timeout=30), p.stderr.read().decode().strip(), os.read(r, 64)
    os.close(r)
    p.stdout.close(); p.stderr.close(); p.close()
    print(target, rc, got, err)
    if rc != 0 or got != b"through\\n":
        bad.append(target)
sys.exit(1 if bad else 0)
""")
    proc = subprocess.run([PY, str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("through") >= 3, proc.stdout


def test_a_cell_too_large_for_the_server_is_held_by_bubblewrap_and_says_why() -> None:
    # 1.2 MB of environment: more than one message of the server's, less than exec's limit.
    big = {f"CUMATRIX_BIG_{i}": "x" * 100_000 for i in range(12)}
    res = run_local(Job(cell_id="big", kind="command", timeout=60, env=big,
                        argv=(PY, "-c", "import os; print(sum(k.startswith('CUMATRIX_BIG_') for k in os.environ))")),
                    policy=ON)
    assert res.returncode == 0, res.stderr_tail
    assert res.stdout_tail.strip() == "12"
    assert res.extra["sandbox"] == "bubblewrap"
    assert "more than the fork server reads" in res.extra["fork_server_refused"]


MARK = """
import sys, time
open(sys.argv[1], "a").write(f"ran {time.monotonic()}\\n")
time.sleep(float(sys.argv[2]))
"""


def _mark_file(tmp_path: Path) -> Path:
    mark = tmp_path / "mark"  # the one host file the cell may write
    mark.touch()
    mark.chmod(0o666)
    return mark


def test_a_cell_made_ready_runs_nothing_of_its_program_until_it_goes(tmp_path: Path) -> None:
    mark = _mark_file(tmp_path)
    cell = Job(cell_id="r", kind="command", timeout=60, argv=(PY, "-c", MARK, str(mark), "0"),
               writable=(str(mark),))
    ready = ready_local(cell, policy=ON)
    time.sleep(1.0)  # long enough for its sandbox, and for its program had it been started
    assert mark.read_text() == ""
    went = time.monotonic()
    res = ready.go().wait()
    assert res.returncode == 0, (res.stdout_tail, res.stderr_tail)
    assert res.extra["sandbox"] == "namespaces"
    ran = float(mark.read_text().split()[1])
    assert ran >= went, "the program ran before go"


def test_a_cell_made_ready_and_dropped_never_runs_and_leaves_nothing(tmp_path: Path) -> None:
    mark = _mark_file(tmp_path)
    cell = Job(cell_id="r", kind="command", timeout=60, argv=(PY, "-c", MARK, str(mark), "0"),
               writable=(str(mark),))
    ready = ready_local(cell, policy=ON)
    time.sleep(0.5)
    ready.cancel()
    time.sleep(0.5)
    assert mark.read_text() == ""
    # The server takes the next cell as before, and nothing of the dropped one is in its way.
    after = run_local(Job(cell_id="n", kind="command", timeout=60, argv=(PY, "-c", MARK, str(mark), "0"),
                          writable=(str(mark),)), policy=ON)
    assert after.returncode == 0, after.stderr_tail
    assert mark.read_text().count("ran") == 1


def test_a_ready_cells_timeout_counts_from_its_go(tmp_path: Path) -> None:
    mark = _mark_file(tmp_path)
    cell = Job(cell_id="r", kind="command", timeout=2, argv=(PY, "-c", MARK, str(mark), "0.5"),
               writable=(str(mark),))
    ready = ready_local(cell, policy=ON)
    time.sleep(2.5)  # longer than its timeout, before its turn
    res = ready.go().wait()
    assert not res.timed_out, (res.stdout_tail, res.stderr_tail)
    assert res.returncode == 0, (res.stdout_tail, res.stderr_tail)
    assert 0.5 <= res.duration_s < 2, res.duration_s


def test_a_served_cells_record_names_its_program_and_its_init_and_nothing_of_the_helper() -> None:
    """The tracer stops neither at the init's exit nor for its SIGCHLD, and reads no maps of the
    helper's image the program's process leaves at its exec: the record still says how the init
    and the program ended, and names only what the program mapped."""
    res = run_local(job("import sys; sys.exit(3)"), policy=ON)
    assert res.returncode == 3, res.stderr_tail
    trace = res.trace
    assert trace is not None
    assert trace.traced, trace
    assert trace.complete, trace
    helper = str(spawn_shim())
    assert not [o.path for o in trace.objects if o.path == helper], "the helper's image is not the cell's"
    assert any(o.path.endswith("libc.so.6") or "/libc-" in o.path for o in trace.objects), trace.objects
    ends = {p.exe: p.exit_code for p in trace.processes if p.exe}
    assert ends.get(helper) == 3, f"the init ends as its program did, on the record: {trace.processes}"
    program = [p for p in trace.processes if p.images and p.exe and p.exe != helper]
    assert [p.exit_code for p in program] == [3], trace.processes
    assert os.path.realpath(program[0].images[-1]) == os.path.realpath(PY), program

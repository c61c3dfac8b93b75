"""A cell is its whole process tree, and sees nothing of the harness: real processes, real kills.

Each test is one attack: a ``setsid`` double-forked daemon, a SIGKILL of the harness (serial
and ``-n 2``), a cell reading the harness's secrets or importing its packages, a sandboxed
cell reaching the host's network or writing the host's files.  bubblewrap tests skip where
it is absent unless ``CUMATRIX_REQUIRE_BWRAP=1``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cumatrix.core.jobs import Job
from cumatrix.execute import sandbox, spawn
from cumatrix.execute.local import run_local
from cumatrix.execute.sandbox import SANDBOXED as HELD_BY
from cumatrix.execute.sandbox import Policy
from cumatrix.judge.classify import classify
from helpers.procs import alive
from helpers.results import read_cells_by_case
from helpers.sandbox import require_bwrap

REPO = Path(__file__).resolve().parents[2]
RUNTIME = "nvidia-cuda-runtime-cu12==12.9.79"
PY = sys.executable
REQUIRE_BWRAP = os.environ.get("CUMATRIX_REQUIRE_BWRAP") == "1"

#: A cell that leaves a daemon: fork, setsid, fork again, and the grandchild re-execs
#: ``sleep`` with an empty environment (no marker to find it by); the cell itself exits 0.
DAEMON = """
import os, sys, time
out = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(out + '.tmp', 'w') as f:
            f.write(str(os.getpid()))
        os.rename(out + '.tmp', out)
        os.execve('/bin/sleep', ['sleep', '300'], {})
    os._exit(0)
while not os.path.exists(out):
    time.sleep(0.01)
"""


def _all_gone(pids: set[int], within: float = 10.0) -> set[int]:
    end = time.monotonic() + within
    while time.monotonic() < end:
        left = {p for p in pids if alive(p)}
        if not left:
            return set()
        time.sleep(0.05)
    return {p for p in pids if alive(p)}


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace").replace("\0", " ")
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _kill_leftovers(pids: set[int]) -> None:
    for p in pids:
        if alive(p):
            os.kill(p, signal.SIGKILL)


def _cgroup_usable() -> bool:
    home = sandbox._cgroup2_home()
    return home is not None and os.access(home / "cgroup.procs", os.W_OK)


# ------------------------------------------------------------------------ one cell's tree

_CHILD = """
import json, sys
from cumatrix.core.jobs import Job
from cumatrix.execute.local import run_local
res = run_local(Job(cell_id="t", kind="command", argv=(sys.executable, "-c", sys.argv[1], sys.argv[2]), timeout=30))
print(json.dumps({"rc": res.returncode, "extra": res.extra, "err": res.stderr_tail, "timed_out": res.timed_out,
                  "wall": res.duration_s}))
"""


@pytest.mark.parametrize("mode", ["cgroup-v2", "subreaper"])
def test_setsid_double_fork_daemon_ends_with_the_cell(mode: str, tmp_path: Path, cli_env: Any) -> None:
    if mode == "cgroup-v2" and not _cgroup_usable():
        pytest.skip(f"no writable cgroup v2 here ({sandbox.Containment().why})")
    pidfile = tmp_path / "daemon.pid"
    env = cli_env({"CUMATRIX_CONTAINMENT": mode})
    proc = subprocess.run([PY, "-c", _CHILD, DAEMON, str(pidfile)], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["rc"] == 0, got["err"]
    # The cell ends when its process does, though the daemon holds its stdout open.
    assert not got["timed_out"]
    assert got["wall"] < 10
    assert got["extra"]["containment"] == mode
    daemon = int(pidfile.read_text())
    try:
        assert _all_gone({daemon}, within=5) == set(), f"the {mode} cell's daemon {daemon} survived the cell"
        assert got["extra"]["killed_after"] >= 1  # the result says the cell left something running
    finally:
        _kill_leftovers({daemon})


def test_daemon_of_a_timed_out_cell_ends_too(tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    code = DAEMON + "time.sleep(300)\n"
    res = run_local(Job(cell_id="t", kind="command", argv=(PY, "-c", code, str(pidfile)), timeout=2))
    assert classify(res, kind="command").outcome == "timeout"
    daemon = int(pidfile.read_text())
    try:
        assert _all_gone({daemon}, within=5) == set()
    finally:
        _kill_leftovers({daemon})


def test_spawn_without_a_compiler_still_contains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No C compiler: no spawn shim, the same steps in a preexec_fn, the same containment."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("CUMATRIX_CACHE", raising=False)
    monkeypatch.setattr(spawn, "_SHIM", {})
    assert sandbox.spawn_shim() is None
    pidfile = tmp_path / "daemon.pid"
    res = run_local(Job(cell_id="t", kind="command", argv=(PY, "-c", DAEMON, str(pidfile)), timeout=30))
    assert res.returncode == 0, res.stderr_tail
    assert not res.timed_out, res.stderr_tail
    assert res.extra["spawn"] == "preexec"
    daemon = int(pidfile.read_text())
    try:
        assert _all_gone({daemon}, within=5) == set()
    finally:
        _kill_leftovers({daemon})


def test_spawn_shim_is_used_where_a_compiler_exists() -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on PATH")
    res = run_local(Job(cell_id="t", kind="command", argv=("true",), timeout=30))
    assert res.returncode == 0
    assert "spawn" not in res.extra
    missing = run_local(Job(cell_id="t", kind="command", argv=("no-such-program-cumatrix",), timeout=30))
    assert missing.returncode == 127
    assert "cannot start 'no-such-program-cumatrix'" in missing.stderr_tail


@pytest.mark.parametrize(("script", "code", "sig"), [
    ("exit 7", 7, None),
    ("kill -SEGV $$", None, signal.SIGSEGV),
    # The program signals its own process group, as `kill 0` in a cleanup trap does: the
    # shim that waits for it (cgroup-v2) ignores that, so the status is the program's.
    ("kill -TERM 0; sleep 1; exit 3", None, signal.SIGTERM),
    ("trap '' TERM; kill -TERM 0; exit 4", 4, None),
])
def test_the_status_is_the_programs_own(script: str, code: int | None, sig: int | None) -> None:
    res = run_local(Job(cell_id="t", kind="command", argv=("sh", "-c", script), timeout=30))
    assert (res.returncode, res.signal, res.timed_out) == (code, sig, False), res.stderr_tail


def test_the_program_starts_in_its_cells_cgroup() -> None:
    """Started there (clone3 CLONE_INTO_CGROUP), not moved in after: the program's first
    read of /proc/self/cgroup already names the cell's group."""
    box = sandbox.containment()
    if box.group is None:
        pytest.skip(f"containment is {box.mode}: {box.why}")
    res = run_local(Job(cell_id="t", kind="command", argv=("cat", "/proc/self/cgroup"), timeout=30))
    assert res.returncode == 0, res.stderr_tail
    line = next(ln for ln in res.stdout_tail.splitlines() if ln.startswith("0::"))
    assert line.split("/")[-2] == box.group.name, line
    assert line.split("/")[-1].startswith("c"), line


# ------------------------------------------------------------------------ SIGKILL of the harness

TREE = """
runtimes:
  cu12.9: {{wheel: {rt}}}
drivers: [host]
probe: false
cases:
  - {{name: a, argv: [sh, -c, "sleep 300 & echo $! > {d}/a.child; {py} {d}/daemon.py {d}/a.daemon; wait"]}}
  - {{name: b, argv: [sh, -c, "sleep 300 & echo $! > {d}/b.child; {py} {d}/daemon.py {d}/b.daemon; wait"]}}
"""


@pytest.mark.network
@pytest.mark.parametrize("how", ["cumatrix run", "cumatrix run -n 2", "pytest matrix.yaml"])
def test_sigkill_of_the_harness_leaves_nothing_running(how: str, tmp_path: Path, cli_env: Any,
                                                       wheel_cache: Path) -> None:
    (tmp_path / "daemon.py").write_text(DAEMON)
    m = tmp_path / "matrix.yaml"
    m.write_text(TREE.format(rt=RUNTIME, d=tmp_path, py=PY))
    # Unsandboxed (as runs were by default when this was written): the cells write their host
    # pids into the test's directory; a sandboxed cell has neither.
    if how.startswith("pytest"):
        argv = [PY, "-m", "pytest", str(m), "-p", "no:cacheprovider", "-q", "--cumatrix-out", str(tmp_path / "out"),
                "--cumatrix-sandbox", "off"]
    else:
        argv = [PY, "-m", "cumatrix", "run", str(m), "--out", str(tmp_path / "out"), "-q", "--no-sandbox"]
        argv += ["-n", "2"] if "-n 2" in how else []
    harness = subprocess.Popen(argv, cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    expect = ["a.child", "a.daemon"] + (["b.child", "b.daemon"] if "-n 2" in how else [])
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f).exists() for f in expect):
            assert harness.poll() is None, f"the harness ended early: {harness.stderr.read() if harness.stderr else ''}"
            assert time.monotonic() < deadline, "the cells never started"
            time.sleep(0.1)
        time.sleep(0.3)  # the daemon's pid file is written just before its exec
        seen = _descendants(harness.pid) | {int((tmp_path / f).read_text()) for f in expect}
        if "-n 2" in how:
            workers = [p for p in _children(harness.pid) if "watch_main" not in _cmdline(p)]
            assert len(workers) == 2, "the xdist workers are not the harness's children"
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=30)
        left = _all_gone(seen, within=15)
        described = {p: _cmdline(p) for p in left}
        assert left == set(), f"still running after SIGKILL of `{how}`: {described}"
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
        if harness.stderr:
            harness.stderr.close()
        _kill_leftovers(seen)
    home = sandbox._cgroup2_home()
    if home is not None and _cgroup_usable():
        deadline = time.monotonic() + 10
        mine = [g for g in home.glob("cumatrix-*") if g.name.split("-", 1)[1].split(".")[0] in {str(p) for p in seen | {harness.pid}}]
        while mine and time.monotonic() < deadline:
            time.sleep(0.1)
            mine = [g for g in mine if g.exists()]
        assert mine == [], "the killed harness's cgroups were not removed"


# ------------------------------------------------------------------------ what a cell sees

SEES = """
runtimes:
  cu12.9: {{wheel: {rt}}}
drivers: [host]
probe: false
cases:
  - {{name: env, argv: [{py}, -c, "import os, json; print(json.dumps(dict(os.environ)))"]}}
  - {{name: imports, argv: [{system_py}, -c, "{imports}"]}}
"""

IMPORTS = ("import sys, json\\nr = {}\\nfor m in ('cumatrix', 'yaml', 'pytest', 'harness_only_mod'):\\n"
           "    try:\\n        __import__(m)\\n        r[m] = True\\n    except ImportError:\\n        r[m] = False\\n"
           "print(json.dumps(r))")


@pytest.mark.network
def test_command_cell_sees_no_secret_and_no_harness_package(tmp_path: Path, cli_env: Any, cli: Any,
                                                            wheel_cache: Path) -> None:
    system_py = "/usr/bin/python3"
    if not os.access(system_py, os.X_OK):
        pytest.skip("no /usr/bin/python3 to run as a plain interpreter")
    mods = tmp_path / "harness-mods"
    mods.mkdir()
    (mods / "harness_only_mod.py").write_text("")
    m = tmp_path / "matrix.yaml"
    m.write_text(SEES.format(rt=RUNTIME, py=PY, system_py=system_py, imports=IMPORTS))
    secrets = {"AWS_SECRET_ACCESS_KEY": "hunter2", "GITHUB_TOKEN": "ghp_x", "NVIDIA_API_KEY": "nvapi-x",
               "CI_JOB_TOKEN": "x", "CUMATRIX_TEST_ASKED": "passed-on"}
    env = cli_env(secrets)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(mods)])
    proc = subprocess.run([PY, "-m", "cumatrix", "run", str(m), "--out", str(tmp_path / "out"), "-q"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    cells = read_cells_by_case(tmp_path / "out")
    seen = json.loads(cells["env"]["stdout_tail"])
    for name in ("AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "NVIDIA_API_KEY", "CI_JOB_TOKEN", "CUMATRIX_TEST_ASKED"):
        assert name not in seen, f"{name} reached a command cell"
    assert "PYTHONPATH" not in seen
    assert "PATH" in seen
    assert seen["CUMATRIX_CELL"] == "cu12.9/host/env"
    got = json.loads(cells["imports"]["stdout_tail"])
    outside = subprocess.run([system_py, "-c", IMPORTS.replace("\\n", "\n")], capture_output=True, text=True,
                             env={"PATH": os.environ["PATH"]}, timeout=60, check=True)
    assert got == json.loads(outside.stdout)  # exactly what the plain interpreter has outside
    assert got["cumatrix"] is False
    assert got["harness_only_mod"] is False
    # --pass-env hands one variable on, by name
    assert sandbox.child_env(Job(cell_id="t", kind="command", argv=("true",)), base_env=secrets,
                             policy=Policy(pass_env=("CUMATRIX_TEST_ASKED",)))["CUMATRIX_TEST_ASKED"] == "passed-on"


def test_limits_bound_cores_and_cpu_but_not_address_space() -> None:
    code = ("import resource as r, json; print(json.dumps({n: r.getrlimit(getattr(r, 'RLIMIT_' + n)) "
            "for n in ('CORE', 'CPU', 'NOFILE', 'AS', 'DATA')}))")
    res = run_local(Job(cell_id="t", kind="command", argv=(PY, "-c", code), timeout=10))
    got = json.loads(res.stdout_tail)
    import resource

    inf = resource.RLIM_INFINITY
    assert got["CORE"] == [0, 0]
    assert 0 < got["CPU"][1] <= 10 * (os.cpu_count() or 1) + sandbox.CPU_SLACK_S
    assert got["NOFILE"][1] <= sandbox.NOFILE_MAX
    assert got["AS"] == [inf, inf]
    assert got["DATA"] == [inf, inf]


# ------------------------------------------------------------------------ bubblewrap


@pytest.fixture(scope="module")
def bwrap() -> str:
    return require_bwrap()


SANDBOXED = """
import os, socket, sys
s = socket.socket(); s.settimeout(3)
print('connect', s.connect_ex(('127.0.0.1', int(sys.argv[1]))))
print('home', os.path.expanduser('~'))
for p in ('/usr/cumatrix-x', sys.argv[2] + '/x'):
    try:
        open(p, 'w')
        print('wrote', p)
    except OSError as e:
        print('refused', e.errno)
print('tmp', sorted(os.listdir('/tmp')))
open('/tmp/cell-file', 'w').write('x')
print('read', open(sys.argv[3]).read())
"""


def test_sandbox_has_no_network_read_only_root_private_tmp(bwrap: str, tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    marker = Path("/tmp") / f"cumatrix-host-file-{os.getpid()}"
    marker.write_text("host")
    given = tmp_path / "input.txt"  # a path the job names: bound back in, read-only
    given.write_text("given")
    tmp_path.chmod(0o755)  # a root harness's cell is an unprivileged uid: it reads what anyone may
    try:
        res = run_local(Job(cell_id="t", kind="command", timeout=30, mounts=(str(given),),
                            argv=(PY, "-c", SANDBOXED, str(port), str(tmp_path), str(given))),
                        policy=Policy(sandbox="on"))
    finally:
        server.close()
        marker.unlink()
    out = res.stdout_tail
    assert res.returncode == 0, res.stderr_tail
    assert res.extra["sandbox"] in HELD_BY
    assert "connect 0" not in out
    assert "connect " in out
    assert "wrote" not in out
    assert out.count("refused 30") == 2
    assert "home /tmp\n" in out  # the host's home is not there; the cell's own is its private /tmp
    assert marker.name not in out  # the host's /tmp is not the cell's
    assert "read given" in out
    assert not Path("/tmp/cell-file").exists()  # nor is the cell's /tmp the host's


def test_sandboxed_crash_is_still_a_signal(bwrap: str) -> None:
    res = run_local(Job(cell_id="t", kind="command", timeout=30,
                        argv=(PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")),
                    policy=Policy(sandbox="on"))
    assert classify(res, kind="command").outcome == "crash:SIGSEGV"


def test_sandbox_on_without_bubblewrap_is_a_clear_harness_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "_BWRAP", {"bwrap": (None, "bubblewrap is not installed")})
    res = run_local(Job(cell_id="t", kind="command", argv=("true",), timeout=10), policy=Policy(sandbox="on"))
    obs = classify(res, kind="command")
    assert obs.outcome == "harness-error"
    assert "bubblewrap is not installed" in obs.detail
    auto = run_local(Job(cell_id="t", kind="command", argv=("true",), timeout=10), policy=Policy(sandbox="auto"))
    assert auto.returncode == 0
    assert auto.extra["sandbox"] == "none: bubblewrap is not installed"


def test_a_venv_under_tmp_runs_in_the_sandbox(bwrap: str, tmp_path: Path) -> None:
    """The sandbox's /tmp is private: a virtualenv there (CI checkouts often are) is bound back whole."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    res = run_local(Job(cell_id="t", kind="command", argv=(str(venv / "bin" / "python"), "-c",
                                                           "import sys; print(sys.prefix)"), timeout=60),
                    policy=Policy(sandbox="on"))
    assert res.extra.get("sandbox") in HELD_BY
    assert res.returncode == 0, res.stderr_tail
    assert res.stdout_tail.strip() == str(venv)

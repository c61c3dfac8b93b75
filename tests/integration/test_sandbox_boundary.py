"""The sandbox is a boundary: each attack that once got through a bubblewrap cell, run again.

Real bubblewrap, the real Docker daemon's socket where one runs, real sysctl files and cgroups.
Skipped where bubblewrap cannot run (unless ``CUMATRIX_REQUIRE_BWRAP=1``).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from cumatrix.core.jobs import Job
from cumatrix.execute import sandbox
from cumatrix.execute.local import run_local
from cumatrix.execute.sandbox import Policy
from helpers.sandbox import HOLDERS, hold_with, require_bwrap

PY = sys.executable
REQUIRE_BWRAP = os.environ.get("CUMATRIX_REQUIRE_BWRAP") == "1"


@pytest.fixture(scope="module", autouse=True)
def bwrap() -> str:
    return require_bwrap()


_HOLDER: dict[str, str] = {}


@pytest.fixture(autouse=True, params=HOLDERS)
def holder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every attack here runs against both ways of holding a cell: the fork server and bubblewrap."""
    _HOLDER["want"] = hold_with(request.param, monkeypatch)
    return _HOLDER["want"]


def boxed(code: str, *args: str, policy: Policy | None = None, cwd: str | None = None,
          **job: object) -> tuple[int | None, str, str]:
    res = run_local(Job(cell_id="t", kind="command", timeout=60, argv=(PY, "-c", code, *args), **job),
                    policy=policy or Policy(sandbox="on"), cwd=cwd)
    assert res.extra.get("sandbox") == _HOLDER["want"], res.extra
    return res.returncode, res.stdout_tail, res.stderr_tail


CONNECT = """
import socket, sys
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        s.sendall(b"GET /_ping HTTP/1.0\\r\\n\\r\\n")
        print("connected", path, s.recv(64))
    except OSError as e:
        print("refused", path, e.errno)
"""


def test_no_host_socket_is_reachable_docker_daemon_included(tmp_path: Path) -> None:
    # A socket of our own under /run (where daemons keep theirs), and the Docker daemon's
    # where one runs: both reachable from the host, neither from a cell.
    ours = Path("/run") / f"cumatrix-test-{os.getpid()}.sock"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(ours))
    except OSError as e:
        pytest.skip(f"cannot make a socket under /run: {e}")
    server.listen()
    try:
        paths = [str(ours), *(p for p in ("/var/run/docker.sock", "/run/docker.sock") if Path(p).exists())]
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(ours))  # the host can
        client.close()
        rc, out, err = boxed(CONNECT, *paths)
    finally:
        server.close()
        ours.unlink()
    assert rc == 0, err
    assert "connected" not in out
    assert out.count("refused") == len(paths)


SYSCTL = """
import os
print("uid", os.getuid(), os.geteuid())
for path in ("/proc/sys/vm/swappiness", "/proc/sys/kernel/core_pattern"):
    try:
        open(path, "w").close()
        print("opened", path)
    except OSError as e:
        print("refused", path, e.errno)
for path in ("/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/unified/cgroup.procs"):
    if os.path.exists(path):
        try:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
            print("joined", path)
        except OSError as e:
            print("refused", path, e.errno)
print("cgroup", open("/proc/self/cgroup").read().strip().splitlines()[-1])
print("capeff", [ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("CapEff")][0])
"""


def test_a_cell_cannot_change_kernel_settings_nor_leave_its_cgroup() -> None:
    before = Path("/proc/sys/vm/swappiness").read_text()
    rc, out, err = boxed(SYSCTL)
    assert rc == 0, err
    assert "opened" not in out
    assert "joined" not in out
    assert out.count("refused /proc/sys") == 2
    assert "capeff 0000000000000000" in out  # no capability at all
    if os.geteuid() == 0:  # a root harness's cell is not root on the host
        assert f"uid {sandbox.NOBODY} {sandbox.NOBODY}" in out
    assert "cgroup 0::/" in out  # its own cgroup namespace: the host's tree is not named
    assert Path("/proc/sys/vm/swappiness").read_text() == before


FILL = """
import os, sys
log, limit = sys.argv[1], int(sys.argv[2])
try:
    open(os.path.join(os.path.dirname(log), "planted"), "w").write("x")
    print("planted")
except OSError as e:
    print("refused dir", e.errno)
for target in ("/tmp/fill", "/dev/shm/fill"):
    try:
        with open(target, "wb") as f:
            for _ in range(limit // 65536 + 4):
                f.write(b"\\0" * 65536)
        print("filled", target)
    except OSError as e:
        print("full", target, e.errno)
import signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past RLIMIT_FSIZE: EFBIG instead of death
try:
    with open(log, "ab") as f:
        for _ in range(limit // 65536 + 4):
            f.write(b"\\0" * 65536)
    print("filled log")
except OSError as e:
    print("full log", e.errno)
st = os.statvfs("/tmp")
print("tmp size", st.f_blocks * st.f_frsize)
"""


def test_what_a_cell_writes_is_bounded_and_only_its_log_is_a_host_path(tmp_path: Path) -> None:
    limit = 4 << 20
    audit = tmp_path / "audit"
    audit.mkdir()
    log = audit / "cell.log"
    log.touch()
    log.chmod(0o666)
    tmp_path.chmod(0o755)
    audit.chmod(0o777)  # even a directory anyone may write is not the cell's to write
    rc, out, err = boxed(FILL, str(log), str(limit), policy=Policy(sandbox="on", write_limit=limit),
                         writable=(str(log),))
    assert rc == 0, err
    assert "planted" not in out
    assert not (audit / "planted").exists()
    assert "filled" not in out  # ENOSPC at the tmpfs' size, or EFBIG at RLIMIT_FSIZE, first
    assert "full /tmp/fill" in out
    assert "full /dev/shm/fill" in out
    assert "full log 27" in out  # EFBIG: RLIMIT_FSIZE
    assert f"tmp size {limit}" in out
    assert log.stat().st_size <= limit
    assert sorted(p.name for p in audit.iterdir()) == ["cell.log"]


def test_the_write_limit_is_an_option_with_a_range(tmp_path: Path, cli: Any) -> None:
    assert sandbox.parse_size("1G") == 1 << 30
    assert sandbox.parse_size("512MiB") == 512 << 20
    with pytest.raises(ValueError, match="not a size"):
        sandbox.parse_size("1e308")
    m = tmp_path / "m.yaml"
    m.write_text("runtimes: {cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}}\ndrivers: [host]\n")
    for bad in ("1e308", "2T", "1K", "-5"):
        proc = cli("run", m, "--out", tmp_path / "o", f"--sandbox-write-limit={bad}", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert "--sandbox-write-limit" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_what_the_harness_built_in_its_cache_is_readable_by_the_cell(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Builds are renamed into place from 0700 temporary directories; a root harness's cell
    # (an unprivileged uid) must still load them, while the cache stays 0700 to everyone else.
    cache = tmp_path / "cache"
    monkeypatch.setenv("CUMATRIX_CACHE", str(cache))
    built = cache / "builds" / "abc"
    built.mkdir(parents=True)
    cache.chmod(0o700)
    built.chmod(0o700)
    (built / "lib.txt").write_text("built")
    tmp_path.chmod(0o755)
    rc, out, err = boxed("import sys; print(open(sys.argv[1]).read())", str(built / "lib.txt"),
                         mounts=(str(built / "lib.txt"),))
    assert rc == 0, err
    assert "built" in out, err
    assert cache.stat().st_mode & 0o777 == 0o700



def test_what_the_harness_keeps_is_masked_even_when_made_after_a_cell_of_the_same_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A cell whose working directory holds the harness's state directory, run once before the
    # state (the --resume key) exists and once after: the second must not read the key.
    home = tmp_path / "home"
    home.mkdir()
    tmp_path.chmod(0o755)
    home.chmod(0o755)
    monkeypatch.setenv("XDG_STATE_HOME", str(home / "state"))
    key = home / "state" / "cumatrix" / "key"
    read_key = "import sys\ntry:\n    print(open(sys.argv[1]).read())\nexcept OSError as e:\n    print('refused', e.errno)"
    _, out, err = boxed(read_key, str(key), cwd=str(home))
    assert "refused" in out, (out, err)
    key.parent.mkdir(parents=True)
    key.write_text("secret-key")
    key.chmod(0o644)  # even a key anyone may read is not the cell's
    _, out, err = boxed(read_key, str(key), cwd=str(home))
    assert "secret-key" not in out, out
    assert "refused" in out, (out, err)


def test_what_the_harness_keeps_stays_masked_through_a_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The project holds links to the harness's state directory: a cell started in one that
    # leads above the key (its bind shows the key's directory) finds it masked; one that
    # leads into it is refused, naming the link.  Before, the masks were placed by the paths
    # as written: the first cell read the key.
    state = tmp_path / "state"
    key = state / "cumatrix" / "key"
    key.parent.mkdir(parents=True)
    key.write_text("secret-key")
    key.chmod(0o644)  # even a key anyone may read is not the cell's
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "above").symlink_to(state)
    (proj / "into").symlink_to(key.parent)
    for d in (tmp_path, state, key.parent, proj):
        d.chmod(0o755)
    read_key = "import sys\ntry:\n    print(open(sys.argv[1]).read())\nexcept OSError as e:\n    print('refused', e.errno)"
    rc, out, err = boxed(read_key, "cumatrix/key", cwd=str(proj / "above"))
    assert "secret-key" not in out, out
    assert "refused" in out, (out, err)
    rc, out, err = boxed(read_key, "key", cwd=str(proj / "into"))
    assert rc is None
    assert "secret-key" not in out
    assert f"symbolic link {proj / 'into'} (-> {key.parent})" in err, err
    assert "which the harness keeps" in err


def test_a_working_directory_in_run_is_refused_before_the_cell_starts(tmp_path: Path) -> None:
    # Under /run as written: nothing there is shown to a cell, so it cannot start there. Before,
    # bubblewrap failed to enter it and the cell was judged from that exit (`exit:1`).
    where = Path("/run") / f"cumatrix-test-{os.getpid()}-cwd"
    try:
        where.mkdir(mode=0o755)
    except OSError as e:
        pytest.skip(f"cannot make a directory under /run: {e}")
    try:
        rc, _out, err = boxed("print('started')", cwd=str(where))
    finally:
        where.rmdir()
    assert rc is None
    assert f"working directory {where} is in /run" in err, err

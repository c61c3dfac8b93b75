"""The docker backend against a real Docker daemon: real images, real containers.

The base image is built by ``containers/build-base.sh`` (debootstrap, no registry), the
runtime image from a real runtime wheel.  Skipped with the reason when no daemon answers,
unless ``CUMATRIX_REQUIRE_DOCKER=1``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from cumatrix.core.errors import DaemonUnavailable
from cumatrix.core.jobs import Job
from cumatrix.core.model import Runtime
from cumatrix.execute.local import run_local
from cumatrix.judge.classify import classify
from cumatrix.provision import runtimes
from helpers.kernel_state import KEY_ROADS, fields
from helpers.sandbox import CONNECT, socket_under_run

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
WHEEL_REQ = "nvidia-cuda-runtime-cu12==12.9.79"
REQUIRED = os.environ.get("CUMATRIX_REQUIRE_DOCKER") == "1"


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"CUMATRIX_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def client() -> docker.DockerClient:
    try:
        c = docker.from_env(timeout=60)
        c.ping()
    except Exception as e:  # noqa: BLE001  any failure to reach the daemon means: no docker here
        _unavailable(f"no Docker daemon answers ({type(e).__name__}: {e}); start one with `sudo dockerd &`")
    return c


@pytest.fixture(scope="session")
def base_image(client: docker.DockerClient) -> str:
    proc = subprocess.run(["bash", str(REPO / "containers" / "build-base.sh")],
                          capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        _unavailable(f"containers/build-base.sh failed: {proc.stderr.strip()[-500:]}")
    tag = proc.stdout.strip().splitlines()[-1]
    client.images.get(tag)  # it exists
    return tag


@pytest.fixture(scope="session")
def wheel_dir(wheel_cache: Path) -> Path:
    """A directory holding the real cu12.9 runtime wheel (fetched into the cache by pip)."""
    return runtimes.fetch_wheel(WHEEL_REQ).parent


@pytest.fixture(scope="session")
def backend(base_image: str) -> Iterator[object]:
    from cumatrix.execute.docker import DockerBackend

    with DockerBackend(base_image) as be:
        yield be


@pytest.fixture(scope="session")
def rt_image(backend: object, wheel_dir: Path) -> object:
    info = backend.prepare_runtime(Runtime(name="cu12.9", requirement=WHEEL_REQ), wheel_dir)  # type: ignore[attr-defined]
    assert info.ok, info.problem
    return info


@pytest.fixture
def scratch_image(client: docker.DockerClient) -> Iterator[str]:
    """An image with no shell and no python3: one file, imported from a tarball."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        data = b"cumatrix test image without python3\n"
        ti = tarfile.TarInfo("etc/motd")
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
    tag = f"cumatrix-test-nopython:{uuid.uuid4().hex[:8]}"
    client.api.import_image_from_data(buf.getvalue(), repository=tag.split(":", maxsplit=1)[0], tag=tag.split(":")[1],
                                      changes=["LABEL cumatrix.test=1"])  # its build stages go at session end
    yield tag
    client.images.remove(tag, force=True)


def _job(cell: str, *argv: str, kind: str = "command", timeout: float = 60.0, image: str | None = None,
         **kw: object) -> Job:
    return Job(cell_id=f"cu12.9/host/{cell}", kind=kind, argv=argv, timeout=timeout,
               runtime_name="cu12.9", image=image, reports_verdict=kind != "command", **kw)  # type: ignore[arg-type]


def _ours(client: docker.DockerClient, cell_id: str) -> list[object]:
    # sparse: from the list call alone; a full list inspects each container afterwards, and one
    # removed in between (by the watcher this is waiting for) raised NotFound.
    return client.containers.list(all=True, sparse=True, filters={"label": f"cumatrix.cell={cell_id}"})


# ------------------------------------------------------------------------ images


def test_build_base_skips_when_image_exists(base_image: str) -> None:
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(REPO / "containers" / "build-base.sh")],
                          capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip().splitlines()[-1] == base_image
    assert "nothing to do" in proc.stderr
    assert time.monotonic() - t0 < 10


def test_runtime_image_is_built_once_and_labelled(backend: object, rt_image: object,
                                                 client: docker.DockerClient, wheel_dir: Path) -> None:
    from cumatrix.execute.docker import DockerBackend

    assert rt_image.tag.startswith("cumatrix-rt:cu12.9-")  # type: ignore[attr-defined]
    img = client.images.get(rt_image.tag)  # type: ignore[attr-defined]
    assert img.labels["cumatrix.runtime.version"] == "12.9.79"
    env = dict(e.split("=", 1) for e in img.attrs["Config"]["Env"])
    assert env["CUMATRIX_CUDART"].endswith("/lib/libcudart.so.12")
    # A fresh backend, same inputs: the same tag, found, not rebuilt.
    with DockerBackend(backend.base_image) as fresh:  # type: ignore[attr-defined]
        again = fresh.prepare_runtime(Runtime(name="cu12.9", requirement=WHEEL_REQ), wheel_dir)
    assert (again.tag, again.image_id, again.built) == (rt_image.tag, rt_image.image_id, False)  # type: ignore[attr-defined]


def test_probe_in_container_matches_local(backend: object, rt_image: object) -> None:
    spec = json.dumps({"kind": "probe", "libcudart": None})
    res = backend.run_job(_job("probe", "python3", "-m", "cumatrix.child.case", spec, kind="probe"))  # type: ignore[attr-defined]
    obs = classify(res, kind="probe")
    assert res.verdict is not None, res.stderr_tail
    assert res.verdict.data["runtime_version"] == 12090
    assert res.extra["image"] == rt_image.tag
    assert res.extra["image_id"] == rt_image.image_id
    # The same cell run locally against the same wheel classifies the same way.
    local_rt = runtimes.from_wheel("cu12.9", WHEEL_REQ, wheel_dir=None)
    local = run_local(_job("probe", sys.executable, "-m", "cumatrix.child.case",
                           json.dumps({"kind": "probe", "libcudart": str(local_rt.libcudart)}), kind="probe"),
                      base_env={**os.environ, "PYTHONPATH": str(SRC)})
    assert classify(local, kind="probe").outcome == obs.outcome
    # No GPU on a host without a driver: the child says so itself.
    if not Path("/dev/nvidiactl").exists():
        assert obs.outcome == "skipped:no-cuda-driver"


@pytest.mark.parametrize(("cell", "code", "expected"), [
    ("segfault", "import ctypes; ctypes.string_at(0)", "crash:SIGSEGV"),
    ("abort", "import os; os.abort()", "crash:SIGABRT"),
    # A command cannot forge a verdict: what it prints is log, its exit status is the outcome.
    ("forged-then-segfault", ("print('CUMATRIX-RESULT {\"outcome\": \"ok\"}', flush=True); "
                              "import ctypes; ctypes.string_at(0)"), "crash:SIGSEGV"),
    ("logs-a-verdict-line", "print('CUMATRIX-RESULT {\"outcome\": \"ok\"}')", "ok"),
    ("exit-3", "raise SystemExit(3)", "exit:3"),
    ("ok", "import ctypes", "ok"),
])
def test_command_outcomes_match_local(backend: object, rt_image: object, cell: str, code: str,
                                      expected: str, client: docker.DockerClient) -> None:
    res = backend.run_job(_job(cell, "python3", "-c", code))  # type: ignore[attr-defined]
    assert classify(res, kind="command").outcome == expected, res.stderr_tail
    local = run_local(_job(cell, sys.executable, "-c", code))
    assert classify(local, kind="command").outcome == expected
    assert _ours(client, f"cu12.9/host/{cell}") == []  # removed after the run


def test_hang_times_out_and_container_is_gone(backend: object, rt_image: object, client: docker.DockerClient) -> None:
    t0 = time.monotonic()
    res = backend.run_job(_job("hang", "python3", "-c", "import time; time.sleep(300)", timeout=2))  # type: ignore[attr-defined]
    assert res.timed_out
    assert classify(res, kind="command").outcome == "timeout"
    assert time.monotonic() - t0 < 30
    assert _ours(client, "cu12.9/host/hang") == []


def test_oom_killed_is_sigkill_with_oom_noted(base_image: str) -> None:
    from cumatrix.execute.docker import DockerBackend

    with DockerBackend(base_image, mem_limit="64m") as small:
        res = small.run_job(_job("oom", "python3", "-c", "b = b'x' * (512 << 20)", image=base_image))
    obs = classify(res, kind="command")
    assert res.oom_killed
    assert obs.outcome == "crash:SIGKILL"
    assert "OOM" in obs.detail


def test_mounts_are_read_only_and_network_is_off(backend: object, rt_image: object, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)  # cells run as a non-root user
    (tmp_path / "in.txt").write_text("hello")
    code = ("import os, pathlib, sys\n"
            f"d = pathlib.Path({str(tmp_path)!r})\n"
            "assert (d / 'in.txt').read_text() == 'hello'\n"
            "try:\n    (d / 'out.txt').write_text('x')\nexcept OSError as e:\n    print('ro', e.errno)\n"
            "print('nets', sorted(os.listdir('/sys/class/net')))\n"
            "print('ld', os.environ['LD_LIBRARY_PATH'])\n")
    res = backend.run_job(_job("mounts", "python3", "-c", code, mounts=(str(tmp_path),),  # type: ignore[attr-defined]
                               lib_path=("/opt/first",), env=(("CUMATRIX_X", "1"),)))
    assert res.returncode == 0, res.stderr_tail
    assert "ro 30" in res.stdout_tail  # EROFS
    assert "nets ['lo']" in res.stdout_tail
    assert "ld /opt/first" in res.stdout_tail
    assert not (tmp_path / "out.txt").exists()


def test_no_abi_of_the_kernel_lets_a_container_cell_reach_a_keyring(backend: object, rt_image: object) -> None:
    # A key is shown to every process of its host uid until the kernel collects it; docker's
    # default seccomp profile (which the backend keeps) refuses the three key calls by every ABI.
    res = backend.run_job(_job("keys", "python3", "-c", KEY_ROADS))  # type: ignore[attr-defined]
    assert res.returncode == 0, res.stderr_tail
    got = fields(res.stdout_tail)
    assert got["native"] in ("-1", "-38"), got  # EPERM (docker's profile) or ENOSYS
    for road in ("x32", "i386"):
        assert got[road] in ("-1", "-38") or got[road].startswith("signal"), (road, got)


def test_a_cwd_through_a_link_to_run_mounts_nothing_of_run(backend: object, rt_image: object, tmp_path: Path) -> None:
    """``cwd: runlink`` (a link to the host's ``/run`` in the project): before, the container
    got the host's ``/run`` at that path and connected to a socket there (the daemon's own
    ``docker.sock`` lies beside it); now a harness error naming the link."""
    tmp_path.chmod(0o755)
    (tmp_path / "runlink").symlink_to("/run")
    with socket_under_run() as where:
        res = backend.run_job(_job("runlink", "python3", "-c", CONNECT, f"{where.name}/sock",  # type: ignore[attr-defined]
                                   cwd=str(tmp_path / "runlink")))
    assert "connected" not in res.stdout_tail
    obs = classify(res, kind="command")
    assert obs.outcome == "harness-error", (obs, res.stdout_tail)
    assert f"symbolic link {tmp_path / 'runlink'} (-> /run)" in obs.detail


def test_what_the_harness_keeps_is_masked_under_a_mounted_directory(backend: object, rt_image: object,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's ``--out`` and its history inside the directory a cell starts in: before, the
    container read both through the read-only mount of that directory."""
    tmp_path.chmod(0o755)
    (tmp_path / "out").mkdir(mode=0o755)
    (tmp_path / "out" / "results.jsonl").write_text('{"type": "run"}\n')
    (tmp_path / "hist.sqlite").write_bytes(b"SQLite format 3\0")
    for f in ("out/results.jsonl", "hist.sqlite"):
        (tmp_path / f).chmod(0o644)
    monkeypatch.setenv("CUMATRIX_HISTORY", str(tmp_path / "hist.sqlite"))
    monkeypatch.setattr(backend, "hidden", raising=False, value=(str(tmp_path / "out"),))
    code = ("import sys\nfor p in sys.argv[1:]:\n    try:\n        print('read', p, open(p, 'rb').read()[:16])\n"
            "    except OSError as e:\n        print('refused', p, e.errno)\n")
    res = backend.run_job(_job("kept", "python3", "-c", code, "out/results.jsonl", "hist.sqlite",  # type: ignore[attr-defined]
                               cwd=str(tmp_path)))
    assert res.returncode == 0, res.stderr_tail
    # The directory is an empty tmpfs, the file /dev/null: nothing of either is read.
    assert "refused out/results.jsonl" in res.stdout_tail, res.stdout_tail
    assert "type" not in res.stdout_tail
    assert "SQLite" not in res.stdout_tail, res.stdout_tail


# ------------------------------------------------------------------------ bad input and faults


def test_daemon_not_running_says_how_to_start_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from cumatrix.execute.docker import DockerBackend

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    with pytest.raises(DaemonUnavailable) as exc:
        DockerBackend(None)
    assert exc.value.exit_code == 2
    assert "dockerd" in str(exc.value)
    assert "no-daemon.sock" in str(exc.value)


def test_missing_image_is_a_per_cell_harness_error(backend: object) -> None:
    ref = f"cumatrix-test-absent:{uuid.uuid4().hex[:8]}"
    info = backend.prepare_runtime(Runtime(name="ghost", image=ref))  # type: ignore[attr-defined]
    assert not info.ok
    assert f"image {ref} not found locally; build or pull it" in info.problem
    res = backend.run_job(Job(cell_id="ghost/host/probe", kind="probe", argv=("python3",), runtime_name="ghost"))  # type: ignore[attr-defined]
    obs = classify(res, kind="probe")
    assert obs.outcome == "harness-error"
    assert "not found locally" in obs.detail


def test_image_without_python3_is_a_per_cell_error(backend: object, scratch_image: str) -> None:
    info = backend.prepare_runtime(Runtime(name="nopy", image=scratch_image))  # type: ignore[attr-defined]
    assert not info.ok
    assert "has no working python3" in info.problem
    res = backend.run_job(Job(cell_id="nopy/host/probe", kind="probe", argv=("python3",), runtime_name="nopy"))  # type: ignore[attr-defined]
    assert classify(res, kind="probe").outcome == "harness-error"


def test_failing_dockerfile_build_is_a_clear_error(base_image: str, tmp_path: Path, scratch_image: str) -> None:
    from cumatrix.execute.docker import DockerBackend, ImageBuildError

    # A wheel whose libcudart is no ELF file: the build's own load check must fail.
    bad = tmp_path / "nvidia_cuda_runtime_cu12-12.9.79-py3-none-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("nvidia/cuda_runtime/lib/libcudart.so.12", b"not an ELF file\n" * 1024)
    with DockerBackend(base_image) as be:
        with pytest.raises(ImageBuildError) as exc:
            be.build_runtime_image(Runtime(name="bad", requirement=WHEEL_REQ), bad)
        msg = str(exc.value)
        assert "building the image of runtime 'bad'" in msg
        assert "invalid ELF header" in msg
        # Through prepare_runtime the same failure is a per-cell problem, not a crash of the run.
        info = be.prepare_runtime(Runtime(name="bad", requirement=WHEEL_REQ), tmp_path)
        assert not info.ok
        assert info.problem
        assert bad.name in info.problem
    # A base image that is not there, and one without a shell, fail as clearly.
    with DockerBackend("cumatrix-test-absent:1") as be, \
            pytest.raises(ImageBuildError, match="base image cumatrix-test-absent:1 not found locally"):
        be.build_runtime_image(Runtime(name="x", requirement=WHEEL_REQ), bad)
    with DockerBackend(scratch_image) as be, pytest.raises(ImageBuildError, match="/bin/sh"):
        be.build_runtime_image(Runtime(name="x", requirement=WHEEL_REQ), runtimes.fetch_wheel(WHEEL_REQ))


_KILLED_CHILD = """
import sys
from cumatrix.execute.docker import DockerBackend
from cumatrix.core.jobs import Job
image, cell = sys.argv[1], sys.argv[2]
DockerBackend(image).run_job(Job(cell_id=cell, kind="command", image=image, timeout=600,
                                 argv=("python3", "-c", "import time; time.sleep(600)")))
"""


def test_killed_harness_leaves_no_container(base_image: str, client: docker.DockerClient) -> None:
    """SIGKILL of the harness (no ``finally`` runs): its watcher removes the container."""
    cell = f"killed/{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, base_image, cell],
                            env={**os.environ, "PYTHONPATH": str(SRC)})
    try:
        deadline = time.monotonic() + 60
        while not client.containers.list(filters={"label": f"cumatrix.cell={cell}", "status": "running"}):
            assert proc.poll() is None, "the container never started"
            assert time.monotonic() < deadline, "the container never started"
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while _ours(client, cell) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ours(client, cell) == []


def test_stale_containers_go_at_next_start_and_live_ones_stay(base_image: str, client: docker.DockerClient) -> None:
    """A container left by a run whose watcher could not remove it goes when the next backend starts."""
    from cumatrix.execute.docker import DockerBackend

    cell = f"stale/{uuid.uuid4().hex[:8]}"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    with DockerBackend(base_image) as live:
        labels = {**live._labels(cell), "cumatrix.owner": f"{dead.stdout.strip()}.1"}  # an owner that is gone
        stale = client.containers.run(base_image, ["sleep", "60"], detach=True, network_mode="none", labels=labels)
        keep_cell = f"live/{uuid.uuid4().hex[:8]}"
        c = client.containers.run(base_image, ["sleep", "60"], detach=True, network_mode="none",
                                  labels=live._labels(keep_cell))
        try:
            DockerBackend(base_image).close()
            # The sweep has removed it, or found its removal already under way (another run's
            # sweep, a parallel test's): it is gone within moments either way.
            deadline = time.monotonic() + 30
            while _ours(client, cell) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _ours(client, cell) == []
            assert _ours(client, keep_cell)  # its owner (this process) is alive
        finally:
            c.remove(force=True)
            with contextlib.suppress(docker.errors.NotFound):
                stale.remove(force=True)


_HARDENING = """
import os, pathlib
st = pathlib.Path('/proc/self/status').read_text()
caps = {l.split(':')[0]: l.split()[1] for l in st.splitlines() if l.startswith(('Cap', 'NoNewPrivs'))}
print('uid', os.getuid(), 'gid', os.getgid())
print('capeff', caps['CapEff'], 'capbnd', caps['CapBnd'], 'nnp', caps['NoNewPrivs'])
for p in ('/usr/x', '/etc/x', '/x'):
    try:
        open(p, 'w')
        print('wrote', p)
    except OSError as e:
        print('ro', p, e.errno)
open('/tmp/scratch', 'w').write('ok')
print('tmp', open('/tmp/scratch').read())
"""


def test_container_is_hardened(backend: object, rt_image: object, client: docker.DockerClient) -> None:
    """Non-root, no capabilities, no-new-privileges, read-only root with a writable /tmp, CPU limit."""
    res = backend.run_job(_job("hardening", "python3", "-c", _HARDENING))  # type: ignore[attr-defined]
    assert res.returncode == 0, res.stderr_tail
    out = res.stdout_tail
    assert "uid 0" not in out, out
    assert "gid 0 " not in out, out
    assert "capeff 0000000000000000 capbnd 0000000000000000 nnp 1" in out
    assert "wrote" not in out
    assert out.count(" 30\n") == 3
    assert "tmp ok" in out
    assert res.extra["containment"] == "container"
    assert backend.cpus >= 1
    assert backend.user != "0:0"


def test_command_cell_in_docker_gets_no_harness_pythonpath(backend: object, rt_image: object) -> None:
    code = "import os; print('pp', os.environ.get('PYTHONPATH'))\ntry:\n import cumatrix\nexcept ImportError:\n print('no-harness')"
    res = backend.run_job(_job("pp", "python3", "-c", code, env=(("PYTHONPATH", str(SRC)),)))  # type: ignore[attr-defined]
    assert res.returncode == 0, res.stderr_tail
    assert "pp None" in res.stdout_tail
    assert "no-harness" in res.stdout_tail


def test_driver_libraries_reach_the_container_without_a_toolkit(base_image: str, tmp_path: Path) -> None:
    """Device-nodes mode: the driver's user-mode libraries are mounted read-only and on LD_LIBRARY_PATH.

    Stand-ins: this host has no NVIDIA driver, so the "driver" below is a directory of small
    files laid out like a real driver install (versioned files plus SONAME links, and a
    leftover of an older version that must not be taken).
    """
    from cumatrix.execute.docker import DRIVER_LIB_DIR, DockerBackend, GpuAccess, driver_libraries

    drv = tmp_path / "driver"
    drv.mkdir()
    for name in ("libcuda.so.580.159.04", "libnvidia-ptxjitcompiler.so.580.159.04",
                 "libnvidia-ml.so.580.159.04", "libnvidia-ml.so.550.1"):
        (drv / name).write_text(f"stand-in for {name}\n")
    (drv / "libcuda.so.1").symlink_to("libcuda.so.580.159.04")
    (drv / "libnvidia-ptxjitcompiler.so.1").symlink_to("libnvidia-ptxjitcompiler.so.580.159.04")
    libs = driver_libraries(drv / "libcuda.so.1")
    inside = {Path(c).name for _, c in libs}
    assert inside == {"libcuda.so.1", "libcuda.so.580.159.04", "libnvidia-ptxjitcompiler.so.1",
                      "libnvidia-ptxjitcompiler.so.580.159.04", "libnvidia-ml.so.580.159.04"}
    gpu = GpuAccess(mode="device-nodes", libraries=libs)  # no device nodes: there are none here
    code = ("import os\n"
            f"print(open('{DRIVER_LIB_DIR}/libcuda.so.1').read().strip())\n"
            "print(os.environ['LD_LIBRARY_PATH'])\n")
    with DockerBackend(base_image, gpu=gpu) as be:
        res = be.run_job(_job("driver-libs", "python3", "-c", code, image=base_image))
    assert res.returncode == 0, res.stderr_tail
    assert "stand-in for libcuda.so.580.159.04" in res.stdout_tail
    assert DRIVER_LIB_DIR in res.stdout_tail

"""Docker cells traced by the kernel: the spawn helper is the container's entry (real dockerd,
the base image of containers/build-base.sh, real runtime wheels).

An audit log a docker cell forges, or one it leaves empty by unsetting LD_AUDIT, no longer
decides its verdict: the helper's record, written on the container's stderr between lines
holding a secret of the harness's once no process of the cell is left, does.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cumatrix.core.jobs import Job
from cumatrix.execute import docker_trace, sandbox
from helpers.results import read_cells_by_case

CU129 = "nvidia-cuda-runtime-cu12==12.9.79"

pytestmark = [pytest.mark.docker, pytest.mark.network]


@pytest.fixture(scope="module")
def base_image() -> str:
    try:
        import docker

        with contextlib.closing(docker.from_env(timeout=30)) as client:
            client.ping()
    except Exception as e:  # noqa: BLE001 - any failure to reach the daemon means: no docker here
        if os.environ.get("CUMATRIX_REQUIRE_DOCKER") == "1":
            pytest.fail(f"CUMATRIX_REQUIRE_DOCKER=1 but no Docker daemon answers: {e}")
        pytest.skip(f"no Docker daemon answers ({type(e).__name__}); start one with `bash .ci/dockerd`")
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(["bash", str(repo / "containers" / "build-base.sh")], capture_output=True, text=True,
                          timeout=900, check=False)
    if proc.returncode != 0:
        pytest.skip(f"containers/build-base.sh failed: {proc.stderr.strip()[-300:]}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def backend(base_image: str) -> Iterator[Any]:
    shim = sandbox.spawn_shim()
    if shim is None or not docker_trace.is_static(shim):
        pytest.skip("no statically linked spawn helper (gcc and libc.a are needed)")
    from cumatrix.execute.docker import DockerBackend

    with DockerBackend(base_image) as be:
        yield be


def _job(be: Any, *argv: str) -> Job:
    return Job(cell_id="base/host/t", kind="command", argv=argv, timeout=60, image=be.base_image)


def _cells(cli: Any, d: Path, base: str, body: str) -> tuple[Any, dict[str, dict[str, Any]]]:
    m = d / "m.yaml"
    m.write_text(textwrap.dedent(body).lstrip("\n"))
    out = d / "out"
    proc = cli("run", m, "--backend", "docker", "--base-image", base, "--out", out, "-q", cwd=d, timeout=600)
    assert (out / "results.jsonl").exists(), proc.stderr
    return proc, read_cells_by_case(out)


def test_the_cells_tree_is_traced_inside_its_container(backend: Any) -> None:
    """Every process of the tree is seen, with what it mapped, and the cell's exit and its
    output are what they were untraced (the record is taken out of its stderr)."""
    res = backend.run_job(_job(backend, "sh", "-c", "python3 -c 'import ctypes' && echo out && echo err >&2; exit 3"))
    assert (res.returncode, res.stdout_tail, res.stderr_tail) == (3, "out\n", "err\n")
    assert res.trace is not None, res.trace
    assert res.trace.traced, res.trace
    assert res.trace.complete, res.trace
    images = [img for p in res.trace.processes for img in p.images]
    assert any(Path(i).name.startswith("python3") for i in images), images
    assert any("/_ctypes" in o.path for o in res.trace.objects), [o.path for o in res.trace.objects]
    crashed = backend.run_job(_job(backend, "sh", "-c", "kill -SEGV $$"))
    assert (crashed.returncode, crashed.signal) == (None, 11)
    assert crashed.trace is not None
    assert crashed.trace.traced
    assert crashed.trace.complete


def test_a_record_printed_by_the_cell_is_not_taken(backend: Any) -> None:
    """Attack: the cell prints a record of its own on stderr (the helper's markers, a made-up
    secret, a "traced" record that saw nothing) and then kills the helper, its parent, so that
    no real record follows.  The forged record is not the helper's: the cell has no record, it
    says so, and it ends as SIGKILL."""
    fake = (r"\n\036cumatrix-trace 0123456789abcdef0123456789abcdef begin\nt\t1\nz\t0\n"
            r"\036cumatrix-trace 0123456789abcdef0123456789abcdef end\n")
    res = backend.run_job(_job(backend, "sh", "-c", f"printf '{fake}' >&2; kill -9 $PPID; sleep 5"))
    assert res.signal == 9, (res.returncode, res.stderr_tail)
    assert res.trace is not None, res.trace
    assert not res.trace.traced, res.trace
    assert not res.trace.complete, res.trace
    assert res.trace.note is not None
    assert "left no record" in res.trace.note
    assert "cumatrix-trace 0123456789abcdef" in res.stderr_tail  # the cell's own text, kept as output


def test_a_docker_cell_that_forges_its_audit_log_gets_the_kernels_verdict(tmp_path: Path, cli: Any,
                                                                           base_image: str, backend: Any) -> None:
    """Attack: a docker cell writes to its audit log that a CUDA 13 runtime was mapped (a
    foreign runtime: the cell would be skipped as not using its own), then exits 1.  The
    kernel's record never saw that file: the cell is ``exit:1`` and the claim is named."""
    forge = r'printf "o\t$$\tlibcudart.so.13\t/opt/fake/libcudart.so.13\n" >> "$CUMATRIX_AUDIT_LOG"; exit 1'
    proc, got = _cells(cli, tmp_path, base_image, f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: forge, argv: [sh, -c, '{forge}']}}
        """)
    rec = got["forge"]
    assert rec["observed"]["outcome"] == "exit:1", (rec["observed"], proc.stdout)
    fp = rec["fingerprint"]
    assert fp["mappings_from"] == "kernel", fp
    assert "/opt/fake/libcudart.so.13" in fp["audit_claims_not_backed"]
    assert fp["trace"]["traced"]
    assert fp["trace"]["complete"]


def test_claims_through_the_images_links_are_backed_and_forged_ones_are_not(tmp_path: Path, cli: Any,
                                                                             base_image: str, backend: Any) -> None:
    """The loader of a docker cell opens ``/lib/x86_64-linux-gnu/libc.so.6``; the kernel names
    the file ``/usr/lib/...`` (``/lib`` is a link in the image).  The harness cannot resolve a
    path inside the container, so every such genuine claim was listed as not backed.  The
    tracer now resolves the log's paths in the container: only the forged claim (a runtime
    never mapped, spelt through the same link) is named, and the cell is judged as before."""
    if backend.run_job(_job(backend, "sh", "-c", "test -L /lib && test -L /lib64")).returncode != 0:
        pytest.skip("the base image has no /lib and /lib64 links: nothing to resolve")
    forged = "/lib/x86_64-linux-gnu/libcudart.so.13"
    script = (rf'printf "o\t$$\tlibcudart.so.13\t{forged}\n" >> "$CUMATRIX_AUDIT_LOG"; '
              'exec python3 -c "import ctypes, os; ctypes.CDLL(os.environ[\'CUMATRIX_CUDART\'])"')
    proc, got = _cells(cli, tmp_path, base_image, f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: links, argv: [sh, -c, {json.dumps(script)}]}}
        """)
    rec = got["links"]
    assert rec["observed"]["outcome"] == "ok", (rec["observed"], proc.stdout)
    fp = rec["fingerprint"]
    assert fp["mappings_from"] == "kernel", fp
    assert fp.get("audit_claims_not_backed") == [forged], fp.get("audit_claims_not_backed")
    assert fp["runtime_file"].startswith("/opt/cumatrix/runtime/"), fp


def test_a_docker_cell_that_loads_its_runtime_without_ld_audit_is_still_seen(
        tmp_path: Path, cli: Any, base_image: str, backend: Any) -> None:
    """A child started with ``env -u LD_AUDIT`` dlopens the image's runtime: the audit log
    holds nothing of it, and the kernel's record still names the file and its version."""
    load = "import ctypes, os; ctypes.CDLL(os.environ['CUMATRIX_CUDART'])"  # the image's runtime, by path
    proc, got = _cells(cli, tmp_path, base_image, f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: hide, argv: [env, -u, LD_AUDIT, python3, -c, "{load}"]}}
        """)
    rec = got["hide"]
    assert rec["observed"]["outcome"] == "ok", (rec["observed"], proc.stdout)
    fp = rec["fingerprint"]
    assert fp["mappings_from"] == "kernel", fp
    [lib] = [lib for lib in fp["libraries"] if Path(lib["path"]).name == "libcudart.so.12"]
    assert lib["path"].startswith("/opt/cumatrix/runtime/")
    assert lib["version"] == "12.9"
    assert (fp["runtime_file"], fp["runtime_version"]) == (lib["path"], 12090)



def test_a_cell_that_floods_its_log_still_has_its_record(backend: Any) -> None:
    """The cell writes more to stderr than the container's log keeps (it rotates): the record,
    written last, is still read."""
    res = backend.run_job(_job(backend, "sh", "-c", "head -c 80000000 /dev/zero | tr '\\0' a >&2; exit 0"))
    assert res.returncode == 0
    assert res.verdict is None
    assert res.trace is not None, res.trace
    assert res.trace.traced, res.trace
    assert res.trace.complete, res.trace


# --------------------------------------------------------------------------- escapes (issue: every process, every load)


def test_a_docker_cells_clone_untraced_is_refused(backend: Any) -> None:
    """Attack: a process of the container's tree calls ``clone(CLONE_UNTRACED)`` (a raw system
    call, so that no C library wrapper is in the way).  Before: a child no tracer heard of.
    Now the helper's seccomp filter refuses it with EPERM, and the record is complete."""
    code = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
            "r = libc.syscall(56, 0x00800000 | 17, 0, 0, 0, 0); "  # SYS_clone, CLONE_UNTRACED | SIGCHLD
            "os._exit(0) if r == 0 else print('clone', r, ctypes.get_errno())")
    res = backend.run_job(_job(backend, "python3", "-c", code))
    assert res.stdout_tail.split() == ["clone", "-1", "1"], (res.stdout_tail, res.stderr_tail)  # EPERM
    assert res.trace is not None
    assert res.trace.traced
    assert res.trace.complete, res.trace


def test_a_docker_cells_leftover_process_is_followed_to_its_end(backend: Any) -> None:
    """The container's first process exits, leaving a child running: the child is traced until
    it ends (killed with the cell), and its end is on the record."""
    res = backend.run_job(_job(backend, "sh", "-c", "sleep 30 & exit 0"))
    assert res.returncode == 0
    assert res.duration_s < 20, res.duration_s  # killed with the cell, not waited for
    assert res.trace is not None
    assert res.trace.complete, res.trace
    # The child (killed at once, before or after its exec of sleep) ended by SIGKILL, on the record.
    assert any(p.signal == 9 for p in res.trace.processes), res.trace.processes


def test_a_docker_cells_library_unloaded_before_exit_is_on_the_record(backend: Any) -> None:
    """Attack: load a library, then dlclose it before exit: no maps read at exec or exit show
    it.  Each file mapped executable is recorded when it is mapped."""
    code = ("import ctypes, glob, os; "
            "path = next(p for p in sorted(glob.glob('/usr/lib/x86_64-linux-gnu/lib*.so.*')) "
            "if os.path.basename(p).startswith(('libbz2', 'liblzma', 'libsqlite3', 'libffi', 'libexpat'))); "
            "h = ctypes.CDLL(path); ctypes.CDLL(None).dlclose(ctypes.c_void_p(h._handle)); "
            "print(os.path.realpath(path))")
    res = backend.run_job(_job(backend, "python3", "-c", code))
    assert res.returncode == 0, res.stderr_tail
    unloaded = res.stdout_tail.strip()
    assert res.trace is not None
    assert res.trace.complete, res.trace
    assert any(o.path.removesuffix(" (deleted)") == unloaded for o in res.trace.objects), \
        (unloaded, [o.path for o in res.trace.objects])


def test_a_docker_cells_library_loaded_from_a_memfd_is_named_by_its_bytes(backend: Any) -> None:
    """Attack: copy a library into a memfd and load it through /proc/self/fd/N: the kernel names
    it ``/memfd:NAME (deleted)``, which nothing outside the container can read.  The tracer
    reads its SONAME from its bytes when it is mapped."""
    code = ("import ctypes, glob, os; "
            "path = next(p for p in sorted(glob.glob('/usr/lib/x86_64-linux-gnu/lib*.so.*')) "
            "if os.path.basename(p).startswith(('libbz2', 'liblzma', 'libsqlite3', 'libffi', 'libexpat'))); "
            "fd = os.memfd_create('lib'); os.write(fd, open(path, 'rb').read()); "
            "ctypes.CDLL(f'/proc/self/fd/{fd}'); print(os.path.basename(os.path.realpath(path)))")
    res = backend.run_job(_job(backend, "python3", "-c", code))
    assert res.returncode == 0, res.stderr_tail
    assert res.trace is not None
    memfds = [o for o in res.trace.objects if o.path.startswith("/memfd:lib")]
    assert memfds, [o.path for o in res.trace.objects]
    assert memfds[0].soname is not None
    assert res.stdout_tail.strip().startswith(memfds[0].soname), (res.stdout_tail, memfds[0])


def test_a_docker_cells_library_made_executable_by_mprotect_is_on_the_record(backend: Any) -> None:
    """Attack: map a library as data (no PROT_EXEC: no mmap stop), make it executable with
    mprotect, unmap it; the same with a memfd holding its bytes.  Before: neither was mapped
    executable at any moment the maps were read.  Now the mprotect that adds PROT_EXEC stops
    the tracer, which records the file backing the range, and the memfd's bytes by SHA-256."""
    code = textwrap.dedent("""
        import ctypes, glob, hashlib, os
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        path = os.path.realpath(next(p for p in sorted(glob.glob('/usr/lib/x86_64-linux-gnu/lib*.so.*'))
                                if os.path.basename(p).startswith(('libbz2', 'liblzma', 'libsqlite3', 'libffi'))))
        data = open(path, 'rb').read()
        mem = os.memfd_create('lib')
        os.write(mem, data)
        for fd in (os.open(path, os.O_RDONLY), mem):
            at = libc.mmap(None, 4096, 1, 2, fd, 0)  # PROT_READ, MAP_PRIVATE
            assert libc.mprotect(at, 4096, 5) == 0, ctypes.get_errno()  # PROT_READ | PROT_EXEC
            libc.munmap(at, 4096)
        print(path, hashlib.sha256(data).hexdigest(), len(data))
        """)
    res = backend.run_job(_job(backend, "python3", "-c", code))
    assert res.returncode == 0, res.stderr_tail
    path, digest, size = res.stdout_tail.split()
    assert res.trace is not None
    assert res.trace.complete, res.trace
    assert any(o.path == path for o in res.trace.objects), (path, [o.path for o in res.trace.objects])
    memfds = [o for o in res.trace.objects if o.path.startswith("/memfd:lib")]
    assert [o.digest for o in memfds] == [(digest, int(size))], memfds

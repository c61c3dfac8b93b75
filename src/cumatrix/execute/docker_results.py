"""A finished container as a cell's result, and the small docker calls the backend makes."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import requests.exceptions

from cumatrix.core.errors import DaemonUnavailable
from cumatrix.core.jobs import ChildResult, Job
from cumatrix.core.witness import KernelTrace, tracing_enabled
from cumatrix.execute import docker_trace, sandbox
from cumatrix.execute.local import _Capture
from cumatrix.execute.protocol import FileChannel, parse

START_HINT = ("start one with `sudo dockerd &` (or `sudo systemctl start docker`), or point "
              "DOCKER_HOST at a daemon that runs")
DEFAULT_HOST = "unix:///var/run/docker.sock"
_SIGNAL_BASE = 128  # docker-init (tini) exits with 128+N when its child dies of signal N


def world_readable(path: str) -> bool:
    st = Path(path).stat()
    need = 0o005 if stat.S_ISDIR(st.st_mode) else 0o004
    mode = st.st_mode
    return mode & need == need


def wait(container: Any, timeout: float) -> tuple[dict[str, Any], bool]:
    """The container's exit status, and whether it had to be killed at the job's timeout."""
    try:
        return container.wait(timeout=max(timeout, 0.1)), False
    except requests.exceptions.RequestException:  # the wait's read timeout is the job's
        with contextlib.suppress(docker.errors.APIError):  # it exited between the timeout and the kill
            container.kill()
        return container.wait(timeout=60), True


def collect(container: Any, status: dict[str, Any], *, timed_out: bool, duration: float,
             chan: FileChannel | None, extra: dict[str, object],
             rec: docker_trace.RecordChannel | None = None) -> ChildResult:
    """A finished container as a ChildResult: its exit (a signal or an OOM kill), logs, verdict."""
    container.reload()
    state = container.attrs.get("State") or {}
    code = int(status.get("StatusCode", state.get("ExitCode", -1)))
    oom = bool(state.get("OOMKilled"))
    out, err, trace = _streams(container, rec)
    verdict, verr = parse(chan.raw()) if chan is not None else (None, None)
    rc, sig = _exit(code, oom=oom)
    extra.update(exit_code_raw=code, container=container.name, containment="container")
    if trace is docker_trace.NO_RECORD and not timed_out and not oom and sig is None:
        # The helper ended the container itself and its record is not in the log: the cell
        # flooded the log past its size limit (the record rotated away) or hid it some other
        # way.  Its audit log is no evidence, and no outcome is read without the kernel's.
        msg = ("the tracer's record of this container is missing from its log (the cell's output passed the "
               "log's size limit?): no verdict without it")
        return ChildResult(returncode=rc, signal=sig, timed_out=False, stdout_tail=out.text(),
                           stderr_tail=err.text(), verdict=None, verdict_error=None, duration_s=duration, oom_killed=oom,
                           extra={**extra, "harness_error": msg}, trace=trace)
    return ChildResult(returncode=rc, signal=sig, timed_out=timed_out, stdout_tail=out.text(),
                       stderr_tail=err.text(), verdict=verdict, verdict_error=verr,
                       duration_s=duration, oom_killed=oom, extra=extra, trace=trace)


def _streams(container: Any, rec: docker_trace.RecordChannel | None
             ) -> tuple[_Capture, _Capture, KernelTrace | None]:
    """The container's stdout and stderr, and the tracer's record (None: untraced) taken out
    of the stderr it ends."""
    out, err = _Capture(), _Capture()
    for chunk in logs(container, stdout=True, stderr=False):
        out.feed(chunk)
    trace: KernelTrace | None = None
    if rec is None:
        for chunk in logs(container, stdout=False, stderr=True):
            err.feed(chunk)
    else:  # the whole stream: the helper's record is its end, taken out of what the cell wrote
        cell_err, trace = rec.split(b"".join(logs(container, stdout=False, stderr=True)))
        err.feed(cell_err)
    return out, err, trace


def _exit(code: int, *, oom: bool) -> tuple[int | None, int | None]:
    """(exit code, signal) of a container that exited with ``code`` (or was killed for memory)."""
    if oom:
        return None, 9
    if _SIGNAL_BASE < code < _SIGNAL_BASE + 65:
        return None, code - _SIGNAL_BASE
    return code, None


def record_channel(user: str) -> tuple[docker_trace.RecordChannel | None, KernelTrace | None]:
    """The tracer's channel for one container, or why the cell runs untraced (None: tracing is off)."""
    if not tracing_enabled():
        return None, None
    shim = sandbox.spawn_shim()
    if shim is None:
        return None, KernelTrace(traced=False, complete=False,
                                 note="no tracer: the spawn helper could not be built")
    if not docker_trace.is_static(shim):
        return None, KernelTrace(traced=False, complete=False,
                                 note="no tracer in containers: the spawn helper is not linked statically "
                                      "(the C library's libc.a is missing), so it cannot run in every image")
    return docker_trace.RecordChannel(shim, user), None


def check_unix_socket() -> None:
    """Connect to the daemon's unix socket once with a socket we close ourselves.

    docker-py's unix transport leaves its socket open when ``connect`` fails (a
    ``ResourceWarning`` at collection), so a missing daemon is detected here first.
    """
    host = os.environ.get("DOCKER_HOST") or DEFAULT_HOST
    if not host.startswith("unix://"):
        return
    path = host[len("unix://"):]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        try:
            sock.connect(path)
        except OSError as e:
            raise DaemonUnavailable(f"no Docker daemon answers at {host}: {e.strerror or e}; {START_HINT}") from e


def logs(container: Any, *, stdout: bool, stderr: bool) -> Iterator[bytes]:
    stream = container.logs(stdout=stdout, stderr=stderr, stream=True, follow=False)
    try:
        yield from stream
    finally:
        stream.close()


def short(e: BaseException) -> str:
    text = getattr(e, "explanation", None) or str(e)
    return " ".join(str(text).split())[:600]


def harness_error(message: str, **extra: object) -> ChildResult:
    """A per-cell harness error: a fact (``extra["harness_error"]``) the judge's ``classify`` names."""
    return ChildResult(returncode=None, signal=None, timed_out=False, stdout_tail="", stderr_tail=message,
                       verdict=None, verdict_error=None,
                       duration_s=0.0, extra={**extra, "harness_error": message, "backend": "docker"})


def workdir(job: Job, *, others_read: bool) -> tuple[str, ...]:
    """A command cell's working directory: the one it has on the local backend (its case's
    ``cwd:``, else the matrix file's directory; where the run started for the bundled default
    matrix), mounted read-only at the same path, so that the same matrix reads the same files
    on both backends (its relative paths, a module beside it).  None for the harness's own
    children; none for ``/``, which the image's root stands for; and none where the containers'
    user (``others_read``: not this one) could not read the directory the run started in: the
    cell then starts in the image's working directory, as docs/docker.md says.  A directory the
    matrix gives (its case's or its file's) is always mounted: one the containers' user cannot
    read is then a harness error naming it (the sandbox refuses it too), never another
    directory silently."""
    if job.kind != "command":
        return ()
    cwd = job.cwd or str(Path.cwd())
    if cwd == "/" or (not job.cwd and others_read and not world_readable(cwd)):
        return ()
    return (cwd,)

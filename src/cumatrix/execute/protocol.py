"""The child protocol: how the harness's own child code hands its verdict to the harness.

Only harness-owned children (the probe, the swap cell, ``calibrate``'s measuring child,
version queries) report a verdict, and they do it over a private channel that a cell's
program cannot write to by accident or on purpose: a socket whose one end the harness
passes to that child alone (its descriptor number in ``CUMATRIX_VERDICT_FD``), or, where no
descriptor can cross (a container), a file in a directory the harness creates for that one
child and mounts for it alone (``CUMATRIX_VERDICT_FILE``).  Command and gate cells get
neither: they are judged from exit status, signal, loader messages and timeout, and
whatever they print is log.  A program that prints a verdict-looking line on stdout is
therefore only logging (a tag on stdout would let a command forge its own pass).

The payload is one line, ``CUMATRIX-RESULT {json}``: a JSON object with a valid
``outcome``; the parent validates it (missing, several, not JSON, not an object and a bad
outcome are distinct failures).  pathfinder's ``subprocess_protocol`` is the model.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

# The tag and the channel's names are defined once, in the child's module (which imports nothing
# of the harness); the harness reads them from there.
from cumatrix.child.channel import ENV_FD, ENV_FILE, MAX_BYTES, TAG, emit, encode, take_channel
from cumatrix.core.cache import temp_prefix
from cumatrix.core.jobs import Verdict
from cumatrix.core.model import OUTCOME_RE
from cumatrix.core.readers import BoundedChannel
from cumatrix.core.witness import read_cell_file

__all__ = ["ENV_FD", "ENV_FILE", "MAX_BYTES", "TAG", "Verdict", "emit", "encode", "parse", "take_channel"]




# --------------------------------------------------------------------------- parent side


def parse(raw: bytes | None) -> tuple[Verdict | None, str | None]:
    """Validate what a harness child wrote: ``(verdict, None)`` or ``(None, why malformed)``.

    ``(None, None)`` means the child wrote nothing (it died, or never got that far).
    """
    if not raw:
        return None, None
    if len(raw) > MAX_BYTES:
        return None, f"verdict of {len(raw)} bytes (at most {MAX_BYTES})"
    lines = [ln for ln in raw.decode(errors="replace").splitlines() if ln.strip()]
    if len(lines) > 1:
        return None, f"{len(lines)} verdict lines (the protocol allows exactly one)"
    text = lines[0]
    if not text.startswith(TAG):
        return None, f"verdict line without the {TAG.strip()} tag: {text[:200]!r}"
    body = text[len(TAG):].strip()
    try:
        value = json.loads(body)
    except json.JSONDecodeError as e:
        return None, f"verdict line is not JSON ({e.msg} at column {e.colno}): {body[:200]!r}"
    if not isinstance(value, dict):
        return None, f"verdict is not an object: {body[:200]!r}"
    return _typed(value, body)


def _typed(value: dict[str, object], body: str) -> tuple[Verdict | None, str | None]:
    outcome = value.get("outcome")
    if not isinstance(outcome, str) or not OUTCOME_RE.match(outcome):
        return None, f"verdict has no valid 'outcome': {outcome!r}"
    timings, data = value.get("timings") or {}, value.get("data") or {}
    if not isinstance(timings, dict) or not isinstance(data, dict):
        return None, f"verdict 'timings' and 'data' must be objects: {body[:200]!r}"
    path, error_name = value.get("path"), value.get("error_name")
    return Verdict(outcome=outcome, path=None if path is None else str(path),
                   error_name=None if error_name is None else str(error_name),
                   detail=str(value.get("detail") or ""), timings=timings, data=data), None


class PipeChannel(BoundedChannel):
    """The local backend's channel: a connected Unix socket whose one end only the harness child gets.

    Not a pipe: a pipe's end held by a process can be opened by any process of its user
    through ``/proc/PID/fd/N`` while that process is dumpable, and a harness child is dumpable
    from its ``exec`` until its first statement makes it private.  A socket cannot be opened
    through ``/proc`` at all (``ENXIO``), so that window no longer exists; the socket has no
    name, so nothing can connect to it either.
    """

    limit = MAX_BYTES  # a verdict's size; the tracer's channel (core/witness.py) holds a trace

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.shutdown(socket.SHUT_WR)  # the harness only reads
        super().__init__(ours.detach(), theirs.detach())
        os.set_inheritable(self.read_fd, False)

    def env(self) -> tuple[tuple[str, str], ...]:
        return ((ENV_FD, str(self.write_fd)),)

    def raw(self) -> bytes:
        return b"x" * (MAX_BYTES + 1) if self.overflow else bytes(self.buffer)


class FileChannel:
    """The container backends' channel: a file in a directory made for one child.

    ``mount_dir`` is bind-mounted read-write at ``container_dir`` for that child alone.
    """

    container_dir = "/run/cumatrix-verdict"

    def __init__(self) -> None:
        self.mount_dir = Path(tempfile.mkdtemp(prefix=temp_prefix("verdict")))
        # The container's user is not the harness's: it may create files here and pass through,
        # but not list the directory (0733, sticky), and the verdict's name is a secret of this
        # child's environment, so no other local user can find the file to write it first.
        self.mount_dir.chmod(0o1733)
        self.name = f"verdict-{secrets.token_hex(16)}"

    def env(self) -> tuple[tuple[str, str], ...]:
        return ((ENV_FILE, f"{self.container_dir}/{self.name}"),)

    def raw(self) -> bytes:
        try:
            # The container can replace it (a FIFO, a link): read a regular file only, unblocked.
            got = read_cell_file(self.mount_dir / self.name, limit=MAX_BYTES + 1)
        except OSError:
            return b""
        return b"x" * (MAX_BYTES + 1) if len(got) > MAX_BYTES else got

    def close(self) -> None:
        shutil.rmtree(self.mount_dir, ignore_errors=True)  # whatever the container left there


def run_harness_child(argv: Sequence[str], *, env: Mapping[str, str], timeout: float
                      ) -> tuple[Verdict | None, str | None, subprocess.CompletedProcess[str]]:
    """Run a harness child outside a cell (``calibrate``'s measuring child, benchmarks).

    Its stdout and stderr are captured as log; the verdict comes over a private socket.  A
    child still running after ``timeout`` seconds is killed (returncode -9, no verdict).
    """
    chan = PipeChannel()
    full_env = dict(env)
    full_env.update(chan.env())
    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=full_env,
                                    pass_fds=(chan.write_fd,))
            chan.after_spawn()
            _drain(chan, time.monotonic() + timeout)
            try:
                rc = proc.wait(timeout=max(0.1, timeout))
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
            out.seek(0)
            err.seek(0)
            done = subprocess.CompletedProcess(list(argv), rc, out.read().decode(errors="replace"),
                                               err.read().decode(errors="replace"))
    finally:
        chan.close()
    verdict, why = parse(chan.raw())
    return verdict, why, done


def _drain(chan: PipeChannel, deadline: float) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(chan.read_fd, selectors.EVENT_READ)
        while (remaining := deadline - time.monotonic()) > 0:
            if not sel.select(timeout=min(remaining, 1.0)):
                continue
            chunk = os.read(chan.read_fd, 65536)
            if not chunk:
                return
            chan.feed(chunk)

"""The kernel's record of a docker cell: the spawn helper as the container's entry.

No descriptor can pass from the harness into a container, so the helper runs there with
``--trace-record`` (see ``csrc/spawn.c``): it traces the cell's whole tree as it does for
local cells, keeps the record in memory, and writes it to the container's stderr only once
waitpid reports no process of the tree left, between two lines that hold a secret of the
harness's.  The secret reaches the helper in a file of a directory mounted for that one
container, which the helper reads and removes before the first process of the cell exists;
the helper is not dumpable, so its memory cannot be read by the cell's processes (the same
user).  A cell can print lines that look like a record, but not with the secret, and none of
its processes is alive when the real one is written.  docs/threat-model.md argues it.

The helper must run in any image: it is used only when it was linked statically (no
``PT_INTERP``, so no dynamic loader and no C library of the image's).
"""

from __future__ import annotations

import os
import secrets
import shutil
import struct
import tempfile
from dataclasses import replace
from pathlib import Path

from cumatrix.core.cache import temp_prefix
from cumatrix.core.witness import MAX_TRACE_BYTES, KernelTrace, parse_trace

#: Where the helper and the secret's directory appear inside the container.
SPAWN_IN_CONTAINER = "/run/cumatrix-spawn"
SECRET_DIR_IN_CONTAINER = "/run/cumatrix-trace"
_MARK = b"\x1ecumatrix-trace "
_PT_INTERP = 3

#: The record when the container ended without the helper writing one (killed at the timeout
#: or for memory, with the helper).
NO_RECORD = KernelTrace(traced=False, complete=False,
                        note="the tracer in the container left no record (it was killed with the container)")


def is_static(path: Path) -> bool:
    """Whether the ELF file ``path`` has no program interpreter (runs without a dynamic loader)."""
    try:
        with path.open("rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return False  # only 64-bit little-endian helpers are looked into
            phoff, = struct.unpack_from("<Q", head, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    for i in range(phnum):
        p_type, = struct.unpack_from("<I", table, i * phentsize)
        if p_type == _PT_INTERP:
            return False
    return True


class RecordChannel:
    """One container's secret and how the helper's record is found in its stderr."""

    def __init__(self, shim: Path, user: str) -> None:
        self.shim = shim
        self.secret = secrets.token_hex(24)
        self.dir = Path(tempfile.mkdtemp(prefix=temp_prefix("trace")))
        self.name = f"s-{secrets.token_hex(8)}"
        path = self.dir / self.name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.secret + "\n")
        # The helper runs as the cell's user and must read and remove the file: the directory
        # and the file are that user's alone (a root harness gives them to its cells' user).
        uid, _, gid = user.partition(":")
        if os.getuid() == 0 and uid.isdigit() and int(uid) != 0:
            g = int(gid) if gid.isdigit() else int(uid)
            os.chown(self.dir, int(uid), g)
            os.chown(path, int(uid), g)

    def command(self, argv: tuple[str, ...]) -> list[str]:
        """The container's command: the helper tracing ``argv``."""
        return [SPAWN_IN_CONTAINER, "--trace-record", f"{SECRET_DIR_IN_CONTAINER}/{self.name}", "0", "-", "-",
                "--", *argv]

    def split(self, stderr: bytes) -> tuple[bytes, KernelTrace]:
        """The cell's own stderr, and the helper's record (:data:`NO_RECORD` without one)."""
        begin = b"\n" + _MARK + self.secret.encode() + b" begin\n"
        end = _MARK + self.secret.encode() + b" end\n"
        at = stderr.rfind(begin)
        if at < 0:
            return stderr, NO_RECORD
        body_at = at + len(begin)
        stop = stderr.find(end, body_at)
        if stop < 0:  # cut off (the log's size limit): what came is read, marked incomplete
            body = stderr[body_at:]
            trace = parse_trace(body[:MAX_TRACE_BYTES], overflow=len(body) > MAX_TRACE_BYTES)
            return stderr[:at], _incomplete(trace)
        body = stderr[body_at:stop]
        trace = parse_trace(body[:MAX_TRACE_BYTES], overflow=len(body) > MAX_TRACE_BYTES)
        return stderr[:at] + stderr[stop + len(end):], trace

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _incomplete(trace: KernelTrace) -> KernelTrace:

    return replace(trace, complete=False)

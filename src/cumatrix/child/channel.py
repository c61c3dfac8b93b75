"""The child's end of the verdict channel (see :mod:`cumatrix.execute.protocol`).

Runs inside a cell, so it uses the standard library alone: the probe, the swap cell and
``calibrate``'s measuring child hand their one verdict to the harness through it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

#: The verdict line's tag: defined here and nowhere else.
TAG = "CUMATRIX-RESULT "
ENV_FD = "CUMATRIX_VERDICT_FD"
ENV_FILE = "CUMATRIX_VERDICT_FILE"
#: A verdict larger than this is malformed (and cannot stall the harness).
MAX_BYTES = 1 << 20



def encode(payload: Mapping[str, object]) -> bytes:
    """One verdict line."""
    return (TAG + json.dumps(payload, sort_keys=True, default=str) + "\n").encode()


def emit(payload: Mapping[str, object], *, environ: Mapping[str, str] | None = None) -> bool:
    """Hand ``payload`` to the harness over the channel it gave this process.

    Returns False (and writes nothing) when this process was given no channel, e.g. when a
    person runs the child by hand; callers then print it for the person.
    """
    env = os.environ if environ is None else environ
    line = encode(payload)
    fd_text = env.get(ENV_FD)
    if fd_text:
        fd = int(fd_text)
        view = memoryview(line)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.close(fd)
        return True
    target = env.get(ENV_FILE)
    if target:
        tmp = target + ".part"
        with open(tmp, "wb") as f:
            f.write(line)
        os.replace(tmp, target)  # the parent sees a whole verdict or none
        return True
    return False


def take_channel() -> dict[str, str]:
    """Remove the channel from this process's environment (so programs it starts do not
    inherit it) and return what was removed, for :func:`emit`."""
    got = {k: os.environ.pop(k) for k in (ENV_FD, ENV_FILE) if k in os.environ}
    fd = got.get(ENV_FD)
    if fd:
        os.set_inheritable(int(fd), False)
    return got

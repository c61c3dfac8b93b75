"""Whether bubblewrap can run cells here: the tests of the sandbox skip where it cannot, or
fail where the run requires it (``CUMATRIX_REQUIRE_BWRAP=1``, as CI sets)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from cumatrix.execute import sandbox


def require_bwrap() -> str:
    """The path of a bwrap that runs here; otherwise the test skips (or fails, where required)."""
    path, why = sandbox.bubblewrap()
    if path is None:
        if os.environ.get("CUMATRIX_REQUIRE_BWRAP") == "1":
            pytest.fail(f"CUMATRIX_REQUIRE_BWRAP=1 but {why}")
        pytest.skip(f"bubblewrap cannot run here: {why}")
    return path


#: How a sandboxed cell can be held: by the fork server (a root harness with cgroups, or any
#: other harness from a user namespace of the server's own) or by bubblewrap per cell
#: (``CUMATRIX_FORK_SERVER=off``).
HOLDERS = ("namespaces", "bubblewrap")


def hold_with(holder: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Make the cells of this test held by ``holder``; the label their records will carry."""
    if holder == "bubblewrap":
        monkeypatch.setenv("CUMATRIX_FORK_SERVER", "off")
        return "bubblewrap"
    monkeypatch.delenv("CUMATRIX_FORK_SERVER", raising=False)
    return "namespaces"


#: Connects to the Unix socket its argument (or ``$SOCK``) names; says what it got, exits 0.
CONNECT = r"""
import os, socket, sys
path = sys.argv[1] if len(sys.argv) > 1 else os.environ["SOCK"]
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(path)
    print("connected", path)
except OSError as e:
    print("refused", path, e.errno)
"""


@contextlib.contextmanager
def socket_under_run() -> Iterator[Path]:
    """A world-connectable socket of our own, ``sock``, in a fresh directory under the host's
    ``/run`` (where daemons keep theirs: ``docker.sock``, munge's) that anyone may enter, with
    ``connect.py`` beside it (:data:`CONNECT` on that socket); removed after.  Skips where
    ``/run`` takes no directory of ours."""
    where = Path("/run") / f"cumatrix-test-{secrets.token_hex(6)}"
    try:
        where.mkdir(mode=0o755)
    except OSError as e:
        pytest.skip(f"cannot make a directory under /run: {e}")
    where.chmod(0o755)
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(where / "sock"))
        (where / "sock").chmod(0o777)
        server.listen(8)
        (where / "connect.py").write_text(CONNECT.replace(
            'sys.argv[1] if len(sys.argv) > 1 else os.environ["SOCK"]', 'os.path.join(os.path.dirname(__file__), "sock")'))
        (where / "connect.py").chmod(0o644)
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(str(where / "sock"))  # the host can
        probe.close()
        yield where
    finally:
        server.close()
        shutil.rmtree(where, ignore_errors=True)

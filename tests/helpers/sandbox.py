"""Whether bubblewrap can run cells here: the tests of the sandbox skip where it cannot, or
fail where the run requires it (``CUMATRIX_REQUIRE_BWRAP=1``, as CI sets)."""

from __future__ import annotations

import os

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

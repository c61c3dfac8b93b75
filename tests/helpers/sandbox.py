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

"""Fixtures of the integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    """pytest's directory of the test (0700), searchable by others as a checkout is: a root
    harness sandboxes its cells by default and runs them as ``nobody``, which must enter the
    directory a run starts in and read the scripts a test writes there."""
    tmp_path.chmod(0o755)
    return tmp_path

"""Fixtures of the integration tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


class _Searchable:
    """pytest's ``tmp_path_factory`` whose directories (0700) are searchable by others, as a
    checkout's are: a root harness sandboxes its cells by default and runs them as ``nobody``,
    which must enter the directory a run starts in and read the scripts a test writes there.
    ``tmp_path`` comes from here too."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self._factory = factory

    def mktemp(self, basename: str, numbered: bool = True) -> Path:
        path = self._factory.mktemp(basename, numbered=numbered)
        path.chmod(0o755)
        return path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._factory, name)


@pytest.fixture(scope="session")
def tmp_path_factory(tmp_path_factory: pytest.TempPathFactory) -> _Searchable:
    return _Searchable(tmp_path_factory)

"""Shared fixtures: one persistent wheel cache, matrix files in tmp_path, the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

import cumatrix

pytest_plugins = ["pytester"]

#: The directory holding the ``cumatrix`` package, whether installed or run with PYTHONPATH=src.
PACKAGE_PARENT = str(Path(cumatrix.__file__).resolve().parent.parent)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, with the package importable by a child Python."""
    env = dict(os.environ)
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_PARENT, *([old] if old else [])])
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    if extra:
        env.update(extra)
    return env


def run_cli(*args: str | Path, cwd: Path | None = None, env: Mapping[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m cumatrix ARGS`` in a real subprocess."""
    return subprocess.run([sys.executable, "-m", "cumatrix", *map(str, args)], cwd=cwd, env=child_env(env),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def wheel_cache() -> Path:
    """Pin ``XDG_CACHE_HOME`` for the whole session so runtime wheels are fetched once.

    Default: the user's own cache (repeated runs are fast); CI points XDG_CACHE_HOME at its
    own cached directory.  Pinned explicitly because pytester moves HOME for its runs.
    """
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    base.mkdir(parents=True, exist_ok=True)
    os.environ["XDG_CACHE_HOME"] = str(base)
    return base / "cumatrix"


@pytest.fixture
def write_matrix(tmp_path: Path) -> Callable[..., Path]:
    """Write a (dedented) matrix file into tmp_path and return its path."""

    def write(text: str, name: str = "matrix.yaml") -> Path:
        p = tmp_path / name
        p.write_text(textwrap.dedent(text).lstrip("\n"))
        return p

    return write


@pytest.fixture(scope="session")
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """:func:`run_cli`: the real ``cumatrix`` command in a subprocess."""
    return run_cli


@pytest.fixture(scope="session")
def cli_env() -> Callable[..., dict[str, str]]:
    """:func:`child_env`: an environment in which a child Python imports this cumatrix."""
    return child_env

"""Shared fixtures: one persistent wheel cache, matrix files in tmp_path, the real CLI."""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

# pytester's in-process runs put sys.modules back as they found it, but libyaml's C parser
# (imported once per process) keeps the node classes of the yaml package it first saw: a yaml
# imported afresh inside a second run would not recognise them (every tag None).  Imported
# here, before any run, it is the one copy.
import yaml  # noqa: F401

import cumatrix

#: pytester, and the fixtures several test modules share: ``browser`` (real headless Chromium).
pytest_plugins = ["pytester", "helpers.browser"]

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
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="session", autouse=True)
def history_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The history that the runs, merges and gates of the tests append to: the session's own,
    not the user's (``CUMATRIX_HISTORY``, inherited by every child)."""
    path = tmp_path_factory.mktemp("history") / "history.sqlite"
    os.environ["CUMATRIX_HISTORY"] = str(path)
    return path


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


# --------------------------------------------------------------------------- docker images
# The docker tests build runtime images (and, through the classic builder, untagged build
# stages that inherit the base image's `cumatrix.base` label) and import throwaway images
# labelled `cumatrix.test`.  What this session added goes when it ends, with the function
# `cumatrix clean --images` uses; the base image from containers/build-base.sh stays (it is
# a cache: built once per recipe, and .ci/run builds it before the tests).
_IMAGES_BEFORE: dict[str, set[str]] = {}


def _docker_client() -> object | None:
    if not (os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists()):
        return None
    # Any failure (import, socket, API) means no daemon answers: the docker tests skip, and nothing is
    # left to clean.
    with contextlib.suppress(Exception):
        import docker

        client = docker.from_env(timeout=30)
        client.ping()
        return client
    # The refused connection's socket was dropped, not closed: collect it now (the exception that
    # held it is gone), quietly, rather than inside whichever test runs when the collector gets to it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    return None


def _close(client: object) -> None:
    """Close the client's connections now, not when the garbage collector gets to them."""
    client.close()  # type: ignore[attr-defined]


def pytest_sessionstart(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return
    client = _docker_client()
    if client is not None:
        try:
            _IMAGES_BEFORE["runtime"] = {i.id for i in client.images.list(filters={"label": "cumatrix=1"})}  # type: ignore[attr-defined]
        finally:
            _close(client)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or "runtime" not in _IMAGES_BEFORE:
        return
    client = _docker_client()
    if client is None:
        return
    from cumatrix.front.clean import remove_build_stages

    try:
        for img in client.images.list(filters={"label": "cumatrix=1"}):  # type: ignore[attr-defined]
            if img.id not in _IMAGES_BEFORE["runtime"]:
                with contextlib.suppress(Exception):  # in use by a container of a parallel run, or gone already
                    client.images.remove(img.id, force=True)  # type: ignore[attr-defined]
        remove_build_stages(client)
        remove_build_stages(client, label="cumatrix.test")
    finally:
        _close(client)


# --------------------------------------------------------------------------- directories


class _Searchable:
    """pytest's ``tmp_path_factory`` whose directories (0700) are searchable by others, as a
    checkout's are: a root harness sandboxes its cells by default and runs them as ``nobody``,
    which must enter the directory a run starts in and read the scripts a test writes there.
    ``tmp_path`` and ``pytester`` come from here too."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self._factory = factory

    def mktemp(self, basename: str, numbered: bool = True) -> Path:
        path = self._factory.mktemp(basename, numbered=numbered)
        path.chmod(0o755)
        return path

    def __getattr__(self, name: str) -> object:
        return getattr(self._factory, name)


@pytest.fixture(scope="session")
def tmp_path_factory(tmp_path_factory: pytest.TempPathFactory) -> _Searchable:
    return _Searchable(tmp_path_factory)

"""The gate installs wheels only: a dependency named by direct reference (an in-tree build
backend of someone's) never runs, and with --wheel-dir no request reaches any index.

Real wheels, real pip, a real build backend that would leave a mark, a real HTTP server
standing for a package index that records every request.
"""

from __future__ import annotations

import http.server
import subprocess
import threading
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cumatrix.front.gate.cli import direct_references
from helpers.sandbox import require_bwrap
from helpers.wheels import make_wheel

Cli = Callable[..., subprocess.CompletedProcess[str]]
MATRIX = "version: 1\nruntimes:\n  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}\ndrivers: [host]\n"
BACKEND = """\
import os
def _mark():
    open(os.environ.get("MARK_FILE", "/tmp/cumatrix-evildep-ran"), "w").write(str(os.getuid()))
def get_requires_for_build_wheel(config_settings=None):
    _mark(); return []
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _mark(); raise RuntimeError("built")
def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _mark(); raise RuntimeError("built")
"""


def _wheel(out: Path, dist: str, requires: list[str]) -> Path:
    return make_wheel(out, dist, {f"{dist}/__init__.py": b""}, requires=requires, top_level=True, purelib=True,
                      compression=zipfile.ZIP_STORED)


@pytest.fixture
def index() -> Iterator[list[str]]:
    """A package index that answers 404 to everything and records each path asked for."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    seen.append(f"http://127.0.0.1:{server.server_address[1]}/simple")  # [0]: the URL itself
    yield seen
    server.shutdown()
    server.server_close()


def test_a_direct_reference_is_read_from_the_metadata(tmp_path: Path) -> None:
    w = _wheel(tmp_path, "demo_ref", ["evildep @ file:///somewhere", "numpy>=1; python_version>'3'"])
    assert direct_references(w) == ["evildep @ file:///somewhere"]


def test_a_dependency_by_direct_reference_is_never_built(tmp_path: Path, cli: Cli, wheel_cache: Path) -> None:
    evil = tmp_path / "evildep"
    (evil / "backend").mkdir(parents=True)
    (evil / "backend" / "evil_backend.py").write_text(BACKEND)
    (evil / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "evil_backend"\n'
                                         'backend-path = ["backend"]\n')
    mark = tmp_path / "ran"
    wheel = _wheel(tmp_path, "demo_ref", [f"evildep @ file://{evil}"])
    (tmp_path / "m.yaml").write_text(MATRIX)
    (tmp_path / "c.txt").write_text("")
    r = cli("gate", wheel, "--matrix", tmp_path / "m.yaml", "--constraints", tmp_path / "c.txt",
            "--out", tmp_path / "out", env={"MARK_FILE": str(mark)}, timeout=300)
    assert not mark.exists(), "the dependency's build backend ran"
    assert r.returncode == 1, r.stdout + r.stderr
    assert "direct reference" in r.stdout


def test_with_a_wheel_dir_nothing_reaches_an_index(tmp_path: Path, cli: Cli, wheel_cache: Path,
                                                   index: list[str]) -> None:
    wheel = _wheel(tmp_path, "demo_dep", ["somedep>=1"])
    (tmp_path / "m.yaml").write_text(MATRIX)
    (tmp_path / "c.txt").write_text("")
    wd = wheel_cache / "wheels"
    if not list(wd.glob("nvidia_cuda_runtime_cu12-12.9.79-*.whl")):
        pytest.skip(f"no nvidia-cuda-runtime-cu12 12.9.79 wheel in {wd}")
    r = cli("gate", wheel, "--matrix", tmp_path / "m.yaml", "--constraints", tmp_path / "c.txt",
            "--wheel-dir", wd, "--out", tmp_path / "out",
            env={"PIP_INDEX_URL": index[0], "PIP_EXTRA_INDEX_URL": index[0]}, timeout=300)
    assert index[1:] == [], f"pip asked the index for {index[1:]}"
    # not in the wheel dir: not installed
    assert r.returncode == 1, r.stdout + r.stderr
    assert "somedep" in r.stdout, r.stdout + r.stderr


def test_pip_runs_in_the_sandbox_when_nothing_needs_the_network(tmp_path: Path, cli: Cli, wheel_cache: Path) -> None:
    import os

    from cumatrix.execute import sandbox
    from cumatrix.front.gate.cli import SITES_DIR

    if os.geteuid() != 0:
        pytest.skip("the sandbox's own uid shows on the installed files only under a root harness")
    require_bwrap()
    wheel = _wheel(tmp_path, "demo_boxed", [])
    (tmp_path / "m.yaml").write_text(MATRIX)
    r = cli("gate", wheel, "--matrix", tmp_path / "m.yaml", "--out", tmp_path / "out", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    installed = tmp_path / "out" / SITES_DIR / ".staged" / "demo_boxed-1.0-py3-none-any" / "demo_boxed" / "__init__.py"
    assert installed.stat().st_uid == sandbox.NOBODY  # pip ran as the cells do, not as root

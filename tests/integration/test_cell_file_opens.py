"""Each way the harness opens a file a cell names, given a FIFO (with no writer: an open that
waits for one never returns): each answers at once, as nothing or as ``not a regular file``.

Each call runs in a child Python with a time limit, so that a regression stalls one test, not
the suite.  The harness's whole run against such FIFOs: tests/integration/test_tracer_escapes.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

PY = sys.executable


def _answers(cli_env: Any, code: str) -> str:
    """What ``code`` prints, run in a child Python; fails the test if it waits 30 s."""
    try:
        proc = subprocess.run([PY, "-c", textwrap.dedent(code)], env=cli_env(), capture_output=True, text=True,
                              timeout=30, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the call waited on the FIFO")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "libcudart.so.13"
    os.mkfifo(path)
    return path


def test_a_mapped_path_read_for_its_soname(cli_env: Any, fifo: Path) -> None:
    """``_kernel_named_soname``: the SONAME of a file the kernel said was mapped."""
    got = _answers(cli_env, f"""
        from cumatrix.execute import mapped
        print(repr(mapped._kernel_named_soname({str(fifo)!r}, {{}})))
        """)
    assert got == "''"


def test_a_mapped_path_looked_into_for_a_static_runtime(cli_env: Any, fifo: Path) -> None:
    """``static_runtime_in``: a mapped object searched for a statically linked runtime."""
    got = _answers(cli_env, f"""
        from cumatrix.binary import staticcudart
        print(staticcudart.static_runtime_in({str(fifo)!r}, lambda: {{}}))
        print(staticcudart.has_bytes({str(fifo)!r}, (b"x",)))
        """)
    assert got.split() == ["None", "False"]


def test_an_audit_requester_read_for_its_runpath(cli_env: Any, fifo: Path) -> None:
    """``provenance._search_paths``: the RPATH/RUNPATH of the object a request was made for."""
    got = _answers(cli_env, f"""
        from cumatrix.execute import provenance
        print(provenance._search_paths({str(fifo)!r}))
        """)
    assert got == "()"


def test_the_wheel_metadata_beside_a_mapped_file(cli_env: Any, tmp_path: Path) -> None:
    """``owning_wheel``: the RECORD and METADATA of the wheels beside a mapped file (a cell's
    directory can hold them)."""
    lib = tmp_path / "pkg" / "libcudart.so.13"
    lib.parent.mkdir()
    lib.write_bytes(b"\x7fELF")
    info = tmp_path / "fake-1.0.dist-info"
    info.mkdir()
    os.mkfifo(info / "METADATA")
    os.mkfifo(info / "RECORD")
    got = _answers(cli_env, f"""
        from pathlib import Path
        from cumatrix.execute import mapped
        print(mapped.owning_wheel(Path({str(lib)!r})))
        """)
    assert got == "None"


def test_a_mapped_path_made_a_fifo_is_a_fact(fifo: Path) -> None:
    from cumatrix.execute import mapped

    (fact,) = mapped.special_files([str(fifo), "/nonexistent/x"])
    assert fact.startswith(f"{fifo}: not a regular file")

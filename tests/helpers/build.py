"""Real ELF files for the tests, built with the machine's gcc."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest


def gcc() -> str:
    """The path of gcc; the test skips (with how to install it) where there is none."""
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("gcc is not installed (apt-get install gcc)")
    return cc


def run_gcc(*args: str | Path, cwd: Path | None = None) -> None:
    """``gcc ARGS``; the test fails with gcc's messages if it does."""
    proc = subprocess.run([gcc(), *map(str, args)], cwd=cwd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def shared_library(out: Path, source: str, *args: str) -> Path:
    """A shared object at ``out`` (``-shared -fPIC -O1``, then ``args``) built from C ``source``
    (dedented), which is written beside it as ``out`` with the suffix ``.c``.  gcc runs in
    ``out``'s directory, so relative paths in ``args`` (``-Lstubs``) start there."""
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_suffix(".c")
    src.write_text(textwrap.dedent(source))
    run_gcc("-shared", "-fPIC", "-O1", "-o", out.name, src.name, *args, cwd=out.parent)
    return out


def undefined_symbol_program(d: Path, symbol: str = "shim_new") -> tuple[Path, Path]:
    """A program ``d/prog`` linked against ``libshim.so``'s ``symbol``, and a directory whose
    ``libshim.so`` (same soname) lacks it: run with ``LD_LIBRARY_PATH`` at that directory, the
    loader fails with ``undefined symbol: SYMBOL``."""
    for lib, body in (("new", f"int {symbol}(void) {{ return 0; }}\n"), ("old", "int shim_old(void) { return 0; }\n")):
        shared_library(d / lib / "libshim.so", body, "-Wl,-soname,libshim.so")
    (d / "main.c").write_text(f"int {symbol}(void);\nint main(void) {{ return {symbol}(); }}\n")
    run_gcc("-o", d / "prog", d / "main.c", f"-L{d / 'new'}", "-lshim")
    return d / "prog", d / "old"

"""The code's own hygiene, checked like any other behaviour: ruff with the project's rules
(cibuildwheel's families, complexity at most 15), ``mypy --strict``, and modules a reader can
hold in their head (at most 600 lines)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "cumatrix"
#: The most lines one module of the harness may have.
MAX_LINES = 600


def _tool(name: str) -> list[str]:
    # The tools are test dependencies (pyproject's `test` extra): installed beside this
    # interpreter, run as modules of it so the venv's copy is the one used.
    if shutil.which(name, path=str(Path(sys.executable).parent)) is None:
        pytest.fail(f"{name} is not installed in this environment: pip install -e '.[test]'")
    return [sys.executable, "-m", name]


def test_ruff_finds_nothing_in_src_and_tests() -> None:
    proc = subprocess.run([*_tool("ruff"), "check", "--no-cache", "--output-format", "concise", "src", "tests"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict_is_clean() -> None:
    proc = subprocess.run([*_tool("mypy"), "--strict", "--no-incremental"], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_module_is_longer_than_the_limit() -> None:
    long = {str(p.relative_to(ROOT)): n for p in sorted(SRC.rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by what they own): {long}"

"""The code's own hygiene, checked like any other behaviour: ruff with the project's rules
(cibuildwheel's families, complexity at most 15 in src and tests), ``mypy --strict``, modules a reader can
hold in their head (at most 600 lines), and functions a reviewer can follow (radon's cyclomatic
complexity at most 10, its ranks A and B, for every function, method, closure and class: ruff's
C901 does not count boolean operators, radon does)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "cumatrix"
#: The most lines one module of the harness may have.
MAX_LINES = 600
#: The highest cyclomatic complexity radon may give one block of the harness (``radon cc -n C
#: src/cumatrix`` lists none).
MAX_COMPLEXITY = 10
#: Functions above it, each with why it stays so for now (``module path::qualified name``):
#: none.  A function that must stay above it is named here, with the reason.
COMPLEXITY_EXCEPTIONS: frozenset[str] = frozenset()


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


def test_no_function_is_more_complex_than_the_limit() -> None:
    knots: dict[str, int] = {}
    for path in sorted(SRC.rglob("*.py")):
        for block in _blocks(cc_visit(path.read_text(encoding="utf-8"))):
            name = f"{path.relative_to(SRC).as_posix()}::{block.fullname}"
            if block.complexity > MAX_COMPLEXITY and name not in COMPLEXITY_EXCEPTIONS:
                knots[name] = block.complexity
    assert not knots, f"functions above radon complexity {MAX_COMPLEXITY} (split them): {knots}"


def _blocks(blocks: list[Any]) -> list[Any]:
    """Every block radon measured, the closures inside functions too (``cc_visit`` names them
    only under the function that holds them)."""
    out: list[Any] = []
    for block in blocks:
        out += [block, *_blocks(list(getattr(block, "closures", [])))]
    return out

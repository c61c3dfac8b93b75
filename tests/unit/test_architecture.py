"""The stage packages keep their layers: import-linter's contracts in pyproject.toml hold."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_hold() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]' installs it)")
    proc = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_the_child_package_imports_only_the_standard_library_and_itself() -> None:
    # What runs inside a cell must start in any interpreter: nothing third-party either.
    allowed = set(sys.stdlib_module_names) | {"cumatrix"}
    for path in (ROOT / "src" / "cumatrix" / "child").glob("*.py"):
        import ast

        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                top = name.split(".")[0]
                assert top in allowed, f"{path.name} imports {name}"
                if top == "cumatrix":
                    assert name.startswith("cumatrix.child"), f"{path.name} imports {name}"

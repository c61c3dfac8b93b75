"""Which imports of a wheel's Python code are guarded by ``try/except ImportError``: the
statement-only walk of :func:`cumatrix.audit.static._imports` sees what a walk of every node saw."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from cumatrix.audit.findings import Finding
from cumatrix.audit.static import _imports, optional_import_notes
from helpers.wheels import make_wheel

SOURCE = textwrap.dedent("""\
    import a
    try:
        import b
        def f():
            import c
    except ImportError:
        import d
    else:
        import e
    if x:
        try:
            from .g import h
        except (ValueError, ModuleNotFoundError):
            pass
    try:
        import i
    except ValueError:
        pass
    class K:
        try:
            import j
        except:
            pass
    match y:
        case 1:
            import k
""")


def test_guarded_imports_are_those_in_a_try_body_that_catches_import_error() -> None:
    got = {(name, guarded) for name, _, guarded in _imports(ast.parse(SOURCE), "pkg.sub")}
    assert got == {("a", False), ("b", True), ("c", True), ("d", False), ("e", False),
                   ("pkg.sub.g", True), ("pkg.sub.g.h", True), ("i", False), ("j", True), ("k", False)}


def test_imports_come_in_the_order_of_ast_walk() -> None:
    tree = ast.parse(SOURCE)
    walked = [n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    seen = list(dict.fromkeys(line for _, line, _ in _imports(tree, "pkg.sub")))
    assert seen == walked


def test_the_analysis_is_cached_by_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gate run again on the same wheel reads the analysis from the cache, keyed by what the
    zip's directory says of every .py member; a changed .py is analysed again."""
    monkeypatch.delenv("CUMATRIX_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    failing = [Finding(file="demo/_ext.so", severity="error", code="needs-libcuda", subject="libcuda.so.1",
                       message="", fix="")]
    guarded = b"try:\n    from . import _ext\nexcept ImportError:\n    _ext = None\n"
    wheel = make_wheel(tmp_path / "a", "demo", {"demo/__init__.py": guarded, "demo/_ext.so": b"\x7fELF"})
    first = optional_import_notes(wheel, failing)
    assert [n.code for n in first] == ["optional-import"]
    assert len(list((tmp_path / "cache" / "cumatrix" / "gate-imports").glob("*.json"))) == 1
    assert optional_import_notes(wheel, failing) == first
    plain = make_wheel(tmp_path / "b", "demo", {"demo/__init__.py": b"from . import _ext\n", "demo/_ext.so": b"\x7fELF"})
    assert optional_import_notes(plain, failing) == []  # another content, another entry

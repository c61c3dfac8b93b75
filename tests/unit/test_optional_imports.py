"""Which imports of a wheel's Python code are guarded by ``try/except ImportError``: the
statement-only walk of :func:`cumatrix.audit.static._imports` sees what a walk of every node saw."""

from __future__ import annotations

import ast
import textwrap

from cumatrix.audit.static import _imports

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

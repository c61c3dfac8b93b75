"""The stage packages keep their layers: import-linter's contracts in pyproject.toml hold; an
import inside a function says why it is there."""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import grimp
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
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                top = name.split(".")[0]
                assert top in allowed, f"{path.name} imports {name}"
                if top == "cumatrix":
                    assert name.startswith("cumatrix.child"), f"{path.name} imports {name}"


def imports_without_a_reason(source: str) -> list[int]:
    """Line numbers of the imports inside a function that carry no comment: none on the
    statement's own lines, and no comment line directly above it, where "above" passes over
    blank lines and the imports just before it (one comment may explain a group)."""
    lines = source.splitlines()
    commented = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                 if tok.type == tokenize.COMMENT}
    missing: list[int] = []

    def check(body: list[ast.stmt]) -> None:
        run: set[int] = set()  # the lines of the run of imports the statement belongs to
        for i, stmt in enumerate(body):
            if not isinstance(stmt, ast.Import | ast.ImportFrom):
                continue
            if i == 0 or not isinstance(body[i - 1], ast.Import | ast.ImportFrom):
                run = set()
            end = stmt.end_lineno or stmt.lineno
            run.update(range(stmt.lineno, end + 1))
            if any(n in commented for n in range(stmt.lineno, end + 1)):
                continue
            above = stmt.lineno - 1  # past blank lines and the run's earlier imports
            while above >= 1 and (above in run or not lines[above - 1].strip()):
                above -= 1
            if above < 1 or not lines[above - 1].lstrip().startswith("#"):
                missing.append(stmt.lineno)

    def visit(node: ast.AST, in_function: bool) -> None:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and in_function:
                check([s for s in block if isinstance(s, ast.stmt)])
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(ast.parse(source), False)
    return sorted(missing)


def test_the_import_checker_tells_a_reason_from_none() -> None:
    source = """\
import os


def f():
    import json

    # deferred: a reason for the group
    import ctypes

    import sqlite3
    x = 1
    import re  # deferred: a reason on the line
    from collections import (
        OrderedDict,
    )
    if x:
        import zlib
    return os, json, ctypes, sqlite3, re, OrderedDict, zlib
"""
    # json: nothing above it; ctypes and sqlite3: the comment above the two (a blank line between);
    # re: on its line; OrderedDict: the line above is code; zlib: nested in an if, nothing above
    assert imports_without_a_reason(source) == [5, 13, 17]


def test_function_level_imports_say_why() -> None:
    """Imports inside functions only where start-up needs them, each with its reason."""
    src = ROOT / "src" / "cumatrix"
    bad: list[str] = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        source = path.read_text(encoding="utf-8")
        bad += [f"src/cumatrix/{rel}:{n}: {source.splitlines()[n - 1].strip()}"
                for n in imports_without_a_reason(source)]
    assert not bad, ("imports inside functions without a comment saying why (hoist them to the top of the "
                     "module, or say what deferring saves, e.g. '# deferred: docker SDK costs ~170 ms'):\n"
                     + "\n".join(bad))


def test_the_architecture_page_names_every_module() -> None:
    """docs/architecture.md's package table lists each package's modules: a newcomer finds a
    module by its stage there, so a module added or split off must be named in its row."""
    rows: dict[str, set[str]] = {}
    for line in (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| `(\w+)` \| (.*?) \|", line)
        if m:
            rows[m.group(1)] = set(re.findall(r"`([\w/]+\.py)`", m.group(2)))
    src = ROOT / "src" / "cumatrix"
    missing = {pkg.name: sorted(have - rows.get(pkg.name, set()))
               for pkg in sorted(src.iterdir()) if (pkg / "__init__.py").is_file()
               if (have := {f.relative_to(pkg).as_posix() for f in pkg.rglob("*.py") if f.name != "__init__.py"})
               - rows.get(pkg.name, set())}
    assert not missing, f"modules docs/architecture.md does not name, by package: {missing}"


def import_circles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """The import circles among ``package``'s modules: each strongly connected set of more than one
    module (Tarjan's algorithm), every import counted, those inside functions and under
    TYPE_CHECKING too: each is an arrow a reader has to follow."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.find_modules_directly_imported_by(v)):
            if not w.startswith(package):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for module in sorted(m for m in graph.modules if m.startswith(package)):
        if module not in index:
            visit(module)
    return circles


def test_no_import_circle_in_src() -> None:
    """A module's imports lead only to modules that do not lead back: the layers contract holds
    between packages, this within them (a command's parser never imports its command, the
    history never imports the records that name a history diff)."""
    graph = grimp.build_graph("cumatrix", cache_dir=None)
    assert import_circles(graph, "cumatrix") == []


def test_the_circle_finder_finds_a_circle() -> None:
    graph = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=a, imported=b)
    assert import_circles(graph, "p") == [["p.a", "p.b", "p.c"]]

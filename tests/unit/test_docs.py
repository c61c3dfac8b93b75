"""The README and the documentation site: the README stays short, every relative link of the
README and of docs/*.md leads somewhere, the schema line the README shows names a file that
exists, the tutorial states the environment allowlist the code applies, and the site builds
with ``mkdocs build --strict`` (skipped where MkDocs is not installed, unless
``CUMATRIX_REQUIRE_DOCS=1``, which CI sets).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 200
PAGES = [README, *sorted(DOCS.glob("*.md"))]

_LINK_RE = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
_FENCE_RE = re.compile(r"^\s*(```|~~~)")


def gen_ref() -> ModuleType:
    """docs/gen_ref.py, the site's hook (it imports no MkDocs at module level)."""
    spec = importlib.util.spec_from_file_location("cumatrix_docs_gen_ref", DOCS / "gen_ref.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def relative_links(page: Path) -> list[tuple[int, str]]:
    """(line, url) of every relative link of ``page`` outside fenced code."""
    out, fenced = [], False
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE_RE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for m in _LINK_RE.finditer(line):
            url = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", url, re.IGNORECASE) or url.startswith("#"):
                continue
            out.append((n, url))
    return out


def test_readme_is_at_most_200_lines() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/ (at most {README_MAX_LINES})"


def test_the_pages_have_links() -> None:
    assert relative_links(README), "README.md links into docs/: none found, the link check would check nothing"


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    generated = {DOCS / p for p in gen_ref().GENERATED}
    broken = []
    for line, url in relative_links(page):
        path = url.split("#", 1)[0].split("?", 1)[0]
        if not path:
            continue
        if path.startswith("/"):
            broken.append(f"{page.relative_to(ROOT)}:{line}: {url}: an absolute link breaks on the site; make it relative")
            continue
        target = Path(os.path.normpath(page.parent / path))
        if not (target.exists() or target in generated):
            broken.append(f"{page.relative_to(ROOT)}:{line}: {url}: no such file ({target.relative_to(ROOT) if target.is_relative_to(ROOT) else target})")
    assert not broken, "\n".join(broken)


def _schema_lines(page: Path) -> list[tuple[int, str]]:
    return [(n, m.group(1)) for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
            if (m := re.search(r"#\s*yaml-language-server:\s*\$schema=(\S+)", line))]


@pytest.mark.parametrize("page", [README, DOCS / "matrix.md"], ids=["README.md", "docs/matrix.md"])
def test_the_schema_line_names_the_schema_in_the_checkout(page: Path) -> None:
    # The example is a matrix at the checkout's root: the path is read from there, and an
    # editable install keeps the schema in the checkout.
    found = _schema_lines(page)
    assert found, f"{page.name}: no `# yaml-language-server: $schema=` line"
    shipped = ROOT / "src" / "cumatrix" / "data" / "matrix.schema.json"
    for line, path in found:
        target = ROOT / path
        assert target.is_file(), f"{page.name}:{line}: $schema={path}: no such file in the checkout"
        assert target.resolve() == shipped.resolve(), f"{page.name}:{line}: $schema={path} is not the shipped schema"


def test_the_readme_command_prints_the_installed_schema() -> None:
    text = README.read_text(encoding="utf-8")
    m = re.search(r"^python -c (\"[^\n]*matrix\.schema\.json[^\n]*\")$", text, re.MULTILINE)
    assert m, "README.md: no `python -c` line that prints the schema's path"
    code = shlex.split(m.group(1))[0]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    printed = Path(out.stdout.strip())
    assert printed.is_file(), f"the README's command printed {printed}, which is not a file"
    import cumatrix

    assert json.loads(printed.read_text()) == json.loads(
        (Path(cumatrix.__file__).parent / "data" / "matrix.schema.json").read_text())


def test_the_tutorial_states_the_environment_allowlist_the_code_applies() -> None:
    from cumatrix.execute import sandbox

    tutorial = (DOCS / "tutorial.md").read_text(encoding="utf-8")
    said = set(re.findall(r"`([^`\s]+)`", tutorial))
    missing = [n for n in (*sandbox.ENV_ALLOW, *sandbox.ENV_ALLOW_PATTERNS) if n not in said]
    assert not missing, f"docs/tutorial.md does not name these variables a cell inherits: {missing}"
    secret_words = re.findall(r"[A-Z]+", sandbox._SECRET_RE.pattern)
    assert all(f"`{w}`" in tutorial for w in secret_words), \
        f"docs/tutorial.md does not list every word that keeps a variable out: {secret_words}"


def test_the_generated_cli_reference_has_every_command() -> None:
    ref = gen_ref()
    page = ref.cli_reference()
    commands = ref._subcommands(ref.cli_parser())
    assert {"run", "gate", "repro"} <= set(commands)
    for name, sub in commands.items():
        assert f"## cumatrix {name}\n" in page
        assert sub.format_usage().split()[1:3] == ["cumatrix", name]


def _mkdocs_missing() -> str | None:
    for mod in ("mkdocs", "material"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed (pip install -e '.[docs]')"
    return None


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    why = _mkdocs_missing()
    if why:
        if os.environ.get("CUMATRIX_REQUIRE_DOCS") == "1":
            pytest.fail(f"CUMATRIX_REQUIRE_DOCS=1 and {why}")
        pytest.skip(why)
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                          str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert out.returncode == 0, f"mkdocs build --strict failed:\n{out.stdout[-4000:]}\n{out.stderr[-8000:]}"
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert 'id="cumatrix-gate"' in cli
    assert "--min-driver" in cli
    matrix = (site / "reference" / "matrix" / "index.html").read_text(encoding="utf-8")
    schema = json.loads((ROOT / "src" / "cumatrix" / "data" / "matrix.schema.json").read_text())
    assert all(f"<code>{key}</code>" in matrix for key in schema["properties"])
    # A report a page links to is in the site, where the rewritten link points.
    assert (site / "repo" / "reports" / "gpu-h200" / "summary.md").is_file()

"""Every matrix example in the README and the docs is a matrix that `cumatrix validate` accepts.

The examples are read from README.md, reference/README.md and docs/*.md themselves, so an edit
that breaks one fails here with the line it starts on.  A ```yaml block is a matrix example when
it has a top-level `runtimes:` or `drivers:` key (the docs also show CI workflow files).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cumatrix.core.errors import ConfigError
from cumatrix.load import matrix

ROOT = Path(__file__).resolve().parents[2]
READMES = [ROOT / "README.md", ROOT / "reference" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK_RE = re.compile(r"^```ya?ml[ \t]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
_MATRIX_RE = re.compile(r"^(?:runtimes|drivers):", re.MULTILINE)


def yaml_examples() -> list[tuple[str, int, str]]:
    """(file name, line the block's first YAML line is on, text) of every matrix example."""
    out = []
    for readme in READMES:
        if not readme.is_file():
            continue
        text = readme.read_text(encoding="utf-8")
        for m in _BLOCK_RE.finditer(text):
            if not _MATRIX_RE.search(m.group(1)):
                continue
            out.append((readme.relative_to(ROOT).as_posix(), text.count("\n", 0, m.start(1)) + 1, m.group(1)))
    return out


def test_the_readme_and_the_docs_have_yaml_examples() -> None:
    names = {name for name, _, _ in yaml_examples()}
    assert {"README.md", "docs/tutorial.md", "docs/matrix.md"} <= names


@pytest.mark.parametrize(("readme", "line", "text"), yaml_examples(),
                         ids=[f"{name}:{line}" for name, line, _ in yaml_examples()])
def test_readme_yaml_example_validates(readme: str, line: int, text: str, tmp_path: Path) -> None:
    path = tmp_path / "example.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        m = matrix.load(path)
    except ConfigError as e:
        pytest.fail(f"{readme}:{line}: the YAML example does not validate:\n{e}")
    assert matrix.cells(m), f"{readme}:{line}: the example selects no cell"

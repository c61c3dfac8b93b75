"""docs/tutorial-runtimes.md is what scripts/tutorial-runtimes.py writes from a real run.

The script builds its extensions with gcc and runs them with ``cumatrix run``; here it writes
into a scratch file, and the committed page must show the same outcome for each section (the
leaked file itself depends on the host: its loader cache, or a stray ``LD_LIBRARY_PATH``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.network


def _outcomes(text: str) -> list[tuple[str, str, str]]:
    """(section title, outcome word, status) of each result block of the page."""
    out, title = [], ""
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:]
        m = re.match(r"^outcome\s+(\S+)\s+\(status: (\w+)\)$", line)
        if m:
            word = m.group(1).split(":", 1)[0] if m.group(1).startswith("runtime-leak:") else m.group(1)
            out.append((title, word, m.group(2)))
    return out


def test_the_page_is_what_a_run_shows(tmp_path: Path, wheel_cache: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed (apt-get install gcc)")
    fresh = tmp_path / "page.md"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "tutorial-runtimes.py"), "--out", str(fresh),
                           "--demo", str(tmp_path / "demo")], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    committed = (ROOT / "docs" / "tutorial-runtimes.md").read_text()
    got = _outcomes(fresh.read_text())
    assert [o[1:] for o in got] == [("skipped:runtime-not-used", "skip"), ("runtime-leak", "fail"), ("ok", "pass"),
                                    ("skipped:runtime-not-used", "skip")]
    assert _outcomes(committed) == got
    # The page speaks of its scratch directory and the wheels by name, not of the machine that wrote it.
    assert str(tmp_path) not in fresh.read_text()
    assert str(wheel_cache) not in fresh.read_text()

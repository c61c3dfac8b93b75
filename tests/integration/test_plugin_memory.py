"""The controller keeps no cell's record once it is stored: memory does not grow with the cells run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from cumatrix.front.cli import _plugin_args

pytestmark = pytest.mark.network  # the matrix's runtime comes from a real wheel (cached)

MATRIX = ("runtimes:\n  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}\ndrivers: [host]\nprobe: false\ncases:\n"
          + "".join(f"  - {{name: c{i}, argv: [\"true\"]}}\n" for i in range(5))
          + "  - {name: broken, argv: [sh, -c, \"exit 3\"]}\n")

#: Looks, after the run, at what pytest kept: every report (terminal reporter) and every item.
CONFTEST = '''
def pytest_sessionfinish(session):
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    calls = [r for reps in tr.stats.values() for r in reps if getattr(r, "when", None) == "call"]
    held = [r for r in calls if getattr(r, "cumatrix_record", None) != "stored"]
    items = [i for i in session.items if getattr(i, "record", None) is not None]
    tr.write_line(f"KEPT calls={len(calls)} records-on-reports={len(held)} records-on-items={len(items)}")
'''


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_no_record_kept_after_it_is_stored(pytester: pytest.Pytester, wheel_cache: Path,
                                           monkeypatch: pytest.MonkeyPatch, cli_env: Any, workers: list[str]) -> None:
    monkeypatch.setenv("PYTHONPATH", cli_env()["PYTHONPATH"])
    monkeypatch.delenv("CI", raising=False)
    (pytester.path / "matrix.yaml").write_text(MATRIX)
    (pytester.path / "conftest.py").write_text(CONFTEST)
    out = pytester.path / "out"
    res = pytester.runpytest_subprocess(str(pytester.path / "matrix.yaml"), *_plugin_args(), "-p", "no:cacheprovider",
                                        "--cumatrix-out", str(out), *workers, timeout=180)
    res.assert_outcomes(passed=5, failed=1)
    kept = re.findall(r"KEPT .*", res.stdout.str())
    assert kept == ["KEPT calls=6 records-on-reports=0 records-on-items=0"], res.stdout.str()
    # ... and every record reached the store, the failing one with what the failure said.
    cells = [r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines()) if r["type"] == "cell"]
    assert len(cells) == 6
    assert re.search(r"cu12\.9/host/broken: expected ok, observed exit:3", res.stdout.str())

"""`pytest matrix.yaml` through the plugin, in a real pytest subprocess (pytester)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from cumatrix.front.cli import _plugin_args
from helpers.results import read_records

pytestmark = pytest.mark.network  # the matrix's runtime comes from a real wheel (cached)

MATRIX = """
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
drivers: [host]
probe: false
cases:
  - {name: one, argv: [true]}
  - {name: two, argv: [true]}
  - {name: three, argv: [true]}
  - {name: broken, argv: [sh, -c, "echo the-stderr-line >&2; exit 4"]}
"""


@pytest.fixture
def run(pytester: pytest.Pytester, wheel_cache: Path, monkeypatch: pytest.MonkeyPatch, cli_env: Any):
    monkeypatch.setenv("PYTHONPATH", cli_env()["PYTHONPATH"])
    monkeypatch.delenv("CI", raising=False)
    m = pytester.path / "matrix.yaml"
    m.write_text(MATRIX)

    def go(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess(str(m), *_plugin_args(), "-p", "no:cacheprovider", *args, timeout=120)

    return go


def _records(out: Path) -> list[dict[str, Any]]:
    return [r for r in read_records(out) if r["type"] == "cell"]


def test_one_item_per_cell(run, pytester: pytest.Pytester) -> None:
    res = run("--collect-only", "-q")
    ids = [ln for ln in res.stdout.lines if ln.startswith("matrix.yaml::")]
    assert ids == [f"matrix.yaml::cu12.9/host/{n}" for n in ("one", "two", "three", "broken")]


def test_k_selects(run, pytester: pytest.Pytester) -> None:
    out = pytester.path / "out"
    res = run("-k", "one or three", "--cumatrix-out", str(out))
    res.assert_outcomes(passed=2, deselected=2)
    assert sorted(r["id"] for r in _records(out)) == ["cu12.9/host/one", "cu12.9/host/three"]


def test_xdist_every_record_once(run, pytester: pytest.Pytester) -> None:
    out = pytester.path / "out"
    res = run("-n", "2", "--cumatrix-out", str(out))
    res.assert_outcomes(passed=3, failed=1)
    ids = [r["id"] for r in _records(out)]
    assert sorted(ids) == sorted(f"cu12.9/host/{n}" for n in ("one", "two", "three", "broken"))
    assert len(ids) == len(set(ids))
    header = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert header["type"] == "run"
    assert header["cells_total"] == 4


def test_failure_text_and_junit(run, pytester: pytest.Pytester) -> None:
    junit = pytester.path / "junit.xml"
    res = run("-k", "broken or one", f"--junitxml={junit}")
    assert res.ret == 1
    text = res.stdout.str()
    assert "cu12.9/host/broken: expected ok, observed exit:4" in text
    assert "expected  ok" in text
    assert "observed  exit:4" in text
    assert "reason    a command passes when it exits 0" in text
    assert "----- child stderr (tail) -----" in text
    assert "the-stderr-line" in text
    assert "Traceback" not in text
    cases = {tc.get("name"): tc for tc in ET.parse(junit).getroot().iter("testcase")}
    props = {n: {p.get("name"): p.get("value") for p in tc.iter("property")} for n, tc in cases.items()}
    assert props["cu12.9/host/broken"]["outcome"] == "exit:4"
    assert props["cu12.9/host/one"] == {"outcome": "ok", "path": "n/a", "expected": "ok"}
    assert cases["cu12.9/host/broken"].find("failure") is not None


def test_matrix_error_is_a_collection_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                            cli_env: Any) -> None:
    monkeypatch.setenv("PYTHONPATH", cli_env()["PYTHONPATH"])
    m = pytester.path / "bad.yaml"
    m.write_text("runtimes: {}\ndrivers: [hots]\n")
    res = pytester.runpytest_subprocess(str(m), *_plugin_args(), "-p", "no:cacheprovider", timeout=60)
    assert res.ret == 2
    assert any("bad.yaml:2:11: drivers: unknown driver 'hots'" in ln for ln in res.stdout.lines), res.stdout.str()


def test_yaml_files_not_named_are_not_collected(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                cli_env: Any) -> None:
    monkeypatch.setenv("PYTHONPATH", cli_env()["PYTHONPATH"])
    (pytester.path / "fixture.yaml").write_text("not: a matrix\n")
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    res = pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider", timeout=60)
    res.assert_outcomes(passed=1)


def test_reports_default_to_out_and_skips_point_at_the_matrix(run, pytester: pytest.Pytester) -> None:
    skip = pytester.path / "skip.yaml"
    skip.write_text(MATRIX.replace("probe: false", "probe: true"))
    res = pytester.runpytest_subprocess(str(skip), *_plugin_args(), "-p", "no:cacheprovider", "-rs", timeout=120)
    # No GPU here: the probe is skipped, and the skip names the runtime's line of the matrix file.
    if "skipped:no-cuda-driver" in res.stdout.str():
        res.stdout.fnmatch_lines(["SKIPPED [[]1[]] skip.yaml:3: skipped:no-cuda-driver*"])
    assert (pytester.path / "out" / "results.jsonl").is_file()
    assert (pytester.path / "out" / "index.html").is_file()


def test_a_run_without_a_matrix_writes_no_reports(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_x():\n    pass\n")
    res = pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider", timeout=120)
    res.assert_outcomes(passed=1)
    assert not (pytester.path / "out").exists()

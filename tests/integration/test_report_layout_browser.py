"""index.html of a real ~300-cell run, in real headless Chromium at 1400 px: the cells that matter
(mismatches, predicted failures) are within the window and whole; what was only skipped is
folded; summary.md folds its all-skipped tables.

The run is real: three runtime wheels x the host driver and two emulated ones x 33 commands
(ok, exit:3, a gcc-built program with an undefined symbol, a predicted SIGSEGV) and the probe.
On a host without a GPU the emulated drivers' cells are all skipped:no-cuda-driver.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cumatrix.report import load_records
from helpers.browser import ARTIFACTS, Page, wait_ready
from helpers.build import undefined_symbol_program

pytestmark = [pytest.mark.browser, pytest.mark.network]

WIDTH = 1400


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, wheel_cache: Path) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not on PATH (the undefined-symbol program is built with it)")
    d = tmp_path_factory.mktemp("layout")
    prog, old = undefined_symbol_program(d, "shim_new_symbol_of_a_long_name")
    py = sys.executable
    cases = []
    for n in range(33):
        if n in (5, 21, 30):
            cases.append(f'  - {{name: exits-{n}, argv: [sh, -c, "exit 3"]}}')
        elif n in (12, 27):
            cases.append(f"  - {{name: loads-{n}, argv: [{prog}], env: {{LD_LIBRARY_PATH: {old}}}}}")
        elif n in (9, 31):
            cases.append(f'  - {{name: segv-{n}, argv: [{py}, -c, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]}}')
        else:
            cases.append(f"  - {{name: fine-{n}, argv: [true]}}")
    m = d / "m.yaml"
    m.write_text(
        "runtimes:\n"
        "  cu12.4: {wheel: nvidia-cuda-runtime-cu12==12.4.127}\n"
        "  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}\n"
        "  cu13.0: {wheel: nvidia-cuda-runtime==13.0.96}\n"
        "drivers: [host, emulated-12.4, emulated-12.8]\n"
        "cases:\n" + "\n".join(cases) + "\n"
        "expect:\n"
        '  - {case: segv-9, outcome: "crash:SIGSEGV", reason: "kills itself with SIGSEGV"}\n'
        '  - {case: segv-31, outcome: "crash:SIGSEGV", reason: "kills itself with SIGSEGV"}\n'
    )
    out = d / "out"
    proc = subprocess.run([sys.executable, "-m", "cumatrix", "run", str(m), "--out", str(out), "-q"],
                          capture_output=True, text=True, timeout=600, cwd=d, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the exit:3 and undefined-symbol cells mismatch
    return out


def test_summary_folds_all_skipped_tables(run_dir: Path) -> None:
    run = load_records(run_dir / "results.jsonl")
    assert 280 <= len(run.cells) <= 320
    text = (run_dir / "summary.md").read_text()
    skipped_grids = [ln for ln in text.splitlines() if ln.startswith("<details><summary>") and "all skipped" in ln]
    if run.header.host_fingerprint.get("driver_version") is None:
        assert len(skipped_grids) == 2, skipped_grids  # both emulated drivers: nothing ran under them
    assert "`ok`: ran and succeeded" in text  # the words explained
    assert "ok:n/a" not in text  # a command's ok reads as ok


def test_cells_that_matter_are_in_view_and_whole_at_1400px(browser: str, run_dir: Path) -> None:
    run = load_records(run_dir / "results.jsonl")
    matter = sorted(c.id for c in run.cells if c.category in ("fail", "expected"))
    assert len(matter) >= 3 * 7  # 3 runtimes x (3 exit + 2 undefined-symbol + 2 predicted crash) on the host driver
    page = Page(browser)
    try:
        page.call("Page.enable")
        page.call("Runtime.enable")
        page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=1000, deviceScaleFactor=1, mobile=False)
        page.call("Page.navigate", url=(run_dir / "index.html").as_uri())
        page.wait_event("Page.loadEventFired")
        wait_ready(page)
        # Scroll the page through once so every grid in it is drawn as a reader would see it.
        page.js("(async () => { for (let y = 0; y < document.documentElement.scrollHeight; y += 500) {"
                " window.scrollTo(0, y); await new Promise(r => requestAnimationFrame(() => r())); } })()")
        found = page.js(
            "JSON.stringify([...document.querySelectorAll('button.cell.c-fail, button.cell.c-expected')].map(b => {"
            " const r = b.getBoundingClientRect(), l = b.querySelector('.l'), s = b.closest('.scroll').getBoundingClientRect();"
            " return {id: b.dataset.id, left: r.left, right: r.right, boxLeft: s.left, boxRight: s.right,"
            " top: r.top + scrollY, bottom: r.bottom + scrollY, boxTop: s.top + scrollY, boxBottom: s.bottom + scrollY,"
            " cut: l.scrollWidth > l.clientWidth + 1, text: l.textContent}; }))")
        cells = json.loads(found)
        assert sorted(c["id"] for c in cells) == matter  # every one drawn: none folded away
        for c in cells:
            # within the window's width
            assert c["left"] >= 0, c
            assert c["right"] <= WIDTH, c
            # not scrolled out of its grid
            assert c["boxLeft"] - 1 <= c["left"], c
            assert c["right"] <= c["boxRight"] + 1, c
            # nor cut off below
            assert c["boxTop"] - 1 <= c["top"], c
            assert c["bottom"] <= c["boxBottom"] + 1, c
            assert not c["cut"], c  # the whole label shows
        assert any(c["text"] == "undefined-symbol:shim_new_symbol_of_a_long_name" for c in cells)
        page.js("window.scrollTo(0, 0)")  # the page as it opens, folded grids and all
        ARTIFACTS.mkdir(exist_ok=True)
        shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": WIDTH,
                               "height": min(4000, page.js("document.documentElement.scrollHeight")), "scale": 1})
        (ARTIFACTS / "report-layout-1400.png").write_bytes(base64.b64decode(shot["data"]))
        # The grids where every cell skipped are folded, and open on request.
        folded = page.js("document.querySelectorAll('.grid-block.folded').length")
        if run.header.host_fingerprint.get("driver_version") is None:
            assert folded == 2
            assert page.js("document.querySelector('.grid-block.folded .scroll').offsetHeight") == 0
            page.click(".grid-block.folded [data-unfold]")
            assert page.js("document.querySelectorAll('.grid-block.folded').length") == 1
            assert page.js("[...document.querySelectorAll('.grid-block')].some(g => !g.classList.contains('folded')"
                           " && g.querySelector('button.cell.c-skip') && !g.querySelector('button.cell.c-ok'))")
            # The host grid's probe line (skipped on every runtime) is folded, with a button to show it.
            assert "where every cell skipped folded" in page.js("document.querySelector('.lines-note').textContent")
            # A filter that asks for skipped cells shows them, folded or not.
            page.js("(() => { const s = document.getElementById('f-cat'); s.value = 'skip';"
                    " s.dispatchEvent(new Event('change')); })()")
            shown = page.js("[...document.querySelectorAll('button.cell.c-skip')]"
                            ".filter(b => b.checkVisibility({visibilityProperty: true})).length")
            assert shown == run.counts.skipped, (shown, run.counts.skipped)
        errors = [ev for ev in page.events if ev.get("method") == "Runtime.exceptionThrown"]
        assert not errors, errors
    finally:
        page.close()

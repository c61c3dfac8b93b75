"""index.html in real headless Chromium, driven over the DevTools protocol.

Loads the page from a file:// URL, checks the grid, a filter, the details panel, that no
network request is made, that hostile stderr stays text, and saves a screenshot under
``test-artifacts/``.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import pytest

from cumatrix.report import load_records, write_all
from helpers import sample_run
from helpers.browser import ARTIFACTS, Page, wait_ready

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
COMPILER_OUTPUT = (
    "header_dispatch.c:41:9: error: too many arguments to function 'cuMemcpyBatchAsync_v2'\n"
    "   41 |         cuMemcpyBatchAsync(dst, src, sizes, n, attrs, idx, na, &fail, s);\n"
    "      |         ^~~~~~~~~~~~~~~~~~\n"
)
def test_index_html_in_chromium(browser: str, tmp_path: Path) -> None:
    records = sample_run.sample_records()
    for rec in records:  # compiler output as a cell's detail: several lines, spaces that matter
        if rec.get("id") == "cu13.0/host/header-dispatch/h12.8/kv-16k-d2h":
            rec["observed"] = dict(rec["observed"], detail=COMPILER_OUTPUT)
    jsonl = sample_run.write_jsonl(tmp_path / "results.jsonl", records)
    run = load_records(jsonl)
    write_all(run, tmp_path)
    index = tmp_path / "index.html"
    n_cells = len(run.cells) + len(run.not_run)

    page = Page(browser)
    try:
        page.call("Network.enable")
        page.call("Page.enable")
        page.call("Runtime.enable")
        page.call("Log.enable")
        page.call("Emulation.setDeviceMetricsOverride", width=1440, height=1000, deviceScaleFactor=1, mobile=False)
        page.call("Page.navigate", url=index.as_uri())
        page.wait_event("Page.loadEventFired")
        wait_ready(page)

        # Grids are drawn as they scroll into view; printing (or this event) draws them all.
        assert page.js("document.getElementById('shown').textContent") == f"{n_cells} of {n_cells} cells shown"
        assert page.js("document.querySelector('.verdict').textContent") == "FAIL"
        page.js("window.dispatchEvent(new Event('beforeprint'))")
        assert page.js("document.querySelectorAll('button.cell').length") == n_cells

        # A filter hides cells: only mismatches.
        page.js("(() => { const s = document.getElementById('f-cat'); s.value = 'fail'; s.dispatchEvent(new Event('change')); })()")
        visible = page.js("[...document.querySelectorAll('button.cell')].filter(b => b.checkVisibility({visibilityProperty: true})).length")
        assert visible == run.counts.failed == 2
        assert page.js("document.getElementById('shown').textContent") == f"2 of {n_cells} cells shown"
        # A driver filter on top of reset.
        page.click("#f-reset")
        page.js("(() => { const s = document.getElementById('f-driver'); s.value = 'emulated-12.4'; s.dispatchEvent(new Event('change')); })()")
        visible = page.js("[...document.querySelectorAll('button.cell')].filter(b => b.checkVisibility({visibilityProperty: true})).length")
        assert 0 < visible < n_cells
        page.click("#f-reset")

        # Full cell text: no label is cut (the longest outcome word included).
        cut = page.js("[...document.querySelectorAll('button.cell .l')].filter(l => l.scrollWidth > l.clientWidth + 1).map(l => l.textContent)")
        assert cut == []
        assert page.js("[...document.querySelectorAll('button.cell .l')].some(l => l.textContent === 'undefined-symbol:cuMemcpyBatchAsync')")
        # Neutral outcomes draw no alarm: only grids holding a mismatch are marked for attention.
        marked = page.js("[...document.querySelectorAll('.grid-block')].filter(g => getComputedStyle(g).borderLeftColor === 'rgb(180, 35, 24)').map(g => g.querySelector('h3').textContent)")
        assert marked, marked
        assert all("✗" in title for title in marked), marked
        skip_only = page.js("[...document.querySelectorAll('.grid-block')].filter(g => g.querySelector('.n.c-skip') && !g.querySelector('.n.c-fail')).length")
        assert skip_only > 0

        # Clicking the hostile cell opens its details, with the stderr as text.
        bad_id = "cu13.0/host/header-dispatch/h12.8/kv-16k-d2h"
        page.click(f'button.cell[data-id="{bad_id}"]')
        assert page.js("document.getElementById('panel').hidden") is False
        panel = page.js("document.getElementById('detail').innerText")
        assert bad_id in panel
        assert "9-param call into a 13.x runtime" in panel  # the mismatch reason
        assert "predicted by rule abi-header-version" in panel  # the prediction's reason
        stderr = page.js("document.querySelector('#detail pre.stderr').textContent")
        assert "<script>window.__pwned = 1</script>" in stderr
        assert "\x1b" not in stderr
        assert "[31m" not in stderr
        assert page.js("document.querySelectorAll('#detail script, #detail img').length") == 0
        assert page.js("typeof window.__pwned") == "undefined"
        # Fingerprint table made it into the panel.
        assert "580.159.04" in panel
        detail = "[...document.querySelectorAll('#detail pre.val')].find(p => p.textContent.includes('too many'))"
        assert page.js(f"{detail}.textContent") == COMPILER_OUTPUT
        assert "mono" in page.js(f"getComputedStyle({detail}).fontFamily").lower()
        assert page.js(f"getComputedStyle({detail}).whiteSpace") == "pre"  # columns kept: the caret stays under the error
        ARTIFACTS.mkdir(exist_ok=True)
        shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=False)
        (ARTIFACTS / "report-index-compiler-output.png").write_bytes(base64.b64decode(shot["data"]))

        # Logs keep their lines, in a monospace font; so does the mismatch in the attention list.
        probe = "cu12.4/host/probe"
        page.click('#attention button[data-idx]')
        page.click(f'button.cell[data-id="{probe}"]')
        pre = "document.querySelector('#detail pre.stderr')"
        assert page.js(f"{pre}.textContent") == "waiting for device...\n" * 3
        assert page.js(f"getComputedStyle({pre}).whiteSpace") == "pre-wrap"
        assert "mono" in page.js(f"getComputedStyle({pre}).fontFamily").lower()
        assert "mono" in page.js("getComputedStyle(document.querySelector('#attention pre.why')).fontFamily").lower()

        # Screenshots for people to look at: the top with the panel open, the whole page, and
        # a narrow window scrolled sideways (the runtime column stays in view).
        ARTIFACTS.mkdir(exist_ok=True)
        page.js("window.scrollTo(0, 0)")
        shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=False)
        (ARTIFACTS / "report-index.png").write_bytes(base64.b64decode(shot["data"]))
        page.click("#close")
        full = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": 1440,
                               "height": page.js("document.documentElement.scrollHeight"), "scale": 1})  # fmt: skip
        (ARTIFACTS / "report-index-full.png").write_bytes(base64.b64decode(full["data"]))
        page.call("Emulation.setDeviceMetricsOverride", width=640, height=900, deviceScaleFactor=1, mobile=False)
        sticky = page.js(
            "(() => { const b = [...document.querySelectorAll('.grid-block')].find(g => { const s = g.querySelector('.scroll');"
            " return s.scrollWidth > s.clientWidth; }); const s = b.querySelector('.scroll'); b.scrollIntoView();"
            " s.scrollLeft = 400; const th = b.querySelector('tbody th');"
            " return [s.scrollLeft, th.getBoundingClientRect().left - s.getBoundingClientRect().left]; })()"
        )
        assert sticky[0] > 0, sticky  # scrolled,
        assert abs(sticky[1]) < 2, sticky  # yet the row header did not move
        narrow = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=False)
        (ARTIFACTS / "report-index-narrow.png").write_bytes(base64.b64decode(narrow["data"]))

        # Nothing but the page itself was requested; no script error, no CSP violation.
        page.js("0")  # drain pending events
        urls = [ev["params"]["request"]["url"] for ev in page.events if ev.get("method") == "Network.requestWillBeSent"]
        assert urls == [index.as_uri()], urls
        errors = [ev for ev in page.events if ev.get("method") == "Runtime.exceptionThrown"]
        assert not errors, errors
        logs = [ev["params"]["entry"] for ev in page.events if ev.get("method") == "Log.entryAdded"]
        assert not [e for e in logs if e.get("level") == "error"], logs
    finally:
        page.close()


def test_empty_run_page_in_chromium(browser: str, tmp_path: Path) -> None:
    header = dict(sample_run.sample_records()[0], cells=[], cells_total=0)
    jsonl = sample_run.write_jsonl(tmp_path / "results.jsonl", [header])
    write_all(load_records(jsonl), tmp_path)
    page = Page(browser)
    try:
        page.call("Page.enable")
        page.call("Page.navigate", url=(tmp_path / "index.html").as_uri())
        page.wait_event("Page.loadEventFired")
        wait_ready(page)
        assert page.js("document.querySelectorAll('button.cell').length") == 0
        assert "no cells" in page.js("document.querySelector('.empty-run').textContent")
        assert page.js("document.getElementById('shown').textContent") == "0 of 0 cells shown"
    finally:
        page.close()


def _many_cells(copies: int) -> list[dict[str, Any]]:
    """The sample's swap cells repeated over ``copies`` workloads (a larger nightly's shape)."""
    recs = sample_run.sample_records(nasty_stderr=False)
    header, cells, end = recs[0], [r for r in recs if r["type"] == "cell"], recs[-1]
    out = []
    for k in range(copies):
        for c in cells:
            if c["axes"].get("kind") != "swap":
                continue
            axes = dict(c["axes"], workload=f"{c['axes']['workload']}-{k}")
            out.append(dict(c, id=c["id"] + f"-{k}", axes=axes))
    return [dict(header, cells=[c["id"] for c in out], cells_total=len(out)), *out, end]


def test_large_page_draws_grids_as_they_scroll_into_view(browser: str, tmp_path: Path) -> None:
    jsonl = sample_run.write_jsonl(tmp_path / "results.jsonl", _many_cells(20))
    run = load_records(jsonl)
    write_all(run, tmp_path)
    n = len(run.cells)
    assert n > 2000
    assert (tmp_path / "index.html").stat().st_size < 1024 * n  # one file, under 1 KB a cell
    page = Page(browser)
    try:
        page.call("Page.enable")
        page.call("Emulation.setDeviceMetricsOverride", width=1440, height=1000, deviceScaleFactor=1, mobile=False)
        page.call("Page.navigate", url=(tmp_path / "index.html").as_uri())
        page.wait_event("Page.loadEventFired")
        wait_ready(page)
        assert page.js("document.getElementById('shown').textContent") == f"{n} of {n} cells shown"
        deadline = time.monotonic() + 10
        while (first := page.js("document.querySelectorAll('button.cell').length")) == 0:
            assert time.monotonic() < deadline, "no grid near the viewport was drawn"
            time.sleep(0.1)  # the observer fires after load; on a busy machine a little later
        assert 0 < first < n / 4  # only the grids near the viewport
        last = "document.querySelector('.grid-block:last-of-type .scroll table')"
        assert page.js(f"{last} === null")
        page.js("document.querySelector('.grid-block:last-of-type').scrollIntoView()")
        deadline = time.monotonic() + 10
        while page.js(f"{last} === null"):
            assert time.monotonic() < deadline, "the last grid was never drawn"
            time.sleep(0.05)
        # A filter counts every cell, drawn or not.
        page.js("(() => { const s = document.getElementById('f-cat'); s.value = 'fail'; s.dispatchEvent(new Event('change')); })()")
        assert page.js("document.getElementById('shown').textContent") == f"{run.counts.failed} of {n} cells shown"
    finally:
        page.close()

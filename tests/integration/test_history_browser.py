"""index.html's "since the last run" section and its GB/s trend plots in real headless
Chromium: drawn, and nothing fetched, no script error, no policy violation."""

from __future__ import annotations

import base64
from dataclasses import replace
from pathlib import Path

import pytest

from cumatrix.report import write_all
from cumatrix.results.history import History
from cumatrix.results.historydiff import diff, resolve
from helpers.browser import ARTIFACTS, Page, wait_ready
from history_nights import State, night_run

pytestmark = pytest.mark.browser

SWAPS = [f"cu12.9/host/loop/h12.9/w{i}" for i in range(3)]


def _night(k: int) -> dict[str, State]:
    states = {"cu12.9/host/c0": State("fail", outcome="crash:SIGSEGV") if k == 5 else State("pass")}
    for i, s in enumerate(SWAPS):
        g = 100.0 * (i + 1) * (0.6 if (i == 1 and k == 5) else 1 + 0.004 * (k % 3))
        states[s] = State("pass", path="batch", gbps=g, speedup=g / 50)
    return states


def test_since_section_and_trend_plots_in_chromium(browser: str, tmp_path: Path) -> None:
    with History.open(tmp_path / "h.sqlite") as h:
        for k in range(6):
            run = night_run(tmp_path, k, _night(k))
            h.append(run, kind="run", commit=None)
        d = diff(h, *resolve(h, None, None), trends=True)
    out = tmp_path / "out"
    write_all(replace(run, since=d), out)
    index = out / "index.html"
    page = Page(browser)
    try:
        for domain in ("Network", "Page", "Runtime", "Log"):
            page.call(f"{domain}.enable")
        page.call("Emulation.setDeviceMetricsOverride", width=1200, height=900, deviceScaleFactor=1, mobile=False)
        page.call("Page.navigate", url=index.as_uri())
        page.wait_event("Page.loadEventFired")
        wait_ready(page)
        assert page.js("document.querySelector('#since h2').textContent") == "Since the last run"
        assert "cu12.9/host/c0" in page.js("document.querySelector('#since ul.changes').textContent")
        sizes = page.js("[...document.querySelectorAll('#since svg.spark')].map(s => {"
                        " const r = s.getBoundingClientRect();"
                        " return [r.width, r.height, s.querySelectorAll('polyline').length,"
                        " s.querySelector('polyline').getAttribute('points').split(' ').length]; })")
        assert sizes == [[160, 36, 1, 6]] * len(SWAPS)
        # the cell whose speed moved is drawn first, in the attention colour
        first = page.js("(() => { const f = document.querySelector('#since figure.trend');"
                        " return [f.classList.contains('moved'), f.textContent, getComputedStyle(f).color]; })()")
        assert first[0], first
        assert SWAPS[1] in first[1], first
        assert first[2] == "rgb(176, 0, 32)", first
        page.js("document.getElementById('since').scrollIntoView()")
        shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=False)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "report-since-last-run.png").write_bytes(base64.b64decode(shot["data"]))
        page.js("0")
        urls = [ev["params"]["request"]["url"] for ev in page.events if ev.get("method") == "Network.requestWillBeSent"]
        assert urls == [index.as_uri()], urls
        assert not [ev for ev in page.events if ev.get("method") == "Runtime.exceptionThrown"]
        logs = [ev["params"]["entry"] for ev in page.events if ev.get("method") == "Log.entryAdded"]
        assert not [e for e in logs if e.get("level") == "error"], logs
    finally:
        page.close()

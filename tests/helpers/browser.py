"""Real headless Chromium for the report tests, driven over the DevTools protocol: the
``browser`` fixture (a page target's WebSocket URL) and :class:`Page`, a minimal client."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--window-size=1440,1000",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def wait_ready(page: Page, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while page.js("document.body && document.body.getAttribute('data-ready')") != "1":
        assert time.monotonic() < deadline, "the page's script never finished"
        time.sleep(0.05)


class Page:
    """A minimal DevTools protocol client for one page target."""

    def __init__(self, ws_url: str) -> None:
        import websocket  # websocket-client, from the `test` extra

        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        my_id = self.next_id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg.get("result", {})
                return result
            self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            self.events.append(msg)
            if msg.get("method") == method:
                return msg
        raise AssertionError(f"no {method} within {timeout} s")

    def js(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise AssertionError(f"JS error in {expression!r}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click at the element's centre."""
        box = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center'}});"
            " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        assert box, f"nothing matches {selector}"
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def close(self) -> None:
        self.ws.close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[str]:
    exe = chromium()
    if exe is None:
        if os.environ.get("CUMATRIX_REQUIRE_BROWSER") == "1":
            pytest.fail("CUMATRIX_REQUIRE_BROWSER=1 but no chromium on PATH (apt-get install chromium)")
        pytest.skip("no headless Chromium on PATH (apt-get install chromium); set CUMATRIX_REQUIRE_BROWSER=1 to require it")
    profile = Path(tempfile.mkdtemp(prefix="cumatrix-chromium-"))
    proc = subprocess.Popen(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.is_file() or not port_file.read_text().strip():
            if proc.poll() is not None:
                pytest.fail(f"chromium exited with {proc.returncode} before opening its DevTools port")
            if time.monotonic() > deadline:
                pytest.fail("chromium did not open its DevTools port within 30 s")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            targets = json.load(resp)
        page = next(t for t in targets if t.get("type") == "page")
        yield page["webSocketDebuggerUrl"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)

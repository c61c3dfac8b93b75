"""Reports at scale: `cumatrix report` time and memory, index.html size, and opening it in Chromium.

For each size (default 1,000 and 10,000 cells) one run:
  (a) writes a results.jsonl shaped like a nightly matrix (swap cells over runtimes x drivers
      x variants x headers x workloads, with fingerprints, timings, a few failures with
      stderr, skips), generated here: the figures are about the reports, not the cells;
  (b) runs `python -m cumatrix report DIR` in a child process: wall time and peak RSS;
  (c) reports index.html's size per cell;
  (d) opens index.html in headless Chromium over the DevTools protocol (a fresh tab per size):
      time from navigation to the page's script being done (`cumatrix-ready` mark), to the
      load event, and to the details panel of one cell after a click.

Then prints the ratios from 1k to 10k (linear: time and size per cell stay flat).

Usage: python benchmarks/report_scale.py [--sizes 1000 10000] [--keep DIR]
Needs chromium on PATH and websocket-client (the `test` extra) for (d); skipped otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

RUNTIMES = [f"cu{v}" for v in ("12.0", "12.4", "12.8", "12.9", "13.0", "13.5", "13.6", "13.7")]
DRIVERS = ["host", "emulated-12.4", "emulated-12.8", "emulated-13.0"]
VARIANTS = ["proc-address", "runtime-dispatch", "driver-dispatch", "header-dispatch", "loop", "direct-link"]
BUILDS = ["12.8", "13.0"]


def _cell(n: int, cid: str, axes: dict[str, str]) -> dict[str, Any]:
    kind = n % 23
    status, outcome, path, stderr, mismatch = "pass", "ok", "batch", "", None
    timings: dict[str, Any] = {"wall_s": 0.8}
    if axes["driver"] != "host" and kind < 8:
        status, outcome, path = "skip", "cannot-emulate", None
    elif kind == 9:
        status, outcome, path = "skip", "skipped:no-cuda-driver", None
    elif kind == 11:
        status, outcome, path = "pass", "crash:SIGSEGV", None
        stderr = "cumatrix-case: calling cudaMemcpyBatchAsync (v13 ABI)\nSegmentation fault (core dumped)\n"
    elif n % 997 == 0:
        status, outcome, path = "fail", "cuda-error:400", None
        mismatch = "observed cuda-error:400, expected ok:batch (9-param call into a 13.x runtime)"
        stderr = "kvswap: cudaMemcpyBatchAsync failed: invalid resource handle\n" * 4
    else:
        g = 10 + n % 40
        timings = {"wall_s": 0.8, "gbps": g, "loop_gbps": 7.5, "speedup": round(g / 7.5, 2), "repetitions": 20,
                   "bytes": 16 << 20, "spread": {"min": g - 1, "p10": g - 0.5, "p90": g + 0.5, "max": g + 1}}
    rt = axes["runtime"]
    return {
        "schema": 1, "type": "cell", "id": cid, "axes": axes, "host": None,
        "expected": {"outcomes": ["ok:batch"] if status != "pass" or outcome == "ok" else [outcome],
                     "reason": f"predicted by rule abi-header-version: {rt} with headers {axes['build']}",
                     "rule": "abi-header-version"},
        "observed": {"outcome": outcome, "path": path, "error_name": None, "detail": "", "exit_status": 0},
        "status": status, "mismatch": mismatch, "timings": timings,
        "fingerprint": {"backend": "local", "driver_version": 13000, "driver_string": "580.159.04",
                        "gpu_name": "NVIDIA H200", "runtime_version": rt,
                        "runtime_file": f"site-packages/nvidia/cuda_runtime/lib/libcudart.so.{rt[2:4]}",
                        "libcuda_file": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"},
        "stderr_tail": stderr, "stdout_tail": "", "started": "2026-12-02T13:00:05Z", "duration_s": 0.8,
    }


def write_run(d: Path, n_cells: int) -> Path:
    """A results.jsonl of ``n_cells`` swap cells."""
    records: list[dict[str, Any]] = []
    n = 0
    workload = 0
    while n < n_cells:
        wl = f"kv-{4 << (workload % 6)}k-{('d2h', 'h2d', 'd2d')[workload % 3]}-{workload}"
        for driver in DRIVERS:
            for rt in RUNTIMES:
                for variant in VARIANTS:
                    for build in BUILDS:
                        if n >= n_cells:
                            break
                        axes = {"runtime": rt, "driver": driver, "kind": "swap", "variant": variant,
                                "family": "runtime", "build": build, "workload": wl}
                        records.append(_cell(n, f"{rt}/{driver}/{variant}/h{build}/{wl}", axes))
                        n += 1
        workload += 1
    header = {"schema": 1, "type": "run", "run_id": "bench", "matrix": "matrix.yaml", "matrix_sha256": "a" * 64,
              "started": "2026-12-02T13:00:00Z", "harness_version": "bench", "argv": ["cumatrix", "run"],
              "backend": "local", "host": None, "host_fingerprint": {"hostname": "bench"},
              "cells_total": n_cells, "cells": [r["id"] for r in records]}
    end = {"schema": 1, "type": "end", "finished": "2026-12-02T14:00:00Z", "interrupted": False}
    d.mkdir(parents=True, exist_ok=True)
    p = d / "results.jsonl"
    with p.open("w") as f:
        for r in [header, *records, end]:
            f.write(json.dumps(r) + "\n")
    return p


def time_report(d: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of `python -m cumatrix report DIR` in a child."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "cumatrix", "report", str(d)], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"cumatrix report {d} exited {proc.returncode}")
    return wall, usage.ru_maxrss / 1024


class Browser:
    """Headless Chromium with one DevTools page; enough protocol for load timings."""

    def __init__(self) -> None:
        exe = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
        if exe is None:
            raise RuntimeError("no chromium on PATH")
        import websocket

        self.profile = Path(tempfile.mkdtemp(prefix="report-scale-chromium-"))
        self.proc = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                      "--disable-background-networking", "--disable-extensions",
                                      "--window-size=1440,1000", "--remote-debugging-port=0",
                                      "--remote-allow-origins=*", f"--user-data-dir={self.profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.is_file() and port_file.read_text().strip()):
            if time.monotonic() > deadline:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            page = next(t for t in json.load(resp) if t.get("type") == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        my_id = self.next_id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my_id:
                result: dict[str, Any] = msg.get("result", {})
                return result

    def js(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return res.get("result", {}).get("value")

    def open(self, index: Path) -> dict[str, float]:
        """Milliseconds from navigation to: the script done, the load event, a cell's details shown."""
        self.call("Page.navigate", url="about:blank")
        self.call("Page.navigate", url=index.as_uri())
        deadline = time.monotonic() + 60
        while self.js("document.readyState === 'complete' && document.body.getAttribute('data-ready')") != "1":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{index} did not finish loading in 60 s")
            time.sleep(0.02)
        ready = self.js("performance.getEntriesByName('cumatrix-ready')[0].startTime")
        load = self.js("performance.getEntriesByType('navigation')[0].loadEventEnd")
        click = self.js("(() => { const t0 = performance.now(); document.querySelector('button.cell').click();"
                        " return document.getElementById('panel').hidden ? -1 : performance.now() - t0; })()")
        return {"ready_ms": float(ready), "load_ms": float(load), "details_ms": float(click)}

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", type=int, default=[1000, 10000])
    ap.add_argument("--keep", type=Path, help="write the runs here (default: a temporary directory, removed)")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="report-scale-"))
    try:
        browser: Browser | None = Browser()
    except Exception as e:  # no chromium or no websocket-client: report the rest
        print(f"browser: skipped ({e})")
        browser = None
    rows = []
    try:
        for n in args.sizes:
            d = root / f"cells-{n}"
            write_run(d, n)
            wall, rss = time_report(d)
            size = (d / "index.html").stat().st_size
            row: dict[str, float] = {"cells": n, "report_s": wall, "report_rss_mib": rss, "html_bytes": size}
            if browser is not None:
                row.update(browser.open(d / "index.html"))
            rows.append(row)
            line = (f"{n:>6} cells: cumatrix report {wall:6.2f} s ({wall / n * 1e3:.3f} ms/cell), peak RSS {rss:5.0f} MiB;"
                    f" index.html {size / 2**20:5.2f} MiB ({size / n:.0f} B/cell)")
            if browser is not None:
                line += (f"; Chromium: script done {row['ready_ms']:.0f} ms, load {row['load_ms']:.0f} ms,"
                         f" details {row['details_ms']:.0f} ms")
            print(line, flush=True)
    finally:
        if browser is not None:
            browser.close()
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        k = b["cells"] / a["cells"]
        print(f"{int(a['cells'])} -> {int(b['cells'])} cells ({k:.0f}x): report time x{b['report_s'] / a['report_s']:.2f}, "
              f"per-cell time x{(b['report_s'] / b['cells']) / (a['report_s'] / a['cells']):.2f}, "
              f"html bytes per cell x{(b['html_bytes'] / b['cells']) / (a['html_bytes'] / a['cells']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

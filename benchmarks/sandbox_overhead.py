"""Per-cell cost of the bubblewrap sandbox: the same cell through ``isolate.run_local`` without
and with it, interleaved (off, on, off, ...) so that drift in the machine's load hits both alike.

Cells: ``true`` (the smallest: the worst case in relative terms), ``python3 -c pass`` and
``python3 -c 'import json, ctypes'``.  Prints the medians, the difference and the ratio, and
a JSON line with the same figures.

Usage: python benchmarks/sandbox_overhead.py [-N 40] [--only NAME]
       python benchmarks/sandbox_overhead.py -N 1000 --only 'python3 -c pass'   # the issue's figure

``-N``: cells of each kind each way (1,000 gives 1,000 sandboxed and 1,000 unsandboxed cells,
interleaved, in one run).  The machine's load changes both alike; it still shows in the
spread, so the JSON line also gives the 10th and 90th percentiles.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from cumatrix.core.jobs import Job
from cumatrix.execute import sandbox
from cumatrix.execute.local import run_local

CELLS = {
    "true": ("true",),
    "python3 -c pass": (sys.executable, "-c", "pass"),
    "python3 import json, ctypes": (sys.executable, "-c", "import json, ctypes"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-N", type=int, default=40, help="cells each way per kind")
    ap.add_argument("--only", choices=sorted(CELLS), help="one kind of cell")
    args = ap.parse_args()
    path, why = sandbox.bubblewrap()
    if path is None:
        sys.exit(f"no sandbox here: {why}")
    off, on = sandbox.Policy(sandbox="off"), sandbox.Policy(sandbox="on")
    rows = {}
    for name, argv in CELLS.items():
        if args.only and name != args.only:
            continue
        job = Job(cell_id="bench", kind="command", argv=argv, timeout=60)
        times: dict[str, list[float]] = {"off": [], "on": []}
        for i in range(args.N + 2):
            for mode, pol in (("off", off), ("on", on)):
                t0 = time.perf_counter()
                res = run_local(job, policy=pol)
                dt = time.perf_counter() - t0
                if res.returncode != 0:
                    sys.exit(f"{name} ({mode}) failed: {res.stderr_tail}")
                if i >= 2:  # the first two warm caches up
                    times[mode].append(dt)
        a, b = statistics.median(times["off"]), statistics.median(times["on"])
        q_off, q_on = (statistics.quantiles(times[k], n=10) for k in ("off", "on"))
        rows[name] = {"off_ms": round(a * 1e3, 2), "on_ms": round(b * 1e3, 2),
                      "extra_ms": round((b - a) * 1e3, 2), "ratio": round(b / a, 3),
                      "off_p10_p90_ms": [round(q_off[0] * 1e3, 2), round(q_off[-1] * 1e3, 2)],
                      "on_p10_p90_ms": [round(q_on[0] * 1e3, 2), round(q_on[-1] * 1e3, 2)],
                      "total_s": round(sum(times["off"]) + sum(times["on"]), 1)}
        print(f"{name:32s} off {a * 1e3:7.2f} ms  on {b * 1e3:7.2f} ms  +{(b - a) * 1e3:6.2f} ms  x{b / a:.2f}")
    print(json.dumps({"N": args.N, "bwrap": path, "cells": rows}))


if __name__ == "__main__":
    main()

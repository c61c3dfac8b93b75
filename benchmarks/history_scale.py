"""The history at scale: a year of nightlies of a 10,000-cell matrix in one history file.

Goals: the file at most 500 MB after 365 runs, ``cumatrix diff`` (the real command, a new
process, the two newest runs and the noise and flips of the last 10) under 1 s, and
appending one run under 2 s.

The runs are built from the cell records of a real run (``reports/gpu-h200/results.jsonl``
by default: swap cells with GB/s and speedups, and probes), repeated under new ids up to
``--cells`` cells.  Every night each swap cell's GB/s and speedup wander by a seeded
few percent; a few cells change outcome each night (some for good, some flipping back), and
a few fail for days at a stretch, so the history keeps full records where a nightly would.
Each run is appended through :meth:`cumatrix.results.history.History.append`, as ``cumatrix run``
appends it; the figures are measured in this run and printed (``--json FILE`` also writes
them)::

    python benchmarks/history_scale.py [--runs 365] [--cells 10000] [--db FILE] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import cumatrix
from cumatrix.results.history import History
from cumatrix.results.historydiff import diff, resolve
from cumatrix.core.model import Observed
from cumatrix.core.record import CellRecord
from cumatrix.report import load_records
from cumatrix.results.records import RunData, RunInfo

REPO = Path(__file__).resolve().parents[1]
GOALS = {"db_mb": 500.0, "diff_s": 1.0, "append_s": 2.0}


def templates(source: Path) -> list[CellRecord]:
    run = load_records(source)
    if not run.cells:
        raise SystemExit(f"{source}: no cell records to build runs from")
    return list(run.cells)


def matrix_cells(base: list[CellRecord], n: int) -> list[CellRecord]:
    """``n`` cells: the real records repeated, each copy under an id of its own."""
    out = []
    for i in range(n):
        t = base[i % len(base)]
        out.append(replace(t, id=f"{t.id}/r{i // len(base)}"))
    return out


def night(cells: list[CellRecord], k: int, rng: random.Random, broken: dict[int, int]) -> RunData:
    """Run ``k`` (0-based): noisy timings, a few outcome changes."""
    started = time.strftime("%Y-%m-%dT02:00:00Z", time.gmtime(1767225600 + 86400 * k))  # from 2026-01-01
    # three new breakages a night, each lasting 1-5 nights; two one-night flips
    for _ in range(3):
        broken[rng.randrange(len(cells))] = k + rng.randint(1, 5)
    flips = {rng.randrange(len(cells)) for _ in range(2)}
    out = []
    for i, c in enumerate(cells):
        t = c.timings
        if t.gbps is not None:
            f = rng.gauss(1.0, 0.03)
            t = replace(t, gbps=t.gbps * f, loop_gbps=(t.loop_gbps or 0) * rng.gauss(1.0, 0.03),
                        speedup=(t.speedup or 1.0) * f, wall_s=(t.wall_s or 1.0) * rng.gauss(1.0, 0.05))
        c = replace(c, timings=t, started=started, duration_s=round((c.duration_s or 1.0) * rng.gauss(1.0, 0.1), 4))
        if broken.get(i, -1) > k or i in flips:
            c = replace(c, status="fail", observed=Observed(outcome="crash:SIGSEGV", detail="injected"),
                        mismatch="injected failure")
        out.append(c)
    info = RunInfo(run_id=f"{k:04d}{rng.getrandbits(32):08x}", matrix="nightly.yaml", matrix_sha256="f" * 64,
                   started=started, finished=started, interrupted=False, harness_version=cumatrix.__version__,
                   backend="local", host="h200", host_fingerprint=dict(cells[0].fingerprint),
                   cells_total=len(out))
    return RunData(runs=(info,), cells=tuple(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=365)
    ap.add_argument("--cells", type=int, default=10_000)
    ap.add_argument("--source", type=Path, default=REPO / "reports" / "gpu-h200" / "results.jsonl")
    ap.add_argument("--db", type=Path, help="history file to build (default: a temporary one, removed)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    cells = matrix_cells(templates(args.source), args.cells)
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "history.sqlite"
        if db.exists():
            raise SystemExit(f"{db}: exists; name a new file")
        appends: list[float] = []
        broken: dict[int, int] = {}
        t_all = time.monotonic()
        with History.open(db) as hist:
            for k in range(args.runs):
                run = night(cells, k, rng, broken)
                t0 = time.perf_counter()
                hist.append(run, kind="run", commit=None, recorded=run.header.started)
                appends.append(time.perf_counter() - t0)
                if (k + 1) % 50 == 0:
                    print(f"  {k + 1} runs appended, last {appends[-1]:.3f} s, file "
                          f"{db.stat().st_size / 1e6:.0f} MB", flush=True)
            hist.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            # what `cumatrix run` adds to its end: the diff behind the reports' section, with trends
            t0 = time.perf_counter()
            diff(hist, *resolve(hist, None, None), trends=True)
            since_s = time.perf_counter() - t0
        build_s = time.monotonic() - t_all
        size = sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        diffs = []
        for _ in range(3):
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "cumatrix", "diff", "--history", str(db), "--json"],
                               capture_output=True, text=True, env=env, check=False)
            diffs.append(time.perf_counter() - t0)
            if p.returncode != 0:
                raise SystemExit(f"cumatrix diff failed ({p.returncode}): {p.stderr}")
        d = json.loads(p.stdout)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "cumatrix", "history", "--history", str(db), "--limit", "5"],
                           capture_output=True, text=True, env=env, check=True)
        history_s = time.perf_counter() - t0
    figures = {
        "runs": args.runs, "cells": args.cells, "db_mb": round(size / 1e6, 1),
        # the first run of a matrix stores every record (each cell is news); a night after it
        # stores short rows and the records of what changed
        "append_s": {"first": round(appends[0], 3), "median": round(statistics.median(appends[1:]), 3),
                     "max": round(max(appends[1:]), 3), "last": round(appends[-1], 3)},
        "diff_cli_s": {"median": round(statistics.median(diffs), 3), "max": round(max(diffs), 3)},
        "history_cli_s": round(history_s, 3), "since_s": round(since_s, 3),
        "diff_found": {k: len(d[k]) for k in ("new_failures", "fixed", "changed", "newly_skipped", "newly_not_run",
                                              "speed", "flaky")},
        "build_s": round(build_s, 1), "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "cumatrix": cumatrix.__version__,
        "load_average": [round(x, 1) for x in os.getloadavg()],  # other work on the machine meanwhile
    }
    ok = {"db_mb": figures["db_mb"] <= GOALS["db_mb"], "diff_s": max(diffs) < GOALS["diff_s"],
          "append_s": max(appends[1:]) < GOALS["append_s"], "first_append_s": appends[0] < GOALS["append_s"]}
    figures["goals_met"] = ok
    print(f"history at scale: {args.runs} runs x {args.cells} cells")
    print(f"  database        {figures['db_mb']} MB (goal <= {GOALS['db_mb']:.0f} MB)")
    print(f"  append one run  median {figures['append_s']['median']} s, max {figures['append_s']['max']} s, "
          f"the last {figures['append_s']['last']} s (goal < {GOALS['append_s']} s); the matrix's first run "
          f"{figures['append_s']['first']} s")
    print(f"  the reports' since-the-last-run (diff with GB/s trends), in process: {figures['since_s']} s")
    print(f"  cumatrix diff   median {figures['diff_cli_s']['median']} s, max {figures['diff_cli_s']['max']} s "
          f"(a new process each; goal < {GOALS['diff_s']} s); found {figures['diff_found']}")
    print(f"  cumatrix history --limit 5  {figures['history_cli_s']} s")
    print(f"  goals met: {ok}")
    print(f"  load average at the end {figures['load_average']} on {figures['cpus']} CPUs; built in {build_s:.0f} s")
    print(json.dumps(figures, sort_keys=True))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

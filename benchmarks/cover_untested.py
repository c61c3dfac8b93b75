"""Covering plans and ``cumatrix untested``, measured.

* the default ``matrix.yaml``: how many cells the pairs plan (``--cover 2``) and the triples
  plan (``--cover 3``) take, against a lower bound no plan can beat (a set of pairs no cell
  holds two of: :func:`cumatrix.front.cover.packing_bound`), and a rotation of 7 nights;
  goal: at most 15% of the cells for pairs;
* a synthetic 8-axis matrix of more than 10,000 cells (a product of 5x4x4x3x3x3x3x2 values,
  less two excludes): the plans' sizes and how long making them takes; goal: under 2 s;
* ``cumatrix untested`` (the real command, a new process) on a year of 10,000-cell nights
  built as ``benchmarks/history_scale.py`` builds them (its own functions, the same seed),
  where one cell in 97 is skipped every night (never tested) and one in 89 is tested only on
  the first night; goal: under 1 s.

Re-run::

    python benchmarks/cover_untested.py [--runs 365] [--cells 10000] [--db FILE] [--json FILE]

``--db FILE`` keeps the history it builds (and reuses it when it exists).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import cumatrix
from cumatrix.core.model import Observed
from cumatrix.core.planned import Selection
from cumatrix.front import cover as C
from cumatrix.load import matrix as M
from cumatrix.results.history import History
from cumatrix.results.untested import find

REPO = Path(__file__).resolve().parents[1]
GOALS = {"pairs_share": 0.15, "synthetic_s": 2.0, "untested_s": 1.0}


def _timed(f, repeat: int = 3):  # type: ignore[no-untyped-def]
    """``f()``'s result, the median and the slowest wall time, and the median CPU time (on a
    shared machine the CPU time moves less with the load than the wall time)."""
    times, cpu, out = [], [], None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        out = f()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    _timed.cpu = statistics.median(cpu)  # type: ignore[attr-defined]
    return out, statistics.median(times), max(times)


def default_matrix() -> dict[str, object]:
    m = M.load(REPO / "matrix.yaml")
    every = M.cells(m)
    pool = [c for c in every if C.buildable(c)]
    rows = [C.cell_row(c) for c in pool]
    out: dict[str, object] = {"cells": len(every), "buildable": len(pool)}
    for t in (2, 3):
        plan, med, _ = _timed(lambda t=t: C.choose(m, every, Selection(strength=t)))
        assert not C.missing(rows, [pool.index(c) for c in plan], t)
        sizes = [len(C.choose(m, every, Selection(strength=t, seed=s))) for s in range(10)]
        out[f"cover{t}"] = {"cells": len(plan), "share": round(len(plan) / len(every), 4),
                            "lower_bound": C.packing_bound(rows, t), "seconds": round(med, 4),
                            "seeds_0_to_9": sizes}
    nights = [len(C.choose(m, every, Selection(strength=2, rotate=7, night=n))) for n in range(7)]
    out["rotate7"] = {"nights": nights, "sum": sum(nights)}
    return out


def synthetic() -> dict[str, object]:
    sizes = (5, 4, 4, 3, 3, 3, 3, 2)
    axes = "abcdefgh"
    rows = [tuple(zip(axes, v, strict=True)) for v in itertools.product(*[range(s) for s in sizes])]
    # two excludes, as a matrix file's: a value pair each
    rows = [r for r in rows if not (r[0][1] == 0 and r[1][1] == 0) and not (r[2][1] == 1 and r[3][1] == 2)]
    out: dict[str, object] = {"cells": len(rows), "axes": len(sizes), "values": list(sizes)}
    for t in (2, 3):
        plan, med, worst = _timed(lambda t=t: C.cover(rows, t, 0))
        assert not C.missing(rows, plan, t)
        out[f"cover{t}"] = {"cells": len(plan), "share": round(len(plan) / len(rows), 4),
                            "lower_bound": C.packing_bound(rows, t), "seconds_median": round(med, 3),
                            "seconds_max": round(worst, 3), "cpu_s": round(_timed.cpu, 3)}  # type: ignore[attr-defined]
    plans, med, worst = _timed(lambda: C.rotation(rows, 7, 2, 0), repeat=1)
    out["rotate7"] = {"nights": [len(p) for p in plans], "seconds": round(med, 3)}
    return out


def _history_scale():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("history_scale", REPO / "benchmarks" / "history_scale.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_history(db: Path, runs: int, n_cells: int, seed: int) -> float:
    """A year of nights as history_scale.py builds them, with cells that are never tested (one in
    97, skipped every night) and cells tested only on the first night (one in 89)."""
    hs = _history_scale()
    rng = random.Random(seed)
    cells = hs.matrix_cells(hs.templates(REPO / "reports" / "gpu-h200" / "results.jsonl"), n_cells)
    broken: dict[int, int] = {}
    t0 = time.monotonic()
    with History.open(db) as hist:
        for k in range(runs):
            run = hs.night(cells, k, rng, broken)
            out = []
            for i, c in enumerate(run.cells):
                skipped = i % 97 == 0 or (i % 89 == 0 and k > 0)
                out.append(replace(c, status="skip", observed=Observed(outcome="skipped:no-cuda-driver",
                                                                       detail="no GPU of its kind"), mismatch=None)
                           if skipped else c)
            hist.append(replace(run, cells=tuple(out)), kind="run", commit=None, recorded=run.header.started)
            if (k + 1) % 50 == 0:
                print(f"  {k + 1} runs appended", flush=True)
        hist.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return time.monotonic() - t0


def untested_figures(db: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    times, cpu = [], []
    doc: dict[str, object] = {}
    for _ in range(3):
        t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run([sys.executable, "-m", "cumatrix", "untested", "--history", str(db), "--json"],
                           capture_output=True, text=True, env=env, check=False)
        times.append(time.perf_counter() - t0)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
        if p.returncode != 0:
            raise SystemExit(f"cumatrix untested failed ({p.returncode}): {p.stderr}")
        doc = json.loads(p.stdout)
    with History.open(db, create=False) as hist:
        _, in_process, _ = _timed(lambda: find(hist))
        in_cpu = _timed.cpu  # type: ignore[attr-defined]
        _, days, _ = _timed(lambda: find(hist, days=90))
    cells = doc["cells"]
    assert isinstance(cells, list)
    return {"cli_s": {"median": round(statistics.median(times), 3), "max": round(max(times), 3),
                      "cpu_median": round(statistics.median(cpu), 3)},
            "in_process_s": round(in_process, 3), "in_process_cpu_s": round(in_cpu, 3), "days_90_in_process_s": round(days, 3),
            "untested_cells": len(cells),
            "never_tested_in_history": sum(1 for c in cells if c["last_tested"] is None)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=365)
    ap.add_argument("--cells", type=int, default=10_000)
    ap.add_argument("--db", type=Path, help="the history to build (kept; reused when it exists)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    figures: dict[str, object] = {"default_matrix": default_matrix(), "synthetic": synthetic()}
    d, s = figures["default_matrix"], figures["synthetic"]
    print(f"default matrix.yaml: {d['cells']} cells ({d['buildable']} can be built)")  # type: ignore[index]
    for t in (2, 3):
        c = d[f"cover{t}"]  # type: ignore[index]
        print(f"  --cover {t}: {c['cells']} cells ({c['share']:.1%}); no plan can take fewer than "
              f"{c['lower_bound']}; seeds 0-9: {c['seeds_0_to_9']}; {c['seconds']} s")
    print(f"  --rotate 7: nights of {d['rotate7']['nights']} cells")  # type: ignore[index]
    print(f"synthetic 8-axis matrix: {s['cells']} cells")  # type: ignore[index]
    for t in (2, 3):
        c = s[f"cover{t}"]  # type: ignore[index]
        print(f"  --cover {t}: {c['cells']} cells (lower bound {c['lower_bound']}), made in median "
              f"{c['seconds_median']} s, max {c['seconds_max']} s (CPU {c['cpu_s']} s)")
    print(f"  --rotate 7: nights of {s['rotate7']['nights']} cells, {s['rotate7']['seconds']} s")  # type: ignore[index]

    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "history.sqlite"
        if not db.exists():
            figures["history_build_s"] = round(build_history(db, args.runs, args.cells, args.seed), 1)
        u = untested_figures(db)
    figures["untested"] = u
    print(f"cumatrix untested on {args.runs} runs x {args.cells} cells (window 30): median {u['cli_s']['median']} s, "
          f"max {u['cli_s']['max']} s, CPU {u['cli_s']['cpu_median']} s (a new process each); in process "
          f"{u['in_process_s']} s (CPU {u['in_process_cpu_s']} s), --days 90 "
          f"{u['days_90_in_process_s']} s; found {u['untested_cells']} cells, {u['never_tested_in_history']} never "
          "tested in the history")
    ok = {"pairs_share": d["cover2"]["share"] <= GOALS["pairs_share"],  # type: ignore[index]
          "synthetic_s": s["cover2"]["seconds_max"] < GOALS["synthetic_s"]  # type: ignore[index]
          and s["cover3"]["seconds_max"] < GOALS["synthetic_s"],  # type: ignore[index]
          "untested_s": u["cli_s"]["max"] < GOALS["untested_s"]}  # type: ignore[index]
    figures.update({"goals_met": ok, "python": platform.python_version(), "machine": platform.machine(),
                    "cpus": os.cpu_count(), "cumatrix": cumatrix.__version__,
                    "load_average": [round(x, 1) for x in os.getloadavg()]})
    print(f"goals met: {ok}; load average {figures['load_average']} on {figures['cpus']} CPUs")
    print(json.dumps(figures, sort_keys=True))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Where a serial run's time between two cells goes: each cell's program stamps the moment its
``main`` starts and the moment it ends, so the time from one program's end to the next one's
start (the gap: the tracer's record and exit, the harness's turn, the next program's release and
exec) is read apart from the programs' own run.

    python benchmarks/cell_cycle.py [-N 300] [--cpu-ms 9] [--baseline-src DIR] [--reps 2]

The program is compiled here (gcc): it spins for ``--cpu-ms`` of its thread's CPU time, then
prints its two stamps and how often it was preempted.  (Its thread's clock, not its process's:
where a CPU-time limit is set, as it is in a cell, the kernel keeps the process's clock by the
tick, 4 ms here, and a spin on it overran by 2 ms a cell on average.)  One run each, interleaved per rep: the bare loop (``subprocess.run`` of the program N
times, the same stamps), ``cumatrix run`` sandboxed (the default), ``--no-sandbox``, and with
``--baseline-src`` (another checkout's ``src``) that code sandboxed.  Per configuration: the
cycle (first start to last end, over N), the program's own run (its wall time for a fixed CPU
time: more than ``--cpu-ms`` where something else took its CPU), the gap, and how many times the
program lost its CPU to another task while it ran (``ru_nivcsw``), medians over reps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cumatrix

RUNTIME = "nvidia-cuda-runtime-cu12==12.0.146"
PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
static double now(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    double start = now(CLOCK_REALTIME), ms = argc > 1 ? atof(argv[1]) : 9;
    volatile unsigned long spin = 0;
    while (now(CLOCK_THREAD_CPUTIME_ID) < ms / 1000) spin++;
    double end = now(CLOCK_REALTIME);
    getrusage(RUSAGE_SELF, &after);
    printf("%.6f %.6f %ld\n", start, end, after.ru_nivcsw - before.ru_nivcsw);
    return 0;
}
"""


def stamps_of(out: Path) -> list[tuple[float, float, float]]:
    cells = json.loads((out / "results.json").read_text())["cells"]
    return sorted(tuple(map(float, c["stdout_tail"].split())) for c in cells)  # type: ignore[misc]


def figures(stamps: list[tuple[float, float, float]]) -> dict[str, float]:
    run = [(e - s) * 1e3 for s, e, _ in stamps]
    gap = [(stamps[i + 1][0] - stamps[i][1]) * 1e3 for i in range(len(stamps) - 1)]
    return {"cycle_ms": (stamps[-1][1] - stamps[0][0]) / len(stamps) * 1e3,
            "run_ms": statistics.mean(run), "gap_ms": statistics.mean(gap),
            "gap_median_ms": statistics.median(gap), "gap_p90_ms": sorted(gap)[int(0.9 * len(gap))],
            "preempted": statistics.mean(p for _, _, p in stamps)}


def bare_loop(program: Path, n: int, cpu_ms: float) -> list[tuple[float, float, float]]:
    out = []
    for _ in range(n):
        got = subprocess.run([str(program), str(cpu_ms)], capture_output=True, text=True, check=True).stdout
        out.append(tuple(map(float, got.split())))
    return sorted(out)  # type: ignore[arg-type]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-N", type=int, default=300, help="cells per run")
    ap.add_argument("--cpu-ms", type=float, default=9.0, help="CPU time each cell's program spins for")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--wheel-dir", help="take the runtime wheel from here (offline)")
    ap.add_argument("--baseline-src", type=Path, help="another checkout's src directory, run beside this code")
    a = ap.parse_args()
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        sys.exit("cell_cycle.py compiles its program: install gcc")
    here = str(Path(cumatrix.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    configs: dict[str, tuple[list[str], dict[str, str]]] = {"cumatrix": ([], env), "cumatrix-nosb": (["--no-sandbox"], env)}
    if a.baseline_src is not None:
        base = os.pathsep.join(p for p in (str(a.baseline_src.resolve()), env["PYTHONPATH"]) if p)
        configs["baseline"] = ([], {**env, "PYTHONPATH": base})
    got: dict[str, list[dict[str, float]]] = {c: [] for c in ("floor", *configs)}
    with tempfile.TemporaryDirectory(prefix="cumatrix-cycle-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # a root harness's cells (their own uid) enter it
        (work / "stamp.c").write_text(PROGRAM)
        program = work / "stamp"
        subprocess.run([cc, "-O2", "-o", str(program), str(work / "stamp.c")], check=True)
        cases = "".join(f"  - {{name: c{i:05d}, argv: [{program}, '{a.cpu_ms}']}}\n" for i in range(a.N))
        matrix = work / "m.yaml"
        matrix.write_text(f"runtimes:\n  cu12.0: {{wheel: {RUNTIME}}}\ndrivers: [host]\nprobe: false\ncases:\n{cases}")
        wheel = ["--wheel-dir", a.wheel_dir] if a.wheel_dir else []
        for rep in range(a.reps):
            got["floor"].append(figures(bare_loop(program, a.N, a.cpu_ms)))
            for name, (flags, cenv) in configs.items():
                out = work / f"out-{name}-{rep}"
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "cumatrix", "run", str(matrix), "-q", "--out", str(out),
                                *wheel, *flags], env=cenv, cwd=work, check=True, stdout=subprocess.DEVNULL)
                got[name].append(figures(stamps_of(out)))
                print(f"  rep {rep} {name:14} {time.perf_counter() - t0:6.2f} s", file=sys.stderr, flush=True)
    print(f"{a.N} cells of a program spinning {a.cpu_ms} ms of CPU, {os.cpu_count()} cores, medians of {a.reps} rep(s); "
          "ms a cell")
    print(f"{'':16}{'cycle':>8}{'run':>8}{'gap':>8}{'gap med':>9}{'gap p90':>9}{'preempted':>10}")
    for name, runs in got.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{name:16}{med['cycle_ms']:8.2f}{med['run_ms']:8.2f}{med['gap_ms']:8.2f}"
              f"{med['gap_median_ms']:9.2f}{med['gap_p90_ms']:9.2f}{med['preempted']:10.2f}")
    print("run: the program's wall time between its stamps (its CPU time is fixed); preempted: the times "
          "another task took its CPU meanwhile (ru_nivcsw), a mean a cell")
    return 0


if __name__ == "__main__":
    sys.exit(main())

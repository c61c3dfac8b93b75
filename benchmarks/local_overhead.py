"""Per-cell overhead of the local backend, against a bare ``python3 -c pass`` spawn.

One run measures, on the same machine:
  (a) a bare ``python3 -c pass`` through ``subprocess.run`` (median of N),
  (b) the same command as a cell through ``isolate.run_local`` (median of N),
  (c) the full per-cell cost through ``cumatrix run`` for a matrix of such command cells
      (wall time / cells, start-up included),
  (d) cells per second for a 500-cell command-only matrix (1 runtime x 500 ``true`` cases)
      with ``-n 2``,
  (e) the cost of observing what a cell maps (rtld-audit, ``cumatrix.execute.observe``): the same
      command through ``isolate.run_local`` plain and audited, interleaved (plain, audited,
      plain, ...) so that drift in the machine's load hits both alike; the audited time
      includes creating the cell's log and reading the mapped list back.  Two commands:
      ``python3 -c pass`` (the smallest cell: the worst case in relative terms) and a
      ``python3`` that loads the runtime with ctypes.  Goal: at most 5% per cell.
  (f) the cost of the kernel's evidence (the spawn helper tracing the cell's tree with ptrace
      and reading /proc/PID/maps at each exit and exec, ``cumatrix.core.witness``): the same audited
      cell untraced (``$CUMATRIX_NO_TRACE=1``) and traced, interleaved, each including what
      the harness does with the result (``observe.conclude``: the audit log alone, or the
      kernel's record with the log checked against it).  Same two commands; goal at most 5%.

  (g) with ``--against REV``: (f) for the code of git revision REV and for this checkout, run
      alternately (REV, this, this, REV, ...) for ``--rounds`` rounds in fresh processes, so
      that the machine's load hits both alike; prints every round and the medians per command.

Usage: python benchmarks/local_overhead.py [-N 50] [--wheel-dir DIR] [--audit-only] [--trace-only]
                                           [--against REV [--rounds 6]]
The runtime wheel of the matrices is fetched into the cache once (or taken from --wheel-dir).
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cumatrix
from cumatrix.core.jobs import Job
from cumatrix.execute import observe
from cumatrix.execute.local import run_local

RUNTIME = "nvidia-cuda-runtime-cu12==12.9.79"
PYTHON = sys.executable  # the interpreter itself: a launcher shim would inflate (a)
_LOG_IDS = itertools.count()  # every cell's log is a new file (audit_plan creates it exclusively)


def bare(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([PYTHON, "-c", "pass"], check=True)
        out.append(time.perf_counter() - t0)
    return out


def local_backend(n: int) -> list[float]:
    job = Job(cell_id="bench", kind="command", argv=(PYTHON, "-c", "pass"), timeout=60)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        res = run_local(job)
        out.append(time.perf_counter() - t0)
        assert res.returncode == 0, res.stderr_tail
    return out


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def audited_vs_plain(n: int, argv: tuple[str, ...], lib_path: tuple[str, ...], work: Path,
                     enforce: tuple[tuple[str, str], ...]) -> tuple[list[float], list[float], list[float], list[float], int]:
    """Interleaved (plain, audited) pairs of the same cell: wall times and the children's CPU
    times (user + system, less sensitive to other load on the machine) of both, and the
    number of CUDA libraries the audited runs saw (a check that the audit ran)."""
    library = observe.build_audit_library()
    plain_job = Job(cell_id="bench", kind="command", argv=argv, lib_path=lib_path, timeout=60)
    plain: list[float] = []
    audited: list[float] = []
    plain_cpu: list[float] = []
    audited_cpu: list[float] = []
    seen = 0
    for _ in range(n):
        c0, t0 = _children_cpu(), time.perf_counter()
        res = run_local(plain_job)
        plain.append(time.perf_counter() - t0)
        plain_cpu.append(_children_cpu() - c0)
        assert res.returncode == 0, res.stderr_tail
        c0, t0 = _children_cpu(), time.perf_counter()
        plan = observe.audit_plan(work / f"audit-{next(_LOG_IDS)}.log", library=library, enforce=enforce)
        res = run_local(Job(cell_id="bench", kind="command", argv=argv, env=plan.env, lib_path=lib_path, timeout=60))
        seen = len(observe.cuda_libraries(observe.read_mapped(plan.log)))
        audited.append(time.perf_counter() - t0)
        audited_cpu.append(_children_cpu() - c0)
        assert res.returncode == 0, res.stderr_tail
    return plain, audited, plain_cpu, audited_cpu, seen


def report_audit(n: int, wheel_dir: str | None) -> bool:
    from cumatrix.provision import runtimes

    rt = runtimes.from_wheel("cu12.9", RUNTIME, wheel_dir=Path(wheel_dir) if wheel_dir else None)
    cell = observe.cell_runtime(rt.libcudart, rt.version)
    ok = True
    with tempfile.TemporaryDirectory(prefix="cumatrix-audit-bench-") as tmp:
        for label, argv in (("python3 -c pass", (PYTHON, "-c", "pass")),
                            ("python3 loading libcudart", (PYTHON, "-c", "import ctypes; ctypes.CDLL('libcudart.so.12')"))):
            audited_vs_plain(3, argv, (str(rt.lib_dir),), Path(tmp), observe.enforce_rules(cell))  # warm up
            plain, audited, pcpu, acpu, seen = audited_vs_plain(n, argv, (str(rt.lib_dir),), Path(tmp),
                                                                observe.enforce_rules(cell))
            p, a = statistics.median(plain), statistics.median(audited)
            pairs = sorted(y / x for x, y in zip(plain, audited, strict=True))
            cost = a / p - 1
            cpu_cost = statistics.mean(acpu) / statistics.mean(pcpu) - 1
            ok = ok and cost <= 0.05
            print(f"(e) {label}: plain median {p * 1e3:.2f} ms, audited {a * 1e3:.2f} ms: {cost * 100:+.1f}% "
                  f"(pairwise median {(statistics.median(pairs) - 1) * 100:+.1f}%); children's CPU "
                  f"{statistics.mean(pcpu) * 1e3:.2f} vs {statistics.mean(acpu) * 1e3:.2f} ms: {cpu_cost * 100:+.1f}%; "
                  f"N={n} interleaved; CUDA libraries seen: {seen}; goal <= +5%")
    return ok


def traced_vs_untraced(n: int, argv: tuple[str, ...], lib_path: tuple[str, ...], work: Path,
                       cell: observe.CellRuntime) -> tuple[list[float], list[float], list[float], list[float], int]:
    """Interleaved (untraced, traced) pairs of the same audited cell, each concluded as the
    orchestrator does: wall times, children's CPU times, and how many objects the kernel saw."""
    from cumatrix.core import witness

    library = observe.build_audit_library()
    enforce = observe.enforce_rules(cell)
    times: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    seen = 0
    for _ in range(n):
        for traced in (False, True):
            if traced:
                os.environ.pop(witness.NO_TRACE_ENV, None)
            else:
                os.environ[witness.NO_TRACE_ENV] = "1"
            c0, t0 = _children_cpu(), time.perf_counter()
            plan = observe.audit_plan(work / f"trace-{next(_LOG_IDS)}.log", library=library, enforce=enforce)
            res = run_local(Job(cell_id="bench", kind="command", argv=argv, env=plan.env, lib_path=lib_path,
                                timeout=60))
            obs = observe.conclude(plan, cell, trace=res.trace)
            times[traced].append(time.perf_counter() - t0)
            cpu[traced].append(_children_cpu() - c0)
            assert res.returncode == 0, res.stderr_tail
            if traced:
                assert res.trace is not None, res.trace
                assert res.trace.traced, res.trace
                assert obs.source == "kernel", res.trace
                seen = len(res.trace.objects)
    os.environ.pop(witness.NO_TRACE_ENV, None)
    return times[False], times[True], cpu[False], cpu[True], seen


def report_trace(n: int, wheel_dir: str | None) -> bool:
    from cumatrix.provision import runtimes

    rt = runtimes.from_wheel("cu12.9", RUNTIME, wheel_dir=Path(wheel_dir) if wheel_dir else None)
    cell = observe.cell_runtime(rt.libcudart, rt.version)
    ok = True
    with tempfile.TemporaryDirectory(prefix="cumatrix-trace-bench-") as tmp:
        for label, argv in (("python3 -c pass", (PYTHON, "-c", "pass")),
                            ("python3 loading libcudart", (PYTHON, "-c", "import ctypes; ctypes.CDLL('libcudart.so.12')"))):
            traced_vs_untraced(3, argv, (str(rt.lib_dir),), Path(tmp), cell)  # warm up (the detector's caches too)
            plain, traced, pcpu, tcpu, seen = traced_vs_untraced(n, argv, (str(rt.lib_dir),), Path(tmp), cell)
            p, t = statistics.median(plain), statistics.median(traced)
            pairs = sorted(y / x for x, y in zip(plain, traced, strict=True))
            cost = t / p - 1
            cpu_cost = statistics.mean(tcpu) / statistics.mean(pcpu) - 1
            ok = ok and cost <= 0.05
            print(f"(f) {label}: untraced median {p * 1e3:.2f} ms, traced {t * 1e3:.2f} ms: {cost * 100:+.1f}% "
                  f"(pairwise median {(statistics.median(pairs) - 1) * 100:+.1f}%); children's CPU "
                  f"{statistics.mean(pcpu) * 1e3:.2f} vs {statistics.mean(tcpu) * 1e3:.2f} ms: {cpu_cost * 100:+.1f}%; "
                  f"N={n} interleaved; objects the kernel saw: {seen}; goal <= +5%")
    return ok


_F_LINE = re.compile(r"^\(f\) (?P<label>.+?): untraced median [\d.]+ ms, traced [\d.]+ ms: (?P<wall>[+-][\d.]+)% "
                     r"\(pairwise median (?P<pair>[+-][\d.]+)%\); children's CPU [\d.]+ vs [\d.]+ ms: "
                     r"(?P<cpu>[+-][\d.]+)%")


def _trace_run(tree: Path, n: int, wheel_dir: str | None) -> dict[str, tuple[float, float, float]]:
    """One ``--trace-only`` run of the code in ``tree``: label -> (wall, pairwise, CPU) cost in %."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    cmd = [sys.executable, str(tree / "benchmarks" / "local_overhead.py"), "--trace-only", "-N", str(n)]
    if wheel_dir:
        cmd += ["--wheel-dir", wheel_dir]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    found = {m["label"]: (float(m["wall"]), float(m["pair"]), float(m["cpu"]))
             for m in map(_F_LINE.match, proc.stdout.splitlines()) if m}
    if not found:
        sys.exit(f"{tree}: no (f) lines (exit {proc.returncode}):\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    return found


def report_against(rev: str, rounds: int, n: int, wheel_dir: str | None) -> None:
    """(g): the tracing cost of revision ``rev`` and of this checkout, interleaved by round."""
    here = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="cumatrix-before-") as tmp:
        archive = subprocess.run(["git", "-C", str(here), "archive", rev], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        short = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", rev], capture_output=True, text=True,
                               check=True).stdout.strip()
        trees = {rev if short.startswith(rev) else f"{rev} ({short})": Path(tmp), "this checkout": here}
        got: dict[str, list[dict[str, tuple[float, float, float]]]] = {k: [] for k in trees}
        for r in range(rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for name in order:
                got[name].append(_trace_run(trees[name], n, wheel_dir))
                for label, (wall, pair, cpu) in got[name][-1].items():
                    print(f"(g) round {r + 1} {name}: {label}: {wall:+.1f}% wall (pairwise {pair:+.1f}%), "
                          f"{cpu:+.1f}% CPU", flush=True)
    for name, runs in got.items():
        for label in runs[0]:
            walls = [run[label][0] for run in runs if label in run]
            pairs = [run[label][1] for run in runs if label in run]
            cpus = [run[label][2] for run in runs if label in run]
            print(f"(g) {name}: {label}: median over {len(walls)} rounds of N={n}: "
                  f"{statistics.median(walls):+.1f}% wall (pairwise {statistics.median(pairs):+.1f}%), "
                  f"{statistics.median(cpus):+.1f}% CPU; goal <= +5%")


def matrix_text(n_cases: int, argv: str) -> str:
    cases = "\n".join(f"  - {{name: c{i:03d}, argv: {argv}}}" for i in range(n_cases))
    return f"runtimes:\n  cu12.9: {{wheel: {RUNTIME}}}\ndrivers: [host]\nprobe: false\ncases:\n{cases}\n"


def cli_run(work: Path, name: str, n_cases: int, argv: str, extra: list[str], wheel_dir: str | None) -> float:
    m = work / f"{name}.yaml"
    m.write_text(matrix_text(n_cases, argv))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(cumatrix.__file__).parent.parent), env.get("PYTHONPATH", "")])
    env["CI"] = "true"  # no per-cell progress lines
    cmd = [sys.executable, "-m", "cumatrix", "run", str(m), "--out", str(work / name), "-q", *extra]
    if wheel_dir:
        cmd += ["--wheel-dir", wheel_dir]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"cumatrix run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-N", type=int, default=50, help="spawns per median (default 50)")
    ap.add_argument("--cells", type=int, default=50, help="cells of the matrix for (c) (default 50)")
    ap.add_argument("--wheel-dir", help="take the runtime wheel from here (offline)")
    ap.add_argument("--audit-only", action="store_true", help="measure only (e), the cost of the rtld-audit")
    ap.add_argument("--trace-only", action="store_true", help="measure only (f), the cost of the kernel's evidence")
    ap.add_argument("--against", metavar="REV", help="(g): compare the tracing cost with git revision REV")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of (g), each side once a round (default 6)")
    a = ap.parse_args()
    if a.against:
        print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}, cumatrix {cumatrix.__version__}")
        report_against(a.against, a.rounds, a.N, a.wheel_dir)
        return 0
    if a.trace_only:
        print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}, cumatrix {cumatrix.__version__}")
        return 0 if report_trace(a.N, a.wheel_dir) else 1
    if a.audit_only:
        print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}, cumatrix {cumatrix.__version__}")
        return 0 if report_audit(a.N, a.wheel_dir) else 1

    bare(3), local_backend(3)  # warm the page cache
    ta = statistics.median(bare(a.N))
    tb = statistics.median(local_backend(a.N))
    with tempfile.TemporaryDirectory(prefix="cumatrix-bench-") as tmp:
        work = Path(tmp)
        cli_run(work, "warm", 1, "[true]", [], a.wheel_dir)  # fetch/unpack the runtime once
        wall_c = cli_run(work, "c", a.cells, f"[{PYTHON}, -c, pass]", [], a.wheel_dir)
        wall_d = cli_run(work, "d", 500, "[true]", ["-n", "2"], a.wheel_dir)
    tc = wall_c / a.cells
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}, cumatrix {cumatrix.__version__}")
    print(f"(a) bare `python3 -c pass` spawn           median {ta * 1e3:7.2f} ms  (N={a.N})")
    print(f"(b) local backend, same command as a cell  median {tb * 1e3:7.2f} ms  (N={a.N})")
    print(f"(c) `cumatrix run`, {a.cells} python3 cells        {tc * 1e3:7.2f} ms/cell  (wall {wall_c:.2f} s)")
    print(f"(d) `cumatrix run -n 2`, 500 `true` cells      {500 / wall_d:7.1f} cells/s  (wall {wall_d:.2f} s)")
    print(f"b/a = {tb / ta:.2f}x (target <= 1.5x)   c/a = {tc / ta:.2f}x")
    audit_ok = report_audit(a.N, a.wheel_dir)
    trace_ok = report_trace(a.N, a.wheel_dir)
    return 0 if tb / ta <= 1.5 and audit_ok and trace_ok else 1


if __name__ == "__main__":
    sys.exit(main())

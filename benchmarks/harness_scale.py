"""The harness at scale: ``cumatrix run`` of N trivial command cells against the floor.

One run measures, interleaved so that every configuration sees the same machine state:

  floor        a loop of ``subprocess.run([python3, -c, pass])``, N times (``-n 2``: two
               such loops of N/2 side by side);
  cumatrix     ``cumatrix run`` of a matrix of 1 runtime x N cases, each case that same
               command (serial, and ``-n 2``), end to end: start-up, collection, the cells,
               the store and the reports; sandboxed, as a run is by default where bubblewrap
               runs (``cumatrix-nosb``: the same with ``--no-sandbox``);
  pytest       plain pytest (and pytest-xdist ``-n 2``) running N tests that each spawn
               that same command;
  baseline     with ``--baseline-src DIR`` (the ``src`` of another checkout, e.g. a
               ``git worktree`` of an older commit): ``cumatrix run`` of that code, sandboxed
               as by default, beside this code's, so that a change is measured in one run.

For every run it records the wall time and the peak memory of the harness's processes
(the controller and its xdist workers, not the cells they spawn): ``tree_mb`` sums each
harness process's high-water mark (``VmHWM``, sampled), ``max_mb`` is the largest single
process (``wait4``'s ``ru_maxrss``).  At the largest size it also times what a run does
before its first cell: ``cumatrix validate`` and ``pytest --collect-only`` of the matrix.

    python benchmarks/harness_scale.py [--sizes 100 1000 10000] [--reps 1] [--large-reps N] [--json FILE]
                                       [--baseline-src DIR]

The runtime is a wheel from the cache (fetched once; ``--wheel-dir`` for offline runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import cumatrix

RUNTIME = "nvidia-cuda-runtime-cu12==12.0.146"
PYTHON = sys.executable
#: The one spawned command: the floor's loop, every cell and every pytest test run it.
SPAWN = (PYTHON, "-c", "pass")
CONFIGS = ("floor", "cumatrix", "cumatrix-nosb", "pytest", "floor-n2", "cumatrix-n2", "xdist-n2", "baseline")


@dataclass
class Sample:
    config: str
    cells: int
    rep: int
    wall_s: float
    cpu_s: float
    max_mb: float
    tree_mb: float
    harness_procs: int
    returncode: int


@dataclass
class _Tree:
    """Samples the high-water marks of a process tree while it runs."""

    root: int
    exclude: tuple[str, ...]
    interval: float = 0.25
    peaks: dict[int, int] = field(default_factory=dict)  # pid -> VmHWM (kB)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _descendants(self) -> list[tuple[int, int]]:
        """``(pid, ppid)`` of the root and every process below it."""
        children: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(name))
        out, todo = [], [(self.root, 0)]
        while todo:
            pid, ppid = todo.pop()
            out.append((pid, ppid))
            todo += [(c, pid) for c in children.get(pid, [])]
        return out

    @staticmethod
    def _argv(pid: int) -> tuple[str, ...]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return tuple(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
        except OSError:
            return ()

    def _sample(self) -> None:
        for pid, ppid in self._descendants():
            try:
                argv = self._argv(pid)
                # A cell's (or a test's) own child costs the floor as much; a child caught
                # between fork and exec still shows its parent's command line and memory.
                if not argv or argv == self.exclude or (ppid and argv == self._argv(ppid)):
                    continue
                # The spawn shim waits for its cell's program as its parent (about 1 MB while the
                # cell runs): the cell's cost, not the harness's memory.  The same binary as the
                # harness's watcher (``--watch``) is the harness's, and is counted.
                if os.path.basename(argv[0]).startswith("cumatrix-spawn") and argv[1:2] != ("--watch",):
                    continue
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            kb = int(line.split()[1])
                            self.peaks[pid] = max(self.peaks.get(pid, 0), kb)
                            break
            except (OSError, ValueError):
                continue

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self) -> None:
        self._stop.set()


def measure(argv: Sequence[str], *, cwd: Path, env: dict[str, str], sample: bool,
            ok: tuple[int, ...] = (0, 1)) -> tuple[float, float, float, float, int, int]:
    """Run ``argv`` to its end: wall and CPU seconds (the whole tree, cells included), largest
    process (MB), tree peak (MB), harness processes, exit status."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(argv), cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    tree = _Tree(root=proc.pid, exclude=SPAWN)
    th = threading.Thread(target=tree.run, daemon=True)
    if sample:
        th.start()
    assert proc.stderr is not None
    err = proc.stderr.read()  # drained while it runs; a full pipe would stall the run
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    tree.stop()
    if sample:
        th.join()
    if proc.returncode not in ok:
        sys.exit(f"{' '.join(argv[:6])} ... failed ({proc.returncode}):\n{err.decode(errors='replace')[-3000:]}")
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024, sum(tree.peaks.values()) / 1024, len(tree.peaks), proc.returncode


def floor(n: int, *, parallel: int, cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """The floor: ``parallel`` loops of ``subprocess.run(SPAWN)`` that share ``n`` spawns (wall, CPU s)."""
    code = f"import subprocess, sys\nfor _ in range(int(sys.argv[1])): subprocess.run({list(SPAWN)!r}, check=True)\n"
    shares = [n // parallel + (1 if i < n % parallel else 0) for i in range(parallel)]
    t0 = time.perf_counter()
    procs = [subprocess.Popen([PYTHON, "-c", code, str(k)], cwd=cwd, env=env) for k in shares]
    cpu = 0.0
    for p in procs:
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode:
            sys.exit("the floor's loop failed")
        cpu += usage.ru_utime + usage.ru_stime
    return time.perf_counter() - t0, cpu


def write_matrix(path: Path, n: int) -> None:
    argv = "[" + ", ".join(SPAWN) + "]"
    with open(path, "w") as f:
        f.write(f"runtimes:\n  cu12.0: {{wheel: {RUNTIME}}}\ndrivers: [host]\nprobe: false\ncases:\n")
        for i in range(n):
            f.write(f"  - {{name: c{i:05d}, argv: {argv}}}\n")


def write_tests(path: Path, n: int) -> None:
    path.write_text("import subprocess\n\nimport pytest\n\n\n"
                    f"@pytest.mark.parametrize('i', range({n}))\n"
                    f"def test_spawn(i):\n    subprocess.run({list(SPAWN)!r}, check=True)\n")


def commands(work: Path, n: int, wheel_dir: str | None) -> dict[str, list[str]]:
    m = work / f"m{n}.yaml"
    t = work / f"test_spawn{n}.py"
    cm = [PYTHON, "-m", "cumatrix", "run", str(m), "-q", *(["--wheel-dir", wheel_dir] if wheel_dir else [])]
    pt = [PYTHON, "-m", "pytest", str(t), "-q", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(work)]
    return {"cumatrix": [*cm, "--out", str(work / f"out{n}")], "baseline": [*cm, "--out", str(work / f"out{n}-base")],
            "cumatrix-nosb": [*cm, "--out", str(work / f"out{n}-nosb"), "--no-sandbox"],
            "cumatrix-n2": [*cm, "--out", str(work / f"out{n}-n2"), "-n", "2"],
            "pytest": pt, "xdist-n2": [*pt, "-n", "2"]}


def _first_cell_s(argv: list[str], *, cwd: Path, env: dict[str, str], stamp: Path) -> float:
    """Seconds from starting ``argv`` (a run) until its first cell's command runs; the run is
    then killed (what it does after its first cell is not start-up)."""
    stamp.unlink(missing_ok=True)
    t0 = time.time()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        while not (stamp.exists() and stamp.read_text().strip()):
            if proc.poll() is not None:
                sys.exit(f"{' '.join(argv[:6])} ... ended before its first cell:\n"
                         f"{proc.stderr.read().decode(errors='replace')[-3000:] if proc.stderr else ''}")
            time.sleep(0.002)
        return int(stamp.read_text()) / 1e9 - t0  # the cell wrote its start (date +%s%N)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def validate_and_collect(work: Path, n: int, env: dict[str, str]) -> dict[str, float]:
    """What a run does before its first cell, at ``n`` cells.

    ``validate_s``: ``cumatrix validate`` with an empty cache (the matrix parsed and checked);
    ``collect_s``: then ``cumatrix run`` until its first cell's command starts (start-up, the
    matrix read back, pytest's collection of every cell, the selection, the runtime, the
    store); ``collect_cold_s``: the same with an empty cache (no ``validate`` before: the run
    parses the matrix itself).  The first cell writes the time it ran; the run is then killed.
    """
    stamp = work / "first-cell.t"
    m = work / f"m{n}-first.yaml"
    text = (work / f"m{n}.yaml").read_text()
    first = f"  - {{name: c{0:05d}, argv: [sh, -c, 'date +%s%N > {stamp}']}}\n"
    lines = text.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("  - "))
    m.write_text("".join(lines[:at]) + first + "".join(lines[at + 1:]))
    out: dict[str, float] = {}
    # Unsandboxed: the first cell stamps the time into the run's directory, which a sandboxed
    # cell cannot write (the start-up before it is the same but for the sandbox's one check).
    run = [PYTHON, "-m", "cumatrix", "run", str(m), "-q", "--out", str(work / "collect-out"), "--no-sandbox"]
    from cumatrix.core.cache import cache_root

    saved = cache_root() / "matrix"  # validated matrices kept between processes (nothing else)
    step_env = {k: v for k, v in env.items() if k != "CUMATRIX_NO_MATRIX_CACHE"}
    shutil.rmtree(saved, ignore_errors=True)
    wall, _, mx, _, _, _ = measure([PYTHON, "-m", "cumatrix", "validate", str(m)], cwd=work, env=step_env, sample=False)
    out["validate_s"], out["validate_max_mb"] = round(wall, 3), round(mx, 1)
    out["collect_s"] = round(_first_cell_s(run, cwd=work, env=step_env, stamp=stamp), 3)
    shutil.rmtree(saved, ignore_errors=True)
    out["collect_cold_s"] = round(_first_cell_s(run, cwd=work, env=step_env, stamp=stamp), 3)
    wall, _, mx, _, _, _ = measure([PYTHON, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-c",
                                    os.devnull, "--rootdir", str(work), str(work / f"test_spawn{n}.py")],
                                   cwd=work, env=step_env, sample=False)
    out["pytest_collect_s"], out["pytest_collect_max_mb"] = round(wall, 3), round(mx, 1)
    out["validate_plus_collect_s"] = round(out["validate_s"] + out["collect_s"], 3)
    return out


def summarise(samples: list[Sample], sizes: Sequence[int]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for n in sizes:
        med = {c: statistics.median([s.wall_s for s in samples if s.cells == n and s.config == c] or [float("nan")])
               for c in CONFIGS}
        cpu = {c: statistics.median([s.cpu_s for s in samples if s.cells == n and s.config == c] or [float("nan")])
               for c in CONFIGS}
        peak = {c: max([s.tree_mb for s in samples if s.cells == n and s.config == c] or [float("nan")])
                for c in CONFIGS}
        rows.append({
            "cells": n, **{f"{c}_s": round(med[c], 3) for c in CONFIGS},
            "cumatrix_vs_floor": round(med["cumatrix"] / med["floor"], 3),
            "nosb_vs_floor": round(med["cumatrix-nosb"] / med["floor"], 3),
            "baseline_vs_floor": round(med["baseline"] / med["floor"], 3),
            "pytest_vs_floor": round(med["pytest"] / med["floor"], 3),
            "cumatrix_n2_vs_floor_n2": round(med["cumatrix-n2"] / med["floor-n2"], 3),
            "xdist_n2_vs_floor_n2": round(med["xdist-n2"] / med["floor-n2"], 3),
            "cumatrix_n2_vs_xdist_n2": round(med["cumatrix-n2"] / med["xdist-n2"], 3),
            **{f"{c}_cpu_s": round(cpu[c], 3) for c in CONFIGS},
            "cpu_cumatrix_vs_floor": round(cpu["cumatrix"] / cpu["floor"], 3),
            "cpu_pytest_vs_floor": round(cpu["pytest"] / cpu["floor"], 3),
            "cpu_cumatrix_n2_vs_xdist_n2": round(cpu["cumatrix-n2"] / cpu["xdist-n2"], 3),
            "extra_ms_per_cell": round((med["cumatrix"] - med["floor"]) / n * 1e3, 3),
            "extra_ms_per_cell_n2": round((med["cumatrix-n2"] - med["floor-n2"]) / n * 1e3, 3),
            "cumatrix_tree_mb": round(peak["cumatrix"], 1), "cumatrix_n2_tree_mb": round(peak["cumatrix-n2"], 1),
            "pytest_tree_mb": round(peak["pytest"], 1), "xdist_n2_tree_mb": round(peak["xdist-n2"], 1)})
    return rows


def show(rows: list[dict[str, object]], pre: dict[str, float] | None, n_pre: int) -> None:
    head = (f"{'cells':>6} {'floor s':>8} {'run s':>8} {'run/fl':>7} {'pyt/fl':>7} {'+ms/cell':>8} | "
            f"{'fl-n2 s':>8} {'run-n2 s':>8} {'run/fl':>7} {'xd/fl':>7} {'run/xd':>7} | "
            f"{'run MB':>7} {'run-n2 MB':>9} {'pyt MB':>7} {'xd MB':>7}")
    if rows:
        print(head)
    for r in rows:
        print(f"{r['cells']:>6} {r['floor_s']:8.2f} {r['cumatrix_s']:8.2f} {r['cumatrix_vs_floor']:7.2f} "
              f"{r['pytest_vs_floor']:7.2f} {r['extra_ms_per_cell']:8.2f} | {r['floor-n2_s']:8.2f} "
              f"{r['cumatrix-n2_s']:8.2f} {r['cumatrix_n2_vs_floor_n2']:7.2f} {r['xdist_n2_vs_floor_n2']:7.2f} "
              f"{r['cumatrix_n2_vs_xdist_n2']:7.2f} | {r['cumatrix_tree_mb']:7.1f} {r['cumatrix_n2_tree_mb']:9.1f} "
              f"{r['pytest_tree_mb']:7.1f} {r['xdist_n2_tree_mb']:7.1f}")
    if rows:
        print(f"{'':>6} CPU seconds (the whole tree, cells included): run/floor, pytest/floor, run-n2/xdist-n2")
    for r in rows:
        print(f"{r['cells']:>6} {r['cpu_cumatrix_vs_floor']:7.2f} {r['cpu_pytest_vs_floor']:7.2f} "
              f"{r['cpu_cumatrix_n2_vs_xdist_n2']:7.2f}   (floor {r['floor_cpu_s']:.2f} s, run {r['cumatrix_cpu_s']:.2f} s, "
              f"run-n2 {r['cumatrix-n2_cpu_s']:.2f} s, xdist-n2 {r['xdist-n2_cpu_s']:.2f} s)")
    for r in rows:
        print(f"{r['cells']:>6} --no-sandbox: {r['cumatrix-nosb_s']:.2f} s, {r['nosb_vs_floor']:.2f}x the floor "
              f"(sandboxed {r['cumatrix_vs_floor']:.2f}x)")
    for r in rows:
        if r["baseline_s"] == r["baseline_s"]:  # measured (not NaN)
            print(f"{r['cells']:>6} baseline (--baseline-src): {r['baseline_s']:.2f} s, {r['baseline_vs_floor']:.2f}x "
                  f"the floor (this code {r['cumatrix_vs_floor']:.2f}x)")
    if rows:
        print("run/fl: cumatrix run / floor; pyt/fl: pytest / floor; xd: pytest-xdist -n 2; "
              "MB: peak of the harness's processes (controller + workers, summed)")
    if pre:
        print(f"before the first cell, {n_pre} cells: validate {pre['validate_s']:.2f} s + a run until its first "
              f"cell's command starts {pre['collect_s']:.2f} s = {pre['validate_plus_collect_s']:.2f} s; without "
              f"validate first (no cached matrix) {pre['collect_cold_s']:.2f} s (pytest --collect-only of {n_pre} "
              f"plain tests: {pre['pytest_collect_s']:.2f} s); validate's peak {pre['validate_max_mb']:.0f} MB")
        for i, t in enumerate(pre.get("tries", [])):  # type: ignore[attr-defined]
            print(f"  start-up try {i + 1}: validate {t['validate_s']:.2f} s + run {t['collect_s']:.2f} s = "
                  f"{t['validate_plus_collect_s']:.2f} s; cold {t['collect_cold_s']:.2f} s")


def _baseline_env(env: dict[str, str], src: Path | None) -> dict[str, str] | None:
    """The environment that runs ``src``'s cumatrix (its package first on ``PYTHONPATH``)."""
    if src is None:
        return None
    src = src.resolve()
    if not (src / "cumatrix" / "__init__.py").is_file():
        sys.exit(f"--baseline-src {src}: no cumatrix package there (give a checkout's src directory)")
    import compileall

    compileall.compile_dir(str(src / "cumatrix"), quiet=1)
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH")) if p)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000], help="cells per run")
    ap.add_argument("--reps", type=int, default=1, help="runs of each configuration per size (interleaved)")
    ap.add_argument("--large-reps", type=int, help="runs at sizes of 10,000 cells and more (default: --reps)")
    ap.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    ap.add_argument("--wheel-dir", help="take the runtime wheel from here (offline)")
    ap.add_argument("--json", type=Path, help="write every sample and the summary here")
    ap.add_argument("--baseline-src", type=Path, help="another checkout's src directory, run beside this code "
                                                       "(config 'baseline', added to --configs)")
    ap.add_argument("--startup-only", action="store_true", help="only what a run does before its first cell, "
                                                                 "at the largest size")
    a = ap.parse_args()

    # Byte-compiled as an installed wheel is (pip compiles at install): with
    # PYTHONDONTWRITEBYTECODE set, a source checkout would compile every module at every start.
    import compileall

    compileall.compile_dir(str(Path(cumatrix.__file__).parent), quiet=1)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(cumatrix.__file__).parent.parent),
                                                     env.get("PYTHONPATH")) if p)
    env["CI"] = "true"
    # Timed runs parse the matrix in every process (controller and each xdist worker), as on a
    # machine that never saw it; what the cache of a validated matrix saves is timed apart.
    env["CUMATRIX_NO_MATRIX_CACHE"] = "1"
    base_env = _baseline_env(env, a.baseline_src)
    if base_env is not None and "baseline" not in a.configs:
        a.configs.append("baseline")
    samples: list[Sample] = []
    pre: dict[str, float] | None = None
    load0 = os.getloadavg()[0]  # a busy machine stretches the wall times of every configuration
    with tempfile.TemporaryDirectory(prefix="cumatrix-scale-") as tmp:
        work = Path(tmp)
        # A root harness's sandboxed cells run as nobody, which must enter the run's directory
        # (mkdtemp makes it 0700: every cell would be a harness error, and fast).
        work.chmod(0o755)
        write_matrix(work / "m1.yaml", 1)
        measure([PYTHON, "-m", "cumatrix", "run", str(work / "m1.yaml"), "-q", "--out", str(work / "warm"),
                 *(["--wheel-dir", a.wheel_dir] if a.wheel_dir else [])], cwd=work, env=env, sample=False)
        for n in ([] if a.startup_only else a.sizes):
            write_matrix(work / f"m{n}.yaml", n)
            write_tests(work / f"test_spawn{n}.py", n)
            cmds = commands(work, n, a.wheel_dir)
            for rep in range(a.reps if n < 10000 or a.large_reps is None else a.large_reps):
                for c in a.configs:
                    if c.startswith("floor"):
                        wall, cpu = floor(n, parallel=2 if c == "floor-n2" else 1, cwd=work, env=env)
                        samples.append(Sample(c, n, rep, round(wall, 3), round(cpu, 3), 0.0, 0.0, 0, 0))
                    elif c == "baseline" and base_env is None:
                        sys.exit("the baseline config needs --baseline-src DIR")
                    else:
                        wall, cpu, mx, tree, procs, rc = measure(cmds[c], cwd=work,
                                                                 env=base_env if c == "baseline" and base_env else env,
                                                                 sample=True,
                                                                 ok=(0,) if c.startswith("cumatrix") else (0, 1))
                        samples.append(Sample(c, n, rep, round(wall, 3), round(cpu, 3), round(mx, 1), round(tree, 1),
                                              procs, rc))
                    print(f"  {n:>6} {c:12} rep {rep}: {samples[-1].wall_s:8.2f} s  cpu {samples[-1].cpu_s:8.2f} s  "
                          f"{samples[-1].tree_mb:6.1f} MB", file=sys.stderr, flush=True)
        if a.startup_only:
            write_matrix(work / f"m{max(a.sizes)}.yaml", max(a.sizes))
            write_tests(work / f"test_spawn{max(a.sizes)}.py", max(a.sizes))
        # Start-up is a second or two: the median of three, each step interleaved with the others.
        tries = [validate_and_collect(work, max(a.sizes), env) for _ in range(3)]
        pre = {k: statistics.median(t[k] for t in tries) for k in tries[0]}
        pre["tries"] = tries  # type: ignore[assignment]
    rows = [] if a.startup_only else summarise(samples, a.sizes)
    print(f"machine: {os.cpu_count()} cores, load {load0:.1f} -> {os.getloadavg()[0]:.1f}, Python {platform.python_version()}, "
          f"cumatrix {cumatrix.__version__}; median of {a.reps} interleaved run(s)"
          + (f" ({a.large_reps} at 10,000 cells and more)" if a.large_reps is not None else "") + "; start-up: median of 3")
    show(rows, pre, max(a.sizes))
    if a.json:
        a.json.write_text(json.dumps({"cpus": os.cpu_count(), "python": platform.python_version(),
                                      "spawn": ["python3", *SPAWN[1:]], "runtime": RUNTIME, "reps": a.reps, "load": [load0, os.getloadavg()[0]],
                                      "summary": rows, "before_first_cell": pre,
                                      "samples": [asdict(s) for s in samples]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Per-cell overhead of the docker backend against the local backend, same cells, same run.

Each cell runs ``--reps`` times on each backend, interleaved (local, docker, local, ...)
so that both see the same machine state; the figure is the median wall time per cell,
end to end as the harness pays it (docker: create, start, wait, read logs, remove).

    python benchmarks/docker_overhead.py [--base-image TAG] [--wheel-dir DIR] [--reps N] [--json FILE]

Without ``--base-image`` the base is built (or found) by ``containers/build-base.sh``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cumatrix.provision import runtimes
from cumatrix.execute.docker import DockerBackend, package_root
from cumatrix.judge.classify import classify
from cumatrix.core.jobs import ChildResult, Job
from cumatrix.execute.local import run_local
from cumatrix.core.model import Runtime

REPO = Path(__file__).resolve().parents[1]
RUNTIME = Runtime(name="cu12.9", requirement="nvidia-cuda-runtime-cu12==12.9.79")


def local_runner() -> tuple[Callable[[Job], ChildResult], str]:
    """The local backend's ``run_job`` when it exists, else ``isolate.run_local`` (the same child runner)."""
    env = {**os.environ, "PYTHONPATH": str(package_root())}
    try:
        from cumatrix.backends import local
    except ImportError:
        return (lambda job: run_local(job, base_env=env)), "cumatrix.execute.local.run_local"
    backend_cls = getattr(local, "LocalBackend", None)
    if backend_cls is not None:
        try:
            return backend_cls().run_job, "cumatrix.backends.local.LocalBackend.run_job"
        except TypeError:
            pass  # a constructor with required arguments: fall back to the child runner
    return (lambda job: run_local(job, base_env=env)), "cumatrix.execute.local.run_local"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-image")
    ap.add_argument("--wheel-dir", type=Path)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    base = args.base_image or subprocess.run(
        ["bash", str(REPO / "containers" / "build-base.sh")], check=True, capture_output=True, text=True
    ).stdout.strip().splitlines()[-1]
    with DockerBackend(base) as docker_be:
        info = docker_be.prepare_runtime(RUNTIME, args.wheel_dir)
        if not info.ok:
            print(f"cannot build the runtime image: {info.problem}", file=sys.stderr)
            return 2
        rt = runtimes.from_wheel(RUNTIME.name, RUNTIME.requirement or "", wheel_dir=args.wheel_dir)
        run_local_job, local_name = local_runner()

        cells = {
            # (local argv, docker argv, kind)
            "cu12.9/host/true": ((sys.executable, "-c", "pass"), ("python3", "-c", "pass"), "command"),
            "cu12.9/host/import-smoke": ((sys.executable, "-c", "import ctypes"), ("python3", "-c", "import ctypes"),
                                         "command"),
            "cu12.9/host/probe": (
                (sys.executable, "-m", "cumatrix.child.case", json.dumps({"kind": "probe", "libcudart": str(rt.libcudart)})),
                ("python3", "-m", "cumatrix.child.case", json.dumps({"kind": "probe", "libcudart": None})),
                "probe"),
        }
        rows = []
        for cell, (largv, dargv, kind) in cells.items():
            times: dict[str, list[float]] = {"local": [], "docker": []}
            outcomes: dict[str, set[str]] = {"local": set(), "docker": set()}
            for _ in range(args.reps):
                for name in ("local", "docker"):
                    # A probe is a harness child: it reports over the private verdict channel.
                    job = Job(cell_id=cell, kind=kind, argv=largv if name == "local" else dargv,
                              env=(("PYTHONPATH", str(package_root())),), runtime_name=RUNTIME.name, timeout=120,
                              reports_verdict=kind == "probe")
                    t0 = time.perf_counter()
                    res = run_local_job(job) if name == "local" else docker_be.run_job(job)
                    times[name].append(time.perf_counter() - t0)
                    outcomes[name].add(classify(res, kind=kind).outcome)
            lm, dm = statistics.median(times["local"]), statistics.median(times["docker"])
            rows.append({"cell": cell, "local_ms": round(lm * 1e3, 1), "docker_ms": round(dm * 1e3, 1),
                         "overhead_ms": round((dm - lm) * 1e3, 1), "ratio": round(dm / lm, 2),
                         "outcome_local": sorted(outcomes["local"]), "outcome_docker": sorted(outcomes["docker"])})
        result = {"reps": args.reps, "local_backend": local_name, "docker": docker_be.fingerprint(),
                  "image": info.tag, "image_id": info.image_id, "cpus": os.cpu_count(),
                  "machine": platform.machine(), "cells": rows,
                  "median_ratio": round(statistics.median(r["ratio"] for r in rows), 2),
                  "median_overhead_ms": round(statistics.median(r["overhead_ms"] for r in rows), 1)}

    print(f"local backend: {local_name}; docker {result['docker']['daemon_version']}; "
          f"{args.reps} reps per cell per backend, median wall per cell")
    print(f"{'cell':28} {'local ms':>9} {'docker ms':>10} {'overhead':>9} {'ratio':>6}  outcomes (local / docker)")
    for r in rows:
        print(f"{r['cell']:28} {r['local_ms']:9.1f} {r['docker_ms']:10.1f} {r['overhead_ms']:8.1f}  "
              f"{r['ratio']:5.2f}x  {','.join(r['outcome_local'])} / {','.join(r['outcome_docker'])}")
    print(f"median: docker costs {result['median_ratio']}x local, +{result['median_overhead_ms']} ms per cell")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the controller keeps per cell: memory held at the end of a run, per cell run.

Runs a matrix of N trivial command cells in this process (pytest with the cumatrix plugin,
serially) under ``tracemalloc``, at two sizes, and reports the memory still allocated when
the session finishes (after a collection), and the slope between the sizes: the bytes a
cell leaves behind in the controller (pytest's item and reports, and whatever the plugin
keeps).  A constant footprint shows as a slope that does not depend on the sizes.

    python benchmarks/harness_memory.py [--sizes 200 400]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

RUNTIME = "nvidia-cuda-runtime-cu12==12.0.146"


class _AtFinish:
    held = 0

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: Any) -> None:
        gc.collect()
        self.held = tracemalloc.get_traced_memory()[0]


def held_after(n: int, work: Path) -> int:
    m = work / f"m{n}.yaml"
    m.write_text(f"runtimes:\n  cu12.0: {{wheel: {RUNTIME}}}\ndrivers: [host]\nprobe: false\ncases:\n"
                 + "".join(f"  - {{name: c{i:05d}, argv: [\"true\"]}}\n" for i in range(n)))
    probe = _AtFinish()
    tracemalloc.start()
    try:
        code = pytest.main([str(m), "-qq", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(work),
                            "--cumatrix-out", str(work / f"out{n}")], plugins=[probe])
    finally:
        tracemalloc.stop()
    if int(code) != 0:
        sys.exit(f"the run of {n} cells failed ({code})")
    return probe.held


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs=2, default=[200, 400])
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cumatrix-mem-") as tmp:
        held_after(2, Path(tmp))  # imports, the runtime's cache: not per cell
        small, big = (held_after(n, Path(tmp)) for n in a.sizes)
    lo, hi = a.sizes
    print(f"held at the end of the session: {lo} cells {small / 2**20:.2f} MB, {hi} cells {big / 2**20:.2f} MB")
    print(f"per cell: {(big - small) / (hi - lo) / 1024:.2f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

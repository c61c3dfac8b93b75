#!/usr/bin/env python3
"""Compare a reference run's outcomes and speedups with the project's measured facts.

    python3 scripts/compare-facts.py reports/gpu-h200/results.json > reports/gpu-h200/facts-comparison.md

The reference figures below are quoted from docs/facts.md section 5 (H200, driver 580.159.04;
one run each: timings are leads, outcomes are facts).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

# direction -> (loop GB/s, batch GB/s, speedup) at 16 KiB x 1024 blocks, runtime 13.0
FACTS_SPEED = {"d2h": (7.5, 15.7, 2.1), "h2d": (5.7, 13.4, 2.3), "d2d": (3.9, 4.2, 1.07)}
TOLERANCE = 0.25


def main(path: str) -> int:
    data = json.load(open(path))
    cells = data["cells"]
    out = ["# Reference run against the measured facts", ""]
    counts: dict[str, int] = defaultdict(int)
    for c in cells:
        counts[c["status"]] += 1
    out.append(f"{len(cells)} cells: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    out += ["", "## Speedup of the batch path over the per-block loop (16 KiB x 1024 blocks)", "",
            "| cell | loop GB/s | batch GB/s | speedup | facts speedup | within 25% |", "|---|---|---|---|---|---|"]
    bad = 0
    for c in cells:
        ax, obs, t = c["axes"], c["observed"], c.get("timings") or {}
        w = ax.get("workload", "")
        if obs.get("path") != "batch" or ax.get("variant") not in ("proc-address", "runtime-dispatch") or "legacy" in w:
            continue
        direction = w.rsplit("-", 1)[-1]
        if direction not in FACTS_SPEED or t.get("speedup") is None:
            continue
        ref = FACTS_SPEED[direction][2]
        ok = abs(t["speedup"] - ref) <= TOLERANCE * ref
        bad += not ok
        out.append(f"| {c['id']} | {t['loop_gbps']:.1f} | {t['gbps']:.1f} | {t['speedup']:.2f}x | {ref:.2f}x | {'yes' if ok else 'NO'} |")
    out += ["", f"{bad} speedups outside 25% of the facts." if bad else "Every speedup is within 25% of the facts."]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

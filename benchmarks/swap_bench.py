"""Reference swap at the hardware limit: loop, batch and kernel paths and both policies, one run.

Measures on the GPU of this host, every number from this run:

- d2h and h2d, 4 KiB .. 2 MiB blocks x 1024, and d2d at the same sizes: each forced path
  (``loop``, ``batch``, ``kernel``) and the policies ``copy-engine-only`` and ``fastest``
  (built-in choices, and calibrated from this run's forced measurements);
- d2d 16 KiB x (32 layers x 1024 blocks);
- the link limit: 2 MiB blocks, batch path, per direction; the device's copy bandwidth: one
  1 GiB ``cuMemcpyDtoDAsync``.

GB/s count bytes copied once (median of the repetitions; spread in ms).  Writes
``--json`` (rows: direction, block_bytes, blocks, path, policy, gbps, limit_gbps,
repetitions, spread) and ``--plot``, and prints the target ratios of the kernel path.

    python benchmarks/swap_bench.py [--json reports/bench/swap-h200.json] [--plot reports/bench/swap-h200.png]
        [--headers 13.0] [--wheel-dir DIR] [--repetitions N]

Each phase runs in its own child: the calibration file is read once per process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cumatrix.calibrate import RESULT_TAG, Bench, Measurement, best_rows, gpu_absent_reason, table_text

REPO = Path(__file__).resolve().parents[1]
KIB = 1024
SIZES = (4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 2048 * KIB)
BLOCKS = 1024
D2D_LAYERS = 32
FORCED = ("loop", "batch", "kernel")
DEVICE_COPY_BYTES = 1 << 30


def configs() -> list[tuple[str, int, int]]:
    """(direction, block_bytes, blocks) measured in every phase."""
    out = [(d, s, BLOCKS) for d in ("d2h", "h2d", "d2d") for s in SIZES]
    out.append(("d2d", 16 * KIB, D2D_LAYERS * BLOCKS))
    return out


def phase(name: str, library: str, reps: int) -> dict[str, Any]:
    """Child side: ``forced`` (forced paths, copy-engine-only, fastest with built-in choices,
    the limits) or ``calibrated`` (fastest, reading KVSWAP_CALIBRATION)."""
    bench = Bench(library)
    policies = (*FORCED, "copy-engine-only", "fastest") if name == "forced" else ("fastest",)
    rows: list[Measurement] = []
    for direction, block, blocks in configs():
        for m in bench.measure(direction, block, blocks, policies, reps):
            label = m.policy if name == "forced" or m.policy != "fastest" else "fastest-calibrated"
            if name == "forced" and m.policy == "fastest":
                label = "fastest-builtin"
            rows.append(Measurement(**(asdict(m) | {"policy": label})))
    result: dict[str, Any] = {"rows": [asdict(r) for r in rows], "kernel_info": bench.swap.kernel_info()}
    if name == "forced":
        gbps, spread = bench.device_copy_gbps(DEVICE_COPY_BYTES, reps)
        result |= {"device_copy_gbps": gbps, "device_copy_spread": spread, "device": bench.api.device_name(),
                   "versions": bench.api.versions}
    return result


def run_phase(name: str, library: str, reps: int, env_extra: dict[str, str]) -> dict[str, Any]:
    env = dict(os.environ, **env_extra)
    env.pop("KVSWAP_POLICY", None)
    proc = subprocess.run([sys.executable, __file__, "--phase", name, "--library", library,
                           "--repetitions", str(reps)], capture_output=True, text=True, env=env, timeout=540)
    sys.stderr.write(proc.stderr[-3000:])
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(RESULT_TAG)), None)
    if line is None:
        raise SystemExit(f"phase {name}: exit {proc.returncode}, no result")
    result: dict[str, Any] = json.loads(line[len(RESULT_TAG):])
    return result


def plot(rows: list[dict[str, Any]], limits: dict[str, float], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    styles = {"loop": ":", "batch": "--", "kernel": "-", "copy-engine-only": "-.", "fastest-calibrated": "-"}
    for ax, direction in zip(axes, ("d2h", "h2d", "d2d")):
        for policy, style in styles.items():
            pts = sorted((r["block_bytes"], r["gbps"]) for r in rows if r["direction"] == direction and
                         r["policy"] == policy and r["blocks"] == BLOCKS and r["gbps"] is not None)
            if pts:
                ax.plot([p[0] / KIB for p in pts], [p[1] for p in pts], style, marker="o", label=policy,
                        linewidth=2.5 if policy == "fastest-calibrated" else 1.5, alpha=0.85)
        lim = limits[direction]
        ax.axhline(lim, color="k", linewidth=1)
        ax.text(4, lim * 1.05, "link limit" if direction != "d2d" else "device copy (1 GiB memcpy)", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("block size (KiB), 1024 blocks per call")
        ax.set_ylabel("GB/s (bytes copied once)")
        ax.set_title(direction)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=REPO / "reports" / "bench" / "swap-h200.json")
    ap.add_argument("--plot", type=Path, default=REPO / "reports" / "bench" / "swap-h200.png")
    ap.add_argument("--headers", default="13.0")
    ap.add_argument("--wheel-dir", type=Path)
    ap.add_argument("--repetitions", type=int, default=10)
    ap.add_argument("--phase", choices=("forced", "calibrated"), help=argparse.SUPPRESS)
    ap.add_argument("--library", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        print(RESULT_TAG + json.dumps(phase(args.phase, args.library, args.repetitions)), flush=True)
        return 0
    reason = gpu_absent_reason()
    if reason:
        print(f"error: this benchmark needs a GPU: {reason}", file=sys.stderr)
        return 2
    from cumatrix.build import build_variant
    from cumatrix.runtimes import headers_for

    built = build_variant("proc-address", "driver", headers_for(args.headers, wheel_dir=args.wheel_dir))
    if not built.ok or built.library is None:
        print(built.log, file=sys.stderr)
        return 1
    lib = str(built.library)
    forced = run_phase("forced", lib, args.repetitions, {})
    measured = [Measurement(**r) for r in forced["rows"]]
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "calibration.txt"
        table.write_text(table_text(best_rows(measured)))
        calibrated = run_phase("calibrated", lib, args.repetitions, {"KVSWAP_CALIBRATION": str(table)})
    rows = forced["rows"] + calibrated["rows"]

    def gbps(direction: str, block: int, blocks: int, policy: str) -> float:
        for r in rows:
            if (r["direction"], r["block_bytes"], r["blocks"], r["policy"]) == (direction, block, blocks, policy):
                return float(r["gbps"] or 0.0)
        return 0.0

    limits = {d: gbps(d, 2048 * KIB, BLOCKS, "batch") for d in ("d2h", "h2d")}
    limits["d2d"] = float(forced["device_copy_gbps"])
    for r in rows:
        r["limit_gbps"] = limits[r["direction"]]
        r["layers"] = D2D_LAYERS if r["blocks"] == D2D_LAYERS * BLOCKS else 1

    targets: list[dict[str, Any]] = []

    def target(name: str, value: float, goal: float) -> None:
        targets.append({"target": name, "value": round(value, 4), "goal": goal, "met": value >= goal})

    for d in ("d2h", "h2d"):
        for block, goal in ((16 * KIB, 0.8), (4 * KIB, 0.5)):
            for policy in ("kernel", "fastest-calibrated"):
                target(f"{d} {block // KIB} KiB x {BLOCKS}, {policy} / link limit",
                       gbps(d, block, BLOCKS, policy) / limits[d], goal)
    for policy in ("kernel", "fastest-calibrated"):
        target(f"d2d 16 KiB x {D2D_LAYERS}x{BLOCKS}, {policy} / device copy",
               gbps("d2d", 16 * KIB, D2D_LAYERS * BLOCKS, policy) / limits["d2d"], 0.5)
    worst = min(((gbps(d, b, n, "fastest-calibrated") / gbps(d, b, n, "batch"), f"{d} {b // KIB} KiB x {n}")
                 for d, b, n in configs() if gbps(d, b, n, "batch") > 0), default=(0.0, "-"))
    target(f"fastest-calibrated / batch, worst configuration ({worst[1]})", worst[0], 0.95)

    report = {"device": forced.get("device"), "versions": forced.get("versions"),
              "kernel_info": forced.get("kernel_info"), "limits_gbps": limits,
              "device_copy_spread_ms": forced.get("device_copy_spread"), "rows": rows, "targets": targets,
              "method": "median of --repetitions event-timed calls after 2 warm-ups; GB/s count bytes copied once; "
                        "scattered destination slots; pinned host memory (cuMemHostAlloc)"}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    plot(rows, limits, args.plot, f"kvswap proc-address on {report['device']} ({forced.get('kernel_info')})")

    print(f"{'dir':4} {'block':>8} {'blocks':>6}  " + "  ".join(f"{p[:10]:>10}" for p in
          (*FORCED, "copy-engine-only", "fastest-builtin", "fastest-calibrated")))
    for d, b, n in configs():
        print(f"{d:4} {b:>8} {n:>6}  " + "  ".join(f"{gbps(d, b, n, p):10.1f}" for p in
              (*FORCED, "copy-engine-only", "fastest-builtin", "fastest-calibrated")))
    print(f"limits GB/s: {json.dumps({k: round(v, 1) for k, v in limits.items()})}")
    for t in targets:
        print(f"{'MET ' if t['met'] else 'MISS'} {t['target']}: {t['value']:.2f} (goal {t['goal']})")
    print(f"wrote {args.json} and {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``cumatrix calibrate``: measure loop, batch and kernel per direction x block size x count.

The reference's ``fastest`` policy picks, per call, the path this table says is fastest for
the nearest (direction, block size, count).  The batch (copy-engine) path is measured split over
1, 2, 4 and 8 streams, and each row records the count that was fastest for its direction and size:
what the copy engines reward differs per direction.  The kernel rows are measured with the whole
GPU to themselves; the table says so (``sm-budget 0``), since the same kernel beside a computation
gets far fewer SMs.  The measurement runs in a child process (stdlib +
ctypes, driver API only, as a driver-family swap cell does), so a CUDA failure cannot take
the CLI down.  The table is written twice: JSON (every measurement) and the plain text the
C library reads (``direction block_bytes blocks path`` per line), which
``KVSWAP_CALIBRATION=FILE`` hands to it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cumatrix.core.cache import default_table
from cumatrix.core.options import RunOptions, SandboxPolicy
from cumatrix.core.private import write_new

DIRECTIONS = ("d2h", "h2d", "d2d")
#: 4 KiB .. 2 MiB, the block sizes KV caches use (a page of tokens x heads x head dim).
DEFAULT_SIZES = (4096, 16384, 65536, 262144, 2097152)
DEFAULT_COUNTS = (64, 1024)
#: Paths a calibration compares, as the policies that force them.
PATHS = ("loop", "batch", "kernel")
#: Copy-engine fan-outs (streams per batch call) a calibration tries for the batch path.
STREAM_CHOICES = (1, 2, 4, 8)
#: The SM budget the kernel rows are measured with: 0, the whole GPU (no computation beside them).
CALIBRATION_SM_BUDGET = 0
#: The most bytes one measurement moves (per side); larger (size, count) pairs are skipped.
MAX_BYTES = 2 << 30


@dataclass(frozen=True, kw_only=True, slots=True)
class Measurement:
    """One timed configuration: median GB/s (bytes copied once) over ``repetitions`` calls."""

    direction: str
    block_bytes: int
    blocks: int
    policy: str
    path: str
    gbps: float | None
    repetitions: int
    spread: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    streams: int = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class CalibrationRow:
    """The fastest path for one (direction, block size, count); ``streams`` for batch rows."""

    direction: str
    block_bytes: int
    blocks: int
    path: str
    gbps: float
    streams: int = 1




def as_calibration_input(measurements: list[Measurement]) -> list[Measurement]:
    """The measurements a table is made of: the copy-engine path as the ``fastest`` policy takes it
    (``copy-engine-only``: calls of 128 descriptors, fanned out over the measured stream counts)
    stands for ``batch``; the forced batch (one caller's stream, the chunk limit) is left out."""
    out = []
    for m in measurements:
        if m.policy == "copy-engine-only":
            out.append(Measurement(**(asdict(m) | {"policy": "batch"})))
        elif m.policy in ("loop", "kernel"):
            out.append(m)
    return out


def best_rows(measurements: list[Measurement]) -> list[CalibrationRow]:
    """Per (direction, block_bytes, blocks), the forced path with the highest median GB/s."""
    best = _fastest(m for m in measurements if m.policy in PATHS)
    # The batch's fan-out: the fastest batch measurement of the key, even where another path won
    # (the copy-engine-only policy reads it from this row).
    fan = _fastest(m for m in measurements if m.policy == "batch")
    return [CalibrationRow(direction=k[0], block_bytes=k[1], blocks=k[2], path=m.policy, gbps=m.gbps or 0.0,
                           streams=fan[k].streams if k in fan else 1)
            for k, m in sorted(best.items())]


def _fastest(measurements: Iterable[Measurement]) -> dict[tuple[str, int, int], Measurement]:
    """Per (direction, block_bytes, blocks), the measurement with the highest median GB/s (the
    first of equals); one without a figure is passed over."""
    best: dict[tuple[str, int, int], Measurement] = {}
    for m in measurements:
        if m.gbps is None:
            continue
        key = (m.direction, m.block_bytes, m.blocks)
        if key not in best or m.gbps > (best[key].gbps or 0.0):
            best[key] = m
    return best


def table_text(rows: list[CalibrationRow], sm_budget: int = CALIBRATION_SM_BUDGET) -> str:
    """The text ``KVSWAP_CALIBRATION`` names: ``direction block_bytes blocks path streams`` per line,
    and ``sm-budget N``: the CTAs the kernel rows were measured with (0: the whole GPU)."""
    lines = ["# kvswap calibration: direction block_bytes blocks path streams (written by cumatrix calibrate)",
             "# sm-budget: CTAs the kernel rows were measured with (0: the whole GPU, nothing beside it)",
             f"sm-budget {sm_budget}"]
    lines += [f"{r.direction} {r.block_bytes} {r.blocks} {r.path} {r.streams}" for r in rows]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- measuring (child side)


class Bench:
    """A driver-API context, one proc-address library, and buffers reused across paths."""

    def __init__(self, library: str) -> None:
        # deferred: the ctypes CUDA wrapper (~15 ms), only for a calibration run
        from cumatrix.child import cudaapi

        self._cudaapi = cudaapi
        self.api = cudaapi.Driver()
        self.swap = cudaapi.KvSwapLibrary(library)
        self.lib = self.api.lib
        self.lib.cuMemsetD8Async.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p]
        self.lib.cuMemcpyDtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t,
                                                  ctypes.c_void_p]
        self.stream = self.api.stream("dedicated")
        self.start, self.end = self.api.event(), self.api.event()

    def buffers(self, direction: str, total: int) -> tuple[int, int]:
        """Fresh source and destination of ``total`` bytes each, the source filled."""
        src = self.api.alloc_device(total) if direction in ("d2h", "d2d") else self.api.alloc_host(total)
        dst = self.api.alloc_device(total) if direction in ("h2d", "d2d") else self.api.alloc_host(total)
        self.api.check(self.lib.cuMemsetD8Async(src, 0x5A, total, self.stream), "cuMemsetD8Async")
        return src, dst

    def free(self) -> None:
        """Release every buffer (large configurations do not fit side by side)."""
        self.api.close()
        self.api._dev_allocs.clear()
        self.api._host_allocs.clear()

    def time_ms(self, fn: Any, reps: int, warmup: int, *, before: Any = None,
                host: list[float] | None = None) -> list[float]:
        """Event-timed milliseconds of ``fn()`` on the bench stream.  ``before()`` runs ahead of
        the start event each time (say, a kernel that holds the GPU while ``fn`` is enqueued);
        ``host`` gets the milliseconds the calling thread spent in ``fn()``."""
        out: list[float] = []
        for i in range(warmup + reps):
            if before is not None:
                before()
            self.api.record(self.start, self.stream)
            t0 = time.perf_counter() if host is not None else 0.0
            fn()
            if host is not None and i >= warmup:
                host.append((time.perf_counter() - t0) * 1e3)
            self.api.record(self.end, self.stream)
            ms = self.api.elapsed_ms(self.start, self.end)
            if i >= warmup:
                out.append(ms)
        return out

    def layout(self, direction: str, block: int, blocks: int) -> tuple[Any, Any, Any, int]:
        """Fresh buffers and the scattered descriptors (block i -> slot perm[i], as a KV swap does)."""
        src, dst = self.buffers(direction, block * blocks)
        perm = list(range(blocks))
        random.Random(blocks).shuffle(perm)
        src_ptrs = (ctypes.c_void_p * blocks)(*[src + i * block for i in range(blocks)])
        dst_ptrs = (ctypes.c_void_p * blocks)(*[dst + perm[i] * block for i in range(blocks)])
        sizes = (ctypes.c_size_t * blocks)(*([block] * blocks))
        return src_ptrs, dst_ptrs, sizes, blocks

    def measure(self, direction: str, block: int, blocks: int, policies: tuple[str, ...], reps: int,
                warmup: int = 2, streams: tuple[int, ...] = (0,)) -> list[Measurement]:
        """Time every policy on one scattered layout (block i -> slot perm[i], as a KV swap does).

        ``streams``: the copy-engine fan-outs tried for the batch and copy-engine-only policies
        (0: the library's calibrated choice); other policies run once with the calibrated choice.
        """
        total = block * blocks
        args = self.layout(direction, block, blocks)
        out = []
        for policy, fan in [(p, f) for p in policies for f in (streams if p in ("batch", "copy-engine-only") else (0,))]:
            self.swap.set_policy(policy)
            self.swap.set_copy_streams(fan)

            def call() -> None:
                if self.swap(args, self.stream) != 0:
                    raise self.swap.failure()

            try:
                times = self.time_ms(call, reps, warmup)
            except self._cudaapi.CudaFailure as e:
                out.append(Measurement(direction=direction, block_bytes=block, blocks=blocks, policy=policy,
                                       path=e.path, gbps=None, repetitions=0, error=e.detail))
                continue
            med = statistics.median(times)
            used = self.swap.copy_streams(direction, block, blocks) or 1
            out.append(Measurement(direction=direction, block_bytes=block, blocks=blocks, policy=policy,
                                   path=self._cudaapi.PATHS.get(self.swap.path.value, "n/a"),
                                   gbps=total / 1e9 / (med / 1e3), repetitions=reps,
                                   spread=self._cudaapi.spread(times), streams=used))
        self.swap.set_copy_streams(0)
        self.api.sync()
        self.free()
        return out

    def device_copy_gbps(self, total: int, reps: int) -> tuple[float, dict[str, float]]:
        """GB/s (bytes copied once) of one large cuMemcpyDtoDAsync: the device's own copy bandwidth."""
        src, dst = self.buffers("d2d", total)
        times = self.time_ms(lambda: self.api.check(self.lib.cuMemcpyDtoDAsync_v2(dst, src, total, self.stream),
                                                    "cuMemcpyDtoDAsync"), reps, 2)
        self.free()
        return total / 1e9 / (statistics.median(times) / 1e3), self._cudaapi.spread(times)


def calibrate(library: str, directions: tuple[str, ...], sizes: tuple[int, ...], counts: tuple[int, ...],
              reps: int) -> dict[str, Any]:
    """Measure every forced path for each configuration; return measurements, table and device facts."""
    bench = Bench(library)
    measurements: list[Measurement] = []
    for direction in directions:
        for size in sizes:
            for count in counts:
                if size * count <= MAX_BYTES:
                    measurements += bench.measure(direction, size, count, ("loop", "copy-engine-only", "kernel"),
                                                  reps, streams=STREAM_CHOICES)
    measurements = as_calibration_input(measurements)
    rows = best_rows(measurements)
    return {"device": bench.api.device_name(), "versions": bench.api.versions,
            "kernel_info": bench.swap.kernel_info(), "measurements": [asdict(m) for m in measurements],
            "table": [asdict(r) for r in rows], "sm_budget": CALIBRATION_SM_BUDGET,
            "sm_budget_meaning": "kernel rows measured with the whole GPU (no computation beside them)"}


def child_main(argv: list[str]) -> int:
    """Child entry: ``argv[0]`` is a JSON spec; the measurements go to the harness over the
    private verdict channel (:mod:`cumatrix.execute.protocol`)."""
    # deferred: calibrate's parser is built for every `cumatrix --help`; the child and protocol modules cost ~50 ms
    from cumatrix.child.cudaapi import CudaFailure as CellFailure
    from cumatrix.execute import protocol

    channel = protocol.take_channel()
    spec = json.loads(argv[0])
    try:
        result = calibrate(spec["library"], tuple(spec["directions"]), tuple(spec["sizes"]),
                           tuple(spec["counts"]), int(spec["repetitions"]))
        verdict: dict[str, object] = {"outcome": "ok", "path": "n/a", "data": result}
    except CellFailure as e:
        verdict = {"outcome": e.outcome, "detail": e.detail}
    if not protocol.emit(verdict, environ=channel):
        print(protocol.encode(verdict).decode(), end="", flush=True)  # run by hand: show it
    return 0


# --------------------------------------------------------------------------- the command (parent side)


def _size_arg(text: str) -> int:
    t = text.strip().lower()
    mult = 1
    for suffix, m in (("kib", 1024), ("k", 1024), ("mib", 1 << 20), ("m", 1 << 20)):
        if t.endswith(suffix):
            t, mult = t[: -len(suffix)], m
            break
    try:
        value = int(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 4096, 16k, 2MiB)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a block size must be positive")
    return value


def _measure(spec: dict[str, object], policy: SandboxPolicy | None = None) -> dict[str, Any] | str:
    """Run the measuring child (a harness child, spawned and contained like a cell through the
    orchestrator); its result, or why none.  The judge decides whether it measured: its outcome
    must be what the oracle expects of it (``ok``)."""
    # deferred: the orchestrator costs ~215 ms and ~190 modules, which building the parser does without
    from cumatrix.core.jobs import Job
    from cumatrix.orchestrate import run_child
    from cumatrix.predict.oracle import expect_tool
    from cumatrix.provision.cell import PACKAGE_PARENT

    env = (("PYTHONPATH", os.pathsep.join(p for p in (PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p)),)
    job = Job(cell_id="calibrate", kind="calibrate", reports_verdict=True, timeout=3600, env=env,
              mounts=(PACKAGE_PARENT, str(spec["library"])),
              argv=(sys.executable, "-c",
                    "import sys; from cumatrix.front.calibrate import child_main; sys.exit(child_main(sys.argv[1:]))",
                    json.dumps(spec)))
    ran = run_child(job, expect_tool("calibrate"),
                    base_env={k: v for k, v in os.environ.items() if k != "KVSWAP_POLICY"}, policy=policy)
    if ran.status == "pass":
        return dict(ran.observed.data)
    observed = ran.observed
    return f"the measuring child ended with {observed.outcome}: {observed.detail or ran.child.stderr_tail[-2000:]}"


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Build proc-address, measure in a child, write FILE (text) and FILE.json, print the table."""
    # deferred: the host's fingerprint module (~6 modules) is loaded only when calibrate runs, not at --help
    from cumatrix.host.fingerprint import gpu_absent_reason

    reason = gpu_absent_reason()
    if reason:
        print(f"error: calibrate measures on a GPU, and this host has none usable: {reason}", file=sys.stderr)
        return 2
    # deferred: the build and runtime modules cost ~25 ms, only for a calibration run
    from cumatrix.provision.build import build_variant
    from cumatrix.provision.runtimes import headers_for

    built = build_variant("proc-address", "driver", headers_for(args.headers, wheel_dir=args.wheel_dir))
    if not built.ok or built.library is None:
        print(f"error: proc-address does not build against CUDA {args.headers} headers:\n{built.log}",
              file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else default_table()
    spec = {"library": str(built.library), "directions": list(args.directions), "sizes": list(args.sizes),
            "counts": list(args.counts), "repetitions": args.repetitions}
    result = _measure(spec, RunOptions.from_cli(args).policy)
    if isinstance(result, str):
        print(f"error: {result}", file=sys.stderr)
        return 1
    rows = [CalibrationRow(**r) for r in result["table"]]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_new(out, table_text(rows), replace=True)  # new files renamed into place: never through a link
    write_new(out.with_suffix(".json"), json.dumps(result, indent=1, sort_keys=True) + "\n", replace=True)
    _print_measured(result["measurements"], rows)
    print(f"kernel: {result['kernel_info']}, measured with the whole GPU (sm-budget 0)  (GB/s, bytes copied once)")
    hint = ("`cumatrix run` hands it to every swap cell" if out == default_table()
            else f"use it with: export KVSWAP_CALIBRATION={out}")
    print(f"wrote {out} and {out.with_suffix('.json')}; {hint}")
    return 0


def _best_gbps(measurements: list[dict[str, Any]]) -> dict[tuple[str, int, int], dict[str, float | None]]:
    """Per (direction, block size, blocks): each path's best GB/s, None where it never measured."""
    by_key: dict[tuple[str, int, int], dict[str, float | None]] = {}
    for m in measurements:
        vals = by_key.setdefault((m["direction"], m["block_bytes"], m["blocks"]), {})
        if m["gbps"] is not None and (vals.get(m["policy"]) or 0.0) < m["gbps"]:
            vals[m["policy"]] = m["gbps"]  # the batch's best fan-out
        vals.setdefault(m["policy"], None)
    return by_key


def _print_measured(measurements: list[dict[str, Any]], rows: list[CalibrationRow]) -> None:
    """The measured GB/s per (direction, block size, blocks) and path, with the path chosen."""
    print(f"{'dir':4} {'block':>8} {'blocks':>6}  " + "  ".join(f"{p:>8}" for p in PATHS) + "  best")
    by_key = _best_gbps(measurements)
    best = {(r.direction, r.block_bytes, r.blocks): f"{r.path} ({r.streams} streams)" if r.path == "batch" else r.path
            for r in rows}
    for key, vals in by_key.items():
        cells = "  ".join(f"{vals[p]:8.1f}" if vals.get(p) is not None else f"{'-':>8}" for p in PATHS)
        print(f"{key[0]:4} {key[1]:>8} {key[2]:>6}  {cells}  {best.get(key, '-')}")


def add_calibrate_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]
                         ) -> argparse.ArgumentParser:
    """Register ``calibrate`` on ``subparsers`` with ``func=cmd_calibrate``."""
    p = subparsers.add_parser(
        "calibrate", help="measure loop, batch and kernel swaps on this GPU; write the path table",
        description="Measure the reference swap's loop, batch and kernel paths per direction x block size x "
                    "count, and write the table the `fastest` policy reads (KVSWAP_CALIBRATION=FILE).")
    p.add_argument("--out", metavar="FILE", help="text table to write (JSON beside it as FILE.json); "
                                                 "default: the cumatrix cache")
    p.add_argument("--sizes", nargs="+", type=_size_arg, default=list(DEFAULT_SIZES), metavar="SIZE",
                   help="block sizes (4096, 16k, 2MiB; default 4k 16k 64k 256k 2MiB)")
    p.add_argument("--counts", nargs="+", type=int, default=list(DEFAULT_COUNTS), metavar="N",
                   help="blocks per call (default 64 1024)")
    p.add_argument("--directions", nargs="+", choices=DIRECTIONS, default=list(DIRECTIONS))
    p.add_argument("--repetitions", type=int, default=10, metavar="N", help="timed calls per path (median)")
    p.add_argument("--headers", default="13.0", metavar="X.Y", help="CUDA headers to build against (default 13.0)")
    p.add_argument("--wheel-dir", type=Path, metavar="DIR", help="take the runtime wheel from DIR")
    p.set_defaults(func=cmd_calibrate)
    return p

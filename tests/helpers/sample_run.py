"""A realistic results.jsonl for the report tests, shaped like a run on one H200 host.

Outcomes follow the measured behaviour in the project facts (cu12.8/12.9 runtimes crash when
the ABI is picked from the driver version, cu13 runtimes answer error 400 to the 9-param
call, a cu12 runtime cannot run under an emulated driver); the numbers are test data, not
a measurement.  The report tests (and the browser tests) build their input with
:func:`sample_records`.
"""

from __future__ import annotations

import json
from pathlib import Path

XSS = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\">"
NASTY = f"\x1b[31mfatal\x1b[0m: *bold* `tick` | pipe _under_ [link](http://example.invalid) {XSS} \x07bell"

HEADER_FP = {
    "hostname": "gpu-node-1",
    "driver_version": 13000,
    "driver_string": "580.159.04",
    "gpus": [{"name": "NVIDIA H200", "compute_capability": "9.0"}],
    "forward_compat": False,
    "docker": None,
}

RUNTIME_VERSIONS = {"cu12.4": 12040, "cu12.9": 12090, "cu13.0": 13000, "none": None}


def _fp(runtime: str) -> dict[str, object]:
    rv = RUNTIME_VERSIONS[runtime]
    return {
        "backend": "local",
        "driver_version": 13000,
        "driver_string": "580.159.04",
        "gpu_name": "NVIDIA H200",
        "compute_capability": "9.0",
        "runtime_file": None if rv is None else f"site-packages/nvidia/cuda_runtime/lib/libcudart.so.{rv // 1000}",
        "runtime_version": rv,
        "libcuda_file": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04",
        "forward_compat": False,
        "image": None,
        "image_id": None,
    }


def _swap_outcome(runtime: str, driver: str, variant: str, build: str) -> tuple[list[str], str, str, str | None]:
    """(expected, observed outcome, path, rule) for one swap cell."""
    if driver != "host" and runtime.startswith("cu12"):
        return ["cannot-emulate"], "cannot-emulate", "", "emulated-cu12"
    if driver != "host" and runtime.startswith("cu13"):
        return ["cuda-error:35"], "cuda-error:35", "", "newer-major"
    if variant == "direct-link" and driver == "emulated-12.4":
        return ["undefined-symbol:cuMemcpyBatchAsync"], "undefined-symbol:cuMemcpyBatchAsync", "", "symbol-gating"
    if variant in ("proc-address", "runtime-dispatch"):
        path = "fallback" if driver == "emulated-12.4" or runtime == "cu12.4" else "batch"
        return [f"ok:{path}"], "ok", path, "correct-pattern"
    if variant == "loop":
        return ["ok:fallback"], "ok", "fallback", "loop"
    if variant == "driver-dispatch":
        if runtime == "cu12.9":
            return ["crash:SIGSEGV"], "crash:SIGSEGV", "", "abi-driver-version"
        return ["ok"], "ok", "batch" if runtime != "cu12.4" else "fallback", "abi-driver-version"
    if variant == "header-dispatch":
        if runtime == "cu13.0" and build == "12.8":
            return ["cuda-error:400"], "cuda-error:400", "", "abi-header-version"
        if runtime == "cu12.9" and build == "13.0":
            return ["crash:SIGSEGV"], "crash:SIGSEGV", "", "abi-header-version"
        return ["ok"], "ok", "batch" if runtime != "cu12.4" else "fallback", "abi-header-version"
    return ["ok"], "ok", "batch", "default"


def sample_records(*, nasty_stderr: bool = True, truncate_after: int | None = None) -> list[dict[str, object]]:
    """A header, ~70 cell records (2 of them mismatches) and an end record."""
    runtimes = ["cu12.4", "cu12.9", "cu13.0"]
    drivers = ["host", "emulated-12.4"]
    builds = ["12.8", "13.0"]
    workloads = [("kv-16k-d2h", 16384, 15.7, 7.5), ("kv-4k-h2d", 4096, 6.6, 1.6)]
    cells: list[dict[str, object]] = []

    def add(cid: str, axes: dict[str, str], expected: list[str], outcome: str, path: str | None, rule: str,
            timings: dict[str, object], stderr: str = "") -> None:  # fmt: skip
        from_path = outcome == "ok" and path
        ok = any(e == outcome or (e.startswith("ok:") and from_path and e == f"ok:{path}") for e in expected)
        skip = outcome.startswith("skipped:") or outcome == "cannot-emulate"
        cells.append(
            {
                "schema": 1,
                "type": "cell",
                "id": cid,
                "axes": axes,
                "host": None,
                "expected": {"outcomes": expected, "reason": f"predicted by rule {rule}", "rule": rule},
                "observed": {
                    "outcome": outcome,
                    "path": path if outcome == "ok" else None,
                    "error_name": "cudaErrorInvalidResourceHandle" if outcome == "cuda-error:400" else None,
                    "detail": "",
                    "exit_status": -11 if outcome == "crash:SIGSEGV" else 0,
                },
                "status": "skip" if skip else ("pass" if ok else "fail"),
                "mismatch": None if ok or skip else f"observed {outcome}, expected {' | '.join(expected)}",
                "timings": timings,
                "fingerprint": _fp(axes["runtime"]),
                "stderr_tail": stderr,
                "stdout_tail": "",
                "started": "2026-12-02T13:00:05Z",
                "duration_s": 0.8,
            }
        )

    for driver in drivers:
        for runtime in runtimes:
            add(f"{runtime}/{driver}/probe", {"runtime": runtime, "driver": driver, "kind": "probe"},
                ["ok:n/a"] if driver == "host" else ["cannot-emulate", "cuda-error:35"],
                "ok" if driver == "host" else ("cannot-emulate" if runtime.startswith("cu12") else "cuda-error:35"),
                "n/a", "probe", {"wall_s": 0.2})  # fmt: skip
        for runtime in ["none", *runtimes]:
            variants = ["proc-address", "direct-link", "loop"] if runtime == "none" else [
                "runtime-dispatch", "driver-dispatch", "header-dispatch", "loop"]  # fmt: skip
            for variant in variants:
                for build in builds:
                    for wl, nbytes, gbps, loop in workloads:
                        exp, outcome, path, rule = _swap_outcome(runtime, driver, variant, build)
                        axes = {"runtime": runtime, "driver": driver, "kind": "swap", "variant": variant,
                                "family": "driver" if runtime == "none" else "runtime", "build": build, "workload": wl}  # fmt: skip
                        timings: dict[str, object] = {"wall_s": 0.8}
                        if outcome == "ok":
                            g = gbps if path == "batch" else loop * 1.02
                            timings = {"wall_s": 0.8, "gbps": round(g, 2), "loop_gbps": loop, "speedup": round(g / loop, 2),
                                       "repetitions": 20, "bytes": nbytes * 1024,
                                       "spread": {"min": round(g * 0.95, 2), "p10": round(g * 0.97, 2),
                                                  "p90": round(g * 1.02, 2), "max": round(g * 1.04, 2)}}  # fmt: skip
                        stderr = ""
                        if outcome == "crash:SIGSEGV":
                            stderr = "cumatrix-case: calling cudaMemcpyBatchAsync (v13 ABI)\nSegmentation fault (core dumped)\n"
                        add(f"{runtime}/{driver}/{variant}/h{build}/{wl}", axes, exp, outcome, path, rule, timings, stderr)

    # Two mismatches, one with hostile output.
    for rec in cells:
        if rec["id"] == "cu13.0/host/header-dispatch/h12.8/kv-16k-d2h":
            rec["observed"] = {"outcome": "crash:SIGSEGV", "path": None, "error_name": None,
                               "detail": "killed by SIGSEGV", "exit_status": -11}  # fmt: skip
            rec["status"] = "fail"
            rec["mismatch"] = "observed crash:SIGSEGV, expected cuda-error:400 (9-param call into a 13.x runtime)"
            rec["stderr_tail"] = NASTY if nasty_stderr else "Segmentation fault\n"
            rec["timings"] = {"wall_s": 0.4}
        if rec["id"] == "cu12.4/host/probe":
            rec["observed"] = {"outcome": "timeout", "path": None, "error_name": None, "detail": "no verdict in 60 s",
                               "exit_status": None}  # fmt: skip
            rec["status"] = "fail"
            rec["mismatch"] = "observed timeout, expected ok:n/a"
            rec["stderr_tail"] = "waiting for device...\n" * 3

    header = {
        "schema": 1,
        "type": "run",
        "run_id": "2026-12-02T13-00-00Z-gpu-node-1",
        "matrix": "matrix.yaml",
        "matrix_sha256": "a" * 64,
        "started": "2026-12-02T13:00:00Z",
        "harness_version": "0.1.0",
        "argv": ["cumatrix", "run"],
        "backend": "local",
        "host": None,
        "host_fingerprint": HEADER_FP,
        "cells_total": len(cells),
        "cells": [c["id"] for c in cells],
    }
    kept = cells if truncate_after is None else cells[:truncate_after]
    out: list[dict[str, object]] = [header, *kept]
    if truncate_after is None:
        out.append({"schema": 1, "type": "end", "finished": "2026-12-02T13:04:40Z", "interrupted": False})
    return out


def write_jsonl(path: Path, records: list[dict[str, object]], *, tail: str = "") -> Path:
    """Write records one per line, then ``tail`` verbatim (e.g. half a record)."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")
    return path

"""Every reference variant on a real GPU: correct bytes, the expected path, timings.

Needs an NVIDIA driver; skipped with the reason where ``libcuda.so.1`` cannot be loaded
or ``cuInit`` fails (``CUMATRIX_REQUIRE_GPU=1`` turns the skip into a failure).  Each cell
runs in its own child, as the harness runs them: a runtime and a driver share a process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cumatrix
from cumatrix.provision.build import build_variant
from cumatrix.provision.runtimes import KNOWN_WHEELS, from_wheel, headers_for
from helpers.gpu import gpu_reason

pytestmark = pytest.mark.gpu
SRC_ROOT = str(Path(cumatrix.__file__).resolve().parents[1])


@pytest.fixture(scope="module", autouse=True)
def gpu() -> None:
    reason = gpu_reason()
    if reason:
        if os.environ.get("CUMATRIX_REQUIRE_GPU") == "1":
            pytest.fail(f"CUMATRIX_REQUIRE_GPU=1 but {reason}")
        pytest.skip(reason)


_CHILD = "import json,sys; from cumatrix.child import swapcell; print(json.dumps(swapcell.run(json.loads(sys.argv[1]))))"


def run_cell(spec: dict[str, object]) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=SRC_ROOT), check=False)
    assert proc.returncode == 0, f"child exit {proc.returncode}: {proc.stderr[-2000:]}"
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# (variant, family, runtime wheel or None, headers, expected path); every row is expected to pass
# on a 13.x driver (docs/facts.md sections 2 and 6).
ROWS = [
    ("proc-address", "driver", None, "12.8", "batch"),
    ("proc-address", "driver", None, "13.0", "batch"),
    ("direct-link", "driver", None, "12.8", "batch"),
    ("loop", "driver", None, "12.8", "fallback"),
    ("runtime-dispatch", "runtime", "12.9", "12.8", "batch"),
    ("runtime-dispatch", "runtime", "13.0", "13.0", "batch"),
    ("runtime-dispatch", "runtime", "12.4", "12.8", "fallback"),
    ("driver-dispatch", "runtime", "13.0", "12.8", "batch"),
    ("header-dispatch", "runtime", "12.9", "12.8", "batch"),
    ("header-dispatch", "runtime", "13.0", "13.0", "batch"),
    ("loop", "runtime", "13.0", "13.0", "fallback"),
    ("loop", "runtime", "12.9", "12.8", "fallback"),
]


@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
@pytest.mark.parametrize(("variant", "family", "runtime", "headers", "path"), ROWS,
                         ids=[f"{r[0]}-{r[1]}-cu{r[2] or 'none'}-h{r[3]}" for r in ROWS])
def test_variant_on_gpu(tmp_path_factory: pytest.TempPathFactory, variant: str, family: str, runtime: str | None,
                        headers: str, path: str, direction: str) -> None:
    include = headers_for(headers)
    lib = build_variant(variant, family, include)
    base = build_variant("loop", family, include)
    assert lib.ok, lib.log + base.log
    assert base.ok, lib.log + base.log
    spec: dict[str, object] = {"family": family, "variant": variant, "library": str(lib.library),
                               "baseline": str(base.library), "direction": direction, "block_bytes": 16384,
                               "blocks": 256, "layers": 1, "stream": "dedicated", "repetitions": 20, "warmup": 2}
    if runtime:
        spec["libcudart"] = str(from_wheel(f"cu{runtime}", KNOWN_WHEELS[runtime]).libcudart)
    if variant == "proc-address":
        # The copy engines' paths; the copy kernel has tests of its own (test_kernel_gpu.py).
        spec["policy"] = "copy-engine-only"
    v = run_cell(spec)
    assert (v["outcome"], v["path"]) == ("ok", path), v
    data = v["data"]
    assert isinstance(data, dict)
    assert data["verified_bytes"] == 16384 * 256
    t = v["timings"]
    assert isinstance(t, dict)
    assert t["gbps"] > 0
    assert t["repetitions"] >= 20
    # What ran and how fast beside the limit (one contiguous copy of the same bytes, same direction).
    assert t["limit_gbps"] > 0
    assert t["limit_ratio"] == pytest.approx(t["gbps"] / t["limit_gbps"])
    assert (data["path"], data["gbps"], data["limit_gbps"]) == (path, t["gbps"], t["limit_gbps"])
    if variant == "proc-address":
        assert data["policy"] == "copy-engine-only", data
        assert data["copy_streams"] >= 1, data


@pytest.mark.parametrize("family", ["driver", "runtime"])
def test_legacy_stream_guard_on_gpu(family: str) -> None:
    # vLLM issue 46345: the correct variants fall back on the legacy stream.
    variant = "proc-address" if family == "driver" else "runtime-dispatch"
    include = headers_for("13.0")
    lib, base = build_variant(variant, family, include), build_variant("loop", family, include)
    spec: dict[str, object] = {"family": family, "variant": variant, "library": str(lib.library),
                               "baseline": str(base.library), "direction": "d2h", "block_bytes": 16384,
                               "blocks": 256, "layers": 1, "stream": "legacy", "repetitions": 20, "warmup": 2}
    if family == "runtime":
        spec["libcudart"] = str(from_wheel("cu13.0", KNOWN_WHEELS["13.0"]).libcudart)
    else:
        spec["policy"] = "copy-engine-only"  # the guard is about the copy engines' batch call
    v = run_cell(spec)
    assert (v["outcome"], v["path"]) == ("ok", "fallback"), v

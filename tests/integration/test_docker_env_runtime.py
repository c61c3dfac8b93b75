"""An environment runtime baked into a docker image, against a real Docker daemon.

Skipped with the reason when no daemon answers, unless ``CUMATRIX_REQUIRE_DOCKER=1``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

pytestmark = [pytest.mark.docker, pytest.mark.network]

REPO = Path(__file__).resolve().parents[2]


def _base_image() -> str:
    def unavailable(reason: str) -> None:
        if os.environ.get("CUMATRIX_REQUIRE_DOCKER") == "1":
            pytest.fail(f"CUMATRIX_REQUIRE_DOCKER=1 but {reason}")
        pytest.skip(reason)

    try:
        with contextlib.closing(docker.from_env(timeout=60)) as client:  # closed: an open client's socket outlives the check
            client.ping()
    except (docker.errors.DockerException, OSError) as e:  # no daemon reachable: no docker here
        unavailable(f"no Docker daemon answers ({type(e).__name__}: {e})")
    proc = subprocess.run(["bash", str(REPO / "containers" / "build-base.sh")],
                          capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        unavailable(f"containers/build-base.sh failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip().splitlines()[-1]


def test_an_environment_runtime_runs_inside_its_image(tmp_path: Path, wheel_cache: Path, write_matrix: Any,
                                                      cli: Any) -> None:
    base = _base_image()
    m = write_matrix("""
        runtimes:
          env12.9: {requirements: [cuda-bindings==12.9.*, nvidia-cuda-runtime-cu12==12.9.79]}
        drivers: [host]
        cases:
          - name: bindings
            argv: [python3, -c, "import sys, cuda.bindings, ctypes, os; ctypes.CDLL(os.environ['CUMATRIX_CUDART']); print(sys.prefix)"]
    """)
    proc = cli("run", m, "--backend", "docker", "--base-image", base, "--out", tmp_path / "out", cwd=tmp_path,
               timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = [json.loads(ln) for ln in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    case = next(r for r in recs if r.get("id") == "env12.9/host/bindings")
    assert case["status"] == "pass"
    assert case["stdout_tail"].strip() == "/opt/cumatrix/env"
    assert case["fingerprint"]["image"].startswith("cumatrix-env:env12.9-")
    probe = next(r for r in recs if r.get("id") == "env12.9/host/probe")
    assert probe["observed"]["data"]["runtime_version"] == 12090

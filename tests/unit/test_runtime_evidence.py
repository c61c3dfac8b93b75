"""The runtime facts of the static audit: export dates, dependency and search-path parsing,
architecture floors; and that the packaged export data is what NVIDIA's wheels export."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cumatrix.audit.runtime_evidence import (
    arch_min_cuda,
    export_table,
    parse_export_table,
    runtime_loads,
    runtime_requirement,
    tree_major,
)
from cumatrix.core.model import CudaVersion

ROOT = Path(__file__).resolve().parents[2]


def test_export_dates() -> None:
    t = export_table()
    assert t.first["cudaGetDriverEntryPointByVersion"] == 12050
    assert t.first["cudaMemcpyBatchAsync"] == 12080
    # Texture references went in 12.0, the cudaThread* aliases in 13.0.
    assert t.last["cudaBindTexture"] == 11080
    assert t.last["cudaThreadSynchronize"] == 12090
    assert t.versions[0] == 11070
    assert t.label().startswith("libcudart 11.7-")
    # Every CUDA 12 minor with a wheel was read, so "first exported by 12.5" is exact.
    assert {12000, 12040, 12050, 12080} <= set(t.versions)


@pytest.mark.parametrize(("bad", "why"), [
    ({"schema": 2, "versions": {}, "symbols": {}}, "unsupported schema"),
    ({"schema": 1, "versions": {"12.x": {}}, "symbols": {}}, "not a CUDA version"),
    ([], "unsupported schema"),
])
def test_malformed_export_data_is_refused(bad: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_export_table(bad)


@pytest.mark.parametrize(("requires", "major"), [
    (["numpy", "nvidia-cuda-runtime-cu12>=12.1.105; extra == 'with-cuda'"], 12),
    (["nvidia-cuda-runtime>=13.0.48; sys_platform == 'linux'"], 13),
    (["nvidia-cuda-runtime==13.*"], 13),
    (["nvidia-cuda-runtime-cu11 (==11.8.89)"], 11),
    (["nvidia-cuda-nvrtc-cu12", "torch"], None),
    # Names as PEP 503 compares them: underscores, dots and case are one spelling.
    (["nvidia_cuda_runtime_cu12==12.9.79"], 12),
    (["NVIDIA.CUDA.Runtime.CU11 (>=11.8)"], 11),
    # Another project whose name begins with the runtime's is not the runtime.
    (["nvidia-cuda-runtime-tools>=1.0", "nvidia-cuda-runtime>=14.0,<15"], 14),
    # A floor among several specifiers; a line pip would refuse is skipped.
    (["nvidia-cuda-runtime ===", "nvidia-cuda-runtime !=13.0.1, >=13.0.48"], 13),
])
def test_runtime_requirement(requires: list[str], major: int | None) -> None:
    got = runtime_requirement(requires)
    assert (got[0] if got else None) == major


def test_tree_major() -> None:
    assert tree_major(["$ORIGIN/../nvidia/cublas/lib", "$ORIGIN/../nvidia/cu13/lib"]) == (
        13, "$ORIGIN/../nvidia/cu13/lib")
    assert tree_major(["$ORIGIN/../../nvidia/cuda_runtime/lib"]) == (
        None, "$ORIGIN/../../nvidia/cuda_runtime/lib")
    assert tree_major(["/usr/local/cuda/lib64"]) is None


def test_runtime_loads_severity_follows_the_evidence() -> None:
    cu12_tree = ["$ORIGIN/../nvidia/cuda_runtime/lib"]
    agreed = runtime_loads(sonames=(), stub_names=400, search_paths=cu12_tree,
                           requires=["nvidia-cuda-runtime-cu12"])
    assert [(r.major, r.agreed) for r in agreed] == [(12, True)]
    # Path and dependency disagree: the path's major, as a warning.
    split = runtime_loads(sonames=(), stub_names=400, search_paths=["$ORIGIN/../nvidia/cu13/lib"],
                          requires=["nvidia-cuda-runtime-cu12"])
    assert [(r.major, r.agreed) for r in split] == [(13, False)]
    # A soname names its major whatever else is there; a bare soname names none.
    named = runtime_loads(sonames=["libcudart.so.11.0", "libcudart.so", "libcuda.so.1"],
                          stub_names=0, search_paths=(), requires=())
    assert [(r.subject, r.major, r.agreed) for r in named] == [
        ("dlopen libcudart.so.11.0", 11, False)]
    # Neither a soname nor a table: nothing is loaded, whatever the path says.
    assert runtime_loads(sonames=["libcuda.so.1"], stub_names=0, search_paths=cu12_tree,
                         requires=["nvidia-cuda-runtime-cu12"]) == []


def test_arch_floors() -> None:
    assert arch_min_cuda(120) == CudaVersion(12, 8)
    assert arch_min_cuda(100) == CudaVersion(12, 8)
    assert arch_min_cuda(90) == CudaVersion(11, 8)
    assert arch_min_cuda(110) == CudaVersion(13, 0)
    assert arch_min_cuda(35) is None


@pytest.mark.network
def test_packaged_exports_match_the_runtime_wheels() -> None:
    # Downloads (once, into the cache) the runtime wheel of every minor and rebuilds the data.
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "runtime-exports.py"), "--check"],
                          capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0 and "differs" not in proc.stdout:
        pytest.skip(f"cannot download the runtime wheels here: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]

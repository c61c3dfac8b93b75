"""torch, JAX and CuPy on a GPU host, as the rtld-audit library logged them: their own CUDA 13
runtime in a cu12.9 cell is bundled (skipped:runtime-not-used), never a leak.

The logs in data/ were written by csrc/audit.c on an NVIDIA H200 host where the loader cache
also lists a CUDA 13 toolkit's libcudart.so.13: ``python3 -c "import torch; ..."`` (and jax,
cupy) from the host's torch environment, with a cu12.9 runtime wheel first on
LD_LIBRARY_PATH and libcudart.so.12 enforced, as a cell of examples/h200-clients.yaml runs
them.  Re-record with ``LD_AUDIT=<built audit library> CUMATRIX_AUDIT_LOG=FILE python3 -c ...``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cumatrix.execute import observe as O
from cumatrix.execute import provenance as P

DATA = Path(__file__).parent / "data"
SITE = "/opt/torch/.venv/lib/python3.12/site-packages"  # the GPU host's torch environment
CELL_DIR = "/tmp/rt/nvidia/cuda_runtime/lib"  # the cu12.9 wheel, unpacked there


def _trace(program: str, package_dirs: tuple[str, ...]) -> tuple[P.Provenance, ...]:
    log = DATA / f"gpu-h200-audit-{program}.log"
    mapped = O.read_mapped(log, cuda_only=True)
    setting = P.Setting(cell_file=f"{CELL_DIR}/libcudart.so.12", harness_dirs=(CELL_DIR,), package_dirs=package_dirs)
    return P.trace(mapped, P.read_searches(log), setting)


# With the interpreter's own environment known (how a cell finds it), and without (an
# interpreter cumatrix could not ask): the same verdict, through the RPATH's holder.
@pytest.mark.parametrize("package_dirs", [(SITE,), ()], ids=["environment-known", "environment-unknown"])
@pytest.mark.parametrize("program", ["torch", "jax"])
def test_torch_and_jax_bring_their_own_runtime(program: str, package_dirs: tuple[str, ...]) -> None:
    provs = _trace(program, package_dirs)
    [runtime] = [p for p in provs if p.is_runtime]
    assert (runtime.name, runtime.origin, runtime.step) == ("libcudart.so.13", "bundled", "rpath")
    assert runtime.path.startswith(SITE)
    assert runtime.path.endswith("/nvidia/cu13/lib/libcudart.so.13")
    assert P.leaked(provs) is None
    # Everything else they mapped is theirs too, but the host's driver (through the loader cache).
    assert {p.origin for p in provs} == {"bundled", "driver"}
    assert {p.step for p in provs if p.origin == "driver"} == {"ld.so.cache"}


def test_cupy_maps_no_runtime_and_nothing_of_the_host_but_the_driver() -> None:
    provs = _trace("cupy", (SITE,))
    assert not [p for p in provs if p.is_runtime]
    assert P.leaked(provs) is None
    assert {p.origin for p in provs} == {"bundled", "driver"}

"""A skip never hides a failure, and facts come from content: each road from a failing program
to a green run that once worked, tried for real against ``cumatrix run`` (real processes, real
runtime wheels, gcc- and nvcc-built programs; no GPU needed).

- a failed program is judged against its prediction whatever runtime it used; "the cell's
  runtime was not used" stays a fact on its record and in every report;
- a runtime mapped as data (``mmap(PROT_READ)``) was not loaded; a file named like a CUDA
  library is one only by its content; NVRTC is no runtime;
- a runtime reached through a link in the program's own directory has the origin of the file
  the link names;
- NVIDIA's rule says a program with a newer CUDA major than the driver fails, not how: the
  prediction is ``fails``, and a C program exiting 2 meets it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cumatrix.provision import runtimes as R
from helpers.build import gcc, shared_library
from helpers.results import read_cells_by_case

CU129 = "nvidia-cuda-runtime-cu12==12.9.79"
CU130 = "nvidia-cuda-runtime==13.0.96"
PY = sys.executable

pytestmark = pytest.mark.network  # the cells provision real runtime wheels (cached after the first)

#: A CUDA program as nvcc builds it by default: the CUDA runtime linked statically (FACTS.md
#: section 9).  Without a usable driver its first call fails and it exits 2, as a C program
#: chooses to (the issue's program on the H200 exited 2 under an emulated 12.4 driver).
STATIC_CU = r"""
#include <cuda_runtime.h>
#include <stdio.h>
int main(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) { fprintf(stderr, "cudaGetDeviceCount: %s (%d)\n", cudaGetErrorName(e), (int)e); return 2; }
    printf("%d devices\n", n);
    return 0;
}
"""


def _run(cli: Any, d: Path, body: str, timeout: float = 240) -> tuple[Any, dict[str, dict[str, Any]]]:
    m = d / "m.yaml"
    m.write_text(textwrap.dedent(body).lstrip("\n"))
    out = d / "out"
    # --no-sandbox: the judge is the subject, and some cells open a runtime wheel of the cache by
    # a path written into their program (the sandbox, the default, shows only what a job names).
    proc = cli("run", m, "--out", out, "-q", "--no-sandbox", cwd=d, timeout=timeout)
    assert (out / "results.jsonl").exists(), proc.stderr
    return proc, read_cells_by_case(out)


@pytest.fixture(scope="module")
def cu13(wheel_cache: Path) -> Path:
    return R.from_wheel("cu13.0", CU130).libcudart.resolve()


#: The same, asking the driver's version through the driver API first (linked with libcuda).
STATIC_CU_WITH_DRIVER = STATIC_CU.replace("#include <stdio.h>", "#include <stdio.h>\n#include <cuda.h>").replace(
    "int n = 0;", "int n = 0, dv = 0;\n    cuDriverGetVersion(&dv);")


def _nvcc_static_program(d: Path, *args: str, source: str = STATIC_CU) -> Path:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed (a CUDA toolkit's bin/ on PATH)")
    src = d / "static13.cu"
    src.write_text(textwrap.dedent(source))
    prog = d / "static13"
    proc = subprocess.run([nvcc, "-o", str(prog), str(src), *args], capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return prog


# --------------------------------------------------------------------------- a failure is judged


def test_a_static_cuda13_program_that_fails_in_a_cu12_cell_is_judged(tmp_path: Path, cli: Any) -> None:
    """Before: its static CUDA 13 runtime is not the cell's cu12.9, so the failure (exit 2: no
    driver here) was ``skipped:runtime-not-used`` and the run exited 0.  Now the failure keeps
    its outcome and is judged; the runtime it used is a fact on the record and in the reports."""
    prog = _nvcc_static_program(tmp_path)
    proc, got = _run(cli, tmp_path, f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: static13, argv: ['{prog}']}}
        """)
    rec = got["static13"]
    assert (rec["observed"]["outcome"], rec["status"]) == ("exit:2", "fail"), rec["observed"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fp = rec["fingerprint"]
    assert fp["runtime_file"] == str(prog), fp
    assert fp["static_runtimes"][0]["major"] == 13
    assert "not the cell's libcudart.so.12" in fp["runtime_not_used"]
    out = tmp_path / "out"
    assert "runtime was not used" in (out / "summary.md").read_text()
    assert 'name="runtime_not_used"' in (out / "junit.xml").read_text()
    assert "runtime_not_used" in json.loads((out / "results.json").read_text())["cells"][0]["fingerprint"]


# --------------------------------------------------------------------------- loads, by content


@pytest.mark.parametrize("status", [0, 1])
def test_a_runtime_mapped_as_data_is_not_a_load(tmp_path: Path, cli: Any, cu13: Path, status: int) -> None:
    """Attack: map a real CUDA 13 runtime read-only as data (never loaded, never run) in a cu12.9
    cell.  Before: ``skipped:runtime-not-used`` whatever the exit status.  Now nothing was
    loaded: exit 0 passes, exit 1 fails, and no runtime is recorded."""
    gcc()
    body = (f"import mmap, os; f = open({str(cu13)!r}, 'rb'); "
            f"m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); os._exit({status})")
    proc, got = _run(cli, tmp_path, f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: data, argv: [{PY}, -c, "{body}"]}}
        """)
    rec = got["data"]
    want = ("ok", "pass") if status == 0 else ("exit:1", "fail")
    assert (rec["observed"]["outcome"], rec["status"]) == want, rec["observed"]
    assert proc.returncode == status, proc.stderr
    fp = rec["fingerprint"]
    assert fp["mappings_from"] == "kernel"
    assert fp["runtime_file"] is None
    assert not [lib for lib in fp["libraries"] if "libcudart" in lib["path"]], fp["libraries"]
    assert "runtime_not_used" not in fp


@pytest.mark.parametrize("name", ["libnvrtc.so.13", "libcudart.so.13"])
def test_a_text_file_named_like_a_cuda_library_is_no_runtime(tmp_path: Path, cli: Any, name: str) -> None:
    """Attack: a 100-byte text file named like a CUDA 13 library, mapped executable, in a cu12.9
    cell, and exit 0.  Before: ``skipped:runtime-not-used`` (NVRTC 13 taken for a static CUDA 13
    runtime; a file named libcudart taken for a runtime).  Now: a file is a runtime only by its
    content, and NVRTC never stands for one: the cell passes."""
    gcc()
    fake = tmp_path / "lib" / name
    fake.parent.mkdir()
    fake.write_text("not a library\n" * 7 + "!!")
    assert fake.stat().st_size == 100
    body = (f"import mmap, os; f = open({str(fake)!r}, 'rb'); "
            "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC); os._exit(0)")
    proc, got = _run(cli, tmp_path, f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: fake, argv: [{PY}, -c, "{body}"]}}
        """)
    rec = got["fake"]
    assert (rec["observed"]["outcome"], rec["status"]) == ("ok", "pass"), rec["observed"]
    assert proc.returncode == 0, proc.stderr
    fp = rec["fingerprint"]
    assert (fp["runtime_file"], fp["runtime_version"]) == (None, None), fp
    [lib] = [lib for lib in fp["libraries"] if lib["path"] == str(fake)]  # recorded, by its own name
    if name.startswith("libcudart"):
        assert "exports no cudaRuntimeGetVersion" in lib["not_a_runtime"]


# --------------------------------------------------------------------------- origin, by the file


@pytest.fixture
def toolkit_dir() -> Iterator[Path]:
    """A /usr/local/cuda-XX.Y-style toolkit directory (lib64/), removed afterwards."""
    if not os.access("/usr/local", os.W_OK):
        pytest.skip("needs to write a toolkit directory under /usr/local (run as root)")
    root = Path(f"/usr/local/cuda-0.{uuid.uuid4().int % 1000}-cumatrix-test-{uuid.uuid4().hex[:8]}")
    try:
        (root / "lib64").mkdir(parents=True)
        yield root / "lib64"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_link_in_the_programs_directory_to_a_host_runtime_is_a_leak(
        tmp_path: Path, cli: Any, cu13: Path, toolkit_dir: Path) -> None:
    """Attack: an extension whose RUNPATH is $ORIGIN, and beside it a link libcudart.so.13 to a
    host toolkit's runtime.  Before: ``bundled`` (the path the loader took is the program's
    own), so ``skipped:runtime-not-used``.  Now the origin is the file's: a leak."""
    host_rt = toolkit_dir / "libcudart.so.13"
    shutil.copy2(cu13, host_rt)
    ext = shared_library(tmp_path / "prog" / "_ext.so", """
        int cudaRuntimeGetVersion(int *);
        int probe(void) { int v = 0; return cudaRuntimeGetVersion(&v) == 0 ? v : -1; }
        """, "-Wl,--unresolved-symbols=ignore-all", "-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN",
        "-Wl,--no-as-needed", "-L", str(toolkit_dir), "-l:libcudart.so.13")
    link = ext.parent / "libcudart.so.13"
    link.symlink_to(host_rt)
    proc, got = _run(cli, tmp_path, f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: linked, argv: [{PY}, -c, "import ctypes; print(ctypes.CDLL('{ext}').probe())"]}}
        """)
    rec = got["linked"]
    assert rec["stdout_tail"].strip() == "13000", rec
    assert rec["status"] == "fail", rec["observed"]
    assert rec["observed"]["outcome"].startswith("runtime-leak:"), rec["observed"]
    assert proc.returncode == 1
    [lib] = [lib for lib in rec["fingerprint"]["libraries"] if str(lib["soname"]).startswith("libcudart.so.13")]
    assert lib["origin"] == "outside", lib
    assert f"is a link to {host_rt}" in lib["why"]


# --------------------------------------------------------------------------- what is predicted


def test_a_static_runtime_c_program_on_an_older_driver_is_predicted_to_fail(tmp_path: Path,
                                                                           wheel_cache: Path) -> None:
    """NVIDIA's rule (a CUDA 13 runtime needs a 13.x driver) says the program fails, not how.
    Before: ``exit:1`` "on which a Python program exits 1", so a C program that exits 2 was a
    mismatch.  Now the prediction is ``fails``, and it passes.  The host's driver is a stand-in
    (no GPU here): a 12.8 host's fingerprint, and a libcuda.so.1 stand-in the program links."""
    cc = gcc()
    from cumatrix.load.matrix import cells as matrix_cells
    from cumatrix.load.matrix import load as load_matrix
    from cumatrix.orchestrate import Orchestrator

    d = tmp_path / "driver"
    d.mkdir()
    stand_in = Path(__file__).resolve().parents[1] / "stand_ins" / "libcuda_stand_in.c"
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(d / "libcuda.so.1"),
                    str(stand_in)], check=True)
    # Linked with the driver too (as programs that use the driver API beside the runtime are),
    # so that the driver stays mapped after the runtime gives up on it.
    (d / "libcuda.so").symlink_to("libcuda.so.1")  # the linker's name for it
    prog = _nvcc_static_program(tmp_path, f"-L{d}", "-lcuda", source=STATIC_CU_WITH_DRIVER)
    m = tmp_path / "m.yaml"
    m.write_text(textwrap.dedent(f"""
        runtimes: {{cu13.0: {{wheel: {CU130}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: static13, argv: ['{prog}'], env: {{LD_LIBRARY_PATH: '{d}'}}}}
        """).lstrip())
    orch = Orchestrator(matrix=load_matrix(m))
    orch._host_fp = {"driver_version": 12080}  # a 12.8 host, as the fingerprint would report it
    try:
        [cell] = list(matrix_cells(orch.matrix))
        rec = orch.run(cell).record
    finally:
        orch.close()
    assert rec.fingerprint["driver_mapped"] is True, json.dumps(rec.fingerprint, default=str)
    assert rec.fingerprint["runtime_version"] // 1000 == 13
    assert rec.expected.rule == "program-major-newer-than-driver"
    assert rec.expected.outcomes == {"fails"}
    assert "Python" not in rec.expected.reason
    assert rec.observed.outcome == "exit:2", rec.observed
    assert (rec.status, rec.mismatch) == ("pass", None)

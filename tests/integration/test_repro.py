"""``cumatrix repro`` end to end: real runtime wheels, real gcc builds, real crashing children, real gdb."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cumatrix.host.fingerprint import host_fingerprint

HAS_GPU = host_fingerprint().get("driver_version") is not None
MATRIX = """
version: 1
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
drivers: [host]
probe: false
cases:
  - {name: fine, argv: [python3, -c, "pass"]}
  - {name: segv, argv: [python3, -c, "import ctypes; ctypes.string_at(0)"], timeout: 60,
     python: harness}  # a bare python3 is the PATH's (a pyenv shim is a script gdb cannot run)
expect:
  - {case: segv, outcome: "crash:SIGSEGV", reason: "reads address 0"}
"""

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def matrix_file(write_matrix: Callable[..., Path], wheel_cache: Path) -> Path:
    return write_matrix(MATRIX)


def test_list_names_entries_references_and_needs(cli: Cli) -> None:
    r = cli("repro", "--list")
    assert r.returncode == 0, r.stderr
    for bug_id in ("vllm-undefined-symbol", "vllm-cuda13-build", "sglang-driver-dispatch",
                   "sglang-header-dispatch", "legacy-stream", "v12-abi-on-cu13"):
        assert f"{bug_id}: " in r.stdout
    for ref in ("vLLM PR 38460", "vLLM PR 38919", "SGLang PR 23172", "SGLang PR 23183", "SGLang issue 36302",
                "vLLM issue 46345"):
        assert ref in r.stdout
    assert "gpu no; emulated driver no; headers 13.0" in r.stdout
    assert "gpu yes; driver >= CUDA 12.4; emulated driver 12.4; headers 12.8" in r.stdout


def test_unknown_bug_id_exits_2_with_a_suggestion(cli: Cli) -> None:
    r = cli("repro", "--bug", "vllm-undefined-symbl")
    assert r.returncode == 2
    assert "did you mean 'vllm-undefined-symbol'?" in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_cell_id_exits_2_with_a_suggestion(cli: Cli, matrix_file: Path) -> None:
    r = cli("repro", "cu12.9/hots/fine", "--matrix", matrix_file)
    assert r.returncode == 2
    assert "unknown cell id 'cu12.9/hots/fine'" in r.stderr
    assert "did you mean 'cu12.9/host/fine'?" in r.stderr


def test_cell_of_another_matrix_exits_2(cli: Cli, matrix_file: Path) -> None:
    r = cli("repro", "cu13.0/host/driver-dispatch/h12.8/kv-16k-d2h", "--matrix", matrix_file)
    assert r.returncode == 2
    assert f"not a cell of {matrix_file}; it looks like a cell id of another matrix: pass --matrix" in r.stderr


def test_passing_cell_has_nothing_to_reproduce(cli: Cli, matrix_file: Path, tmp_path: Path) -> None:
    r = cli("repro", "cu12.9/host/fine", "--matrix", matrix_file, "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert "cell cu12.9/host/fine behaves as expected (ok): nothing to reproduce" in r.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(HAS_GPU, reason="this host has an NVIDIA driver: the entry runs instead")
def test_gpu_entry_without_gpu_exits_3_with_a_skeleton_report(cli: Cli, tmp_path: Path) -> None:
    r = cli("repro", "--bug", "sglang-driver-dispatch", "--out", tmp_path)
    assert r.returncode == 3
    assert "needs an NVIDIA GPU and driver; this host has none" in r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["sglang-driver-dispatch.md"]


@pytest.mark.network
@pytest.mark.skipif(HAS_GPU, reason="this host has an NVIDIA driver: the entry runs instead")
def test_a_static_bug_reproduces_from_its_binaries_without_a_gpu(cli: Cli, wheel_cache: Path, tmp_path: Path) -> None:
    # The undefined symbol is visible in the binary: no GPU is needed to see the bad variant link
    # cuMemcpyBatchAsync (CUDA 12.8) directly and the good one not, against a CUDA 12.4 driver.
    r = cli("repro", "--bug", "vllm-undefined-symbol", "--out", tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "vllm-undefined-symbol: reproduced" in r.stdout
    assert "bad variant links cuMemcpyBatchAsync directly" in r.stdout
    assert "good variant links no driver symbol newer than that" in r.stdout
    text = (tmp_path / "vllm-undefined-symbol.md").read_text()
    assert text.startswith("# vllm-undefined-symbol: reproduced")
    assert "the evidence was read from the built binaries" in text


@pytest.mark.network
def test_cuda13_build_bug_reproduces_here(cli: Cli, wheel_cache: Path, tmp_path: Path) -> None:
    r = cli("repro", "--bug", "vllm-cuda13-build", "--out", "reports/repro", cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "vllm-cuda13-build: reproduced" in r.stdout
    report = tmp_path / "reports" / "repro" / "vllm-cuda13-build.md"
    assert [p.name for p in report.parent.iterdir()] == ["vllm-cuda13-build.md"]
    text = report.read_text()
    assert text.startswith("# vllm-cuda13-build: reproduced")
    assert "too many arguments" in text
    assert "vLLM PR 38919" in text
    if not HAS_GPU:
        assert "only the build step ran, for both variants" in text
        assert "-> built libkvswap-proc-address.so" in text
        assert "direct-link (driver family) with CUDA 13.0 headers -> build-error" in text


def test_crashing_cell_report_backtrace_and_standalone_command(cli: Cli, matrix_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = cli("repro", "cu12.9/host/segv", "--matrix", matrix_file, "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr  # the oracle (an expect: override) predicted the crash
    report = out / "cu12.9--host--segv.md"
    assert f"report: {report}" in r.stdout
    text = report.read_text()
    assert "observed **crash:SIGSEGV** (oracle verdict: pass)" in text
    assert "### Python stack (faulthandler)" in text
    assert "Fatal Python error: Segmentation fault" in text
    assert "| driver |" in text
    assert "| python |" in text
    assert "### Native backtrace of the crashing thread" in text
    if shutil.which("gdb") is None:
        if os.environ.get("CUMATRIX_REQUIRE_GDB") == "1":
            pytest.fail("gdb is not installed")
        assert "gdb is not installed: fallback to the faulthandler (Python) stack only" in text
    else:
        assert "Program received signal SIGSEGV" in text
        assert "\n#0  " in text
        assert "info sharedlibrary" in text
        assert "libc.so.6" in text
        assert "(the debugger's run, not kernel-traced: the debugger is the tree's tracer" in text
    command = text.split("### Standalone command", 1)[1].split("```sh\n", 1)[1].split("\n```", 1)[0]
    assert " env " in command
    assert "LD_LIBRARY_PATH=" in command
    assert "string_at(0)" in command
    # It names no path of this machine's cache: the runtime's directory is found as cumatrix finds it.
    from cumatrix.core.cache import cache_location

    assert str(cache_location()) not in command
    assert command.startswith('CUMATRIX_CACHE="${CUMATRIX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cumatrix}"; env ')
    # It starts where the cell started: the matrix file's directory, whichever directory it is run from.
    assert f"; env -C {shlex.quote(str(matrix_file.parent))} " in command
    assert '"$CUMATRIX_CACHE"' in command
    # The standalone command, run by a shell with none of the harness around it (a user's shell:
    # PATH, HOME and, where set, XDG_CACHE_HOME), segfaults again.
    shell = {k: os.environ[k] for k in ("PATH", "HOME", "XDG_CACHE_HOME", "CUMATRIX_CACHE") if k in os.environ}
    again = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120,
                           env=shell, check=False)
    assert again.returncode in (-11, 139), (again.returncode, again.stderr)
    assert "Segmentation fault" in again.stderr

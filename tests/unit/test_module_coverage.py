"""The per-module device-code rule (cumatrix.audit.coverage) on libraries gcc builds here,
whose ``.nv_fatbin`` holds containers written by tests/helpers/fatbin.py: which modules are
dispatch targets (a note), which are general code without the GPU's (an error naming their
kernels, read from the cubin's entry symbols, LZ4 and zstd inflated), and which cannot be
read (a warning that never decides an error alone).
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from cumatrix.audit.static import AuditData, AuditSettings, audit_wheel
from cumatrix.binary.fatbin import cubin_kernels, module_kernels, read_fatbin_modules
from cumatrix.core.model import CudaVersion
from helpers.fatbin import Entry, cubin, library, ptx, sass
from helpers.wheels import write_zip

if shutil.which("gcc") is None:
    pytest.skip("gcc is not on PATH (these tests build real ELF files)", allow_module_level=True)

DATA = AuditData(introductions={}, abi_changes={}, sources=())


def _gate(tmp_path: Path, modules: list[list[Entry]], arch: str,
          min_driver: str = "13.0",
          in_data: list[list[Entry]] | None = None) -> list[tuple[str, str, str, str]]:
    so = library(tmp_path / "lib.so", modules, in_data or ())
    wheel = write_zip(tmp_path / "demo.whl", {"demo/lib.so": so.read_bytes(),
                                              "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\n"})
    from cumatrix.binary.fatbin import parse_arch

    s = AuditSettings(min_driver=CudaVersion.parse(min_driver),
                      arch_list=tuple(parse_arch(a) for a in arch.split()))
    a = audit_wheel(wheel, min_driver=s.min_driver, runtimes=None, strict=False, optional=(),
                    introductions={}, abi_changed={}, settings=s, data=DATA, jobs=1)
    return [(f.severity, f.code, f.subject, f.message) for f in a.findings]


def _codes(found: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str]]:
    return sorted((sev, code, subj) for sev, code, subj, _ in found)


GENERAL = [sass(80, ["gemm_general"]), sass(90, ["gemm_general"]), sass(100, ["gemm_general"])]


def test_cubin_kernels_are_its_entry_symbols() -> None:
    # A __device__ function is a function symbol too, but no entry: it is never launched.
    assert cubin_kernels(cubin(["k1", "_Z2k2Pf"], device_functions=["helper"])) == ("_Z2k2Pf", "k1")
    assert cubin_kernels(cubin([])) == ()


def test_dispatch_targets_are_notes_not_errors(tmp_path: Path) -> None:
    """cuBLAS's shape: general modules for every family, and kernel sets for one GPU family
    (Hopper only, Ada only), arch-specific ones (sm_90a) and older GPUs (sm_50/60/61) that it
    picks at run time.  Before, each module without sm_80 counted toward an error at 8.0."""
    found = _gate(tmp_path, [
        GENERAL,
        [sass(90, ["hopper_only"])],
        [sass(89, ["ada_only"])],
        [sass(90, ["wgmma_kernel"], variant="a")],
        [sass(50, ["maxwell_k"]), sass(60, ["maxwell_k"]), sass(61, ["maxwell_k"])],
        [Entry("ptx", 90, ptx(["forward_compat"]))],
    ], "8.0")
    assert [c for c in _codes(found) if c[0] in ("error", "warning")] == []
    notes = [m for sev, code, subj, m in found if code == "dispatch-target" and subj == "sm_80"]
    assert len(notes) == 1
    assert "5 of 6 kernel modules hold code only for other GPUs" in notes[0]


def test_general_module_without_the_gpu_is_an_error_naming_its_kernels(tmp_path: Path) -> None:
    """The gap the union hid: general kernels with SASS for 7.5, 8.0 and 9.0 and no PTX, next
    to a module carrying compute_90 PTX that 'covers' 10.0 for the file as a whole."""
    found = _gate(tmp_path, [
        [sass(75, ["scale_rows", "add_bias"]), sass(80, ["scale_rows", "add_bias"]),
         sass(90, ["scale_rows", "add_bias"])],
        [sass(75, ["softmax"]), sass(80, ["softmax"]), sass(90, ["softmax"])],
        [sass(80, ["fill"]), Entry("ptx", 90, ptx(["fill"]))],
    ], "10.0")
    errors = [(subj, m) for sev, code, subj, m in found if sev == "error"]
    assert [s for s, _ in errors] == ["sm_100"]
    text = errors[0][1]
    assert "2 of 3 kernel modules" in text
    assert "e.g. kernel add_bias" in text
    assert "add_bias, scale_rows, softmax" in text  # the kernels that would be missing


def test_module_without_a_kernel_never_counts(tmp_path: Path) -> None:
    # The statically linked runtime's own module: code for several families, no kernel; LZ4
    # compressed, as CUDA 12.x writes it (before, unread, it made a warning).
    found = _gate(tmp_path, [[sass(75, [], compress="lz4"), sass(80, [], compress="lz4"),
                              sass(90, [], compress="lz4")],
                             [sass(80, ["k"]), Entry("ptx", 80, ptx(["k"]))]], "10.0")
    assert [c for c in _codes(found) if c[0] in ("error", "warning")] == []


@pytest.mark.parametrize("compress", ["lz4", "zstd"])
def test_compressed_modules_are_read(tmp_path: Path, compress: str) -> None:
    """Before, an LZ4 module's kernels were "not read" and the finding fell to a warning."""
    general = [sass(75, ["packed_kernel"], compress=compress),
               sass(80, ["packed_kernel"], compress=compress),
               sass(90, ["packed_kernel"], compress=compress)]
    so = library(tmp_path / "k.so", [general])
    data = so.read_bytes()
    start = data.find(b"\x50\xed\x55\xba")
    mods = read_fatbin_modules(io.BytesIO(data), start, len(data) - start, strict=False)
    assert all(c.compressed for c in mods[0].codes)
    assert module_kernels(io.BytesIO(data), mods[0]).names == ("packed_kernel",)
    found = _gate(tmp_path, [general, [sass(80, ["k"]), Entry("ptx", 80, ptx(["k"]))]], "10.0")
    assert ("error", "no-device-code", "sm_100") in _codes(found)
    assert any("e.g. kernel packed_kernel" in m for *_, m in found)


def test_unreadable_module_is_named_and_never_decides_an_error_alone(tmp_path: Path) -> None:
    broken = [sass(75, ["k"], compress="lz4", corrupt=True),
              sass(80, ["k"], compress="lz4", corrupt=True),
              sass(90, ["k"], compress="lz4", corrupt=True)]
    found = _gate(tmp_path, [broken, [sass(80, ["k"]), Entry("ptx", 80, ptx(["k"]))]], "10.0")
    assert _codes(found) == [("warning", "no-device-code", "sm_100")]
    message = found[0][3]
    assert "could not be read" in message
    assert "LZ4" in message
    assert "offset 0x" in message


def test_file_of_arch_specific_code_only_is_a_dispatch_target(tmp_path: Path) -> None:
    # vLLM's _flashmla_C: sm_90a SASS only, loaded by the library on Hopper alone.
    found = _gate(tmp_path, [[sass(90, ["flash_mla"], variant="a")]], "8.0 9.0")
    assert _codes(found) == [("note", "dispatch-target", "sm_80")]
    # A file of plain code that misses a GPU is still an error.
    plain = _gate(tmp_path, [[sass(90, ["k"])]], "8.0")
    assert ("error", "no-device-code", "sm_80") in _codes(plain)


def test_module_that_skips_a_gpu_between_its_targets_is_a_dispatch_target(tmp_path: Path) -> None:
    # cuBLAS 13.0's FP8 kernels: sm_89, sm_120f and compute_120 (Ada, consumer Blackwell);
    # Hopper and 10.0 run other kernels. Before, an error at 9.0 and at 10.0.
    found = _gate(tmp_path, [
        [sass(75, ["g"]), sass(80, ["g"]), sass(90, ["g"]), sass(100, ["g"]), sass(120, ["g"])],
        [sass(89, ["fp8_gemm"]), sass(120, ["fp8_gemm"], variant="f"),
         Entry("ptx", 120, ptx(["fp8_gemm"], target="sm_120"))],
    ], "9.0 10.0")
    assert [c for c in _codes(found) if c[0] in ("error", "warning")] == []


def test_file_whose_modules_hold_no_kernel_is_no_error(tmp_path: Path) -> None:
    # cuFFT's libcufftw.so.11: one sm_52 module with no kernel; before, an error at 8.0.
    assert [c for c in _codes(_gate(tmp_path, [[sass(52, [])]], "8.0"))
            if c[0] in ("error", "warning")] == []
    # The same file with a kernel in it is the error it always was.
    assert ("error", "no-device-code", "sm_80") in _codes(_gate(tmp_path, [[sass(52, ["k"])]],
                                                                "8.0"))


def test_kernels_kept_in_data_are_read(tmp_path: Path) -> None:
    """cuFFT 11.4 keeps 24,454 containers in .ldata and loads them itself; its .nv_fatbin
    holds one sm_52 module.  Before, the gate saw only sm_52 and failed it at 8.0."""
    general = [[sass(80, ["fft_kernel"]), sass(90, ["fft_kernel"])]]
    ok = _gate(tmp_path, [[sass(52, ["helper_k"])]], "8.0 9.0", in_data=general)
    assert [c for c in _codes(ok) if c[0] in ("error", "warning")] == []
    # The kernels in the data are judged as any others: none runs on 10.0.
    bad = _gate(tmp_path, [[sass(52, ["helper_k"])]], "10.0", in_data=general)
    assert ("error", "no-device-code", "sm_100") in _codes(bad)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (builds real fat binaries)")
@pytest.mark.parametrize(("mode", "flag"), [("size", 0x8000), ("speed", 0x2000)])
def test_kernels_of_fat_binaries_nvcc_compresses(tmp_path: Path, mode: str, flag: int) -> None:
    """nvcc 13's --compress-mode: zstd (entry flag 0x8000) for size, default and balance, LZ4
    (0x2000) for speed; either way the kernels are read from the cubin's entry symbols."""
    import struct
    import subprocess

    (tmp_path / "k.cu").write_text("__device__ __noinline__ float h(float x) { return x * x; }\n"
                                   "__global__ void scale_rows(float *p) { p[0] = h(p[0]); }\n"
                                   "extern \"C\" __global__ void plain_kernel(int *p) { p[0] = 1; }\n")
    fatbin = tmp_path / "k.fatbin"
    subprocess.run(["nvcc", "-fatbin", f"--compress-mode={mode}", "-Xfatbin", "-compress-all",
                    "-gencode", "arch=compute_80,code=sm_80", "k.cu", "-o", str(fatbin)],
                   cwd=tmp_path, check=True, capture_output=True)
    data = fatbin.read_bytes()
    (module,) = read_fatbin_modules(io.BytesIO(data), 0, len(data))
    flags = struct.unpack_from("<Q", data, 16 + 40)[0]  # the first entry header's flags
    assert flags & flag
    assert module_kernels(io.BytesIO(data), module).names == ("_Z10scale_rowsPf", "plain_kernel")

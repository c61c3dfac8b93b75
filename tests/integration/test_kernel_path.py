"""The copy-kernel path without a GPU: the device source is valid CUDA, proc-address still links no
CUDA library and exports the policy API, the calibration table round-trips into the C choice,
and ``cumatrix calibrate`` refuses cleanly on a host without a GPU."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

import cumatrix
from cumatrix.binary.elf import elf_defined_symbols, elf_needed
from cumatrix.front.calibrate import (
    CalibrationRow,
    Measurement,
    add_calibrate_parser,
    as_calibration_input,
    best_rows,
    table_text,
)
from cumatrix.provision.build import build_variant, reference_dir
from cumatrix.provision.runtimes import headers_for

SRC_ROOT = str(Path(cumatrix.__file__).resolve().parents[1])
POLICY_API = ("kvswap_set_policy", "kvswap_get_policy", "kvswap_swap_blocks_dir", "kvswap_kernel_info",
              "kvswap_calibration_source", "kvswap_calibrated_path", "kvswap_calibrated_streams",
              "kvswap_calibration_sm_budget", "kvswap_set_copy_streams", "kvswap_set_sm_budget",
              "kvswap_get_sm_budget", "kvswap_set_beside_compute_host_path", "kvswap_get_beside_compute_host_path")
PATH = {"batch": 1, "loop": 2, "kernel": 3}
DIR = {"d2h": 1, "h2d": 2, "d2d": 3}


@pytest.fixture(scope="module", params=["12.0", "12.8", "13.0"])
def proc_address(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = build_variant("proc-address", "driver", headers_for(request.param),
                          cache=tmp_path_factory.mktemp("builds"))
    assert built.ok, built.log
    assert built.library is not None, built.log
    return built.library


def _kernel_source(tmp_path: Path) -> Path:
    """The C string of kvswap_kernel.cu.h, printed by a gcc-built program (what NVRTC is given)."""
    prog = tmp_path / "dump.c"
    prog.write_text('#include <stdio.h>\n#include "kvswap_kernel.cu.h"\n'
                    "int main(void) { fputs(kvswap_kernel_source, stdout); return 0; }\n")
    exe = tmp_path / "dump"
    subprocess.run(["gcc", "-Wall", "-Werror", f"-I{reference_dir()}", "-o", str(exe), str(prog)], check=True)
    out = tmp_path / "kvswap_kernel.cu"
    out.write_text(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)
    return out


@pytest.mark.parametrize("param_blocks", [None, 2040])
def test_kernel_source_compiles_to_sm90_machine_code(tmp_path: Path, param_blocks: int | None) -> None:
    # As NVRTC gets it: without the define (drivers or NVRTC before 12.1), and with it (the
    # descriptors-in-parameters kernel, 32664 bytes of parameters).
    nvcc = shutil.which("nvcc")
    if not nvcc:
        if os.environ.get("CUMATRIX_REQUIRE_NVCC") == "1":
            pytest.fail("CUMATRIX_REQUIRE_NVCC=1 but nvcc is not on PATH")
        pytest.skip("nvcc is not on PATH")
    source = _kernel_source(tmp_path)
    cubin = tmp_path / "k.cubin"
    define = [f"-DKVSWAP_PARAM_BLOCKS={param_blocks}"] if param_blocks else []
    proc = subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-Werror", "all-warnings", *define, "-o", str(cubin),
                           str(source)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    with cubin.open("rb") as f:
        names = {sym.name for sec in ELFFile(f).iter_sections() if isinstance(sec, SymbolTableSection)
                 for sym in sec.iter_symbols()}
    assert "kvswap_copy_blocks" in names
    assert ("kvswap_copy_params" in names) == bool(param_blocks), sorted(names)


def test_no_cuda_dt_needed_and_policy_api_exported(proc_address: Path) -> None:
    with proc_address.open("rb") as f:
        elf = ELFFile(f)
        needed = list(elf_needed(elf))
        defined = set(elf_defined_symbols(elf))
    assert not [n for n in needed if n.startswith(("libcuda", "libcudart", "libnvrtc"))], needed
    assert set(POLICY_API) <= defined, sorted(set(POLICY_API) - defined)


_CHILD = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.kvswap_calibration_source.restype = ctypes.c_char_p
lib.kvswap_kernel_info.restype = ctypes.c_char_p
lib.kvswap_calibrated_path.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t]
lib.kvswap_calibrated_streams.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t]
queries = json.loads(sys.argv[2])
print(json.dumps({"policy": lib.kvswap_get_policy(), "bad": lib.kvswap_set_policy(9), "set": lib.kvswap_set_policy(1),
                  "after": lib.kvswap_get_policy(), "source": lib.kvswap_calibration_source().decode(),
                  "info": lib.kvswap_kernel_info().decode(),
                  "picks": [lib.kvswap_calibrated_path(*q) for q in queries],
                  "streams": [lib.kvswap_calibrated_streams(*q) for q in queries],
                  "sm_budget": lib.kvswap_calibration_sm_budget(), "beside_budget": lib.kvswap_get_sm_budget()}))
"""


def _ask(library: Path, queries: list[list[int]], **env: str) -> dict[str, object]:
    # No CUDA call is made: the policy and calibration API work before (and without) a driver.
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("KVSWAP_")} | env
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(library), json.dumps(queries)], capture_output=True,
                          text=True, env=child_env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def test_policy_api_and_built_in_choices(proc_address: Path) -> None:
    r = _ask(proc_address, [[DIR["d2h"], 16384, 1024], [DIR["h2d"], 2 << 20, 1024], [0, 16384, 1024]])
    # The default is beside-compute (5): swaps usually run beside a model's computation.
    assert (r["policy"], r["bad"], r["set"], r["after"]) == (5, -1, 0, 1)
    assert r["source"] == "built-in"
    assert r["picks"] == [PATH["kernel"], PATH["batch"], -1]
    assert str(r["info"]).startswith("not yet tried")
    assert _ask(proc_address, [], KVSWAP_POLICY="copy-engine-only")["policy"] == 1


def test_calibration_file_drives_the_choice(proc_address: Path, tmp_path: Path) -> None:
    def m(direction: str, block: int, blocks: int, policy: str, gbps: float) -> Measurement:
        return Measurement(direction=direction, block_bytes=block, blocks=blocks, policy=policy, path=policy,
                           gbps=gbps, repetitions=10)

    rows = best_rows([m("d2h", 4096, 1024, "loop", 1.0), m("d2h", 4096, 1024, "batch", 5.0),
                      m("d2h", 4096, 1024, "kernel", 30.0), m("d2h", 2 << 20, 1024, "batch", 54.0),
                      m("d2h", 2 << 20, 1024, "kernel", 40.0), m("d2d", 16384, 1024, "loop", 9.0),
                      m("d2d", 16384, 1024, "kernel", None or 0.0)])
    assert rows[0] == CalibrationRow(direction="d2d", block_bytes=16384, blocks=1024, path="loop", gbps=9.0)
    table = tmp_path / "cal.txt"
    table.write_text(table_text(rows) + "garbage line\nd2h 0 1 kernel\n")
    r = _ask(proc_address, [[DIR["d2h"], 4096, 1024], [DIR["d2h"], 8192, 64], [DIR["d2h"], 1 << 20, 1024],
                            [DIR["d2d"], 16384, 32768], [DIR["h2d"], 4096, 1024]], KVSWAP_CALIBRATION=str(table))
    assert r["source"] == str(table)
    # Nearest row of the same direction; a direction the file does not cover keeps the batch copy.
    assert r["picks"] == [PATH["kernel"], PATH["kernel"], PATH["batch"], PATH["loop"], PATH["batch"]]


def test_calibration_records_streams_and_the_sm_budget(proc_address: Path, tmp_path: Path) -> None:
    # Per direction, the copy-engine fan-out the batch was fastest with (even where the kernel won
    # the row), and the SM budget the kernel rows assumed (0: the whole GPU), read back by the C side.
    def m(direction: str, block: int, policy: str, gbps: float, streams: int = 1) -> Measurement:
        return Measurement(direction=direction, block_bytes=block, blocks=1024, policy=policy, path=policy,
                           gbps=gbps, repetitions=10, streams=streams)

    # The copy-engine path as `fastest` takes it stands for `batch`; the forced batch is left out.
    measured = [m("d2h", 16384, "copy-engine-only", 20.0, 1), m("d2h", 16384, "copy-engine-only", 30.0, 4),
                m("d2h", 16384, "kernel", 48.0), m("h2d", 16384, "copy-engine-only", 22.0, 1),
                m("h2d", 16384, "copy-engine-only", 11.0, 4), m("h2d", 16384, "kernel", 12.0),
                m("h2d", 16384, "batch", 99.0, 8)]
    rows = best_rows(as_calibration_input(measured))
    assert [(r.direction, r.path, r.streams) for r in rows] == [("d2h", "kernel", 4), ("h2d", "batch", 1)]
    text = table_text(rows)
    assert "sm-budget 0\n" in text
    table = tmp_path / "cal.txt"
    table.write_text(text)
    r = _ask(proc_address, [[DIR["d2h"], 16384, 1024], [DIR["h2d"], 16384, 1024]], KVSWAP_CALIBRATION=str(table))
    assert (r["picks"], r["streams"], r["sm_budget"]) == ([PATH["kernel"], PATH["batch"]], [4, 1], 0)
    # An explicit setting wins over the table; the beside-compute budget has its own default.
    r = _ask(proc_address, [[DIR["h2d"], 16384, 1024]], KVSWAP_CALIBRATION=str(table), KVSWAP_CE_STREAMS="3",
             KVSWAP_SM_BUDGET="12")
    assert (r["streams"], r["beside_budget"]) == ([3], 12)
    assert _ask(proc_address, [])["beside_budget"] == 32


def test_missing_calibration_file_falls_back_to_built_in(proc_address: Path, tmp_path: Path) -> None:
    r = _ask(proc_address, [[DIR["d2d"], 16384, 32768]], KVSWAP_CALIBRATION=str(tmp_path / "absent.txt"))
    assert r["source"] == "built-in"
    assert r["picks"] == [PATH["kernel"]]


def _has_gpu() -> bool:
    try:
        return ctypes.CDLL("libcuda.so.1").cuInit(0) == 0
    except OSError:
        return False


def test_calibrate_without_gpu_exits_2(tmp_path: Path) -> None:
    if _has_gpu():
        pytest.skip("this host has a GPU: calibrate would measure")
    code = ("import argparse, sys\nfrom cumatrix.front.calibrate import add_calibrate_parser\n"
            "p = argparse.ArgumentParser(prog='cumatrix'); sub = p.add_subparsers()\n"
            "add_calibrate_parser(sub)\nargs = p.parse_args(sys.argv[1:])\nsys.exit(args.func(args))\n")
    out = tmp_path / "cal.txt"
    proc = subprocess.run([sys.executable, "-c", code, "calibrate", "--out", str(out), "--sizes", "4k", "2MiB"],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=SRC_ROOT), timeout=60,
                          check=False)
    assert proc.returncode == 2
    assert "calibrate measures on a GPU" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_calibrate_parser_rejects_bad_sizes() -> None:
    p = argparse.ArgumentParser(prog="cumatrix")
    add_calibrate_parser(p.add_subparsers())
    args = p.parse_args(["calibrate", "--sizes", "4k", "16KiB", "2m", "--directions", "d2h"])
    assert args.sizes == [4096, 16384, 2 << 20]
    assert args.directions == ["d2h"]
    with pytest.raises(SystemExit) as e:
        p.parse_args(["calibrate", "--sizes", "lots"])
    assert e.value.code == 2

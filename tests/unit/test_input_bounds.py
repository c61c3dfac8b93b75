"""Input that cannot hurt: member names that are not UTF-8, numbers out of range, matrices of
too many cells, ELF files declaring too many headers.  Property-based (hypothesis), with the
real command where the contract is an exit code, and real gcc-built ELF files.
"""

from __future__ import annotations

import math
import shutil
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cumatrix.binary.zipnames import bad_utf8_name
from cumatrix.core.errors import ConfigError, RuntimeNotFound
from cumatrix.load import matrix as M

RT = "runtimes: {cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}}\n"


def _not_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


BAD_NAMES = st.binary(min_size=1, max_size=40).filter(
    lambda b: _not_utf8(b) and b"/" not in b and b"\0" not in b)


PREFIX = "pk\u00e9/".encode()


def crafted_wheel(path: Path, raw: bytes) -> Path:
    """A wheel with a member whose name is ``raw``, flagged UTF-8: written under a placeholder
    of the same length, then the bytes swapped in (zipfile writes no such name)."""
    # A directory not in ASCII, so that zipfile sets the UTF-8 flag itself.
    placeholder = ("Q" * len(raw)).encode()
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(PREFIX.decode() + placeholder.decode(), b"x")
        zf.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    data = path.read_bytes()
    path.write_bytes(data.replace(PREFIX + placeholder, PREFIX + raw))
    return path


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=BAD_NAMES)
def test_a_name_that_is_not_utf8_is_found_and_named(tmp_path: Path, raw: bytes) -> None:
    wheel = crafted_wheel(tmp_path / "demo-1.0-py3-none-any.whl", raw)
    with pytest.raises(UnicodeDecodeError):  # what zipfile itself does with it
        zipfile.ZipFile(wheel)
    assert bad_utf8_name(wheel) == PREFIX + raw
    from cumatrix.provision.runtimes import unpack_wheel

    with pytest.raises(RuntimeNotFound, match="not valid UTF-8"):  # a runtime wheel: exit 2
        unpack_wheel(wheel, tmp_path / "out")


def test_the_gate_exits_2_naming_wheel_and_member(tmp_path: Path, cli: Any) -> None:
    wheel = crafted_wheel(tmp_path / "demo-1.0-py3-none-any.whl", b"\xff\xfe")
    proc = cli("gate", wheel, "--static-only", "--out", tmp_path / "o")
    assert proc.returncode == 2, proc.stderr
    assert "demo-1.0-py3-none-any.whl" in proc.stderr
    assert "pk\u00e9/\\xff\\xfe" in proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------------ numbers


@settings(max_examples=80, deadline=None)
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**400, 10**400)))
def test_timeouts_have_a_range(value: float) -> None:
    ok = not isinstance(value, bool) and math.isfinite(float(value)) if abs(value) < 1e308 else False
    ok = ok and 0 < value <= M.TIMEOUT_MAX
    if ok:
        assert M.check_timeout(value) == float(value)
    else:
        with pytest.raises(ConfigError, match="at most 604800"):
            M.check_timeout(value)


@settings(max_examples=30, deadline=None)
@given(value=st.one_of(st.floats(min_value=604800.001, max_value=1e308), st.integers(604801, 10**30)))
def test_a_matrix_timeout_out_of_range_is_exit_2_at_its_place(value: float) -> None:
    text = RT + f"drivers: [host]\ncases:\n  - {{name: a, argv: [true], timeout: {value!r}}}\n"
    with pytest.raises(ConfigError) as e:
        M.loads(text, "m.yaml")
    assert str(e.value).startswith("m.yaml:4:")
    assert "timeout" in str(e.value)


@settings(max_examples=30, deadline=None)
@given(key=st.sampled_from(["blocks", "layers", "repetitions", "warmup"]), value=st.integers(2_000_000, 10**20))
def test_workload_counts_have_a_range(key: str, value: int) -> None:
    w = {"name": "w", "direction": "h2d", "block_bytes": 4096, "blocks": 1, key: value}
    body = ", ".join(f"{k}: {v}" for k, v in w.items())
    text = RT + f"drivers: [host]\nbuilds: ['12.9']\nvariants: [kv-swap]\nworkloads:\n  - {{{body}}}\n"
    with pytest.raises(ConfigError) as e:
        M.loads(text, "m.yaml")
    assert str(e.value).startswith("m.yaml:")
    assert key in str(e.value)


def test_the_cli_timeout_has_the_same_range(tmp_path: Path, cli: Any) -> None:
    m = tmp_path / "m.yaml"
    m.write_text(RT + "drivers: [host]\nprobe: false\ncases: [{name: a, argv: [true]}]\n")
    for value in ("1e308", "604801"):
        proc = cli("run", m, "--out", tmp_path / "o", f"--timeout={value}", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert "at most 604800" in proc.stderr, proc.stderr


# ------------------------------------------------------------------------ cell count


@settings(max_examples=30, deadline=None)
@given(d=st.integers(1, 4), r=st.integers(1, 4), c=st.integers(0, 5), probe=st.booleans())
def test_the_cell_bound_is_the_expansion(d: int, r: int, c: int, probe: bool) -> None:
    if c == 0 and not probe:
        probe = True
    text = ("runtimes:\n" + "".join(f"  r{i}: {{wheel: nvidia-cuda-runtime-cu12==12.9.79}}\n" for i in range(r))
            + "drivers: [" + ", ".join(["host", *(f"emulated-12.{i}" for i in range(d - 1))]) + "]\n"
            + f"probe: {str(probe).lower()}\n"
            + ("cases:\n" + "".join(f"  - {{name: c{i}, argv: [true]}}\n" for i in range(c)) if c else ""))
    m = M.loads(text, "m.yaml")
    assert M.cell_bound(m) == len(list(M.expand(m, apply_exclude=False)))


def test_a_matrix_of_too_many_cells_is_refused_before_expanding(tmp_path: Path, cli: Any) -> None:
    # 10 drivers x 1,000 runtimes x 10,000 cases: 10^8 cells from a few hundred kilobytes.
    text = ("runtimes:\n" + "".join(f"  r{i}: {{wheel: nvidia-cuda-runtime-cu12==12.9.79}}\n" for i in range(1000))
            + "drivers: [host, " + ", ".join(f"emulated-12.{i}" for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)) + "]\nprobe: false\n"
            + "cases:\n" + "".join(f"  - {{name: c{i}, argv: [true]}}\n" for i in range(10000)))
    m = tmp_path / "m.yaml"
    m.write_text(text)
    t0 = time.monotonic()
    proc = cli("validate", m, timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr
    assert "makes 100,000,000 cells" in proc.stderr
    assert f"{M.MAX_CELLS:,}" in proc.stderr
    assert proc.stderr.startswith(f"{m}:") or f"{m}:" in proc.stderr
    assert took < 60  # refused from the counts, never expanded


# ------------------------------------------------------------------------ ELF headers


@pytest.fixture(scope="module")
def elf_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not on PATH (these tests build a real ELF file)")
    d = tmp_path_factory.mktemp("elfbound")
    (d / "m.c").write_text("int f(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", "m.so", "m.c"], cwd=d, check=True, capture_output=True)
    return (d / "m.so").read_bytes()


def extended_shnum(elf: bytes, count: int) -> bytes:
    """``elf`` (64-bit, little-endian) declaring ``count`` section headers through extended
    numbering: ``e_shnum`` 0 and the count in section 0's ``sh_size``."""
    data = bytearray(elf)
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    struct.pack_into("<H", data, 0x3C, 0)
    struct.pack_into("<Q", data, shoff + 0x20, count)
    return bytes(data)


def _audit_codes(wheel: Path) -> list[str]:
    from cumatrix.audit.static import AuditData, AuditSettings, audit_wheel
    from cumatrix.core.model import CudaVersion

    s = AuditSettings(min_driver=CudaVersion(12, 0))
    data = AuditData(introductions={}, abi_changes={}, sources=())
    a = audit_wheel(wheel, min_driver=s.min_driver, runtimes=None, strict=False, optional=(), introductions={},
                    abi_changed={}, settings=s, data=data, jobs=1)
    return [f.code for f in a.findings]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(count=st.integers(65536, 2_000_000))
def test_too_many_section_headers_are_unreadable_at_once(elf_bytes: bytes, tmp_path: Path, count: int) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("demo/m.so", extended_shnum(elf_bytes, count))
        zf.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    t0 = time.monotonic()
    codes = _audit_codes(wheel)
    assert "unreadable-elf" in codes
    assert time.monotonic() - t0 < 5


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shoff=st.integers(1, 2**40))
def test_a_header_table_beyond_the_file_is_unreadable(elf_bytes: bytes, tmp_path: Path, shoff: int) -> None:
    data = bytearray(elf_bytes)
    shnum = struct.unpack_from("<H", data, 0x3C)[0]
    shoff = len(data) + shoff  # past the end, by any amount
    struct.pack_into("<Q", data, 0x28, shoff)
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo/m.so", bytes(data))
        zf.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    assert shnum
    assert "unreadable-elf" in _audit_codes(wheel)


def test_an_intact_elf_is_within_bounds(elf_bytes: bytes, tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo/m.so", elf_bytes)
        zf.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    assert "unreadable-elf" not in _audit_codes(wheel)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))

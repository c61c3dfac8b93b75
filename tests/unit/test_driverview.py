"""What a cell with its own mount namespace is given of an emulated driver, as operations and
mounts (cumatrix.execute.driverview); the end-to-end roads are tests/integration/test_driver_roads.py."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from cumatrix.execute import driverview
from cumatrix.provision import drivers


def _driver(tmp_path: Path) -> tuple[Path, Path]:
    d = tmp_path / "driver"
    d.mkdir()
    (d / "libcuda.so.580.95.05").write_bytes(b"\x7fELF real")
    (d / "libcuda.so.1").symlink_to("libcuda.so.580.95.05")
    (d / "libcuda.so").symlink_to("libcuda.so.1")
    (d / "libcudart.so.13").write_bytes(b"not the driver")
    ip = tmp_path / "ip" / "libcuda.so.1"
    ip.parent.mkdir()
    ip.write_bytes(b"\x7fELF interposer")
    return d / "libcuda.so.1", ip


def test_the_private_path_is_the_interposers_own() -> None:
    source = resources.files("cumatrix").joinpath("data/interposer.c").read_text()
    m = re.search(r'#define PRIVATE_DRIVER_PATH "([^"]+)"', source)
    assert m is not None
    assert m.group(1) == drivers.PRIVATE_DRIVER_PATH


def test_every_name_of_the_driver_is_the_interposer_and_the_real_file_is_private(tmp_path: Path) -> None:
    real, ip = _driver(tmp_path)
    ops = driverview.sandbox_ops(str(ip), str(real), lambda _f: True)
    binds = [(ops[i + 1], ops[i + 2]) for i, op in enumerate(ops) if op == "--ro-bind"]
    file = str(real.resolve())
    assert binds[0] == (file, drivers.PRIVATE_DRIVER_PATH)
    # the three names lead to one file: bound over once, never over a link
    assert [b for b in binds[1:] if b[1].startswith(str(real.parent))] == [(str(ip), file)]
    assert drivers.libcuda_names(real) == ("libcuda.so", "libcuda.so.1", "libcuda.so.580.95.05")
    # what the sandbox does not show is left alone; no interposer, no operations
    unseen = driverview.sandbox_ops(str(ip), str(real), lambda f: not f.startswith(str(tmp_path)))
    assert [unseen[i + 2] for i, op in enumerate(unseen) if op == "--ro-bind"
            and unseen[i + 2].startswith(str(tmp_path))] == []
    assert driverview.sandbox_ops("", str(real), lambda _f: True) == []


def test_a_container_gets_the_interposer_in_place_of_the_mounted_driver(tmp_path: Path) -> None:
    real, ip = _driver(tmp_path)
    libs = (("/host/libcuda.so.580.95.05", "/usr/local/cumatrix-driver/lib/libcuda.so.1"),
            ("/host/libnvidia-ptxjitcompiler.so.580.95.05", "/usr/local/cumatrix-driver/lib/libnvidia-ptxjitcompiler.so.1"))
    mounts = {inside: host for host, inside in driverview.container_mounts(str(ip), str(real), libs)}
    assert mounts[drivers.PRIVATE_DRIVER_PATH] == str(real.resolve())
    assert mounts["/usr/local/cumatrix-driver/lib/libcuda.so.1"] == str(ip)
    assert mounts["/usr/lib/x86_64-linux-gnu/libcuda.so"] == str(ip)
    assert mounts["/usr/local/nvidia/lib64/libcuda.so.580.95.05"] == str(ip)
    assert "/usr/local/cumatrix-driver/lib/libnvidia-ptxjitcompiler.so.1" not in mounts  # the backend's own


def test_records_and_the_header_say_where_emulation_follows_the_search_path_only() -> None:
    ev = driverview.emulation_evidence
    assert ev("emulated-12.8", {"containment": "cgroup-v2"}) == (driverview.SEARCH_PATH_ONLY,)  # --no-sandbox
    assert ev("emulated-12.8", {"sandbox": "none: bubblewrap is not installed"}) == (driverview.SEARCH_PATH_ONLY,)
    assert ev("emulated-12.8", {"sandbox": "namespaces"}) == ()
    assert ev("emulated-12.8", {"sandbox": "bubblewrap"}) == ()
    assert ev("emulated-12.8", {"backend": "docker"}) == ()
    assert ev("host", {}) == ()
    assert ev("emulated-12.8", None) == ()  # decided without a child
    assert driverview.emulation_header("local", "off", True)["driver_emulation"].startswith("search-path-only")
    assert driverview.emulation_header("local", "off", False) == {}
    assert driverview.emulation_header("local", "namespaces", True) == {}


def test_the_ld_caches_directories_are_searched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver the ld cache names (``ldconfig -p``, here a stand-in ldconfig printing a cache
    with a libcuda in a directory of its own) is covered as well as the real driver's own."""
    real, ip = _driver(tmp_path)
    cached = tmp_path / "cached"
    cached.mkdir()
    (cached / "libcuda.so.550.54.14").write_bytes(b"\x7fELF another driver")
    (cached / "libcuda.so.1").symlink_to("libcuda.so.550.54.14")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ldconfig").write_text("#!/bin/sh\necho '2 libs found in cache `/etc/ld.so.cache'\"'\"\n"
                                      f"echo '\tlibcuda.so.1 (libc6,x86-64) => {cached}/libcuda.so.1'\n"
                                      "echo '\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6'\n")
    (bin_dir / "ldconfig").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    driverview.ld_cache_dirs.cache_clear()
    driverview.driver_files.cache_clear()
    try:
        assert driverview.ld_cache_dirs() == (str(cached),)
        files = driverview.driver_files(str(real), str(ip))
    finally:
        driverview.ld_cache_dirs.cache_clear()
        driverview.driver_files.cache_clear()
    assert str(cached / "libcuda.so.550.54.14") in files
    assert str(real.resolve()) in files
    assert str(ip) not in files

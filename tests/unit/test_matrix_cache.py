"""A large matrix, once validated, is read back from the user's cache, and only while it is the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from cumatrix.core.errors import ConfigError
from cumatrix.load import matrix

HEAD = "runtimes:\n  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}\ndrivers: [host]\nprobe: false\ncases:\n"


def _write(path: Path, n: int, argv: str = "[/bin/true]") -> None:
    path.write_text(HEAD + "".join(f"  - {{name: c{i:05d}, argv: {argv}}}\n" for i in range(n)))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("CUMATRIX_CACHE", str(root))
    monkeypatch.delenv("CUMATRIX_NO_MATRIX_CACHE", raising=False)
    monkeypatch.setattr(matrix, "_CACHE", {})
    return root / "matrix"


def _fresh_load(path: Path) -> matrix.Matrix:
    matrix._CACHE.clear()  # a new process: nothing in memory
    return matrix.load(path)


def test_a_large_matrix_is_read_back_the_same(tmp_path: Path, cache: Path) -> None:
    m = tmp_path / "m.yaml"
    _write(m, 2000)
    first = _fresh_load(m)
    assert len(list(cache.glob("*.pickle"))) == 1
    again = _fresh_load(m)
    assert again == first
    assert [c.id for c in matrix.cells(again)] == [c.id for c in matrix.cells(first)]


def test_an_edited_matrix_is_parsed_again(tmp_path: Path, cache: Path) -> None:
    m = tmp_path / "m.yaml"
    _write(m, 2000)
    _fresh_load(m)
    _write(m, 2000, argv="[/bin/false]")
    assert matrix.cells(_fresh_load(m))[0].need_case().argv == ("/bin/false",)
    m.write_text(m.read_text() + "  - {name: c00000, argv: [x]}\n")  # now invalid: a duplicate name
    with pytest.raises(ConfigError, match="c00000"):
        _fresh_load(m)


def test_a_damaged_entry_is_ignored(tmp_path: Path, cache: Path) -> None:
    m = tmp_path / "m.yaml"
    _write(m, 2000)
    first = _fresh_load(m)
    for entry in cache.glob("*.pickle"):
        entry.write_bytes(entry.read_bytes()[:100])
    assert _fresh_load(m) == first


def test_small_matrices_and_the_opt_out_are_not_kept(tmp_path: Path, cache: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    small = tmp_path / "small.yaml"
    _write(small, 3)
    _fresh_load(small)
    monkeypatch.setenv("CUMATRIX_NO_MATRIX_CACHE", "1")
    big = tmp_path / "big.yaml"
    _write(big, 2000)
    _fresh_load(big)
    assert not cache.exists() or not list(cache.glob("*.pickle"))


def test_the_same_file_in_another_directory_starts_its_cases_there(tmp_path: Path, cache: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # One name (./m.yaml), one text, two directories: a moved or copied file, read back from
    # the cache, must not start its cases where the other one's start.
    here, there = tmp_path / "here", tmp_path / "there"
    for d in (here, there):
        d.mkdir()
        _write(d / "m.yaml", 2000)
    monkeypatch.chdir(here)
    assert {c.cwd for c in _fresh_load(Path("m.yaml")).cases} == {str(here)}
    monkeypatch.chdir(there)
    assert {c.cwd for c in _fresh_load(Path("m.yaml")).cases} == {str(there)}
    assert len(list(cache.glob("*.pickle"))) == 2


def test_a_matrix_naming_a_directory_is_parsed_each_time(tmp_path: Path, cache: Path) -> None:
    # A named directory is checked when the file is read: one removed since is a problem then.
    (tmp_path / "tools").mkdir()
    m = tmp_path / "m.yaml"
    m.write_text(HEAD + "".join(f"  - {{name: c{i:05d}, argv: [/bin/true], cwd: tools}}\n" for i in range(2000)))
    assert _fresh_load(m).cases[0].cwd == str(tmp_path / "tools")
    assert not cache.exists() or not list(cache.glob("*.pickle"))
    (tmp_path / "tools").rmdir()
    with pytest.raises(ConfigError, match="'tools' does not exist"):
        _fresh_load(m)

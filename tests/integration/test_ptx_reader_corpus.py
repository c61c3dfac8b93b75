"""One reading of PTX for the emulated driver (C) and for the gate and the oracle (Python).

The interposer's reader (``ptx_text_version`` and the fat binary, host object and library
readers of ``cumatrix/data/interposer.c``) and :func:`cumatrix.binary.ptx.ptx_version` (with
:mod:`cumatrix.binary.fatbin`) are two codings of one rule.  Both are run here on one corpus,
``tests/ptx_corpus`` (each file's expected ``.version`` in its ``expected.json``), and on fat
binaries, objects and archives made from it and by nvcc: where they differ, a cell's refusal
and the gate's ``ptx-too-new`` would disagree.  The C reader runs as the interposer's own
source compiled into a small program (``tests/ptx_corpus/read_ptx.c``); gcc, nvcc and ar are
real.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from cumatrix.binary.fatbin import file_device_code, read_fatbin
from cumatrix.binary.ptx import ptx_version
from helpers.build import run_gcc

CORPUS = Path(__file__).resolve().parents[1] / "ptx_corpus"
EXPECTED: dict[str, str | None] = json.loads((CORPUS / "expected.json").read_text())
CEILING = 800  # the reader program's: the interposer without tables emulates 12.0 (PTX ISA 8.0)

if shutil.which("gcc") is None:
    pytest.skip("gcc is not on PATH (the interposer's reader is compiled with it)", allow_module_level=True)


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = tmp_path_factory.mktemp("reader") / "read_ptx"
    data = Path(str(resources.files("cumatrix").joinpath("data")))
    run_gcc("-Wall", "-Werror", "-I", data, "-o", exe, CORPUS / "read_ptx.c", "-ldl")
    return exe


def _c_read(reader: Path, mode: str, files: list[Path]) -> list[int]:
    proc = subprocess.run([str(reader), mode, *map(str, files)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return [int(line) for line in proc.stdout.split()]


def _as_int(v: tuple[int, int] | None) -> int:
    return v[0] * 100 + v[1] if v else 0


def _expected(name: str) -> int:
    v = EXPECTED[name]
    return _as_int((int(v.split(".")[0]), int(v.split(".")[1]))) if v else 0


def test_the_corpus_is_whole() -> None:
    assert sorted(EXPECTED) == sorted(p.name for p in CORPUS.glob("*.ptx"))
    # what the driver's JIT reads past: a prefix longer than any fixed scan, a decoy in comments
    assert (CORPUS / "long-comment-prefix.ptx").stat().st_size > 70_000
    assert (CORPUS / "byte-order-mark.ptx").read_bytes().startswith(b"\xef\xbb\xbf")


def test_both_readers_read_the_corpus_as_expected(reader: Path) -> None:
    files = sorted(CORPUS.glob("*.ptx"))
    c = dict(zip((f.name for f in files), _c_read(reader, "text", files), strict=True))
    py = {f.name: _as_int(ptx_version(f.read_bytes())) for f in files}
    want = {f.name: _expected(f.name) for f in files}
    assert c == want
    assert py == want


def _fatbin(ptx: bytes, *, header_isa: tuple[int, int], sm: int = 90) -> bytes:
    """A fat binary of one uncompressed PTX entry (the layout of cumatrix.binary.fatbin), whose
    header names ``header_isa``: the readers must read the text, as the JIT does."""
    payload = ptx + b"\0" * (8 - len(ptx) % 8)
    entry = struct.pack("<HHIIIIIIIIIQQQ", 1, 0x101, 64, len(payload), 0, 0, 0,
                        header_isa[0] << 16 | header_isa[1], sm, 0, 0, 0x11, 0, len(payload))
    body = entry + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_both_readers_read_ptx_inside_fat_binaries_alike(reader: Path, tmp_path: Path) -> None:
    files = []
    for name in EXPECTED:
        f = tmp_path / (name + ".fatbin")
        f.write_bytes(_fatbin((CORPUS / name).read_bytes(), header_isa=(8, 0)))
        files.append(f)
    c = _c_read(reader, "link:2", files)
    for f, refused in zip(files, c, strict=True):
        data = f.read_bytes()
        with f.open("rb") as fh:
            [code] = read_fatbin(fh, 0, len(data))
        # the text decides; the header's 8.0 only where the text has no version
        isa = _as_int(code.isa)
        assert isa == (_expected(f.name.removesuffix(".fatbin")) or 800), f.name
        assert refused == (isa if isa > CEILING else 0), f.name


def _nvcc() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed (the CUDA toolkit's compiler makes the objects)")
    return nvcc


def test_both_readers_read_nvcc_objects_and_archives_alike(reader: Path, tmp_path: Path) -> None:
    """PTX-only device code from nvcc, compressed and not, as a fat binary, inside a host
    object's .nv_fatbin (CU_JIT_INPUT_OBJECT) and inside an ar archive (CU_JIT_INPUT_LIBRARY)."""
    nvcc, ar = _nvcc(), shutil.which("ar")
    if ar is None:
        pytest.skip("ar (binutils) is not installed")
    (tmp_path / "k.cu").write_text('extern "C" __global__ void add1(int *x) { x[threadIdx.x] += 1; }\n')
    gencode = ["-gencode", "arch=compute_90,code=compute_90"]
    made = {}
    for tag, flags in (("compressed", []), ("plain", ["--no-compress"])):
        fb, obj, lib = tmp_path / f"{tag}.fatbin", tmp_path / f"{tag}.o", tmp_path / f"lib{tag}.a"
        subprocess.run([nvcc, "-fatbin", *gencode, *flags, "-o", str(fb), str(tmp_path / "k.cu")], check=True,
                       capture_output=True, timeout=300)
        subprocess.run([nvcc, "-c", *gencode, *flags, "-o", str(obj), str(tmp_path / "k.cu")], check=True,
                       capture_output=True, timeout=300)
        subprocess.run([ar, "rcs", str(lib), str(obj)], check=True, capture_output=True, timeout=60)
        made[tag] = (fb, obj, lib)
    for tag, (fb, obj, lib) in made.items():
        data = fb.read_bytes()
        with fb.open("rb") as fh:
            [code] = read_fatbin(fh, 0, len(data))
        assert code.compressed == (tag == "compressed")
        [in_object] = file_device_code(str(obj))
        assert code.isa == in_object.isa == (9, 0), tag
        assert _c_read(reader, "link:2", [fb]) == [900], tag
        assert _c_read(reader, "link:3", [obj]) == [900], tag
        assert _c_read(reader, "link:4", [lib]) == [900], tag
        # a host object is no fat binary, nor a library an object: each is read as its type says
        assert _c_read(reader, "link:4", [obj]) == [0]

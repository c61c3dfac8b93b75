#!/usr/bin/env python3
"""Write src/cumatrix/data/cudart_exports.json: which libcudart exports each runtime entry point.

    python3 scripts/runtime-exports.py [--wheel-dir DIR] [--check]

For every CUDA minor that NVIDIA published a runtime wheel of on PyPI (CUDA 11.7 and 11.8 as
``nvidia-cuda-runtime-cu11``, 12.x as ``nvidia-cuda-runtime-cu12``, 13.x as
``nvidia-cuda-runtime``; the newest release of each minor, listed in ``RELEASES`` below), the
wheel is downloaded once (``pip download --no-deps --only-binary=:all:``, no package code runs)
into ``--wheel-dir`` (default: the cumatrix cache, ``$XDG_CACHE_HOME/cumatrix/wheels``) and the
dynamic symbol table of its ``libcudart.so.N`` is read with pyelftools, straight from the zip.
The file records, per symbol, the first and the last of those libraries that export it: the
static audit dates a runtime (linked, loaded or statically copied) by it, offline.

CUDA 11.0 to 11.6 have no runtime wheel on PyPI (only placeholder packages that refuse to
install), so their exports are not read: a symbol exported by 11.7 is dated "11.7 or older".
``--check`` regenerates into memory and exits 1 when the committed file differs.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "cumatrix" / "data" / "cudart_exports.json"

# The newest release of each minor on PyPI (`pip index versions <name>`).
RELEASES: dict[str, str] = {
    "11.7": "nvidia-cuda-runtime-cu11==11.7.99",
    "11.8": "nvidia-cuda-runtime-cu11==11.8.89",
    "12.0": "nvidia-cuda-runtime-cu12==12.0.146",
    "12.1": "nvidia-cuda-runtime-cu12==12.1.105",
    "12.2": "nvidia-cuda-runtime-cu12==12.2.140",
    "12.3": "nvidia-cuda-runtime-cu12==12.3.101",
    "12.4": "nvidia-cuda-runtime-cu12==12.4.127",
    "12.5": "nvidia-cuda-runtime-cu12==12.5.82",
    "12.6": "nvidia-cuda-runtime-cu12==12.6.77",
    "12.8": "nvidia-cuda-runtime-cu12==12.8.90",
    "12.9": "nvidia-cuda-runtime-cu12==12.9.79",
    "13.0": "nvidia-cuda-runtime==13.0.96",
    "13.1": "nvidia-cuda-runtime==13.1.80",
    "13.2": "nvidia-cuda-runtime==13.2.86",
    "13.3": "nvidia-cuda-runtime==13.3.29",
    "13.4": "nvidia-cuda-runtime==13.4.92",
    "13.5": "nvidia-cuda-runtime==13.5.37",
}

_LIB_RE = re.compile(r"(^|/)lib/libcudart\.so\.\d+(\.\d+)*$")
_NAME_RE = re.compile(r"^_{0,2}cuda\w+$")


def _key(v: str) -> tuple[int, int]:
    major, minor = v.split(".")
    return int(major), int(minor)


def default_wheel_dir() -> Path:
    sys.path.insert(0, str(ROOT / "src"))
    from cumatrix.core.cache import cache_dir

    return cache_dir("wheels")


def fetch(requirement: str, dest: Path) -> Path:
    """The wheel of ``requirement`` in ``dest``, downloaded there first when missing."""
    name, version = requirement.split("==")
    prefix = f"{name.replace('-', '_')}-{version}-"
    for p in sorted(dest.glob("*.whl")):
        if p.name.startswith(prefix) and "x86_64" in p.name:
            return p
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--platform", "manylinux2014_x86_64", "--disable-pip-version-check", "-q",
                    "-d", str(dest), requirement], check=True)
    for p in sorted(dest.glob("*.whl")):
        if p.name.startswith(prefix) and "x86_64" in p.name:
            return p
    raise SystemExit(f"{requirement}: pip downloaded no x86_64 wheel into {dest}")


def exports(wheel: Path) -> tuple[str, str, list[str]]:
    """(member path, DT_SONAME, sorted exported cuda* names) of the wheel's libcudart."""
    with zipfile.ZipFile(wheel) as zf:
        libs = [n for n in zf.namelist() if _LIB_RE.search(n)]
        if len(libs) != 1:
            raise SystemExit(f"{wheel.name}: expected one lib/libcudart.so.N, found {libs}")
        elf = ELFFile(io.BytesIO(zf.read(libs[0])))
    soname = ""
    dyn = elf.get_section_by_name(".dynamic")
    for tag in dyn.iter_tags() if dyn is not None else ():
        if tag.entry.d_tag == "DT_SONAME":
            soname = tag.soname
    dynsym = elf.get_section_by_name(".dynsym")
    assert isinstance(dynsym, SymbolTableSection)
    names = sorted({s.name for s in dynsym.iter_symbols()
                    if s["st_shndx"] != "SHN_UNDEF" and s["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK")
                    and _NAME_RE.match(s.name)})
    return libs[0], soname, names


def build(wheel_dir: Path) -> dict[str, object]:
    versions: dict[str, object] = {}
    first: dict[str, str] = {}
    last: dict[str, str] = {}
    for minor in sorted(RELEASES, key=_key):
        req = RELEASES[minor]
        wheel = fetch(req, wheel_dir)
        member, soname, names = exports(wheel)
        versions[minor] = {"wheel": req, "file": wheel.name,
                           "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
                           "library": member, "soname": soname, "exports": len(names)}
        for n in names:
            first.setdefault(n, minor)
            last[n] = minor
        print(f"{req}: {member} ({soname}): {len(names)} cuda* exports", file=sys.stderr)
    newest = max(RELEASES, key=_key)
    return {
        "schema": 1,
        "source": ("defined global symbols of the .dynsym of libcudart in NVIDIA's runtime wheels "
                   "on PyPI, the newest release of each minor (CUDA 11.0-11.6 have none there); "
                   "written by scripts/runtime-exports.py"),
        "versions": versions,
        # name -> [first, last] minor that exports it; last is omitted while the newest still does.
        "symbols": {n: ([first[n]] if last[n] == newest else [first[n], last[n]])
                    for n in sorted(first)},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel-dir", type=Path, default=None,
                    help="where the runtime wheels are (downloaded there when missing)")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when the committed file differs from a fresh build")
    args = ap.parse_args()
    data = build(args.wheel_dir or default_wheel_dir())
    text = json.dumps(data, indent=1, sort_keys=False) + "\n"
    if args.check:
        same = OUT.is_file() and OUT.read_text() == text
        print(f"{OUT.name}: {'up to date' if same else 'differs from a fresh build'}")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(data['symbols'])} symbols", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Wheels and zip files built by the tests."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path


def make_wheel(out_dir: Path, dist: str, files: Mapping[str, bytes], *, version: str = "1.0",
          tag: str = "py3-none-any", requires: Iterable[str] = (), top_level: bool = False,
          purelib: bool = False, compression: int = zipfile.ZIP_DEFLATED) -> Path:
    """A real wheel ``out_dir/DIST-VERSION-TAG.whl``: ``files``, then ``*.dist-info`` with
    METADATA (``requires`` as its ``Requires-Dist`` lines), WHEEL, top_level.txt if asked for,
    and a RECORD with every member's sha256."""
    out_dir.mkdir(parents=True, exist_ok=True)
    info = f"{dist}-{version}.dist-info"
    members = dict(files)
    members[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode()
    members[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: cumatrix-tests\n"
                                f"Root-Is-Purelib: {str(purelib).lower()}\nTag: {tag}\n").encode()
    if top_level:
        members[f"{info}/top_level.txt"] = f"{dist}\n".encode()
    record = [f"{name},sha256={_digest(data)},{len(data)}" for name, data in members.items()]
    members[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    return write_zip(out_dir / f"{dist}-{version}-{tag}.whl", members, compression)


def write_zip(path: Path, members: Mapping[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> Path:
    """A zip file of ``members`` (name -> content), in their order."""
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


#: The tag of the gate tests' wheels: a CPython 3.11 extension for x86-64 Linux.
CP311_LINUX = "cp311-cp311-linux_x86_64"

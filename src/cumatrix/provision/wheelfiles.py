"""A runtime wheel's archive: read in one pass, and unpacked safely (every member is checked
before anything is written)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cumatrix.binary.zipnames import bad_utf8_name, describe
from cumatrix.core.errors import RuntimeNotFound, UnsafeArchive

#: ``libcudart.so.<major>`` inside a wheel, as NVIDIA lays it out (nvidia/cu13/lib/, nvidia/cuda_runtime/lib/).
CUDART_MEMBER = re.compile(r"(?:^|/)lib/libcudart\.so\.(\d+)(?:\.\d+)*$")

_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}


def _refusal(info: zipfile.ZipInfo, root: Path, seen: set[str]) -> str | None:
    """Why a member must not be unpacked under ``root``, or None when it is a plain file or directory."""
    why = _name_refusal(info.filename) or _type_refusal(info)
    if why is not None:
        return why
    name = info.filename
    key = name.rstrip("/")
    if key in seen:
        return "a second member of the same name (it would overwrite the first)"
    seen.add(key)
    dest = (root / name).resolve()
    if dest != root and not dest.is_relative_to(root):
        return f"a path that resolves outside the target ({dest})"
    return None


def _name_refusal(name: str) -> str | None:
    """Why a member's name alone is refused: empty, NUL, absolute, or climbing out with ``..``."""
    if not name or "\x00" in name:
        return "an empty name or a NUL byte in the name"
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "an absolute path"
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        return "a `..` component (it would land outside the target)"
    return None


def _type_refusal(info: zipfile.ZipInfo) -> str | None:
    """Why a member's file type is refused: anything but a regular file or a directory."""
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind in _KINDS:
        return _KINDS[kind]
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        # zip has no hard-link entry; any other type bits are refused rather than guessed at
        return f"an entry of unknown type {oct(kind)} (only regular files and directories are unpacked)"
    return None


def _unsafe_member(wheel: Path, infos: list[zipfile.ZipInfo]) -> str | None:
    """Why the first unsafe member of ``wheel`` must not be unpacked, or None when every one is safe."""
    root = Path("/nonexistent-root").resolve()
    seen: set[str] = set()
    for info in infos:
        why = _refusal(info, root, seen)
        if why:
            return f"{wheel.name}: refusing to unpack member {info.filename!r}: it is {why}"
    return None


def check_members(wheel: Path) -> None:
    """Raise :class:`UnsafeArchive` naming the wheel and member when any member is unsafe to unpack."""
    with open_wheel(wheel) as zf:
        unsafe = _unsafe_member(wheel, zf.infolist())
    if unsafe:
        raise UnsafeArchive(unsafe)


@dataclass(frozen=True, kw_only=True, slots=True)
class WheelReading:
    """What a wheel's archive says of itself, read in one pass without unpacking it."""

    name: str  # METADATA's Name
    version: str  # METADATA's Version
    cudart: str | None  # the ``lib/libcudart.so.<major>`` member, if any
    unsafe: str | None  # why a member must not be unpacked, if one must not


def read_wheel(wheel: Path) -> WheelReading:
    """``wheel``'s ``*.dist-info/METADATA`` (Name, Version), its libcudart member and the safety of
    its members, from one opening of the archive; a wheel without one METADATA naming both is
    :class:`RuntimeNotFound`."""
    with open_wheel(wheel) as zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        metas = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if len(metas) != 1:
            raise RuntimeNotFound(f"{wheel.name}: {len(metas)} *.dist-info/METADATA files (a wheel has one)")
        text = zf.read(metas[0]).decode("utf-8", "replace")
    import email.parser  # imported where a wheel's METADATA is read: 25 ms every matrix load paid

    msg = email.parser.HeaderParser().parsestr(text)
    name, version = msg.get("Name"), msg.get("Version")
    if not name or not version:
        raise RuntimeNotFound(f"{wheel.name}: METADATA names no Name or Version")
    cudarts = sorted(n for n in names if CUDART_MEMBER.search(n))
    return WheelReading(name=str(name).strip(), version=str(version).strip(), cudart=cudarts[0] if cudarts else None,
                        unsafe=_unsafe_member(wheel, infos))


@contextlib.contextmanager
def open_wheel(wheel: Path) -> Iterator[zipfile.ZipFile]:
    """The wheel as a zip file; a name that is not UTF-8 or an unreadable archive is :class:`RuntimeNotFound`."""
    bad = bad_utf8_name(wheel)
    if bad is not None:
        raise RuntimeNotFound(describe(wheel, bad))
    try:
        with zipfile.ZipFile(wheel) as zf:
            yield zf
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, UnicodeDecodeError) as e:
        raise RuntimeNotFound(f"{wheel.name}: not a readable wheel ({type(e).__name__}: {e})") from e


def unpack_wheel(wheel: Path, target: Path) -> Path:
    """Unpack ``wheel`` into ``target`` (created fresh), refusing any unsafe member first.

    Every member is resolved inside ``target``; absolute names, ``..`` components, links,
    device nodes and duplicate names raise :class:`UnsafeArchive` before anything is written,
    and files are created with ``O_EXCL | O_NOFOLLOW`` so nothing already there is followed.
    """
    root = target.resolve()
    seen: set[str] = set()
    with open_wheel(wheel) as zf:
        infos = zf.infolist()
        for info in infos:
            why = _refusal(info, root, seen)
            if why:
                raise UnsafeArchive(f"{wheel.name}: refusing to unpack member {info.filename!r}: it is {why}")
        root.mkdir(parents=True, exist_ok=False)
        for info in infos:
            dest = root / info.filename
            if info.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            with zf.open(info) as src, os.fdopen(fd, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return root



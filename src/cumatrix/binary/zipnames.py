"""Member names of a zip archive checked before :mod:`zipfile` decodes them.

A name flagged UTF-8 (general purpose bit 11) that is not valid UTF-8 makes ``zipfile.ZipFile``
raise ``UnicodeDecodeError`` while it reads the central directory, before any caller can say
which member it was.  :func:`bad_utf8_name` reads the central directory itself and names it.
"""

from __future__ import annotations

import struct
from pathlib import Path

_EOCD = b"PK\x05\x06"
_CDH = b"PK\x01\x02"
_UTF8_FLAG = 0x800
#: The end-of-central-directory record and the longest comment it may carry.
_TAIL = 22 + 0xFFFF


def bad_utf8_name(path: Path) -> bytes | None:
    """The first member name of ``path`` flagged UTF-8 that does not decode, or None.

    None as well where the central directory cannot be read here (zip64, damage): then
    :mod:`zipfile` reports what is wrong in its own words.
    """
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - _TAIL))
            tail = f.read()
            at = tail.rfind(_EOCD)
            if at < 0 or len(tail) - at < 22:
                return None
            cd_size, cd_offset = struct.unpack_from("<II", tail, at + 12)
            if cd_offset == 0xFFFFFFFF or cd_offset + cd_size > size:
                return None
            f.seek(cd_offset)
            cd = f.read(cd_size)
    except OSError:
        return None
    pos = 0
    while pos + 46 <= len(cd) and cd[pos:pos + 4] == _CDH:
        flags = struct.unpack_from("<H", cd, pos + 8)[0]
        n, m, k = struct.unpack_from("<HHH", cd, pos + 28)
        name = cd[pos + 46: pos + 46 + n]
        if flags & _UTF8_FLAG:
            try:
                name.decode("utf-8")
            except UnicodeDecodeError:
                return name
        pos += 46 + n + m + k
    return None


def describe(path: Path, name: bytes) -> str:
    """The message for a member name that is not valid UTF-8."""
    shown = name.decode("utf-8", "backslashreplace")
    return (f"{path}: member '{shown}' has a name flagged UTF-8 that is not valid UTF-8 "
            f"(bytes {name.hex(' ')}); the archive is damaged or crafted")

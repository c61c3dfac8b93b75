"""PTX ISA versions: the one table of which CUDA release (and so which driver) first accepts
each, and the ``.version`` directive read from PTX text as the driver's JIT reads it.

The table is data (``cumatrix/data/ptx_isa.json``, from NVIDIA's PTX ISA release notes), read
once.  The gate's PTX check (:mod:`cumatrix.audit.checks`), the emulated driver's JIT ceiling
(:mod:`cumatrix.provision.drivers`, compiled into the interposer) and the oracle's
explanations all read it here, so they cannot disagree.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources

__all__ = ["DATA_FILE", "isa_table", "ptx_ceiling", "ptx_isa_cuda", "ptx_version"]

DATA_FILE = "data/ptx_isa.json"

# Reading PTX as the driver's JIT reads it ("PTX ISA", "Syntax": comments, and "PTX Module
# Directives: .version").  The emulated driver's C reader (cumatrix/data/interposer.c,
# ptx_text_version) follows the same rule, and both are tested against one corpus
# (tests/ptx_corpus).
_BOM = b"\xef\xbb\xbf"
_SPACE = re.compile(rb"[ \t\r\n\v\f]*")
_NAME = re.compile(rb"[A-Za-z0-9_$]*")
_DIGITS = re.compile(rb"[0-9]+")
# A token that is no directive: up to whitespace, a string, a separator or a comment.
_TOKEN = re.compile(rb'(?:[^ \t\r\n\v\f";{},/]|/(?![/*]))+')


def _pair(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


@cache
def isa_table() -> dict[tuple[int, int], tuple[int, int]]:
    """PTX ISA version -> the CUDA release (major, minor) that introduced it."""
    data = json.loads(resources.files("cumatrix").joinpath(DATA_FILE).read_text())
    return {_pair(isa): _pair(cuda) for isa, cuda in data["isa_first_cuda"].items()}


def ptx_isa_cuda(isa: tuple[int, int]) -> tuple[int, int] | None:
    """The CUDA version (major, minor) whose driver first accepts PTX ISA ``isa``; ``None``
    when the version is newer than the table (then no known driver accepts it)."""
    return isa_table().get(isa)


def ptx_ceiling(driver: int) -> tuple[int, int] | None:
    """The newest PTX ISA a driver of CUDA version ``driver`` (``12080``) compiles; ``None``
    for a driver older than the table."""
    major, minor = driver // 1000, (driver % 1000) // 10
    known = [isa for isa, cuda in isa_table().items() if cuda <= (major, minor)]
    return max(known) if known else None


def _skip_blank(text: bytes, i: int, n: int) -> int:
    """Past whitespace and comments (``//`` to the line's end, ``/* */`` across lines) from
    ``i``; ``n`` where a block comment never ends."""
    while True:
        m = _SPACE.match(text, i, n)
        i = m.end() if m else i
        if i + 2 > n or text[i] != 0x2F or text[i + 1] not in b"/*":
            return i
        if text[i + 1] == 0x2F:
            nl = text.find(b"\n", i, n)
            i = n if nl < 0 else nl
            continue
        close = text.find(b"*/", i + 2, n)
        if close < 0:
            return n
        i = close + 2


def _version_after(text: bytes, i: int, n: int) -> tuple[int, int] | None:
    """``MAJOR.MINOR`` after a ``.version`` that ends at ``i`` (blanks and comments first)."""
    k = _skip_blank(text, i, n)
    major = _DIGITS.match(text, k, n)
    if k == i or major is None:
        return None
    minor = _DIGITS.match(text, major.end() + 1, n) if text[major.end():major.end() + 1] == b"." else None
    if minor is None:
        return None
    # the C reader keeps four digits of each
    return int(major.group()[:4]), int(minor.group()[:4])


def _after_string(text: bytes, i: int, n: int) -> int:
    """Where the string opening at ``text[i]`` (a ``"``) ends, past its closing quote (a
    backslash escapes the byte after it); -1 where none closes it before ``n``."""
    i += 1
    while i < n and text[i] != 0x22:
        i += 2 if text[i] == 0x5C and i + 1 < n else 1
    return i + 1 if i < n else -1


def _bounds(text: bytes) -> tuple[int, int]:
    """Where PTX ``text`` starts (past a UTF-8 byte-order mark) and ends (at its first NUL)."""
    nul = text.find(b"\0")
    n = len(text) if nul < 0 else nul
    return (len(_BOM) if text.startswith(_BOM) and n >= len(_BOM) else 0), n


def _directive_version(text: bytes, i: int, n: int) -> tuple[int, int] | None:
    """The version the directive at ``text[i]`` (a ``.``) gives: ``.version``'s, else none."""
    name = _NAME.match(text, i + 1, n)
    end = name.end() if name else i + 1
    return _version_after(text, end, n) if text[i + 1:end] == b"version" else None


def ptx_version(text: bytes) -> tuple[int, int] | None:
    """The ``.version`` of PTX source ``text``, read as the driver's JIT reads it, or ``None``.

    An optional UTF-8 byte-order mark, whitespace and comments (``//``, ``/* */`` across lines)
    come before it, in any amount (nvcc's PTX begins with comment lines); tokens that are no
    directive are skipped; the first directive decides: ``.version X.Y`` is the version, any
    other means there is none.  A ``.version`` in a comment or a string is not the version.
    The text ends at its first NUL (PTX handed to the driver is a C string)."""
    i, n = _bounds(text)
    while True:
        i = _skip_blank(text, i, n)
        if i >= n:
            return None
        c = text[i]
        if c == 0x22:  # a string (a .file name): nothing in it counts
            i = _after_string(text, i, n)
            if i < 0:
                return None
            continue
        if c == 0x2E:  # the first directive decides
            return _directive_version(text, i, n)
        tok = _TOKEN.match(text, i, n)
        i = tok.end() if tok else i + 1

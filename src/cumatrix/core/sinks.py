"""The terminal as a sink of stored data: what ``diff``, ``history``, ``merge``, ``report``,
``repro`` and ``submit`` print comes from records a host directory, a history database or a
child wrote, and any of those may hold escape sequences.

:func:`terminal` is the one function that makes text fit for a terminal: every escape
sequence (CSI, OSC such as OSC 52's clipboard write, DCS/APC/PM/SOS strings, two-byte
escapes) is removed, and every other control character but newline and tab is shown as
``\\xNN`` (a bare carriage return would let a line overwrite the one before it).  These
commands print no colours of their own, so nothing of that kind is kept.  :func:`guarded`
puts it between a command and its standard output and error.  The Markdown sink is
:mod:`cumatrix.report.text` (``md_inline``, ``md_fenced``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

# ESC [ ... final (CSI); ESC ] ... BEL or ST (OSC); ESC P/X/^/_ ... ST (DCS, SOS, PM, APC);
# a string whose terminator never comes runs to the end; ESC and one byte; the 8-bit CSI.
_ESCAPES_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
                         r"|\x1b[ -~]?|\x9b[0-?]*[ -/]*[@-~]?")
# C0 but tab and newline, DEL, C1 (8-bit forms some terminals obey).
_CONTROLS_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal(text: str) -> str:
    """``text`` fit for a terminal: escape sequences removed, other controls shown as ``\\xNN``."""
    return _CONTROLS_RE.sub(lambda m: f"\\x{ord(m.group(0)):02x}", _ESCAPES_RE.sub("", text))


def one_line(text: str) -> str:
    """``text`` as one line of a terminal: as :func:`terminal`, and a newline or a tab shown as
    ``\\x0a``/``\\x09`` too (a name from elsewhere, a cell id, must not start a line of its own)."""
    return _LINE_CONTROLS_RE.sub(lambda m: f"\\x{ord(m.group(0)):02x}", _ESCAPES_RE.sub("", text))


_LINE_CONTROLS_RE = re.compile("[\x00-\x1f\x7f-\x9f]")


class TerminalStream:
    """A text stream that writes what it is given through :func:`terminal` (the wrapped
    stream's other attributes pass through)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(terminal(text))
        return len(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


@contextmanager
def guarded() -> Iterator[None]:
    """Standard output and error pass through :func:`terminal` while the block runs."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = TerminalStream(out), TerminalStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err

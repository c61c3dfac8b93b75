"""A byte range of a seekable stream read in bounded chunks, for scans over large files."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

__all__ = ["range_chunks"]


def range_chunks(stream: IO[bytes], start: int, size: int, step: int, *,
                 overlap: int = 0) -> Iterator[tuple[int, bytes]]:
    """``(position in the range, chunk)`` of ``stream[start:start + size]``, at most ``step``
    bytes a chunk; each after the one before less ``overlap`` bytes (read again, so a pattern
    cut by a chunk's end is whole in the next), one byte on at the least.  Ends early where
    the stream does."""
    pos = 0
    while pos < size:
        stream.seek(start + pos)
        chunk = stream.read(min(step, size - pos))
        if not chunk:
            return
        yield pos, chunk
        pos += max(len(chunk) - overlap, 1)

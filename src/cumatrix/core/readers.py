"""The reading ends the harness shares between stages: a channel's bounded buffer, and the
base of a read-only, seekable raw stream."""

from __future__ import annotations

import io
import os

__all__ = ["BoundedChannel", "SeekableReader"]


class BoundedChannel:
    """The harness's end of a channel a process it spawns writes to: the read end, the
    harness's copy of the write end until the spawn, and what was read, up to ``limit`` bytes
    (past it nothing more is kept and ``overflow`` says so)."""

    limit: int = 0  #: set by each kind of channel: the most one record may hold

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd
        self.buffer = bytearray()
        self.overflow = False

    def after_spawn(self) -> None:
        """Close the harness's copy of the write end (the spawned process holds its own)."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def feed(self, chunk: bytes) -> None:
        """Keep ``chunk`` read from the channel, unless it would pass the limit."""
        if len(self.buffer) + len(chunk) > self.limit:
            self.overflow = True
            return
        self.buffer += chunk

    def close(self) -> None:
        """Close both ends still open."""
        self.after_spawn()
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1


class SeekableReader(io.RawIOBase):
    """A raw stream that reads and seeks (and never writes)."""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

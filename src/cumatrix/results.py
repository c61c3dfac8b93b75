"""The results store: ``results.jsonl``, one record a line, appended and flushed per cell.

A killed run loses nothing it finished; ``--resume`` reads the finished ids back.  A
line cut mid-write (the harness killed during a write) is ignored on reading.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

JSONL = "results.jsonl"


def dumps(record: dict[str, Any]) -> str:
    """The one JSON encoding of every record and report: stable, sorted, one line."""
    return json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


class Store:
    def __init__(self, out_dir: Path) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / JSONL

    def append(self, record: dict[str, Any]) -> None:
        line = (dumps(record) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # A previous writer killed mid-line leaves no newline; start on a fresh line.
            size = os.fstat(fd).st_size
            if size:
                with open(self.path, "rb") as f:
                    f.seek(size - 1)
                    if f.read(1) != b"\n":
                        line = b"\n" + line
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def records(self) -> Iterator[dict[str, Any]]:
        yield from read_records(self.path)

    def finished_ids(self) -> set[str]:
        return {str(r["id"]) for r in self.records() if r.get("type") == "cell"}


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with open(path, "rb") as f:
        for raw in f:
            raw = raw.strip()
            if not raw:
                continue
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                continue  # a line cut mid-write
            if isinstance(rec, dict):
                yield rec

"""The state of a process, from ``/proc``."""

from __future__ import annotations

import time
from pathlib import Path


def state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``R``, ``S``, ``Z`` ...), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper has ended)."""
    return state(pid) not in (None, "Z", "X")


def gone(pid: int, within: float = 5.0) -> bool:
    """True once ``pid`` no longer runs within ``within`` seconds (a zombie counts as gone)."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False

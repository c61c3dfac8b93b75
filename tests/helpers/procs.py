"""The state of a process, from ``/proc``."""

from __future__ import annotations

import subprocess
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


#: Where the kernel puts a process that opens a FIFO with no partner (``fifo_open``).
FIFO_WAIT = ("wait_for_partner", "fifo_open")


def waiting_on_a_fifo(pid: int) -> bool:
    """Whether a thread of ``pid`` sits in a FIFO's open, waiting for the other end."""
    try:
        tids = [p.name for p in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return False
    for tid in tids:
        try:
            if Path(f"/proc/{pid}/task/{tid}/wchan").read_text().strip() in FIFO_WAIT:
                return True
        except OSError:
            continue
    return False


def run_unstalled(argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float) -> tuple[int, str, bool]:
    """Run ``argv`` (a harness) to its end: (exit status, stderr, whether it ever sat in a FIFO's
    open).  A harness seen waiting on a FIFO is killed at once: that wait has no end, and how
    long a loaded machine takes to run the rest is no measure of it."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stalled = False
    end = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < end:
        if waiting_on_a_fifo(proc.pid):
            # Seen twice, 0.2 s apart: a thread passing through the open is not a wait.
            time.sleep(0.2)
            if waiting_on_a_fifo(proc.pid):
                stalled = True
                break
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
    _, err = proc.communicate()
    return proc.returncode, err, stalled

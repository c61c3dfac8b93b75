"""The live line printed per finished cell: count, percentage, ETA, status, id, outcome."""

from __future__ import annotations

from cumatrix.report.text import clean


def _duration(seconds: float) -> str:
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def progress_line(done: int, total: int, elapsed_s: float, cell_id: str, status: str, outcome: str) -> str:
    """One line per finished cell, e.g.
    ``[ 12/120  10%] ETA 3m05s  PASS  cu12.9/host/driver-dispatch/h13.0/kv-16k-d2h  crash:SIGSEGV``.

    The ETA assumes the remaining cells take as long on average as the finished ones;
    it is ``--`` before the first cell finishes.
    """
    width = len(str(max(total, 0)))
    pct = f"{100 * done // total:3d}%" if total > 0 else "  -%"
    eta = _duration(elapsed_s / done * (total - done)) if done > 0 and total >= done else "--"
    return (
        f"[{done:>{width}}/{total} {pct}] ETA {eta:>6}  {clean(status).upper():<4}  "
        f"{clean(cell_id)}  {clean(outcome)}"
    )

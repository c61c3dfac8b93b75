"""Start-up without the cyclic garbage collector.

Reading a matrix of 10,000 cases and collecting its cells makes hundreds of thousands of
objects that live to the end of the run, and next to no cyclic garbage; yet every collection
that their growing number sets off walks them all again (a sixth of a run's start-up at
10,000 cells).  The collector is paused while they are made; once the cells are collected,
what exists is frozen (:func:`gc.freeze`: never walked again) and the collector runs as
before for what the cells make.  When the run ends, what was frozen is handed back to the
collector (:func:`end`): the run's items hold reference cycles, and the reports written after
them must not be written on top of them.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


class _State:
    """Whether start-up holds the collector, and whether it froze what start-up made."""

    held = False
    frozen = False


_state = _State()


@contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection inside the block (the collector's state is restored after it)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def hold() -> None:
    """Pause the collector for a run's start-up, until :func:`release`."""
    if gc.isenabled():
        gc.disable()
        _state.held = True


def release() -> None:
    """End :func:`hold`: freeze what start-up made, and collect again from here on."""
    if _state.held:
        _state.held = False
        _state.frozen = True
        gc.freeze()
        gc.enable()


def end() -> None:
    """After the run: :func:`release` if still held, and give what it froze back to the collector."""
    release()
    if _state.frozen:
        _state.frozen = False
        gc.unfreeze()

"""Why a cell runs no child: facts of provisioning (and of a front end's own preparation).

Provisioning (and the gate's install of a wheel into a cell) finds facts: the runtime is an
image and the backend is not docker, the variant does not compile, the install failed.  It
names no outcome: :func:`cumatrix.judge.classify.not_run` turns each fact into the outcome
word of the README, so one stage alone decides what a cell's outcome is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: What stopped a cell before its child: each has exactly one outcome (judge.classify.not_run).
NotRunWhy = Literal[
    "needs-docker",  # the runtime is a container image; the backend is not docker
    "no-driver",  # the cell needs an NVIDIA driver and the host has none
    "no-compiler",  # the cell's variant or interposer is compiled here, and there is no gcc
    "build-failed",  # the cell's variant does not compile against its headers
    "emulation-impossible",  # an emulated driver newer than the real one
    "install-failed",  # the wheel under test did not install into the cell (exit_status: the installer's)
    "wheel-not-for-this-python",  # the wheel under test is for another interpreter
    "unsupported-pairing",  # a pairing NVIDIA does not support (the gate does not run it)
    "harness-failed",  # the harness could not prepare the cell (its own failure, not the cell's)
]


@dataclass(frozen=True, kw_only=True, slots=True)
class NotRun:
    """A cell decided before any child ran: what decided it, in words for the record."""

    why: NotRunWhy
    detail: str = ""
    #: The exit status of the step that failed (an installer's), where there was one.
    exit_status: int | None = None

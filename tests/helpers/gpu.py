"""Whether this machine has a usable NVIDIA GPU."""

from __future__ import annotations

import ctypes


def gpu_reason() -> str | None:
    """None where the driver initialises; otherwise why not (for the skip message)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return f"no NVIDIA driver: {e}"
    rc = lib.cuInit(0)
    return None if rc == 0 else f"cuInit failed with CUresult {rc}"

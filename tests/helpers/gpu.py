"""Whether this machine has a usable NVIDIA GPU: the harness's own answer, for the GPU tests' skip."""

from __future__ import annotations

from cumatrix.host.fingerprint import gpu_absent_reason as gpu_reason

__all__ = ["gpu_reason"]

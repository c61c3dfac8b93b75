"""NVIDIA's compatibility rules as typed data, read once from ``cumatrix/data/nvidia.json``.

The file is the knowledge (minimum driver per toolkit, error names, the batch copy's
introduction and ABI change: docs/facts.md sections 1, 3 and 7); this module checks it on
load and hands the rest of the package frozen values, never a raw dict.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

from cumatrix.core.model import CudaVersion

DATA_FILE = "data/nvidia.json"
SCHEMA = 1


class RulesError(ValueError):
    """The packaged rules file is malformed (a packaging bug, not user input)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchCopy:
    """The batched copy: when it appeared and when its ABI changed (CUDA's encoding)."""

    runtime_symbol: str
    driver_symbol: str
    introduced: int
    abi_change: int


@dataclass(frozen=True, kw_only=True, slots=True)
class NvidiaRules:
    """What :mod:`cumatrix.predict.oracle` and the gate know of NVIDIA's rules."""

    #: Minimum Linux driver per toolkit version, oldest first: (toolkit, branch, as NVIDIA writes it).
    min_driver: tuple[tuple[CudaVersion, tuple[int, ...], str], ...]
    errors: Mapping[int, str]
    batch: BatchCopy

    def error_name(self, code: int) -> str:
        return self.errors.get(code, f"error {code}")

    def cuda_for_driver(self, driver: str) -> CudaVersion:
        """The newest CUDA a Linux driver branch supports (``580.159`` -> 13.0)."""
        branch = driver_branch(driver)
        fits = [v for v, floor, _ in self.min_driver if branch >= floor]
        if not fits:
            raise ValueError(f"driver {driver} is older than any CUDA 12 driver ({self.min_driver[0][2]})")
        return max(fits)

    def min_driver_for(self, cuda: CudaVersion) -> str | None:
        """The oldest Linux driver of toolkit ``cuda`` (or of the newest older one listed)."""
        older = [(v, text) for v, _, text in self.min_driver if v <= cuda]
        return max(older)[1] if older else None


def driver_branch(text: str) -> tuple[int, ...]:
    """``"580.65.06"`` -> ``(580, 65, 6)``."""
    try:
        return tuple(int(x) for x in text.strip().split("."))
    except ValueError as e:
        raise ValueError(f"not a driver version: {text!r} (want e.g. 580.65.06)") from e


def _need(data: Mapping[str, object], key: str) -> Mapping[str, object]:
    value = data.get(key)
    if not isinstance(value, Mapping):
        raise RulesError(f"cumatrix/{DATA_FILE}: {key!r} must be an object")
    return value


def parse_rules(data: object) -> NvidiaRules:
    """Check and type the rules file's content."""
    if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
        raise RulesError(f"cumatrix/{DATA_FILE}: unsupported schema (this cumatrix reads {SCHEMA})")
    try:
        table = sorted((CudaVersion.parse(k), driver_branch(str(v)), str(v)) for k, v in _need(data, "min_driver").items())
        errors = {int(k): str(v) for k, v in _need(data, "errors").items()}
        b = _need(data, "batch_copy")
        batch = BatchCopy(runtime_symbol=str(b["runtime_symbol"]), driver_symbol=str(b["driver_symbol"]),
                          introduced=int(str(b["introduced"])), abi_change=int(str(b["abi_change"])))
    except (KeyError, ValueError) as e:
        raise RulesError(f"cumatrix/{DATA_FILE}: {e}") from e
    if not table:
        raise RulesError(f"cumatrix/{DATA_FILE}: 'min_driver' is empty")
    return NvidiaRules(min_driver=tuple(table), errors=errors, batch=batch)


@cache
def rules() -> NvidiaRules:
    """The packaged rules (read and checked once)."""
    return parse_rules(json.loads(resources.files("cumatrix").joinpath(DATA_FILE).read_text()))


# --------------------------------------------------------------------------- the rules, each once


def cuda_major(version: int) -> int:
    """The CUDA major of a version in CUDA's encoding (``12080`` -> 12)."""
    return version // 1000


def major_newer_than_driver(runtime_version: int, driver_version: int) -> bool:
    """NVIDIA's rule that a runtime needs a driver of its own CUDA major or newer.

    A runtime of a newer major than the driver fails its first call with
    ``cudaErrorInsufficientDriver`` (35); minor-version compatibility covers every runtime of
    the driver's major or an older one.  The oracle, the program rule and the gate's skipped
    pairings all ask this one function.
    """
    return cuda_major(runtime_version) > cuda_major(driver_version)


def emulation_newer_than_host(emulated: int, real_driver: int) -> bool:
    """An interposer only hides what the real driver has: it cannot emulate a newer one."""
    return emulated > real_driver


def interposer_detected(runtime_version: int, effective_driver: int, real_driver: int | None) -> bool:
    """A CUDA 12 runtime notices the interposer (error 103) when the emulated version differs
    from the real driver's (docs/facts.md section 4); a CUDA 13 runtime does not."""
    return cuda_major(runtime_version) == 12 and effective_driver != real_driver

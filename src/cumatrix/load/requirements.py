"""The text of runtime requirements in a matrix file: pinned wheels and environment requirements.

Pure parsing, shared by the loader (which checks a matrix) and provisioning (which fetches): a
run reads each ``wheel:`` runtime's pin once (:func:`wheel_pins`) before any is provisioned.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from cumatrix.core.model import CudaVersion, Runtime

#: Requirements of the runtimes measured in docs/facts.md; ``headers X.Y`` picks from here.
KNOWN_WHEELS: dict[str, str] = {
    "12.0": "nvidia-cuda-runtime-cu12==12.0.146",
    "12.4": "nvidia-cuda-runtime-cu12==12.4.127",
    "12.8": "nvidia-cuda-runtime-cu12==12.8.90",
    "12.9": "nvidia-cuda-runtime-cu12==12.9.79",
    "13.0": "nvidia-cuda-runtime==13.0.96",
    "13.5": "nvidia-cuda-runtime==13.5.37",
}


#: The longest part of a pinned version cumatrix reads (NVIDIA's are 1 to 3 digits; a date, 8).
MAX_VERSION_DIGITS = 12


@cache
def cuda_releases() -> tuple[str, ...]:
    """The CUDA releases cumatrix knows, oldest first: those of NVIDIA's driver table
    (``data/nvidia.json``'s ``min_driver``, with its sources) and those whose runtime wheels it
    knows.  ``emulated-X.Y`` must name one of them."""
    table = json.loads(resources.files("cumatrix").joinpath("data", "nvidia.json").read_text(encoding="utf-8"))
    versions = {*table["min_driver"], *KNOWN_WHEELS}
    return tuple(sorted(versions, key=lambda v: tuple(int(p) for p in v.split("."))))


def driver_releases() -> tuple[str, ...]:
    """Every CUDA release a driver can be named by (``--min-driver``), oldest first:
    :func:`cuda_releases` and the releases of NVIDIA's PTX ISA table (``data/ptx_isa.json``:
    CUDA 9.0 on), less 12.7, which that table names for PTX ISA 8.6 although no CUDA 12.7
    toolkit or driver was released (12.6 was followed by 12.8)."""
    table = json.loads(resources.files("cumatrix").joinpath("data", "ptx_isa.json").read_text(encoding="utf-8"))
    versions = {*cuda_releases(), *table["isa_first_cuda"].values()} - {"12.7"}
    return tuple(sorted(versions, key=lambda v: tuple(int(p) for p in v.split("."))))


def _requirement(text: str) -> Requirement | None:
    """``text`` as PEP 508 reads it (``packaging.requirements``), or None where it is not one."""
    try:
        return Requirement(text.strip())
    except InvalidRequirement:
        return None


def parse_requirement(text: str) -> tuple[str, str]:
    """``name==version`` -> (name, version); a pinned version is required (no extras, markers,
    URLs or other specifiers: the matrix names one wheel)."""
    req = _requirement(text)
    version = _pinned_version(req) if req is not None else None
    if req is None or version is None:
        raise ValueError(
            f"not a pinned requirement: {text!r} (want NAME==VERSION, e.g. nvidia-cuda-runtime-cu12==12.9.79)"
        )
    # Every part of a version is read as a number later (sorting, the headers' X.Y): a part of
    # thousands of digits is past what Python converts, and no release has one.
    if any(len(part) > MAX_VERSION_DIGITS for part in version.replace("-", ".").replace("+", ".").split(".")):
        raise ValueError(f"{text[:60]!r}{'...' if len(text) > 60 else ''}: a version part longer than "
                         f"{MAX_VERSION_DIGITS} characters is no release's (want NAME==VERSION, e.g. "
                         "nvidia-cuda-runtime-cu12==12.9.79)")
    return req.name, version


def _pinned_version(req: Requirement) -> str | None:
    """The one exact version ``req`` pins (``==``, no wildcard), or None where it names more
    than one wheel or says more than a name and a version (a URL, extras, a marker)."""
    if req.url or req.extras or req.marker:
        return None
    pins = list(req.specifier)
    if len(pins) != 1 or pins[0].operator != "==" or "*" in pins[0].version:
        return None
    return pins[0].version


@dataclass(frozen=True, kw_only=True, slots=True)
class WheelPin:
    """A ``wheel:`` runtime's requirement, read once: the one wheel it names."""

    requirement: str  # as the matrix writes it (what messages and ``pip download`` are given)
    name: str
    version: str


def wheel_pin(requirement: str) -> WheelPin:
    """``requirement`` read as :func:`parse_requirement` reads it (a ``ValueError`` where it pins no wheel)."""
    name, version = parse_requirement(requirement)
    return WheelPin(requirement=requirement, name=name, version=version)


def wheel_pins(runtimes: Iterable[Runtime]) -> dict[str, WheelPin | ValueError]:
    """The pin of every ``wheel:`` runtime, by runtime name, read before anything is provisioned.

    A requirement that pins no wheel maps to the error that says so: the loader refuses such a
    matrix, but one made in code may carry it, and then its cells meet the error when they are
    provisioned, as they would have without this reading ahead."""
    pins: dict[str, WheelPin | ValueError] = {}
    for rt in runtimes:
        if rt.requirement:
            try:
                pins[rt.name] = wheel_pin(rt.requirement)
            except ValueError as e:
                pins[rt.name] = e
    return pins


def check_env_requirement(text: str) -> str:
    """A requirement of an environment runtime: ``name[extras] specifier ; marker``, nothing else.

    Options (``-e``, ``--index-url``), paths and URLs are refused: the environment's content
    hash covers only what is written here, and an option would reach uv's command line.
    """
    t = text.strip()
    req = _requirement(t) if t else None
    if req is None or req.url:
        raise ValueError(f"not a requirement: {text!r} (want NAME[SPEC], e.g. cuda-bindings==12.9.*; "
                         "no options, paths or URLs)")
    return t


def matrix_headers_wheel(version: CudaVersion, runtimes: Iterable[Runtime]) -> tuple[str, str] | None:
    """(runtime name, requirement) of the first ``wheel:`` runtime of a matrix whose pinned
    release is CUDA ``version`` (its major and minor, as PEP 440 reads the pin: ``== 12.9.79``
    and ``==12.9.79.post1`` are 12.9), whose ``include/`` then serves the headers; None if none is."""
    for rt in runtimes:
        if not rt.requirement:
            continue
        try:
            release = Version(parse_requirement(rt.requirement)[1]).release
        except (ValueError, InvalidVersion):
            continue  # the loader refuses these; a hand-made runtime may not have been checked
        if release[:2] == (version.major, version.minor):
            return rt.name, rt.requirement
    return None

"""The majors of the CUDA libraries other than libcudart that a file needs or loads.

A file that needs ``libcublas.so.13``, ``libnvrtc.so.13`` or ``libcudnn.so.8`` needs a CUDA
runtime of the major whose toolkit ships that library, whatever libcudart it names itself.
Which majors each soname belongs to is data (``data/cuda_libraries.json``, from NVIDIA's
wheels on PyPI and the toolkit's release notes); the checks here are the runtime major checks
of :mod:`cumatrix.audit.checks`, applied to those majors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

from cumatrix.audit.findings import AuditSettings, Finding, Severity
from cumatrix.core.errors import ConfigError
from cumatrix.core.model import CudaVersion
from cumatrix.predict.rules import major_newer_than_driver

DATA_FILE = "data/cuda_libraries.json"
_SCHEMA = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class CudaLibrary:
    """One CUDA library family of ``data/cuda_libraries.json``."""

    name: str  #: cuBLAS, NVRTC, ...
    pattern: re.Pattern[str]  #: matches its sonames; group 1 is the soname major
    #: ``runtime``: it runs on the CUDA runtime (needs that major's driver); ``compiler``: it
    #: builds device code (NVRTC, nvJitLink) and needs no driver itself.
    uses: Literal["runtime", "compiler"]
    majors: Mapping[int, tuple[int, ...]]  #: soname major -> CUDA majors that ship it


@dataclass(frozen=True, kw_only=True, slots=True)
class LibraryUse:
    """A CUDA library a file needs (``DT_NEEDED``) or loads (a soname in its data)."""

    soname: str
    library: CudaLibrary
    cuda: tuple[int, ...]  #: the CUDA majors that ship it
    how: str  #: ``DT_NEEDED libcublas.so.13`` or ``loads libcublas.so.13 at run time (...)``


@cache
def table() -> tuple[CudaLibrary, ...]:
    """The libraries of ``data/cuda_libraries.json``."""
    text = resources.files("cumatrix").joinpath(DATA_FILE).read_text(encoding="utf-8")
    try:
        doc = json.loads(text)
        if doc.get("schema") != _SCHEMA:
            raise ValueError(f"schema {doc.get('schema')!r}, expected {_SCHEMA}")
        return tuple(CudaLibrary(
            name=str(e["name"]), pattern=re.compile(str(e["pattern"])), uses=e["uses"],
            majors={int(k): tuple(int(m) for m in v) for k, v in e["majors"].items()})
            for e in doc["libraries"])
    except (ValueError, KeyError, TypeError, re.error) as e:
        raise ConfigError(f"cumatrix/{DATA_FILE}: {e}") from e


def family(soname: str) -> CudaLibrary | None:
    """The library of :func:`table` whose sonames ``soname`` is one of."""
    return next((lib for lib in table() if lib.pattern.match(soname)), None)


def library_uses(needed: Iterable[str], loaded: Iterable[str], own: str | None = None) -> list[LibraryUse]:
    """The CUDA libraries of :func:`table` among ``needed`` (``DT_NEEDED``) and ``loaded``
    (sonames named in the file's data, what it passes to ``dlopen``), each once.  ``own``:
    the file's own soname (or name); a library of its own family is part of it
    (``libnvrtc.so.13`` loading ``libnvrtc-builtins.so.13.0``), not a dependency."""
    out: list[LibraryUse] = []
    itself = family(own) if own else None
    seen: set[str] = set()
    for sonames, linked in ((needed, True), (loaded, False)):
        for soname in sorted(sonames):
            if soname in seen:
                continue
            for lib in table():
                m = lib.pattern.match(soname)
                if m is None or int(m.group(1)) not in lib.majors or lib is itself:
                    continue
                seen.add(soname)
                how = (f"DT_NEEDED {soname}" if linked
                       else f"loads {soname} at run time (the name is in its read-only data)")
                out.append(LibraryUse(soname=soname, library=lib, cuda=lib.majors[int(m.group(1))],
                                      how=how))
                break
    return out


def _majors_text(cuda: tuple[int, ...]) -> str:
    return f"CUDA {cuda[0]}" if len(cuda) == 1 else "CUDA " + ", ".join(map(str, cuda))


def library_checks(name: str, uses: Iterable[LibraryUse], judged: Iterable[int],
                   s: AuditSettings) -> list[Finding]:
    """``library-major`` and ``library-needs-newer-driver`` for the CUDA libraries file
    ``name`` needs.  A library of exactly one runtime major the file's own runtime findings
    already judge (``judged``) adds nothing: one cause, one line."""
    out: list[Finding] = []
    done = set(judged)
    for use in uses:
        if len(use.cuda) == 1 and use.cuda[0] in done:
            continue
        # Linked: the loader refuses the file without it; loaded: only where the name is used.
        worst: Severity = "error" if use.how.startswith("DT_NEEDED") else "warning"
        outside = _outside_majors(name, use, worst, s)
        if outside is not None:
            out.append(outside)
        newer = _needs_newer_driver(name, use, worst, s)
        if newer is not None:
            out.append(newer)
    return out


def _outside_majors(name: str, use: LibraryUse, worst: Severity, s: AuditSettings) -> Finding | None:
    """``library-major`` where ``use``'s library is of no runtime major ``--runtimes`` declares."""
    if s.runtimes is None or set(use.cuda) & set(s.runtimes):
        return None
    lib, majors = use.library, _majors_text(use.cuda)
    declared = ",".join(map(str, s.runtimes))
    return Finding(
        file=name, severity=worst, code="library-major", subject=use.soname,
        message=(f"{use.how}: {use.soname} is {lib.name} of {majors} ({DATA_FILE}), "
                 f"outside the declared runtime majors ({declared}): this file works "
                 f"only next to a CUDA {use.cuda[-1]} toolkit library"),
        fix=(f"build and link it against the {lib.name} of CUDA {declared}, publish "
             "one wheel per CUDA major, or declare the major with --runtimes"),
    )


def _needs_newer_driver(name: str, use: LibraryUse, worst: Severity,
                        s: AuditSettings) -> Finding | None:
    """``library-needs-newer-driver`` where ``use``'s oldest major needs a driver newer than
    ``--min-driver``."""
    lib, majors = use.library, _majors_text(use.cuda)
    oldest = min(use.cuda)
    if not major_newer_than_driver(int(CudaVersion(oldest, 0)), int(s.min_driver)):
        return None
    if lib.uses == "compiler":
        return Finding(
            file=name, severity="warning", code="library-needs-newer-driver", subject=use.soname,
            message=(f"{use.how}: {lib.name} of {majors} needs no driver itself, but the "
                     f"device code it builds targets CUDA {oldest}: a driver older than "
                     f"{oldest}.0 (--min-driver {s.min_driver}) refuses PTX of that ISA "
                     "(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, 222) and cubins built for it"),
            fix=(f"ask {lib.name} for PTX no newer than the oldest driver runs (NVRTC: "
                 "-arch=compute_XY of an older target, or the driver's own JIT), or raise "
                 f"--min-driver to {oldest}.0"),
        )
    severity: Severity = "note" if s.forward_compat else worst
    return Finding(
        file=name, severity=severity, code="library-needs-newer-driver", subject=use.soname,
        message=(f"{use.how}: {lib.name} of {majors} runs on a CUDA {oldest} runtime, which "
                 f"needs a CUDA {oldest}.0 driver, newer than --min-driver {s.min_driver}"
                 + ("; accepted with --forward-compat (cuda-compat, data-centre GPUs only)"
                    if s.forward_compat else
                    ": on older drivers its calls fail with cudaErrorInsufficientDriver (35)")),
        fix=(f"link the {lib.name} of an older CUDA major, raise --min-driver to {oldest}.0, "
             "or, for data-centre GPUs with cuda-compat only, pass --forward-compat"),
    )

"""Code compiled at run time against the driver's JIT: which PTX a cell's processes could have
handed the driver, and what a driver of the cell's version does with it.

A driver compiles PTX up to the ISA version of its own CUDA release and refuses newer PTX with
``CUDA_ERROR_UNSUPPORTED_PTX_VERSION`` (222): the table is :mod:`cumatrix.binary.ptx`'s
(NVIDIA's PTX ISA release notes).  An emulated driver refuses the same (the interposer reads
the PTX before the real driver's JIT sees it: docs/emulation.md).

The evidence is the PTX producers the cell's processes mapped, as the kernel's record of their
mappings names them (NVRTC, nvJitLink, each with its CUDA major from the SONAME, the full
version where the file name or the wheel carries one; libNVVM by that version alone): a producer of CUDA X.Y emits PTX of the newest ISA
X.Y knows.  Mapping a producer does not prove that its PTX reached the driver (CuPy maps NVRTC
before it compiles anything), so this explains a failure and predicts it only where every
PTX such a producer emits is beyond the driver's ceiling.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cumatrix.binary.fatbin import DeviceCode, covering
from cumatrix.binary.ptx import isa_table, ptx_ceiling, ptx_isa_cuda
from cumatrix.core.model import Cell, CudaVersion, Expected

__all__ = ["PtxProducer", "jit_refusal", "no_usable_code", "ptx_producers", "unknown_machine_code"]

#: The libraries that turn CUDA C++ or NVVM IR into PTX at run time, by SONAME.  NVRTC's and
#: nvJitLink's SONAME carries their CUDA major; libNVVM's (``libnvvm.so.4``) does not, so its
#: release comes from its file name or its wheel's metadata, or it says nothing.
_PRODUCER_RE = re.compile(r"^lib(?P<name>nvrtc|nvJitLink|nvvm)\.so\.(?P<major>\d+)$")
_NAMES = {"nvrtc": "NVRTC", "nvJitLink": "nvJitLink", "nvvm": "libNVVM"}
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)")


@dataclass(frozen=True, kw_only=True, slots=True)
class PtxProducer:
    """A PTX producer some process of the cell mapped."""

    name: str  # "NVRTC" or "nvJitLink"
    soname: str
    major: int
    version: CudaVersion | None  # where the file name says more than the SONAME

    def label(self) -> str:
        return f"{self.name} {self.version or self.major} ({self.soname})"

    def oldest_isa(self) -> tuple[int, int] | None:
        """The oldest PTX ISA this producer emits by default: its release's, where the version
        is known; else the first ISA of its major (CUDA 13.0's 9.0 for any NVRTC 13)."""
        table = isa_table()
        if self.version is not None:
            return ptx_ceiling(int(self.version))
        first = [isa for isa, cuda in table.items() if cuda[0] == self.major]
        return min(first) if first else None


def ptx_producers(libraries: tuple[tuple[str | None, str | None], ...]) -> tuple[PtxProducer, ...]:
    """The PTX producers among mapped libraries, each given as (SONAME, version or None)."""
    out: dict[str, PtxProducer] = {}
    for soname, version in libraries:
        producer = _producer(soname, version)
        if producer is not None:
            out[producer.soname] = producer
    return tuple(out[k] for k in sorted(out))


def _producer(soname: str | None, version: str | None) -> PtxProducer | None:
    """The PTX producer a mapped library (SONAME, version or None) is, or None where it is none
    (or libNVVM of no known version: its SONAME carries no CUDA major)."""
    m = _PRODUCER_RE.match(soname or "")
    if not m or not soname:
        return None
    v = _VERSION_RE.match(version or "")
    if m["name"] == "nvvm":
        if not v:
            return None
        major = int(v.group(1))
    else:
        major = int(m["major"])
    cv = CudaVersion(int(v.group(1)), int(v.group(2))) if v and int(v.group(1)) == major else None
    return PtxProducer(name=_NAMES[m["name"]], soname=soname, major=major, version=cv)


def jit_refusal(cell: Cell, driver: int, producers: tuple[PtxProducer, ...]) -> str | None:
    """Why driver ``driver`` refuses the PTX of an NVRTC among ``producers``, as a report line
    (``jit: PTX ISA 9.0 refused by driver 12.8 ...``); ``None`` when none is beyond its ceiling.

    Only NVRTC predicts: its PTX is handed to the driver's JIT (measured, docs/facts.md section
    11).  libNVVM's PTX may instead be linked into a cubin by nvJitLink, which never reaches the
    JIT (:func:`unknown_machine_code`).
    """
    ceiling = ptx_ceiling(driver)
    if ceiling is None:
        return None
    for p in producers:
        isa = p.oldest_isa()
        if p.name == "NVRTC" and isa is not None and isa > ceiling:
            kind = "emulated driver" if cell.driver.startswith("emulated-") else "driver"
            return (f"jit: PTX ISA {isa[0]}.{isa[1]} refused by driver {CudaVersion.from_int(driver)}: the "
                    f"program mapped {p.label()}, whose PTX is ISA {isa[0]}.{isa[1]} or newer; the {kind}'s JIT "
                    f"compiles up to {ceiling[0]}.{ceiling[1]} (CUDA_ERROR_UNSUPPORTED_PTX_VERSION, 222)")
    return None


def unknown_machine_code(driver: int, producers: tuple[PtxProducer, ...]) -> str | None:
    """Why a cell that mapped nvJitLink or libNVVM of a newer CUDA major than the emulated
    ``driver`` cannot be emulated, or ``None``.  Such a program may link its PTX into a cubin
    itself (numba-cuda does, through nvJitLink) and hand the driver machine code built by a
    newer major's toolchain: whether a driver of an older major loads it, NVIDIA does not
    document, and the real driver behind the interposer loads it."""
    major = driver // 1000
    for p in producers:
        if p.name in ("nvJitLink", "libNVVM") and p.major > major:
            return (f"jit: the program mapped {p.label()}, which may link its code into a cubin of CUDA "
                    f"{p.major}; whether a driver {CudaVersion.from_int(driver)} loads machine code of a newer "
                    "major's toolchain is not documented, and the real driver behind the interposer does")
    return None


def no_usable_code(objects: tuple[tuple[str, tuple[DeviceCode, ...]], ...], arch: int,
                   driver: int) -> tuple[str, str] | None:
    """(rule, report line) for the first object whose fat binaries have nothing a GPU of SM
    ``arch`` on driver ``driver`` can run: no SASS for it and no PTX (``no-kernel-image``:
    cudaErrorNoKernelImageForDevice, 209, on every driver), or PTX only, all newer than the
    driver's JIT (``jit-ptx-too-new``); ``None`` when every object has code for it."""
    gpu = f"sm_{arch}"
    ceiling = ptx_ceiling(driver)
    for path, codes in objects:
        sass, ptx = covering(codes, arch)
        if sass:
            continue
        name = path.rpartition("/")[2]
        have = ", ".join(sorted({c.label() for c in codes}))
        if not ptx:
            return ("no-kernel-image",
                    (f"device code: {name} has no code for {gpu} (it has {have}): a launch there fails "
                     "with cudaErrorNoKernelImageForDevice (209) on every driver"))
        usable = [c for c in ptx if c.isa is None or ceiling is None or c.isa <= ceiling]
        if not usable:
            return "jit-ptx-too-new", _ptx_too_new(ptx, driver, f"{name}'s only code for {gpu} is PTX ({have})")
    return None


def _ptx_too_new(ptx: list[DeviceCode], driver: int, what: str) -> str:
    """The report line of PTX (every entry of a known ISA, all newer than ``driver``'s JIT) that the driver refuses."""
    isa = min(c.isa for c in ptx if c.isa is not None)
    need = ptx_isa_cuda(isa)
    need_text = f"{need[0]}.{need[1]}" if need else "newer"
    return (f"jit: PTX ISA {isa[0]}.{isa[1]} refused by driver {CudaVersion.from_int(driver)}: {what}, "
            f"which needs a {need_text} driver (CUDA_ERROR_UNSUPPORTED_PTX_VERSION, 222)")


def refused_expectation(reason: str, outcomes: frozenset[str]) -> Expected:
    """The expectation of a cell whose PTX the driver refuses."""
    return Expected(outcomes=outcomes, reason=reason, rule="jit-ptx-too-new")

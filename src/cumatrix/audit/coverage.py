"""Device-code coverage per module: each fat binary container of a file, not their union.

A library whose kernel modules mostly carry SASS for 7.5/8.0/9.0 and only a few carry PTX
"covers" 10.0 and 12.0 as a whole file, yet every kernel of a module without usable code fails
there with ``no kernel image is available for execution on the device`` when it is launched.
Each container nvcc writes is one translation unit's module
(:func:`cumatrix.binary.fatbin.read_fatbin_modules`); the checks of
:func:`device_checks` (which judges a whole file's union too) run on each, and the modules that fail one are
counted into one finding per GPU, with one kernel of theirs named.
"""

from __future__ import annotations

from collections.abc import Sequence

from elftools.elf.elffile import ELFFile

from cumatrix.audit import runtime_evidence
from cumatrix.audit.findings import AuditSettings, Finding, _arch_key
from cumatrix.binary.fatbin import (
    DeviceCode,
    FatbinModule,
    covering,
    module_kernel,
    ptx_isa_cuda,
    read_fatbin_modules,
)
from cumatrix.core.model import CudaVersion


def _arch_name(arch: int, variant: str) -> str:
    return f"{arch // 10}.{arch % 10}{variant}"


def device_checks(name: str, codes: tuple[DeviceCode, ...], s: AuditSettings) -> list[Finding]:
    """Findings for the GPUs of ``s.arch_list`` that ``codes`` leaves uncovered."""
    if s.arch_list is None or not codes:
        return []
    out: list[Finding] = []
    for arch, _ in s.arch_list:
        sass, ptx = covering(codes, arch)
        gpu = _arch_name(arch, "")
        have = ", ".join(sorted({c.label() for c in codes}, key=_arch_key))
        if sass:
            continue
        if not ptx:
            out.append(Finding(
                file=name, severity="error", code="no-device-code", subject=f"sm_{arch}",
                message=(f"no SASS that runs on compute capability {gpu} and no PTX to compile "
                         f"for it (the file has {have}): a kernel launch there fails with `no "
                         "kernel image is available for execution on the device`"),
                fix=(f"add -gencode arch=compute_{arch},code=sm_{arch} (or PTX of an older arch "
                     "for JIT: code=compute_XY)"),
            ))
            continue
        # A GPU of this generation runs no driver older than the first that supports it, so
        # the PTX must JIT on that driver, not on an older --min-driver.
        gen = runtime_evidence.arch_min_cuda(arch)
        floor = max(s.min_driver, gen) if gen is not None else s.min_driver
        raised = (f"; a compute capability {gpu} GPU needs "
                  f"{runtime_evidence.min_driver_text(floor)} anyway, so that is the floor here"
                  if floor > s.min_driver else "")
        usable = [c for c in ptx if c.isa is not None and (cv := ptx_isa_cuda(c.isa)) is not None
                  and CudaVersion(*cv) <= floor]
        if usable:
            continue
        newest = min(ptx, key=lambda c: c.isa or (99, 99))
        isa = newest.isa
        need = ptx_isa_cuda(isa) if isa else None
        need_text = (f"a CUDA {need[0]}.{need[1]} driver" if need
                     else "a driver newer than any this audit knows")
        out.append(Finding(
            file=name, severity="error", code="ptx-too-new", subject=f"sm_{arch}",
            message=(f"the only code for compute capability {gpu} is {newest.label()}, which "
                     f"needs {need_text} to JIT-compile, newer than --min-driver "
                     f"{s.min_driver}{raised}: the load fails with "
                     "CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222) there"),
            fix=(f"add SASS for sm_{arch}, or build the PTX with a toolkit no newer than "
                 f"CUDA {floor}"),
        ))
    return out


_NAMED_TRIES = 8  # modules read for a kernel name before the offset stands for one

_FAILS = {
    "no-device-code": ("no SASS that runs on compute capability {gpu} and no PTX to compile for it",
                       "`no kernel image is available for execution on the device`"),
    "ptx-too-new": ("only PTX for compute capability {gpu} that the oldest driver cannot compile",
                    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222)"),
}


def elf_device_modules(elf: ELFFile) -> tuple[FatbinModule, ...]:
    """The fat binary containers of ``elf``'s ``.nv_fatbin`` section (none without one)."""
    section = elf.get_section_by_name(".nv_fatbin")
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return ()
    return read_fatbin_modules(elf.stream, section["sh_offset"], section["sh_size"])


def module_checks(name: str, elf: ELFFile, s: AuditSettings, file_findings: Sequence[Finding]) -> list[Finding]:
    """Findings for the ``--arch-list`` GPUs that some modules of file ``name`` leave uncovered
    while the file as a whole covers them (what the whole file lacks, ``file_findings`` says)."""
    if s.arch_list is None:
        return []
    modules = [m for m in elf_device_modules(elf) if m.codes]
    if len(modules) < 2:
        return []
    said = {(f.code, f.subject) for f in file_findings}
    failing: dict[tuple[str, str], list[FatbinModule]] = {}
    for m in modules:
        for f in device_checks(name, m.codes, s):
            if (f.code, f.subject) not in said:
                failing.setdefault((f.code, f.subject), []).append(m)
    out: list[Finding] = []
    kernels: dict[int, str | None] = {}

    def kernel_of(m: FatbinModule) -> str | None:
        if m.offset not in kernels:
            kernels[m.offset] = module_kernel(elf.stream, m)
        return kernels[m.offset]

    for (code, subject), lacking in failing.items():
        # A module with no kernel (the runtime's own) has nothing to launch: it cannot fail.
        bad = [m for m in lacking if kernel_of(m) != ""]
        if not bad:
            continue
        kernel = next((k for m in bad[:_NAMED_TRIES] if (k := kernel_of(m))), None)
        example = f"kernel {kernel}" if kernel else f"the module at offset {bad[0].offset:#x} of the file"
        # Where no failing module could be read (LZ4), it may be the runtime's own, kernel-less
        # module: a warning, never an error that blocks a release on a guess.
        known = any(kernel_of(m) for m in bad)
        arch = int(subject.removeprefix("sm_"))
        lack, error = _FAILS.get(code, _FAILS["no-device-code"])
        out.append(Finding(
            file=name, severity="error" if known else "warning", code=code, subject=subject,
            message=(f"{len(bad)} of {len(modules) - sum(k == '' for k in kernels.values())} kernel modules (fat binary containers) carry "
                     f"{lack.format(gpu=f'{arch // 10}.{arch % 10}')}, e.g. {example}; the file's "
                     "other modules cover it, but launching a kernel of those modules there fails "
                     f"with {error}" + ("" if known else " (their code is compressed with LZ4, so "
                                                      "whether they hold a kernel was not read)")),
            fix=(f"build every CUDA source of the file with the same -gencode list, including code "
                 f"for {subject} (a per-target CUDA_ARCHITECTURES or per-file flags often drop it)"),
        ))
    return out

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

import contextlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import replace

from elftools.elf.elffile import ELFFile

from cumatrix.audit import runtime_evidence
from cumatrix.audit.findings import AuditSettings, Finding, _arch_key
from cumatrix.binary.elf import data_ranges
from cumatrix.binary.fatbin import (
    FATBIN_MAGIC,
    DeviceCode,
    FatbinError,
    FatbinModule,
    ModuleKernels,
    covering,
    find_fatbin,
    module_kernels,
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
        too_new = _ptx_too_new(name, arch, gpu, ptx, s)
        if too_new is not None:
            out.append(too_new)
    return out


def _jit_floor(arch: int, s: AuditSettings) -> CudaVersion:
    """The oldest driver a GPU of SM ``arch`` runs: ``--min-driver``, or the first driver of its
    generation where that is newer."""
    # A GPU of this generation runs no driver older than the first that supports it, so
    # the PTX must JIT on that driver, not on an older --min-driver.
    gen = runtime_evidence.arch_min_cuda(arch)
    return max(s.min_driver, gen) if gen is not None else s.min_driver


def _jits_on(c: DeviceCode, floor: CudaVersion) -> bool:
    """Whether PTX entry ``c`` is of an ISA a driver of CUDA ``floor`` compiles."""
    cv = ptx_isa_cuda(c.isa) if c.isa is not None else None
    return cv is not None and CudaVersion(*cv) <= floor


def _jit_driver_text(isa: tuple[int, int] | None) -> str:
    """The driver PTX of ISA ``isa`` needs to JIT-compile, in words."""
    need = ptx_isa_cuda(isa) if isa else None
    return (f"a CUDA {need[0]}.{need[1]} driver" if need
            else "a driver newer than any this audit knows")


def _ptx_too_new(name: str, arch: int, gpu: str, ptx: Sequence[DeviceCode],
                 s: AuditSettings) -> Finding | None:
    """The error for GPU ``arch`` where none of its (only) code, ``ptx``, JIT-compiles on the
    oldest driver that can run it; ``None`` where some does."""
    floor = _jit_floor(arch, s)
    raised = (f"; a compute capability {gpu} GPU needs "
              f"{runtime_evidence.min_driver_text(floor)} anyway, so that is the floor here"
              if floor > s.min_driver else "")
    if any(_jits_on(c, floor) for c in ptx):
        return None
    newest = min(ptx, key=lambda c: c.isa or (99, 99))
    need_text = _jit_driver_text(newest.isa)
    return Finding(
        file=name, severity="error", code="ptx-too-new", subject=f"sm_{arch}",
        message=(f"the only code for compute capability {gpu} is {newest.label()}, which "
                 f"needs {need_text} to JIT-compile, newer than --min-driver "
                 f"{s.min_driver}{raised}: the load fails with "
                 "CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222) there"),
        fix=(f"add SASS for sm_{arch}, or build the PTX with a toolkit no newer than "
             f"CUDA {floor}"),
    )


def file_device_checks(name: str, codes: tuple[DeviceCode, ...], s: AuditSettings) -> list[Finding]:
    """:func:`device_checks` on a whole file's code, except that a file whose every entry is
    architecture- or family-specific (``sm_90a``, ``sm_100f``: code for those GPUs only, as
    FlashMLA's Hopper kernels in vLLM's ``_flashmla_C``) is a dispatch target of the GPUs it
    names: a note, never an error, for a GPU it has no code for (the import works there; the
    library launches nothing of it but on its own GPUs)."""
    found = device_checks(name, codes, s)
    if not codes or not all(c.variant for c in codes):
        return found
    return [Finding(file=f.file, severity="note", code="dispatch-target", subject=f.subject,
                    message=(f"all of its device code is architecture- or family-specific "
                             f"({_targets(codes)}): kernels for those GPUs only, not launched "
                             f"on compute capability {_arch_name(int(f.subject[3:]), '')}"),
                    fix="")
            for f in found]


def kernel_file_checks(name: str, elf: ELFFile, s: AuditSettings, found: list[Finding],
                       extra: Sequence[FatbinModule] = ()) -> list[Finding]:
    """``found`` (a whole file's device-code findings) less those no kernel stands behind:
    where every module of the file without code for that GPU holds no kernel (cuFFT's
    ``libcufftw.so.11``: one sm_52 module of no kernel), nothing can fail to launch; where
    such modules cannot be read, a warning (a module not read never decides an error)."""
    if not any(_fails(f) for f in found):
        return found
    modules = _coded_modules(elf, extra)
    if len(modules) > _FILE_READ:
        return found  # a library of many modules: its kernels are there (not read for this)
    kernels = {m.offset: module_kernels(elf.stream, m) for m in modules}
    out: list[Finding] = []
    for f in found:
        if not _fails(f):
            out.append(f)
            continue
        kept = _kernel_backed(f, _lacking_kernels(name, f, modules, kernels, s))
        if kept is not None:
            out.append(kept)
    return out


def _fails(f: Finding) -> bool:
    """Whether ``f`` is an error that a kernel launch fails (:data:`_FAILS`)."""
    return f.code in _FAILS and f.severity == "error"


def _coded_modules(elf: ELFFile, extra: Sequence[FatbinModule]) -> list[FatbinModule]:
    """The modules of ``elf`` (and ``extra``) that hold any code."""
    return [m for m in (*elf_device_modules(elf), *extra) if m.codes]


def _lacking_kernels(name: str, f: Finding, modules: Sequence[FatbinModule],
                     kernels: dict[int, ModuleKernels], s: AuditSettings) -> list[ModuleKernels]:
    """The kernels of the ``modules`` without code for the GPU of finding ``f``."""
    only = replace(s, arch_list=((int(f.subject.removeprefix("sm_")), ""),))
    return [kernels[m.offset] for m in modules if device_checks(name, m.codes, only)]


def _kernel_backed(f: Finding, lacking: list[ModuleKernels]) -> Finding | None:
    """The error ``f`` with a kernel of the modules ``lacking`` named, a warning where they
    cannot be read, or ``None`` where they hold no kernel."""
    names = sorted({n for k in lacking for n in k.names})
    unread = [k.unread for k in lacking if k.unread is not None]
    if names:
        return replace(f, message=f"{f.message} (e.g. kernel {names[0]})")
    if unread:
        return replace(f, severity="warning", message=(
            f"{f.message}; whether its modules hold a kernel could not be read ({unread[0]})"))
    return None


_FAILS = {
    "no-device-code": ("nothing that runs on compute capability {gpu} (no SASS, no PTX for it)",
                       "`no kernel image is available for execution on the device`"),
    "ptx-too-new": ("only PTX for compute capability {gpu} that the oldest driver cannot compile",
                    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222)"),
}
_LISTED = 5
#: Dispatch targets no larger than this are read to leave out those without a kernel (the
#: statically linked runtime's own module is a few KiB); larger ones are counted unread: a
#: library's hundreds of dispatch modules cost a second to inflate and change no verdict.
_SMALL = 64 << 10
_FILE_READ = 64  #: modules of a file read for kernels when the whole file lacks a GPU's code  # kernels named in a finding; the rest are counted


def elf_device_modules(elf: ELFFile) -> tuple[FatbinModule, ...]:
    """The fat binary containers of ``elf``'s device code (:func:`find_fatbin`; none without)."""
    where = find_fatbin(elf)
    if where is None:
        return ()
    start, size, by_name = where
    return read_fatbin_modules(elf.stream, start, size, strict=by_name)


_MAGIC = struct.pack("<I", FATBIN_MAGIC)
_SEARCH_CHUNK = 16 << 20


def embedded_modules(elf: ELFFile) -> tuple[FatbinModule, ...]:
    """Fat binary containers that ``elf`` keeps in its loaded data outside ``.nv_fatbin``,
    found by their magic (8-byte aligned, a container header that parses): a library that
    loads its own kernels at run time (``cuModuleLoadData``, ``cuLibraryLoadData``) keeps
    them there, as cuFFT 11.4's ``libcufft.so.11`` keeps 24,454 containers in ``.ldata``
    beside a ``.nv_fatbin`` of one sm_52 module.  Read only where the ``.nv_fatbin`` alone
    leaves an ``--arch-list`` GPU uncovered: it costs a pass over the data."""
    stream = elf.stream
    out: list[FatbinModule] = []
    for start, size in data_ranges(elf):
        pos, end = start, start + size
        while pos < end:
            stream.seek(pos)
            chunk = stream.read(min(_SEARCH_CHUNK, end - pos))
            if not chunk:
                break
            # Containers are parsed from the stream; the search goes on in this chunk past them.
            at, resume = chunk.find(_MAGIC), pos + max(len(chunk) - 3, 1)
            while at != -1:
                hit = pos + at
                mods: tuple[FatbinModule, ...] = ()
                if hit % 8 == 0:
                    with contextlib.suppress(FatbinError):
                        mods = read_fatbin_modules(stream, hit, end - hit, strict=False)
                if mods:
                    out += mods
                    after = mods[-1].offset + mods[-1].size
                    if after >= pos + len(chunk):
                        resume = after
                        break
                    at = chunk.find(_MAGIC, after - pos)
                else:
                    at = chunk.find(_MAGIC, at + 1)
            pos = resume
    return tuple(out)


def _family(c: DeviceCode) -> int:
    return c.arch // 10


def _targets(codes: Sequence[DeviceCode]) -> str:
    return ", ".join(sorted({c.name for c in codes}, key=_arch_key))


def _general_families(codes: Sequence[DeviceCode]) -> set[int]:
    """The families of GPUs the general (not ``a``/``f``) entries of ``codes`` are for."""
    return {_family(c) for c in codes if not c.variant}


def dispatch_reason(codes: Sequence[DeviceCode], arch: int, newest: int | None) -> str | None:
    """Why a module with no code for SM ``arch`` is a dispatch target, a kernel set that a
    library picks at run time for other GPUs and never launches on this one; ``None`` when
    it is general code that should have covered this GPU: code for several families, all of
    it for older GPUs, up to the newest family that the file's general code (its modules
    spanning several families) reaches, ``newest``.

    Libraries ship both: cuBLAS 12.4's libcublasLt carries 204 modules of sm_90 SASS only
    (Hopper kernels), 14 of sm_89 only, 10 of sm_50/60/61 (Maxwell and Pascal kernels), next to
    general modules built for sm_50 to sm_90 with compute_90 PTX, and runs on every 8.0 GPU;
    cuBLAS 13.0's carries 21 FP8 modules of sm_89, sm_120f and compute_120 (Ada and
    consumer Blackwell), which Hopper and 10.0 never launch."""
    if all(c.variant for c in codes):
        return "all of its code is architecture- or family-specific (a/f)"
    families = _general_families(codes)
    if len(families) == 1:
        return "all of its code is for one family of GPUs"
    if any(c.arch > arch for c in codes):
        return "it holds code for newer GPUs, and leaves this one out"
    top = max(families)
    if newest is not None and top < newest:
        return (f"its code stops at family {top}, older than the file's general code "
                f"(family {newest}): kernels for older GPUs")
    return None


def module_checks(name: str, elf: ELFFile, s: AuditSettings, file_findings: Sequence[Finding],
                  extra: Sequence[FatbinModule] = ()) -> list[Finding]:
    """Findings for the ``--arch-list`` GPUs that some modules of file ``name`` leave uncovered
    while the file as a whole covers them (what the whole file lacks, ``file_findings`` says).

    A module without code for a GPU is an error only where it is general code (its targets
    span several families, up to the newest the file's general code reaches) and holds a
    kernel; a dispatch target (:func:`dispatch_reason`) is a note; a module whose code cannot
    be read (its reason given) is a warning, never an error on its own."""
    if s.arch_list is None:
        return []
    modules = _coded_modules(elf, extra)
    if len(modules) < 2:
        return []
    newest = _newest_general(modules)
    failing = _failing_modules(name, modules, s, file_findings)
    kernels: dict[int, ModuleKernels] = {}

    def kernels_of(m: FatbinModule) -> ModuleKernels:
        if m.offset not in kernels:
            kernels[m.offset] = module_kernels(elf.stream, m)
        return kernels[m.offset]

    out: list[Finding] = []
    for (code, subject), lacking in failing.items():
        found = _module_findings(name, code, subject, lacking, newest, kernels_of)
        # Of all modules, those read and found to hold no kernel (the runtime's own) not counted.
        total = len(modules) - sum(not k.names and k.unread is None for k in kernels.values())
        out += [replace(f, message=f.message.replace("{total}", str(total))) for f in found]
    return out


def _newest_general(modules: Sequence[FatbinModule]) -> int | None:
    """The newest family the general code reaches: of the modules whose (non-variant)
    targets span several families."""
    general = [m for m in modules if len(_general_families(m.codes)) > 1]
    return max((_family(c) for m in general for c in m.codes if not c.variant), default=None)


def _failing_modules(name: str, modules: Sequence[FatbinModule], s: AuditSettings,
                     file_findings: Sequence[Finding]) -> dict[tuple[str, str], list[FatbinModule]]:
    """The modules failing each device check (``code``, ``subject``) that the file as a whole
    passes (those it fails, or dispatches to, ``file_findings`` already says)."""
    said = {(f.code, f.subject) for f in file_findings}
    said |= {(code, f.subject) for f in file_findings if f.code == "dispatch-target"
             for code in _FAILS}
    failing: dict[tuple[str, str], list[FatbinModule]] = {}
    for m in modules:
        for f in device_checks(name, m.codes, s):
            if (f.code, f.subject) not in said:
                failing.setdefault((f.code, f.subject), []).append(m)
    return failing


def _module_findings(name: str, code: str, subject: str, lacking: list[FatbinModule],
                     newest: int | None,
                     kernels_of: Callable[[FatbinModule], ModuleKernels]) -> list[Finding]:
    """The findings of one check (``code``, ``subject``) that the modules ``lacking`` fail."""
    out: list[Finding] = []
    arch = int(subject.removeprefix("sm_"))
    gpu = f"{arch // 10}.{arch % 10}"
    lack, error = _FAILS.get(code, _FAILS["no-device-code"])
    bad, unread, dispatch = _sort_lacking(lacking, arch, newest, kernels_of)
    if bad:
        missing = sorted({n for m in bad for n in kernels_of(m).names})
        shown = ", ".join(missing[:_LISTED]) + (f" (+{len(missing) - _LISTED} more)"
                                                if len(missing) > _LISTED else "")
        first = kernels_of(bad[0]).names[0]
        also = (f"; {len(unread)} more such modules could not be read "
                f"({kernels_of(unread[0]).unread})" if unread else "")
        out.append(Finding(
            file=name, severity="error", code=code, subject=subject,
            message=(f"{len(bad)} of {{total}} kernel modules (fat binary containers) "
                     f"carry code for a range of GPUs ({_targets(bad[0].codes)}) and "
                     f"{lack.format(gpu=gpu)}, e.g. kernel {first}; the file's other "
                     f"modules cover it, but launching one of their {len(missing)} kernels "
                     f"there fails with {error}: {shown}{also}"),
            fix=(f"build every CUDA source of the file with the same -gencode list, including "
                 f"code for {subject} (a per-target CUDA_ARCHITECTURES or per-file flags "
                 "often drop it)"),
        ))
    elif unread:
        m = unread[0]
        out.append(Finding(
            file=name, severity="warning", code=code, subject=subject,
            message=(f"{len(unread)} of {{total}} kernel modules carry code for a range "
                     f"of GPUs ({_targets(m.codes)}) and {lack.format(gpu=gpu)}, but their "
                     f"code could not be read to tell whether they hold a kernel (the module "
                     f"at offset {m.offset:#x} of the file: {kernels_of(m).unread})"),
            fix=f"check with cuobjdump -lelf -lptx that each module has code for {subject}",
        ))
    if dispatch:
        out.append(_dispatch_note(name, subject, gpu, dispatch))
    return out


def _sort_lacking(lacking: list[FatbinModule], arch: int, newest: int | None,
                  kernels_of: Callable[[FatbinModule], ModuleKernels]
                  ) -> tuple[list[FatbinModule], list[FatbinModule], dict[str, int]]:
    """The modules of ``lacking`` that hold a kernel, those that could not be read, and how many
    are dispatch targets of each target list; the runtime's own (no kernel) in none of them."""
    bad: list[FatbinModule] = []
    unread: list[FatbinModule] = []
    dispatch: dict[str, int] = {}
    for m in lacking:
        reason = dispatch_reason(m.codes, arch, newest)
        if reason is not None and m.size <= _SMALL:
            k = kernels_of(m)  # cheap: the runtime's own module, kernel-less, is not one
            if k.unread is None and not k.names:
                continue
        if reason is not None:
            dispatch[_targets(m.codes)] = dispatch.get(_targets(m.codes), 0) + 1
            continue
        k = kernels_of(m)
        if k.unread is not None:
            unread.append(m)
        elif k.names:  # a module with no kernel (the runtime's own) has nothing to launch
            bad.append(m)
    return bad, unread, dispatch


def _dispatch_note(name: str, subject: str, gpu: str, dispatch: dict[str, int]) -> Finding:
    """The note for the modules that are dispatch targets (how many of each target list)."""
    top = sorted(dispatch.items(), key=lambda kv: -kv[1])
    listed = "; ".join(f"{n} with {t}" for t, n in top[:3]) + (
        f"; {sum(n for _, n in top[3:])} more" if len(top) > 3 else "")
    return Finding(
        file=name, severity="note", code="dispatch-target", subject=subject,
        message=(f"{sum(dispatch.values())} of {{total}} kernel modules hold code "
                 f"only for other GPUs ({listed}): kernels a library picks at run time "
                 f"for those GPUs, not launched on compute capability {gpu}"),
        fix="",
    )

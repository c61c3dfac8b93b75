"""The driver axis: the host's real ``libcuda.so.1``, or an emulated older driver.

An emulated driver ``emulated-X.Y`` is a ``libcuda.so.1`` generated and compiled with gcc on
the host, found first through ``LD_LIBRARY_PATH`` under every name of libcuda
(:func:`libcuda_names`); a cell with its own mount namespace gets it in place of every libcuda
file the loader may search, and the real driver at :data:`PRIVATE_DRIVER_PATH`
(:mod:`cumatrix.execute.driverview`). It forwards every entry point to the real
driver except those introduced after X.Y (introduction versions from the ``PFN_`` typedefs of
``cudaTypedefs.h``, see :mod:`cumatrix.provision.headers`), answers ``cuDriverGetVersion`` with X.Y and
caps ``cuGetProcAddress`` / ``cuGetProcAddress_v2`` at X.Y. What that reproduces, and where it
cannot (a cu12 runtime notices it: error 103), is measured in docs/facts.md section 4.  The
load and link entry points (:data:`JIT_ENTRIES`, and the same reached through
``cuGetProcAddress``) refuse PTX newer than X.Y's JIT compiles (the ceiling from
:func:`cumatrix.binary.ptx.ptx_ceiling`) with ``CUDA_ERROR_UNSUPPORTED_PTX_VERSION`` (222),
as a real X.Y driver does (docs/facts.md section 12; docs/emulation.md).

Forwarding needs no signatures: each export is a one-instruction x86-64 trampoline
(``jmp *ptr(%rip)``) through a table filled by a constructor that ``dlopen``\\s the real driver
by absolute path (so the interposer never finds itself).

Where the host has no C compiler (most GPU runners' images), a platform wheel's prebuilt
interposer serves instead (:mod:`cumatrix.provision.prebuilt_driver`): the same C file built
once, at wheel-build time, with a trampoline for every entry point cumatrix knows of and a
configuration block in ``.data``; the per-host copy gets the emulated version, the real
driver's path, the PTX ceiling and the hidden ``cuGetProcAddress`` names written into that
block, and every export it must not have made local in ``.dynsym`` (the dynamic linker and
``dlsym`` skip local symbols), so it exports what the compiled one does and answers as it does.
Names the real driver exports that the prebuilt was not built with are listed on the result
(:attr:`Interposer.missing`), and every cell under it records them; with a compiler, the
per-host build is used and nothing is missing.
"""

from __future__ import annotations

import hashlib
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, SymbolTableSection

from cumatrix.binary.ptx import ptx_ceiling
from cumatrix.core.cache import cache_dir
from cumatrix.core.errors import ConfigError, CumatrixError
from cumatrix.core.model import CudaVersion
from cumatrix.predict.rules import emulation_newer_than_host
from cumatrix.provision import prebuilt_driver


class InterposerError(CumatrixError):
    """An emulated driver cannot be built on this host (no real driver, no compiler).

    A host problem, not bad input: a run turns it into an error for the emulated cells only.
    """


# ------------------------------------------------------------------ parsing the axis

_EMULATED_RE = re.compile(r"^emulated-(?P<rest>.*)$")


def parse_driver_name(text: str) -> CudaVersion | None:
    """``host`` -> ``None``; ``emulated-X.Y`` -> ``CudaVersion(X, Y)``; anything else: ValueError."""
    name = text.strip()
    if name == "host":
        return None
    m = _EMULATED_RE.match(name)
    if not m:
        raise ValueError(f"unknown driver {text!r}: want 'host' or 'emulated-X.Y' (e.g. emulated-12.4)")
    try:
        return CudaVersion.parse(m["rest"])
    except ValueError:
        raise ValueError(
            f"bad emulated driver {text!r}: the version must be MAJOR.MINOR, e.g. emulated-12.4"
        ) from None


# ------------------------------------------------------------------ ELF


def exported_functions(path: Path) -> tuple[str, ...]:
    """Names of the functions ``path`` defines in its dynamic symbol table (sorted, unique)."""
    names: set[str] = set()
    with path.open("rb") as fh:
        elf = ELFFile(fh)
        dynsym = elf.get_section_by_name(".dynsym")
        if not isinstance(dynsym, SymbolTableSection):
            return ()
        for sym in dynsym.iter_symbols():
            if (sym["st_shndx"] != "SHN_UNDEF" and sym["st_info"]["type"] in ("STT_FUNC", "STT_GNU_IFUNC")
                    and sym["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK")
                    and sym["st_other"]["visibility"] in ("STV_DEFAULT", "STV_PROTECTED")):
                names.add(sym.name)
    return tuple(sorted(names))


def _build_id(path: Path) -> str:
    with path.open("rb") as fh:
        elf = ELFFile(fh)
        for sec in elf.iter_sections():
            if isinstance(sec, NoteSection):
                for note in sec.iter_notes():
                    if note["n_type"] == "NT_GNU_BUILD_ID":
                        return str(note["n_desc"])
    return ""


# ------------------------------------------------------------------ the interposer


@dataclass(frozen=True, kw_only=True, slots=True)
class Interposer:
    """A built emulated driver: put ``lib_dir`` first on ``LD_LIBRARY_PATH``."""

    lib_dir: Path  # holds libcuda.so.1
    version: int  # what cuDriverGetVersion answers, e.g. 12040
    hidden: tuple[str, ...]  # real exports left out (introduced after ``version``)
    exported: int  # how many symbols the interposer exports
    cache_hit: bool
    real_libcuda: Path
    #: Made from the prebuilt interposer (no compiler here), not compiled on this host.
    prebuilt: bool = False
    #: Exports of the real driver (kept at this version) the prebuilt does not carry: a
    #: program that links one fails to load under this interposer, as it would not under the
    #: compiled one.  Always empty for a compiled interposer.
    missing: tuple[str, ...] = ()

    @property
    def library(self) -> Path:
        return self.lib_dir / "libcuda.so.1"

    def names(self) -> tuple[str, ...]:
        """Every name of libcuda ``lib_dir`` answers to (:func:`libcuda_names`)."""
        return libcuda_names(self.real_libcuda)


#: Where a cell with its own mount namespace finds the real driver (``PRIVATE_DRIVER_PATH`` of
#: interposer.c): the sandbox and the docker backend bind the real file there and the
#: interposer over every name of libcuda the loader may search, so that only the interposer,
#: which knows this path, reaches the real driver (docs/emulation.md).
PRIVATE_DRIVER_PATH = "/.cumatrix-driver/libcuda.so.1"

_VERSIONED_RE = re.compile(r"^libcuda\.so\.\d+(?:\.\d+)+$")


def libcuda_names(real_libcuda: Path) -> tuple[str, ...]:
    """The names a program may load the driver by: ``libcuda.so`` (numba-cuda tries it first,
    docs/facts.md section 13), ``libcuda.so.1`` (the SONAME) and the real file's own
    ``libcuda.so.<driver version>`` where it has one."""
    own = Path(real_libcuda).resolve().name
    return ("libcuda.so", "libcuda.so.1", *((own,) if _VERSIONED_RE.match(own) else ()))


def _ship_every_name(lib_dir: Path, real_libcuda: Path) -> None:
    """Every name of :func:`libcuda_names` in ``lib_dir``, each a link to its ``libcuda.so.1``:
    on the search path, a program that asks for any of them gets the interposer (without a
    mount namespace, that is all emulation has).  Made where missing (a cache of an older
    layout, or another worker's first)."""
    for name in libcuda_names(real_libcuda):
        link = lib_dir / name
        if name == "libcuda.so.1" or link.is_symlink() or link.exists():
            continue
        try:
            link.symlink_to("libcuda.so.1")
        except FileExistsError:
            continue


#: The entry points the interposer implements itself instead of forwarding.
_OWN = ("cuDriverGetVersion", "cuGetProcAddress", "cuGetProcAddress_v2")

#: The load and link entry points the interposer stands in front of (where the real driver
#: exports them): PTX newer than the emulated driver's JIT ceiling is refused there.
JIT_ENTRIES = ("cuModuleLoad", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary",
               "cuLibraryLoadData", "cuLibraryLoadFromFile", "cuLinkAddData", "cuLinkAddData_v2",
               "cuLinkAddFile", "cuLinkAddFile_v2")


def ptx_ceiling_define(version: int) -> int:
    """``PTX_CEILING`` for an emulated driver of CUDA ``version``: its newest PTX ISA as
    major * 100 + minor (``807`` for 12.8), ``0`` (no ceiling) for a driver older than the table."""
    isa = ptx_ceiling(version)
    return isa[0] * 100 + isa[1] if isa else 0


def _c_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def interposer_template() -> str:
    """The interposer's C source (``cumatrix/data/interposer.c``): compiled with the tables below."""
    return resources.files("cumatrix").joinpath("data/interposer.c").read_text()


def generate_tables(*, version: int, real_libcuda: Path, exports: tuple[str, ...],
                    hidden_bases: tuple[str, ...], unknown: tuple[str, ...]) -> str:
    """The header the template is compiled with: what to forward, what to hide, what to answer.

    ``exports`` are the real driver's exports kept (forwarded, except the entry points the
    template implements itself); ``unknown`` are listed in a comment: exported by the real
    driver but in no PFN_ typedef, so of unknown introduction version, and kept.
    """
    forwarded = [n for n in exports if n not in _OWN and n not in JIT_ENTRIES]
    lines = [f"/* Generated by cumatrix: an emulated CUDA driver {version} forwarding to",
             f" * {real_libcuda}. Do not edit. */",
             f"#define EMULATED_VERSION {version}",
             f"#define REAL_PATH {_c_string(str(real_libcuda))}",
             f"#define HAS_GET_PROC_ADDRESS {int('cuGetProcAddress' in exports)}",
             f"#define HAS_GET_PROC_ADDRESS_V2 {int('cuGetProcAddress_v2' in exports)}",
             f"#define PTX_CEILING {ptx_ceiling_define(version)}",
             *(f"#define HAS_{n} {int(n in exports)}" for n in JIT_ENTRIES),
             f"#define N_FORWARDED {len(forwarded)}",
             "#define FORWARDED(X) \\"]
    lines += [f"    X({n}, {i}) \\" for i, n in enumerate(forwarded)]
    lines += ["", "#define HIDDEN(X) \\"]
    lines += [f"    X({_c_string(n)}) \\" for n in hidden_bases]
    lines.append("")
    if unknown:
        lines += ["/* Of unknown introduction version (in no PFN_ typedef), kept:"]
        lines += [f" *   {n}" for n in unknown]
        lines.append(" */")
    return "\n".join(lines) + "\n"


def _compiler_identity(cc_path: str) -> str:
    try:
        out = subprocess.run([cc_path, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise InterposerError(f"{cc_path} --version failed ({e}): install gcc (apt-get install gcc)") from e
    return f"{Path(cc_path).resolve()} {out.splitlines()[0] if out else ''}"


_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def build_interposer(emulated: CudaVersion, *, real_libcuda: Path | None, introductions: Mapping[str, int],
                     real_driver_version: int, base_introductions: Mapping[str, int] | None = None,
                     cache: Path | None = None,
                     cc: str = "gcc", prebuilt: Path | None = None) -> Interposer:
    """Generate, compile (cached) and return a ``libcuda.so.1`` emulating driver ``emulated``.

    Compiled with ``cc`` where it is on PATH; else (or when ``prebuilt`` names one) made from
    the prebuilt interposer by patching a copy (:mod:`cumatrix.provision.prebuilt_driver`).

    ``introductions`` maps exported names to introduction versions
    (:func:`cumatrix.provision.headers.load_introductions`); ``base_introductions`` maps
    ``cuGetProcAddress`` names (default: derived from ``introductions`` by dropping ``_vN``
    and per-thread suffixes). ``real_driver_version`` is ``real_libcuda``'s ``cuDriverGetVersion``
    (the host fingerprint's, or :func:`cumatrix.execute.driverquery.read_driver_version`): building
    runs no driver code.

    Raises :class:`ConfigError` when ``introductions`` is empty or ``emulated`` is newer than
    the real driver, :class:`InterposerError` when there is no real driver, neither a compiler
    nor a prebuilt interposer, or the build fails.
    """
    version = int(emulated)
    real = _check_build_inputs(emulated, real_libcuda, introductions, real_driver_version)
    bases = dict(base_introductions) if base_introductions is not None else _bases_from(introductions)
    ex = _Exports.of(real, introductions, bases, version)
    root = cache if cache is not None else cache_dir("drivers")
    root.mkdir(parents=True, exist_ok=True)
    cc_path = shutil.which(cc) if prebuilt is None else None
    if cc_path is None:
        return _from_prebuilt(emulated, _prebuilt_or_refuse(emulated, cc, prebuilt), ex.config(version, real),
                              ex.kept, ex.hidden, root)
    return _compiled(emulated, cc_path, real, ex, root)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Exports:
    """What an interposer for one emulated version does with the real driver's functions."""

    kept: tuple[str, ...]  #: exported, forwarding to the real driver
    hidden: tuple[str, ...]  #: introduced after the emulated version: not exported
    unknown: tuple[str, ...]  #: kept, though no header says when they came
    hidden_bases: tuple[str, ...]  #: cuGetProcAddress names introduced after the emulated version

    @classmethod
    def of(cls, real: Path, introductions: Mapping[str, int], bases: Mapping[str, int], version: int) -> _Exports:
        """The real driver's C-named functions, sorted by whether ``version`` has them."""
        exports = tuple(n for n in exported_functions(real) if _NAME_RE.match(n))
        hidden = tuple(n for n in exports if introductions.get(n, 0) > version)
        kept = tuple(n for n in exports if n not in hidden)
        return cls(kept=kept, hidden=hidden, unknown=tuple(n for n in kept if n not in introductions),
                   hidden_bases=_newer_than(bases, version))

    def config(self, version: int, real: Path) -> prebuilt_driver.RuntimeConfig:
        """What the prebuilt interposer is patched with to emulate ``version`` over ``real``."""
        return prebuilt_driver.RuntimeConfig(
            version=version, ptx_ceiling=ptx_ceiling_define(version), real_libcuda=real,
            has_gpa="cuGetProcAddress" in self.kept, has_gpa_v2="cuGetProcAddress_v2" in self.kept,
            hidden_bases=self.hidden_bases)


def _newer_than(introductions: Mapping[str, int], version: int) -> tuple[str, ...]:
    """The names introduced after ``version``, sorted."""
    return tuple(sorted(b for b, v in introductions.items() if v > version))


def _prebuilt_or_refuse(emulated: CudaVersion, cc: str, prebuilt: Path | None) -> Path:
    """``prebuilt``, else this install's prebuilt interposer, else the error that says what to install."""
    found = prebuilt or prebuilt_driver.prebuilt_interposer()
    if found is None:
        raise InterposerError(
            f"emulated-{emulated}: no C compiler {cc!r} on PATH and no prebuilt interposer in this "
            "install; emulated drivers are compiled on the host at run time: install gcc (e.g. "
            "apt-get install gcc), or a platform wheel of cumatrix"
        )
    return found


def _compiled(emulated: CudaVersion, cc_path: str, real: Path, ex: _Exports, root: Path) -> Interposer:
    """The interposer compiled from the template with ``cc_path`` (cached by every input)."""
    version = int(emulated)
    tables = generate_tables(version=version, real_libcuda=real, exports=ex.kept,
                             hidden_bases=ex.hidden_bases, unknown=ex.unknown)
    source = interposer_template()

    st = real.stat()
    key = "\n".join([source, tables, str(real), str(st.st_size), str(st.st_mtime_ns), _build_id(real),
                     _compiler_identity(cc_path)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    lib_dir = root / f"emulated-{emulated}-{digest}"
    cached = (lib_dir / "libcuda.so.1").is_file()
    if not cached:
        cached = _compile(emulated, cc_path, source, tables, root, lib_dir) == "cache-hit"
    _ship_every_name(lib_dir, real)
    return Interposer(lib_dir=lib_dir, version=version, hidden=ex.hidden, exported=len(ex.kept),
                      cache_hit=cached, real_libcuda=real)


def _check_build_inputs(emulated: CudaVersion, real_libcuda: Path | None, introductions: Mapping[str, int],
                        real_driver_version: int) -> Path:
    """The real driver (resolved), or the error that says what is missing."""
    if not introductions:
        raise ConfigError(
            f"emulated-{emulated}: no symbol introduction versions (the runtime headers have no "
            "cudaTypedefs.h PFN_ typedefs); use a runtime wheel of CUDA >= 12.0"
        )
    if real_libcuda is None or not Path(real_libcuda).is_file():
        where = f" (looked for {real_libcuda})" if real_libcuda else ""
        raise InterposerError(
            f"emulated-{emulated}: no real NVIDIA driver (libcuda.so.1) on this host{where}; an "
            "emulated driver forwards to the real one, so it needs an NVIDIA GPU host"
        )
    if platform.machine() != "x86_64":
        raise InterposerError(f"emulated-{emulated}: emulated drivers are built for x86-64 only, "
                              f"this host is {platform.machine()}")
    real = Path(real_libcuda).resolve()
    real_v = real_driver_version
    if emulation_newer_than_host(int(emulated), real_v):
        raise ConfigError(
            f"emulating {emulated} on a host whose driver is {CudaVersion.from_int(real_v)} cannot "
            "work: an interposer only hides what the real driver has"
        )
    return real


def _from_prebuilt(emulated: CudaVersion, prebuilt: Path, config: prebuilt_driver.RuntimeConfig,
                   kept: tuple[str, ...], hidden: tuple[str, ...], root: Path) -> Interposer:
    """A patched copy of ``prebuilt`` (cached): it exports ``kept`` (and cuDriverGetVersion,
    which the compiled one always defines) as far as it carries them, nothing else."""
    carried = exported_functions(prebuilt)
    keep = {*kept, "cuDriverGetVersion"}
    hide = tuple(n for n in carried if n not in keep)
    missing = tuple(n for n in kept if n not in carried)
    try:
        block = config.to_bytes()
    except prebuilt_driver.PatchError as e:
        raise InterposerError(f"emulated-{emulated}: {e}") from e
    st = config.real_libcuda.stat()
    key = b"\n".join([hashlib.sha256(prebuilt.read_bytes()).digest(), block, "\n".join(hide).encode(),
                      f"{st.st_size} {st.st_mtime_ns} {_build_id(config.real_libcuda)}".encode()])
    lib_dir = root / f"emulated-{emulated}-prebuilt-{hashlib.sha256(key).hexdigest()[:20]}"
    cached = (lib_dir / "libcuda.so.1").is_file()
    if not cached:
        cached = _patch(emulated, prebuilt, config, hide, missing, root, lib_dir) == "cache-hit"
    _ship_every_name(lib_dir, config.real_libcuda)
    return Interposer(lib_dir=lib_dir, version=config.version, hidden=hidden, exported=len(kept) - len(missing),
                      cache_hit=cached, real_libcuda=config.real_libcuda, prebuilt=True, missing=missing)


def _patch(emulated: CudaVersion, prebuilt: Path, config: prebuilt_driver.RuntimeConfig, hide: tuple[str, ...],
           missing: tuple[str, ...], root: Path, lib_dir: Path) -> str:
    """Patch a copy of ``prebuilt`` in a fresh directory, then rename it into place; "built" or
    "cache-hit" (another worker wrote the same one first)."""
    tmp = Path(tempfile.mkdtemp(prefix=".patch-", dir=root))
    try:
        prebuilt_driver.patch_interposer(prebuilt, tmp / "libcuda.so.1", config, hide)
        (tmp / "libcuda.so.1").chmod(0o755)
        (tmp / "interposer.txt").write_text(
            f"emulated {emulated} from the prebuilt {prebuilt}, forwarding to {config.real_libcuda}\n"
            + "".join(f"hidden: {n}\n" for n in hide) + "".join(f"missing: {n}\n" for n in missing))
        tmp.rename(lib_dir)
    except prebuilt_driver.PatchError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InterposerError(f"emulated-{emulated}: {e}") from e
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (lib_dir / "libcuda.so.1").is_file():
            raise
        return "cache-hit"
    return "built"


def _compile(emulated: CudaVersion, cc_path: str, source: str, tables: str, root: Path, lib_dir: Path) -> str:
    """Compile into a fresh directory, then rename it into place; "built" or "cache-hit"
    (another worker built the same one first: theirs is identical)."""
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        (tmp / "interposer.c").write_text(source)
        (tmp / "tables.h").write_text(tables)
        cmd = [cc_path, "-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", '-DCUMATRIX_TABLES="tables.h"', "-o",
               str(tmp / "libcuda.so.1"), str(tmp / "interposer.c"), "-ldl"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            raise InterposerError(
                f"emulated-{emulated}: compiling the interposer failed ({' '.join(cmd)}):\n"
                + proc.stderr.strip()[-2000:]
            )
        try:
            tmp.rename(lib_dir)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            return "cache-hit"
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return "built"


_BASE_RE = re.compile(r"^(?P<base>.+?)(?:_v\d+)?(?:_ptds|_ptsz)?$")


def _bases_from(introductions: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, v in introductions.items():
        m = _BASE_RE.match(name)
        base = m["base"] if m else name
        out[base] = min(v, out.get(base, v))
    return out

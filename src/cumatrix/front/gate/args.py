"""The ``cumatrix gate`` argument parser, apart from the command so that building it (every
``cumatrix --help``) does not import the static audit and the dynamic stage."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from cumatrix.binary.fatbin import parse_arch
from cumatrix.core.model import CudaVersion
from cumatrix.core.options import BACKENDS, DEFAULT_BACKEND, DEFAULT_MATRIX, DEFAULT_TIMEOUT
from cumatrix.front.flags import add_cli_options
from cumatrix.front.history_cli import add_history_options

#: Where the gate writes its reports unless --out says otherwise.
DEFAULT_OUT = Path("gate-out")


# --------------------------------------------------------------------------- command line


def _min_driver_arg(text: str) -> CudaVersion:
    # deferred: the release table is read only when a version is given
    from cumatrix.core.suggest import version_hint
    from cumatrix.load.requirements import driver_releases

    try:
        v = CudaVersion.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}; for example --min-driver 12.4") from e
    known = driver_releases()
    if str(v) not in known:  # 12.44, 12.7: no driver was released for such a CUDA version
        raise argparse.ArgumentTypeError(f"there is no CUDA {v} release{version_hint(str(v), known)} "
                                         f"(known: {', '.join(known)})")
    return v


def _runtimes_arg(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"not a list of CUDA runtime majors: {text!r} (want e.g. 12 or 12,13)")
    return tuple(sorted({int(p) for p in parts}))


def _arch_list_arg(text: str) -> tuple[tuple[int, str], ...]:
    parts = [p for p in re.split(r"[\s;,]+", text.strip()) if p]
    if not parts:
        raise argparse.ArgumentTypeError("empty --arch-list (want e.g. \"8.0 9.0 10.0 12.0\")")
    try:
        return tuple(dict.fromkeys(parse_arch(p) for p in parts))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


_EPILOG = """\
examples:
  cumatrix gate dist/*.whl --static-only --min-driver 12.4
      fail if any extension links a driver entry point newer than CUDA 12.4
      (the `undefined symbol: cuMemcpyBatchAsync` of vLLM PR 38460)
  cumatrix gate dist/mypkg-*.whl --static-only --runtimes 12,13 --strict
      also fail on DT_NEEDED libcuda.so.1 and on a libcudart of another major
  cumatrix gate dist/*.whl --static-only --min-driver 12.8 --arch-list "8.0 9.0 10.0 12.0"
      also fail when a GPU of the list has no kernel image, or only PTX a 12.8
      driver cannot compile
  cumatrix gate dist/*.whl --static-only --optional 'mypkg/_flash*.so'
      report files loaded only inside a guarded import as warnings
  cumatrix gate dist/*.whl --matrix matrix.yaml --smoke 'python3 -m mypkg.selftest'
      static audit, then install the wheel into every runtime x driver pairing of
      matrix.yaml, import its top-level packages there and run the smoke command
  cumatrix gate dist/*.whl --backend docker --constraints constraints.txt
      the same in containers without network, dependencies installed on the host

the dynamic stage (unless --static-only): one cell per wheel and pairing,
<runtime>/<driver>/import-<wheel> (and smoke-<wheel>), each with its own install target
(<out>/gate-sites/); every pairing NVIDIA supports must be ok; a runtime of a newer
major than the driver is skipped:unsupported-pairing. Reports in --out (default
gate-out/): summary.md (static findings first), junit.xml (static suites included),
results.json, index.html. With the local backend, dependencies not installed with
--constraints come from the Python environment cumatrix runs in.

what the static audit reports (per ELF file, read from the zip without extracting):
  needs-libcuda          DT_NEEDED on libcuda.so*: warning (error with --strict)
  underlinked-libcuda    undefined driver (cu*) symbols and no DT_NEEDED libcuda: error
  driver-symbol-too-new  undefined cu* symbol introduced after --min-driver: error
  runtime-major          DT_NEEDED libcudart.so.N, a static libcudart N (dated by the
                         names its own tables carry), or a libcudart loaded at run
                         time (dlopen) outside --runtimes: error
  runtime-needs-newer-driver
                         that runtime major needs a newer driver than --min-driver:
                         error (a note with --forward-compat)
                         a runtime loaded at run time (subject `dlopen libcudart...`):
                         a soname in read-only data or a cudart_stub-style name table,
                         its major from the soname, the RPATH/RUNPATH into
                         nvidia/cuNN/lib and the wheel's Requires-Dist on
                         nvidia-cuda-runtime*: an error where path and dependency
                         agree, a warning where only a string hints at it
  library-major          a CUDA library (cuBLAS, cuFFT, cuDNN, NVRTC, nvJitLink...)
                         needed or loaded whose CUDA majors (data/cuda_libraries.json)
                         are all outside --runtimes: error (warning when only loaded)
  library-needs-newer-driver
                         that library's CUDA major needs a newer driver than
                         --min-driver: error (NVRTC, nvJitLink: warning)
  runtime-symbol-too-new undefined cuda* symbol first exported by a libcudart newer
                         than --min-runtime: error
  abi-lookup             string naming a runtime function whose ABI changed between
                         CUDA majors (e.g. cudaMemcpyBatchAsync): warning; an error
                         (abi-lookup-driver-version) when the file asks the driver's
                         version and never the runtime's, a note when it asks the
                         runtime's; names inside a static libcudart are not lookups
  no-device-code         an --arch-list GPU that neither SASS nor PTX covers: error
  ptx-too-new            an --arch-list GPU covered only by PTX whose ISA needs a newer
                         driver than --min-driver, or than the first driver that
                         supports that GPU generation (sm_100/sm_120: CUDA 12.8),
                         whichever is newer: error. Judged per fat binary module too:
                         a module of code for a range of GPUs (several families, up to
                         the file's newest) and none for the GPU is an error naming its
                         kernels; a dispatch target (only a/f-specific code, one
                         family, only newer GPUs, or older GPUs than the file's
                         general code) is not
  dispatch-target        code for other GPUs only, picked by the library at run time:
                         note
  optional-import        a failing file imported only under try/except ImportError:
                         note (suggests --optional)
  unreadable-elf         a file with the ELF magic that does not parse: error
Driver introduction versions and ABI changes are read from the headers of the CUDA
runtime wheels (fetched once into the cache; --wheel-dir uses already-downloaded
wheels); runtime symbols are dated by the exports of libcudart 11.7 to 13.5 (packaged
data, scripts/runtime-exports.py). Notes of one kind that occur more than once in a
wheel are folded into one line with a count; -v lists each.
The summary lists each file's SASS and PTX (arch and PTX ISA version).

exit status: 0 no error finding and every cell met its expectation, 1 an error
finding or a failed cell, 2 bad input (missing or non-wheel file, malformed option,
bad matrix), 5 the dynamic stage ran no cell (every one skipped: a wheel this
Python cannot install, or no pairing this host supports): nothing was installed and
imported, so the gate is not green; gate under a matching Python, or with
--static-only to rely on the static audit alone.
"""


def add_gate_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]
                    ) -> argparse.ArgumentParser:
    """Register ``gate`` on ``subparsers`` with ``func=gate_main`` (the CLI calls ``args.func``)."""
    p = subparsers.add_parser(
        "gate",
        help="pre-release gate for wheels: static ELF audit, then the matrix",
        description=("Fail a wheel release that would break on a supported driver/runtime "
                     "pairing, and say exactly why."),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("wheels", nargs="+", type=Path, metavar="WHEEL", help="wheel files to gate")
    p.add_argument("--min-driver", type=_min_driver_arg, default=None, metavar="X.Y",
                   help=("oldest driver (as the CUDA version it reports) the wheel supports; "
                         "default: X.0 of the lowest --runtimes major, else 12.0"))
    p.add_argument("--runtimes", type=_runtimes_arg, default=None, metavar="N[,N]",
                   help="CUDA runtime majors the wheel supports, e.g. 12 or 12,13")
    p.add_argument("--forward-compat", action="store_true",
                   help=("accept a runtime major newer than --min-driver (data-centre GPUs with "
                         "NVIDIA's cuda-compat package): a note instead of an error"))
    p.add_argument("--min-runtime", type=_min_driver_arg, default=None, metavar="X.Y",
                   help=("oldest CUDA runtime the wheel supports: runtime entry points it links "
                         "that are newer are errors; default: X.0 of the lowest --runtimes "
                         "major, else the oldest known runtime"))
    p.add_argument("--arch-list", type=_arch_list_arg, default=None, metavar="LIST",
                   help=("GPU architectures the wheel must cover, TORCH_CUDA_ARCH_LIST style "
                         "(\"8.0 9.0 10.0 12.0\", ';' or ' ' separated); default: not checked"))
    p.add_argument("--strict", action="store_true",
                   help="make DT_NEEDED on libcuda.so* an error")
    p.add_argument("--optional", action="append", default=[], metavar="GLOB",
                   help=("member path glob (fnmatch) of ELF files loaded only inside a guarded "
                         "import; their findings become warnings (repeatable)"))
    p.add_argument("--static-only", action="store_true", help="stop after the static audit")
    p.add_argument("-v", "--verbose", action="store_true",
                   help=("list every note; by default notes of one kind that occur more than "
                         "once in a wheel are folded into one line with a count"))
    p.add_argument("--matrix", type=Path, default=None, metavar="M",
                   help=("matrix file whose runtime x driver pairings the dynamic stage runs "
                         "(its variants, workloads and cases are ignored); default: "
                         f"./{DEFAULT_MATRIX} if present, else every known runtime on the "
                         "host driver"))
    p.add_argument("--smoke", default=None, metavar="CMD",
                   help=("shell command run in each pairing after the import cell, as its own "
                         "cell (smoke-<wheel>), with the installed wheel on PYTHONPATH"))
    p.add_argument("--constraints", type=Path, default=None, metavar="FILE",
                   help=("install the wheel with its dependencies under these pip constraints, "
                         "instead of alone (--no-deps)"))
    p.add_argument("--backend", choices=BACKENDS, default=DEFAULT_BACKEND,
                   help=("local: a child process per cell (default); docker: a container per "
                         "cell, no network, the install mounted read-only"))
    p.add_argument("--base-image", default=None, metavar="IMAGE",
                   help="docker: base image the runtime images are built on")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help=f"kill a cell after S seconds (default {DEFAULT_TIMEOUT:.0f})")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help=(f"reports go here (default {DEFAULT_OUT}/; with --static-only only when "
                         "given): summary.md, junit.xml, static.json, and after the dynamic "
                         "stage results.jsonl, results.json and index.html"))
    p.add_argument("--wheel-dir", type=Path, default=None, metavar="DIR",
                   help="directory of already-downloaded CUDA runtime wheels")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print only the verdict lines, error findings and failed cells")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document on stdout (static findings and the dynamic stage's "
                        "results.json; docs/json-output.md); the usual lines go to stderr")
    add_history_options(p)
    add_cli_options(p, default="auto")
    return p

"""``cumatrix fetch``: download every wheel a matrix needs, for a host without network.

What a matrix needs: its runtime wheels (``wheel:``), the wheels of its environment
runtimes (``requirements:``, with their dependencies, for the target Python and
platform), and the runtime wheels whose ``include/`` the builds and the driver
interposer compile against.  ``--gate`` adds the wheels the gate's built-in matrix and
its audit data read.  The GPU host then runs with ``--wheel-dir DIR`` or
``CUMATRIX_WHEEL_DIR=DIR``; nothing there reaches the network.

Only ``pip download --only-binary=:all:`` runs: no package's code is executed.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cumatrix.core.errors import RuntimeNotFound, UsageError
from cumatrix.core.model import Matrix
from cumatrix.load import matrix as _matrix
from cumatrix.provision import runtimes
from cumatrix.provision.pip import pip_download, platform_tags

#: The platform a GPU cluster node usually is; its older manylinux tags are accepted too.
DEFAULT_PLATFORM = "manylinux_2_28_x86_64"

EPILOG = """\
examples:
  cumatrix fetch matrix.yaml --dest wheels/                       # for a host like this one
  cumatrix fetch matrix.yaml --dest wheels/ --python-version 3.12 # its Python is 3.12
  cumatrix fetch --gate --dest wheels/                            # also what `cumatrix gate` reads
  cumatrix fetch matrix.yaml --harness --dest wheels/             # and cumatrix's own dependencies
then, on the offline GPU host:
  CUMATRIX_WHEEL_DIR=wheels/ cumatrix run matrix.yaml
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class Needs:
    """Requirements a matrix needs, each with why (for the listing)."""

    pinned: tuple[tuple[str, str], ...]  # (requirement, why), runtime and header wheels, no dependencies
    environments: tuple[tuple[tuple[str, ...], str], ...]  # (requirements, why), with dependencies


def needs(m: Matrix | None, *, gate: bool = False, harness: bool = False) -> Needs:
    """What :func:`fetch` downloads for ``m`` (and for the gate)."""
    pinned: dict[str, str] = {}
    envs: list[tuple[tuple[str, ...], str]] = []
    if m is not None:
        _add_matrix_needs(m, pinned, envs)
    if gate:
        for v, req in runtimes.KNOWN_WHEELS.items():
            pinned.setdefault(req, f"the gate (cu{v})")
    if harness:
        envs.append((harness_requirements(), "cumatrix's own dependencies"))
    return Needs(pinned=tuple(pinned.items()), environments=tuple(envs))


def _add_matrix_needs(m: Matrix, pinned: dict[str, str], envs: list[tuple[tuple[str, ...], str]]) -> None:
    """Add to ``pinned`` and ``envs`` the wheels of ``m``'s runtimes and the header wheels of its builds."""
    rts = m.runtimes
    for rt in rts:
        if rt.requirement:
            pinned.setdefault(rt.requirement, f"runtime {rt.name}")
        elif rt.requirements:
            envs.append((rt.requirements, f"environment runtime {rt.name}"))
    for b in m.builds:
        _, req = runtimes.headers_wheel(b, rts)
        pinned.setdefault(req, f"headers {b}")
    # The interposer of an emulated driver reads symbol versions from the runtimes' headers,
    # else from the newest known wheel (session.Runner.interposer_dir).
    if any(d.emulated for d in m.drivers) and not any(rt.requirement for rt in rts):
        newest = max(runtimes.KNOWN_WHEELS, key=lambda v: tuple(int(x) for x in v.split(".")))
        pinned.setdefault(runtimes.KNOWN_WHEELS[newest], "headers of the driver interposer")


def harness_requirements() -> tuple[str, ...]:
    """cumatrix's own install requirements (no extras), for installing it on the offline host."""
    # deferred: importlib.metadata costs ~15 ms; `cumatrix --help` imports this module, only --harness needs it
    from importlib import metadata

    try:
        reqs = metadata.requires("cumatrix") or []
    except metadata.PackageNotFoundError:
        return ()
    # setuptools: the build backend, so that `pip install --no-index --find-links DIR -e .` works there
    return (*(r for r in reqs if "extra ==" not in r), "setuptools")






def fetch(m: Matrix | None, dest: Path, *, python_version: str | None = None,
          platform: str = DEFAULT_PLATFORM, gate: bool = False, harness: bool = False,
          say: Any = print) -> list[Path]:
    """Download everything ``m`` needs into ``dest``; return the wheels now there.

    Runtime wheels are checked (METADATA, a libcudart, no unsafe member) as they arrive.
    """
    dest.mkdir(parents=True, exist_ok=True)
    plats = platform_tags(platform)
    want = needs(m, gate=gate, harness=harness)
    for req, why in want.pinned:
        pip_download([req], dest, deps=False, python_version=python_version, platforms=plats, what=why)
        name, version = runtimes.parse_requirement(req)
        wheel = runtimes.find_wheel(dest, name, version)
        if wheel is None:
            raise RuntimeNotFound(f"{why}: {req}: pip reported success but left no wheel in {dest}")
        label = next((rt.label for rt in (m.runtimes if m else ()) if rt.requirement == req), why)
        runtimes.check_runtime_wheel(wheel, req, label=label)
        say(f"{wheel.name:90s} {why}")
    for reqs, why in want.environments:
        if not reqs:
            continue
        before = set(dest.glob("*.whl"))
        pip_download(list(reqs), dest, deps=True, python_version=python_version, platforms=plats, what=why)
        added = sorted(set(dest.glob("*.whl")) - before)
        say(f"{' '.join(reqs):90s} {why}: {len(added)} new wheel(s)")
    return sorted(dest.glob("*.whl"))


def cmd_fetch(args: argparse.Namespace) -> int:
    m: Matrix | None = None
    if args.matrix or not (args.gate or args.harness):
        # deferred: the run command's module, for the matrix every command takes when none is named
        from cumatrix.front.run_cmd import matrix_arg

        m = _matrix.load(matrix_arg(args.matrix))
    if args.python_version and not re.fullmatch(r"3\.\d{1,2}", args.python_version):
        raise UsageError(f"--python-version {args.python_version}: want 3.X, e.g. 3.12")
    dest = Path(args.dest)
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"--dest {dest}: exists and is not a directory")
    wheels = fetch(m, dest, python_version=args.python_version, platform=args.platform, gate=args.gate,
                   harness=args.harness)
    print(f"cumatrix: {len(wheels)} wheel(s) in {dest}/; offline: --wheel-dir {dest} or CUMATRIX_WHEEL_DIR={dest}",
          file=sys.stderr)
    return 0


def add_fetch_parser(sub: Any) -> None:
    p = sub.add_parser("fetch", help="download every wheel a matrix needs, for an offline host",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Download the runtime wheels, environment runtimes' wheels and header wheels "
                                   "that MATRIX needs into --dest, for the target Python and platform.")
    p.add_argument("matrix", nargs="?", help="matrix file (default: ./matrix.yaml, else the default matrix bundled "
                   "with cumatrix, as run; none with --gate or --harness alone)")
    p.add_argument("--dest", required=True, metavar="DIR", help="put the wheels here (created if missing)")
    p.add_argument("--python-version", metavar="3.X",
                   help="the target host's Python (default: this one) for environment runtimes' wheels")
    p.add_argument("--platform", default=DEFAULT_PLATFORM, metavar="TAG",
                   help=f"the target's platform tag; older manylinux tags are included (default {DEFAULT_PLATFORM})")
    p.add_argument("--gate", action="store_true", help="also the runtime wheels `cumatrix gate` reads")
    p.add_argument("--harness", action="store_true",
                   help="also cumatrix's own dependencies (pip install --no-index --find-links DIR cumatrix there)")
    p.set_defaults(func=cmd_fetch)

"""Ship the reference C sources (``cumatrix/native/``), the runtime Dockerfile, the default
matrix (``cumatrix/data/matrix.yaml``: what ``cumatrix run`` runs where no matrix.yaml is) and
the compiled spawn helper, rtld-audit library and prebuilt driver interposer
(``cumatrix/libexec/``) inside the package.

``reference/`` at the top of the repository is the source of truth; a wheel or a
non-editable install carries a copy so that ``cumatrix build`` works anywhere.  The spawn
helper, the audit library and the interposer are compiled here, with the compiler of the
machine that builds the wheel, so that a host without one (most GPU runners' images) has the
same evidence and the same emulated drivers as a checkout (the interposer is then configured
per host by patching a copy: cumatrix.provision.prebuilt_driver); the wheel is then a platform wheel (``py3-none-linux_*``, made ``manylinux_*`` by
auditwheel in the release workflow).  ``CUMATRIX_PURE_WHEEL=1`` builds the pure wheel instead:
the helpers are then compiled on the host at first use, as from a checkout; so does a host with no
compiler (``pip install .`` on a GPU runner's image), unless ``CUMATRIX_PURE_WHEEL=0``.
"""

import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent
# The flags observe.py and spawn.py compile with at first use: the same program either way.
# cumatrix.execute.observe.AUDIT_CFLAGS and NOLIBC_CFLAGS (a test compares them): where audit.c
# makes its own system calls (x86-64, AArch64) it is linked without the C library.
AUDIT_CFLAGS = ["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror"]
NOLIBC_CFLAGS = ["-nostdlib", "-fno-builtin", "-fno-tree-loop-distribute-patterns", "-fno-stack-protector",
                 "-Wl,-z,defs"]
if platform.machine() in ("x86_64", "aarch64"):
    AUDIT_CFLAGS += NOLIBC_CFLAGS
SPAWN_CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror"]  # cumatrix.execute.spawn.SPAWN_CFLAGS

def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


# ``pip install .`` on a host without a compiler (a GPU runner's image) still installs: the pure
# wheel, its helpers compiled at first use where a compiler appears, and every run saying what
# evidence it lacks until then.  ``CUMATRIX_PURE_WHEEL=0`` (the release job) makes a missing
# compiler an error instead of a wheel without its helpers.
_PURE_ENV = os.environ.get("CUMATRIX_PURE_WHEEL")
PURE = _PURE_ENV == "1" or (_PURE_ENV != "0" and _compiler() is None)
if PURE and _PURE_ENV != "1":
    print("cumatrix: no C compiler (cc, gcc or $CC) on this host: building the pure package, without the "
          "compiled spawn helper, audit library and driver interposer (cumatrix says what evidence each run "
          "lacks; install gcc and reinstall to have them)", file=sys.stderr)
# The same as cumatrix.provision.prebuilt_driver.COMPILE_FLAGS (a test compares them): the
# interposer with a trampoline per known entry point and its configuration read at run time.
INTERPOSER_FLAGS = ["-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", "-DCUMATRIX_RUNTIME_CONFIG"]


def _compile(out: Path) -> None:
    """cumatrix-spawn (static where the C library allows it: it then starts without the dynamic
    loader, as spawn.py builds it), libcumatrix_audit.so and libcumatrix_cuda.so (the driver
    interposer) into ``out``."""
    cc = _compiler()
    if cc is None:
        raise SystemExit("building a cumatrix wheel compiles csrc/spawn*.c, csrc/audit.c and data/interposer.c: "
                         "no C compiler (cc, gcc or $CC) found; install gcc, or set CUMATRIX_PURE_WHEEL=1 for a "
                         "pure wheel whose helpers are compiled on the host at first use")
    out.mkdir(parents=True, exist_ok=True)
    csrc = HERE / "src" / "cumatrix" / "csrc"
    # Every unit of the helper (spawn.c and spawn_*.c), as execute/spawn.py builds it.
    spawn = [cc, *SPAWN_CFLAGS, "-o", str(out / "cumatrix-spawn"), *map(str, sorted(csrc.glob("spawn*.c")))]
    if subprocess.run([*spawn[:2], "-static", *spawn[2:]], check=False, capture_output=True).returncode != 0:
        subprocess.run(spawn, check=True)
    subprocess.run([cc, *AUDIT_CFLAGS, "-o", str(out / "libcumatrix_audit.so"), str(csrc / "audit.c")], check=True)
    data = HERE / "src" / "cumatrix" / "data"
    subprocess.run([cc, *INTERPOSER_FLAGS, "-o", str(out / "libcumatrix_cuda.so"), str(data / "interposer.c"),
                    "-ldl"], check=True)
    for name in ("cumatrix-spawn", "libcumatrix_audit.so", "libcumatrix_cuda.so"):
        (out / name).chmod(0o755)


class BuildPyWithReference(build_py):
    def run(self) -> None:
        super().run()
        src = HERE / "reference"
        dst = Path(self.build_lib) / "cumatrix" / "native"
        dst.mkdir(parents=True, exist_ok=True)
        if not src.is_dir():
            raise SystemExit(f"{src}: missing; an sdist must carry reference/ (see MANIFEST.in)")
        for f in sorted(src.iterdir()):
            # Every C source, header and included fragment; the README stays behind.
            if f.is_file() and f.suffix != ".md":
                shutil.copy2(f, dst / f.name)
        data = Path(self.build_lib) / "cumatrix" / "data"
        data.mkdir(parents=True, exist_ok=True)
        for name in ("runtime.Dockerfile", "env-runtime.Dockerfile"):
            shutil.copy2(HERE / "containers" / name, data / name)
        shutil.copy2(HERE / "matrix.yaml", data / "matrix.yaml")
        if not PURE and not self.editable_mode:
            _compile(Path(self.build_lib) / "cumatrix" / "libexec")


class BinaryDistribution(Distribution):
    """Built in the platform's tree and installed to platlib, as auditwheel wants binaries to be."""

    def has_ext_modules(self) -> bool:
        return not PURE


class PlatformWheel(bdist_wheel):
    """``py3-none-<platform>``: compiled programs, no extension module (any CPython 3 loads it)."""

    def get_tag(self) -> tuple[str, str, str]:
        if PURE:
            return super().get_tag()
        plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        return "py3", "none", plat


if sys.platform != "linux" and not PURE:
    raise SystemExit("cumatrix runs on Linux only (its helpers trace processes with ptrace and /proc)")

setup(distclass=BinaryDistribution, cmdclass={"build_py": BuildPyWithReference, "bdist_wheel": PlatformWheel})

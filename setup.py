"""Ship the reference C sources (``cumatrix/native/``), the runtime Dockerfile and the default
matrix (``cumatrix/data/matrix.yaml``: what ``cumatrix run`` runs where no matrix.yaml is) inside
the package.

``reference/`` at the top of the repository is the source of truth; a wheel or a
non-editable install carries a copy so that ``cumatrix build`` works anywhere.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithReference(build_py):
    def run(self) -> None:
        super().run()
        src = Path(__file__).parent / "reference"
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
            shutil.copy2(Path(__file__).parent / "containers" / name, data / name)
        shutil.copy2(Path(__file__).parent / "matrix.yaml", data / "matrix.yaml")


setup(cmdclass={"build_py": BuildPyWithReference})

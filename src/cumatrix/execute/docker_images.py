"""Docker images and containers the harness made: their recipes, what a runtime's image is (or why
there is none), and how they are found again by their labels."""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cumatrix
from cumatrix.core.errors import HarnessError


def process_token(pid: int) -> str | None:
    """``<pid>.<start time>`` of a live process, else None (a reused pid has another start time)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime) counted after the ")" that ends the command name.
    fields = stat.rsplit(")", 1)[1].split()
    return f"{pid}.{fields[19]}"


def listed(client: Any, label: str) -> list[tuple[Any, dict[str, str], str, str]]:
    """``(container, labels, name, state)`` of the containers with ``label``, from the list call
    alone: a full listing inspects each container after listing it, and one removed in between
    (another run's, finished) raised ``NotFound`` and ended the caller."""
    out = []
    for c in client.containers.list(all=True, sparse=True, filters={"label": label}):
        a = c.attrs
        names = a.get("Names") or [c.id[:12]]
        out.append((c, dict(a.get("Labels") or {}), str(names[0]).lstrip("/"), str(a.get("State") or "")))
    return out


#: The label ``containers/build-base.sh`` puts on the base image (value: the recipe hash).
BASE_LABEL = "cumatrix.base"


#: The label the docker backend puts on runtime images (and containers).
RUNTIME_LABEL = "cumatrix"


def find_base_image(client: Any) -> str | None:
    """The newest tagged image ``containers/build-base.sh`` built, or None.

    Images built FROM the base inherit its labels, so runtime images (labelled
    ``cumatrix``) and untagged build stages are left out.
    """
    best: tuple[str, str] | None = None
    for img in client.images.list(filters={"label": BASE_LABEL}):
        labels = img.labels or {}
        if RUNTIME_LABEL in labels or not img.tags:
            continue
        created = str(img.attrs.get("Created", ""))
        if best is None or created > best[0]:
            best = (created, img.tags[0])
    return best[1] if best else None


def package_root() -> Path:
    """The directory holding the ``cumatrix`` package (what the child's PYTHONPATH needs)."""
    return Path(cumatrix.__file__).resolve().parent.parent


def runtime_dockerfile() -> Path:
    """``containers/runtime.Dockerfile`` of the source tree, or the copy in package data."""
    return dockerfile("runtime.Dockerfile")


def dockerfile(name: str) -> Path:
    """A Dockerfile of ``containers/`` in the source tree, or its copy in package data."""
    here = Path(__file__).resolve()
    for cand in (here.parents[3] / "containers" / name, here.parents[1] / "data" / name):
        if cand.is_file():
            return cand
    raise HarnessError(f"{name} not found (expected in containers/ of the source tree "
                       "or in cumatrix/data/); reinstall cumatrix")


class ImageBuildError(HarnessError):
    """A runtime image could not be built (the message holds the build log's tail)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ImageInfo:
    """The image a runtime's cells run in, or why there is none (a per-cell error)."""

    runtime_name: str
    tag: str
    image_id: str | None
    source: str  # "wheel <requirement> on <base>" or "image"
    built: bool = False  # built by this call (False: it existed already)
    cudart: str | None = None  # CUMATRIX_CUDART inside the image
    python: str | None = None  # python3 version inside, when checked
    problem: str | None = None  # set when cells of this runtime cannot run

    @property
    def ok(self) -> bool:
        return self.problem is None


def cudart_in_wheel(wheel: Path) -> str:
    """Path of ``libcudart.so.<major>`` inside a runtime wheel."""
    with zipfile.ZipFile(wheel) as zf:
        names = sorted(n for n in zf.namelist()
                       if re.search(r"/lib/libcudart\.so\.\d+$", n))
    if not names:
        raise ImageBuildError(f"{wheel.name}: holds no lib/libcudart.so.<N>; not a CUDA runtime wheel")
    return names[0]

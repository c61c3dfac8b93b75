"""The text of runtime requirements in a matrix file: pinned wheels and environment requirements.

Pure parsing, shared by the loader (which checks a matrix) and provisioning (which fetches).
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources

_REQ_RE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*(?P<version>[0-9][0-9A-Za-z.+-]*)$")


#: Requirements of the runtimes measured in docs/facts.md; ``headers X.Y`` picks from here.
KNOWN_WHEELS: dict[str, str] = {
    "12.0": "nvidia-cuda-runtime-cu12==12.0.146",
    "12.4": "nvidia-cuda-runtime-cu12==12.4.127",
    "12.8": "nvidia-cuda-runtime-cu12==12.8.90",
    "12.9": "nvidia-cuda-runtime-cu12==12.9.79",
    "13.0": "nvidia-cuda-runtime==13.0.96",
    "13.5": "nvidia-cuda-runtime==13.5.37",
}


@cache
def cuda_releases() -> tuple[str, ...]:
    """The CUDA releases cumatrix knows, oldest first: those of NVIDIA's driver table
    (``data/nvidia.json``'s ``min_driver``, with its sources) and those whose runtime wheels it
    knows.  ``emulated-X.Y`` must name one of them."""
    table = json.loads(resources.files("cumatrix").joinpath("data", "nvidia.json").read_text(encoding="utf-8"))
    versions = {*table["min_driver"], *KNOWN_WHEELS}
    return tuple(sorted(versions, key=lambda v: tuple(int(p) for p in v.split("."))))


def parse_requirement(text: str) -> tuple[str, str]:
    """``name==version`` -> (name, version); a pinned version is required."""
    m = _REQ_RE.match(text.strip())
    if not m:
        raise ValueError(
            f"not a pinned requirement: {text!r} (want NAME==VERSION, e.g. nvidia-cuda-runtime-cu12==12.9.79)"
        )
    return m.group("name"), m.group("version")


_ENV_REQ = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,\s-]*\])?\s*([=<>!~][^;@]*)?(;[^@]*)?$")


def check_env_requirement(text: str) -> str:
    """A requirement of an environment runtime: ``name[extras] specifier ; marker``, nothing else.

    Options (``-e``, ``--index-url``), paths and URLs are refused: the environment's content
    hash covers only what is written here, and an option would reach uv's command line.
    """
    t = text.strip()
    if not t or not _ENV_REQ.match(t):
        raise ValueError(f"not a requirement: {text!r} (want NAME[SPEC], e.g. cuda-bindings==12.9.*; "
                         "no options, paths or URLs)")
    return t

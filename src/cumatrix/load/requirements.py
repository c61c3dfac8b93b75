"""The text of runtime requirements in a matrix file: pinned wheels and environment requirements.

Pure parsing, shared by the loader (which checks a matrix) and provisioning (which fetches).
"""

from __future__ import annotations

import re

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

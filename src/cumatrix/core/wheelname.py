"""Wheel file names and interpreter compatibility, as ``packaging`` reads them (PEP 427, PEP 425).

A wheel's name, version and tags come from :func:`packaging.utils.parse_wheel_filename`, never
from splitting its file name on ``-`` (a build tag, or a name that is not normalised, moves the
fields); whether an interpreter can install a wheel is decided up front from
:func:`packaging.tags.sys_tags` of that interpreter, not read back from pip's error text.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import Tag, sys_tags
from packaging.utils import InvalidWheelFilename, NormalizedName, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from cumatrix.core.errors import UsageError


@dataclass(frozen=True)
class WheelName:
    """The fields of a wheel's file name: normalised name, version, build tag and tags."""

    name: NormalizedName
    version: Version
    build: tuple[()] | tuple[int, str]
    tags: frozenset[Tag]

    @property
    def dist(self) -> str:
        """The name as a wheel's file name spells it (PEP 427 escaping: ``-`` becomes ``_``)."""
        return self.name.replace("-", "_")

    @property
    def tag_text(self) -> str:
        """The wheel's tags, expanded from its file name's compressed tag set and sorted."""
        return ", ".join(sorted(str(t) for t in self.tags))

    def is_version(self, text: str) -> bool:
        """``text`` (a pin such as ``pip freeze`` prints) names this version; PEP 440 equality,
        so ``1.0`` is ``1.0.0``."""
        try:
            return self.version == Version(text)
        except InvalidVersion:
            return str(self.version) == text

    @property
    def key(self) -> str:
        """Name, version and every tag: one key per distinct wheel of a distribution."""
        return f"{self.dist}-{self.version}-" + ".".join(sorted(str(t) for t in self.tags))


def wheel_name(wheel: Path | str) -> WheelName:
    """The parsed file name of ``wheel``; :class:`UsageError` where it is not a wheel's name."""
    filename = Path(wheel).name
    try:
        name, version, build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as e:
        raise UsageError(f"{wheel}: not a wheel file name ({e})") from e
    return WheelName(name=name, version=version, build=build, tags=tags)


def maybe_wheel_name(wheel: Path | str) -> WheelName | None:
    """:func:`wheel_name`, or None where the name is not a wheel's (a stray file in a directory)."""
    try:
        return wheel_name(wheel)
    except UsageError:
        return None


#: The tags of interpreters asked in this process, by interpreter path.
_TAGS: dict[str, tuple[Tag, ...] | None] = {}

_ASK_TAGS = "import packaging.tags as t\nfor x in t.sys_tags(): print(x)\n"


def own_tags() -> tuple[Tag, ...]:
    """The tags this interpreter installs, most preferred first."""
    return tuple(sys_tags())


def interpreter_tags(python: str | None = None) -> tuple[Tag, ...] | None:
    """The tags ``python`` (default: this interpreter) installs, most preferred first.

    Another interpreter is asked with a one-line program that imports its own ``packaging``;
    where it has none (or fails to answer), None: then nothing is decided here and pip's own
    verdict at install time stands.
    """
    if python is None or python == sys.executable:
        return own_tags()
    if python not in _TAGS:
        try:
            proc = subprocess.run([python, "-c", _ASK_TAGS], capture_output=True, text=True,
                                  check=False, timeout=60)
        except (OSError, subprocess.SubprocessError):
            proc = None
        if proc is None or proc.returncode != 0 or not proc.stdout.strip():
            _TAGS[python] = None
        else:
            tags: list[Tag] = []
            for line in proc.stdout.split():
                interp, abi, plat = line.split("-")  # a tag as str(Tag) prints it: no '-' inside
                tags.append(Tag(interp, abi, plat))
            _TAGS[python] = tuple(tags)
    return _TAGS[python]


def installable(wheel: Path | str, python: str | None = None) -> bool | None:
    """Whether ``python`` (default: this interpreter) can install ``wheel`` by its tags; None
    where that interpreter's tags are unknown (see :func:`interpreter_tags`)."""
    tags = interpreter_tags(python)
    if tags is None:
        return None
    return not wheel_name(wheel).tags.isdisjoint(tags)

"""Wheel file names and interpreter tags as ``packaging`` reads them (issue 39, item 5)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import packaging
import pytest
from packaging.tags import sys_tags

from cumatrix.core.errors import UsageError
from cumatrix.core.wheelname import installable, interpreter_tags, wheel_name
from cumatrix.provision.environments import _files_of
from cumatrix.provision.runtimes import find_wheel


def _touch(d: Path, name: str) -> Path:
    p = d / name
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("x.py", "")
    return p


def test_a_build_tag_and_an_unnormalised_name_are_read_as_pep_427_says() -> None:
    w = wheel_name("Demo.Pkg-1.0-7-py2.py3-none-any.whl")
    assert (w.name, str(w.version), w.build) == ("demo-pkg", "1.0", (7, ""))
    assert w.tag_text == "py2-none-any, py3-none-any"  # the compressed tag set, expanded
    assert wheel_name("demo_pkg-1.0-py3-none-any.whl").key != wheel_name("demo_pkg-1.0.1-py3-none-any.whl").key


def test_a_name_that_is_no_wheel_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="not a wheel file name"):
        wheel_name("my-pkg-1.0-py3-none-any.whl")  # '-' in the name: split("-") read "pkg" as the version


def test_find_wheel_matches_the_normalised_name_and_pep_440_version(tmp_path: Path) -> None:
    """Before, a prefix match on the file name missed ``Demo.Pkg-1.0-...`` asked for as ``demo_pkg``
    and ``1.0.0``, and took no notice of a build tag."""
    w = _touch(tmp_path, "Demo.Pkg-1.0-1-py3-none-any.whl")
    _touch(tmp_path, "demo_pkg-1.0.1-py3-none-any.whl")
    assert find_wheel(tmp_path, "demo_pkg", "1.0.0") == w
    assert find_wheel(tmp_path, "demo-pkg", "1.0") == w
    assert find_wheel(tmp_path, "demo-pkg", "1.1") is None


def test_an_environments_pins_pick_their_wheels_by_parsed_name(tmp_path: Path) -> None:
    w = _touch(tmp_path, "Demo.Pkg-2.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    _touch(tmp_path, "not-a-wheel.whl")
    assert _files_of(tmp_path, [("demo_pkg", "2.0.0")]) == [w]


def test_this_interpreter_installs_by_its_own_tags() -> None:
    assert interpreter_tags() == tuple(sys_tags())
    assert installable("x-1.0-py3-none-any.whl") is True
    assert installable("x-1.0-cp27-cp27mu-manylinux1_x86_64.whl") is False


def test_another_interpreter_is_asked_for_its_tags(tmp_path: Path) -> None:
    # A path other than sys.executable (a venv of its own): asked in a subprocess.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "other")], check=True)
    other = tmp_path / "other" / "bin" / "python"
    site = subprocess.run([other, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "packaging.pth").write_text(str(Path(packaging.__file__).parent.parent) + "\n")
    tags = interpreter_tags(str(other))
    assert tags is not None
    assert {str(t) for t in tags} >= {f"cp{sys.version_info[0]}{sys.version_info[1]}-none-any", "py3-none-any"}
    assert installable("x-1.0-cp27-cp27mu-manylinux1_x86_64.whl", str(other)) is False


def test_an_interpreter_without_packaging_decides_nothing(tmp_path: Path) -> None:
    """Then pip's own verdict at install time stands: None, not a guess."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    bare = str(tmp_path / "bare" / "bin" / "python")
    assert interpreter_tags(bare) is None
    assert installable("x-1.0-py3-none-any.whl", bare) is None

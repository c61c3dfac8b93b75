"""Requirements read as PEP 508 reads them (``packaging.requirements``), never by a regular
expression: ``validate --check-wheels`` on an environment's requirements, the pins of an
environment's resolution (``uv pip compile``, in ``pip freeze``'s format), and the matrix
runtime whose headers a built cell uses.  Each case below is one a hand-written pattern got
wrong: extras, environment markers, ``===``, ``==X.*``, spaces around ``==``, a name spelt
with capitals, dots or underscores."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cumatrix.core.errors import RuntimeNotFound
from cumatrix.front.checkwheels import check_wheels
from cumatrix.load.matrix import cells, loads
from cumatrix.provision.environments import pin_of
from cumatrix.results.digests import _headers_source
from helpers.wheels import make_wheel


def _matrix(requirements: list[str]) -> str:
    reqs = ", ".join(f"'{r}'" for r in requirements)
    return textwrap.dedent(f"""\
        version: 1
        runtimes:
          env: {{requirements: [{reqs}]}}
        drivers: [host]
        cases: [{{name: a, argv: [/bin/true]}}]
        """)


@pytest.fixture
def wheel_dir(tmp_path: Path) -> Path:
    d = tmp_path / "wheels"
    make_wheel(d, "Foo_Bar", {"foo_bar/__init__.py": b""}, version="1.0.0")
    make_wheel(d, "baz", {"baz/__init__.py": b""}, version="2.0rc1")
    return d


@pytest.mark.parametrize("requirement", [
    "Foo_Bar==1.0.0",
    "foo-bar == 1.0",                      # spaces around ==; PEP 440: 1.0 is 1.0.0
    "FOO.BAR==1.0.*",                      # a prefix match, name in capitals with a dot
    "foo_bar[extra]==1.0.0",               # extras
    'foo-bar==1.0.0; python_version >= "3"',
    "foo-bar (==1.0.0)",                   # the parenthesised form PEP 508 allows
    "foo-bar===1.0.0",                     # arbitrary equality: the text itself
    "foo-bar>=1,<2",
    "foo-bar",
    "baz==2.0rc1",                         # a pin may name a pre-release
    'foo-bar==9.0; python_version < "3"',  # a marker false here: not installed, not checked
])
def test_a_requirement_the_wheel_directory_meets_passes(requirement: str, wheel_dir: Path) -> None:
    m = loads(_matrix([requirement]), "m.yaml")
    assert check_wheels(m, wheel_dir=wheel_dir) == []


@pytest.mark.parametrize("requirement", [
    "foo-bar===1.0",                       # === compares text: 1.0 is not 1.0.0
    "foo-bar (==9.0)",
    "foo-bar>=2",
    "Foo_Bar[extra] == 9.0",
    'foo-bar==9.0; python_version >= "3"',
    "qux",                                 # no wheel of that name at all
])
def test_a_requirement_the_wheel_directory_does_not_meet_is_a_problem_at_its_place(requirement: str,
                                                                                    wheel_dir: Path) -> None:
    m = loads(_matrix([requirement]), "m.yaml")
    problems = check_wheels(m, wheel_dir=wheel_dir)
    assert len(problems) == 1, problems
    p = problems[0]
    assert (p.file, p.line) == ("m.yaml", 3)
    assert p.message == f"runtimes: env: {requirement}: no matching wheel in {wheel_dir}"


@pytest.mark.parametrize(("line", "pin"), [
    ("foo==1.0", ("foo", "1.0")),
    ("Foo_Bar == 1.0", ("foo-bar", "1.0")),
    ("foo.bar[extra]==1.0", ("foo-bar", "1.0")),
    ("foo===1.0", ("foo", "1.0")),
    ('foo==1.0 ; python_version < "3.13"', ("foo", "1.0")),
    ("foo==1.0  # via bar", ("foo", "1.0")),
    ("foo==1.0 \\", ("foo", "1.0")),       # a pin continued by its --hash lines
    ("    --hash=sha256:0123abcd", None),
    ("-e git+https://example.org/p.git#egg=p", None),
    ("--index-url https://example.org/simple", None),
    ("foo @ file:///wheels/foo-1.0-py3-none-any.whl", None),  # an extra wheel: hashed as given
    ("/dist/foo-1.0-py3-none-any.whl", None),  # the same, as uv echoes a path it was given
    ("./dist/foo-1.0-py3-none-any.whl", None),
    ("# via bar", None),
    ("", None),
])
def test_the_pins_of_a_resolution(line: str, pin: tuple[str, str] | None) -> None:
    assert pin_of(line) == pin


@pytest.mark.parametrize(("line", "why"), [
    ("foo>=1.0", "does not pin one version"),
    ("foo==1.*", "does not pin one version"),
    ("foo==1.0,!=1.1", "does not pin one version"),
    ("not a requirement!", "cannot read 'not a requirement!' of the resolution: Expected"),
])
def test_a_resolution_line_that_pins_nothing_readable_is_an_error_not_a_wheel_left_out(line: str, why: str) -> None:
    with pytest.raises(RuntimeNotFound, match=f"^environment x: .*{why}"):
        pin_of(line, "environment x")


@pytest.mark.parametrize("pin", ["nvidia-cuda-runtime-cu12 == 12.9.86", "NVIDIA_CUDA_Runtime_CU12==12.9.86.post1"])
def test_a_built_cell_takes_its_headers_from_the_matrix_runtime_of_that_release(pin: str) -> None:
    m = loads(textwrap.dedent(f"""\
        version: 1
        runtimes:
          mine: {{wheel: "{pin}"}}
        drivers: [host]
        builds: ["12.9"]
        variants: [loop]
        workloads: [{{name: w, direction: d2h, block_bytes: 4096, blocks: 4, layers: 1}}]
        """), "m.yaml")
    built = [c for c in cells(m) if c.build is not None]
    assert built
    assert {_headers_source(m, c) for c in built} == {pin}

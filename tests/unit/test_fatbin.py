"""NVIDIA's rules for which device code serves which GPU, as :mod:`cumatrix.binary.fatbin` applies them
(CUDA C++ Programming Guide, "Binary Compatibility", "PTX Compatibility", "Feature Availability")."""

from __future__ import annotations

import pytest

from cumatrix.binary.fatbin import DeviceCode, covering, parse_arch, ptx_isa_cuda


@pytest.mark.parametrize(("text", "want"), [
    ("9.0", (90, "")), ("9.0a", (90, "a")), ("10.0f", (100, "f")), ("12.0+PTX", (120, "")),
    ("sm_86", (86, "")), ("90a", (90, "a")), ("compute_75", (75, "")),
])
def test_parse_arch(text: str, want: tuple[int, str]) -> None:
    assert parse_arch(text) == want


@pytest.mark.parametrize("text", ["nine", "9", "9.0b", "", "9.10"])
def test_parse_arch_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a GPU architecture"):
        parse_arch(text)


def test_sass_runs_on_later_minors_of_its_major_only() -> None:
    sm80 = DeviceCode(kind="sass", arch=80)
    assert [a for a in (75, 80, 86, 89, 90, 100) if sm80.runs_on(a)] == [80, 86, 89]


def test_arch_specific_runs_only_on_its_arch() -> None:
    for kind in ("sass", "ptx"):
        code = DeviceCode(kind=kind, arch=90, variant="a")  # type: ignore[arg-type]
        assert [a for a in (80, 90, 100, 120) if code.runs_on(a)] == [90]


def test_family_specific_runs_on_its_family() -> None:
    code = DeviceCode(kind="sass", arch=100, variant="f")
    assert [a for a in (90, 100, 103, 110, 120) if code.runs_on(a)] == [100, 103]


def test_ptx_compiles_forward() -> None:
    ptx = DeviceCode(kind="ptx", arch=80, isa=(8, 8))
    assert [a for a in (75, 80, 90, 100, 120) if ptx.runs_on(a)] == [80, 90, 100, 120]
    sass, jit = covering((ptx, DeviceCode(kind="sass", arch=90)), 90)
    assert [c.name for c in sass] == ["sm_90"]
    assert [c.name for c in jit] == ["compute_80"]


def test_ptx_isa_needs_its_toolkit_driver() -> None:
    assert ptx_isa_cuda((9, 0)) == (13, 0)
    assert ptx_isa_cuda((8, 7)) == (12, 8)
    assert ptx_isa_cuda((99, 0)) is None


def test_json_round_trip() -> None:
    code = DeviceCode(kind="ptx", arch=90, variant="a", isa=(9, 0), compressed=True)
    assert DeviceCode.from_json(code.to_json()) == code

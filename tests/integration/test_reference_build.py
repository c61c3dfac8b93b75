"""Build every reference variant with gcc against real runtime wheels' headers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from cumatrix.binary.elf import elf_defined_symbols
from cumatrix.provision.build import build_variant, headers_version, reference_dir
from cumatrix.provision.runtimes import headers_for

CORRECT = [("proc-address", "driver"), ("loop", "driver"), ("runtime-dispatch", "runtime"),
           ("driver-dispatch", "runtime"), ("header-dispatch", "runtime"), ("loop", "runtime")]


@pytest.fixture(scope="module", params=["12.8", "13.0"])
def headers(request: pytest.FixtureRequest) -> tuple[str, Path]:
    return request.param, headers_for(request.param)


def needed(path: Path) -> list[str]:
    with path.open("rb") as f:
        elf = ELFFile(f)
        return [t.needed for s in elf.iter_sections() if isinstance(s, DynamicSection)
                for t in s.iter_tags() if t.entry.d_tag == "DT_NEEDED"]


def public_api() -> set[str]:
    """The functions kvswap.h declares: all a library may export."""
    text = (reference_dir() / "kvswap.h").read_text()
    return set(re.findall(r"KVSWAP_API\s[^;(]*?\b(kvswap_\w+)\s*\(", text))


def exported(path: Path) -> set[str]:
    with path.open("rb") as f:
        return set(elf_defined_symbols(ELFFile(f)))


def test_headers_version(headers: tuple[str, Path]) -> None:
    version, include = headers
    assert headers_version(include) == {"12.8": 12080, "13.0": 13000}[version]


@pytest.mark.parametrize(("variant", "family"), CORRECT)
def test_builds_without_cuda_dt_needed(headers: tuple[str, Path], variant: str, family: str, tmp_path: Path) -> None:
    _, include = headers
    result = build_variant(variant, family, include, cache=tmp_path)
    assert result.ok, result.log
    assert result.library is not None
    assert result.library.is_file()
    libs = needed(result.library)
    assert not [n for n in libs if n.startswith(("libcuda", "libcudart"))], libs
    # What the translation units of a library share (kernel_path.c, kvswap_common.c, driver_api.h)
    # stays hidden: a library exports kvswap.h's functions and nothing else; proc-address all of them.
    api = public_api()
    assert len(api) >= 17, sorted(api)
    assert "kvswap_swap_blocks" in api, sorted(api)
    ours = exported(result.library)
    assert ours <= api, sorted(ours - api)
    assert {"kvswap_swap_blocks", "kvswap_set_chunk_limit", "kvswap_variant_name", "kvswap_family"} <= ours
    if variant == "proc-address":
        assert ours == api, sorted(api - ours)
    again = build_variant(variant, family, include, cache=tmp_path)
    assert again.cache_hit
    assert again.library == result.library


def test_direct_link_links_libcuda_with_12_8_headers(tmp_path: Path) -> None:
    result = build_variant("direct-link", "driver", headers_for("12.8"), cache=tmp_path)
    assert result.ok, result.log
    assert result.library is not None
    assert "libcuda.so.1" in needed(result.library)


def test_direct_link_is_a_build_error_with_13_0_headers(tmp_path: Path) -> None:
    # vLLM's CUDA 13 break: cuda.h #defines cuMemcpyBatchAsync to the 8-parameter _v2.
    result = build_variant("direct-link", "driver", headers_for("13.0"), cache=tmp_path)
    assert not result.ok
    assert result.library is None
    assert "too many arguments" in result.log
    again = build_variant("direct-link", "driver", headers_for("13.0"), cache=tmp_path)
    assert again.cache_hit
    assert not again.ok
    assert again.log == result.log


def test_unknown_variant_suggests(tmp_path: Path) -> None:
    from cumatrix.core.errors import UsageError

    with pytest.raises(UsageError, match="did you mean 'proc-address'"):
        build_variant("proc-adress", "driver", headers_for("12.8"), cache=tmp_path)

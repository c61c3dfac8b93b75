"""Header-derived facts, read from the headers of real runtime wheels."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cumatrix.core.errors import ConfigError
from cumatrix.provision import headers as H
from cumatrix.provision.runtimes import headers_for

VERSIONS = ("12.4", "12.8", "12.9", "13.0", "13.5")


@pytest.fixture(scope="module")
def include() -> dict[str, Path]:
    # Real wheels, fetched once into the cache (pip download), never a copy of the headers.
    return {v: headers_for(v) for v in VERSIONS}


pytestmark = pytest.mark.network


def _typedefs(include: dict[str, Path], v: str) -> str:
    return (include[v] / "cudaTypedefs.h").read_text()


def test_batch_copy_introductions(include: dict[str, Path]) -> None:
    intro = H.pfn_introductions(_typedefs(include, "13.5"))
    assert intro["cuMemcpyBatchAsync"] == 12080
    assert intro["cuMemcpyBatchAsync_v2"] == 13000
    assert intro["cuMemcpyBatchAsync_ptsz"] == 12080
    assert intro["cuMemcpyBatchAsync_v2_ptsz"] == 13000
    assert intro["cuInit"] == min(intro.values()) == 2000
    assert intro["cuGetProcAddress"] == 11030
    assert intro["cuGetProcAddress_v2"] == 12000
    assert intro["cuMemcpyAsync"] == 4000
    # the per-thread flavour of the 3.2 ABI came in 7.0
    assert intro["cuMemcpyHtoD_v2_ptds"] == 7000
    assert intro["cuCtxCreate"] == 2000
    assert intro["cuCtxCreate_v4"] == 12050


def test_older_headers_lack_the_batch_copy(include: dict[str, Path]) -> None:
    assert "cuMemcpyBatchAsync" not in H.pfn_introductions(_typedefs(include, "12.4"))
    intro_128 = H.pfn_introductions(_typedefs(include, "12.8"))
    assert intro_128["cuMemcpyBatchAsync"] == 12080
    assert "cuMemcpyBatchAsync_v2" not in intro_128


def test_base_introductions(include: dict[str, Path]) -> None:
    base = H.base_introductions(_typedefs(include, "13.5"))
    assert base["cuMemcpyBatchAsync"] == 12080
    assert base["cuGetProcAddress"] == 11030
    assert base["cuInit"] == 2000
    assert not any(name.endswith(("_ptds", "_ptsz")) for name in base)


@pytest.mark.parametrize("version", VERSIONS)
def test_export_rule_agrees_with_cuda_h(include: dict[str, Path], version: str) -> None:
    """Every export name the rule derives is one cuda.h declares or maps a name to, and the
    per-thread twin has the parameter types of the plain export it is named after."""
    cuda_h = H._strip_comments((include[version] / "cuda.h").read_text())
    declared = set(re.findall(r"\b(cu\w+)\s*\(", cuda_h))
    declared |= set(re.findall(r"#\s*define\s+cu\w+\s+(?:__CUDA_API_PT\w+\()?(cu\w+)", cuda_h))
    text = _typedefs(include, version)
    exports = H.pfn_exports(text)
    params = {(b, v, pt): p for b, v, pt, p in H.pfn_typedefs(text)}
    by_name = {name: key for key, name in exports.items() if key[2] is None}
    assert len(exports) == len(set(exports.values()))  # one typedef per export
    for key, name in exports.items():
        if key[2] is None:
            assert name in declared, name
            continue
        plain = by_name[name[: -len("_ptds")]]

        def types(p: str) -> list[str]:
            # CUstreamBatchMemOpParams is a typedef of CUstreamBatchMemOpParams_v1
            return [H._param_type(x).replace("_v1", "") for x in H._split_params(p)]

        assert types(params[plain]) == types(params[key]), name


def test_header_defines_match_newest_abi(include: dict[str, Path]) -> None:
    text = (include["13.5"] / "cuda.h").read_text()
    intro = H.pfn_introductions(_typedefs(include, "13.5"))
    assert re.search(r"#define cuMemcpyBatchAsync\s+__CUDA_API_PTSZ\(cuMemcpyBatchAsync_v2\)", text)
    assert re.search(r"#define cuGetProcAddress\s+cuGetProcAddress_v2\b", text)
    assert intro["cuMemcpyBatchAsync_v2"] > intro["cuMemcpyBatchAsync"]


def test_load_introductions_and_newest(include: dict[str, Path]) -> None:
    loaded = H.load_introductions(include["13.0"])
    assert loaded == H.pfn_introductions(_typedefs(include, "13.0"))
    assert H.load_introductions(include["13.0"]) == loaded  # served from the cache
    assert H.newest_typedefs(include.values()) == include["13.5"]
    assert H.header_cuda_version(include["12.8"]) == 12080


def test_missing_typedefs_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"have no cudaTypedefs.h.*CUDA >= 12.0"):
        H.load_introductions(tmp_path)
    (tmp_path / "cudaTypedefs.h").write_text("/* no typedefs here */\n")
    with pytest.raises(ConfigError, match="no PFN_"):
        H.load_introductions(tmp_path)
    with pytest.raises(ConfigError, match="none of the runtime headers"):
        H.newest_typedefs([tmp_path / "nowhere"])


def test_runtime_prototypes_ignore_names_and_comments() -> None:
    a = "extern __host__ cudaError_t CUDARTAPI cudaFoo(void *dst /* d */, size_t n, cudaStream_t s __dv(0));"
    b = "extern  __host__   cudaError_t CUDARTAPI\ncudaFoo(void*, size_t count, cudaStream_t stream);"
    assert H.runtime_prototypes(a) == H.runtime_prototypes(b) == {
        "cudaFoo": "cudaError_t cudaFoo(void*, size_t, cudaStream_t)"}
    c = "extern __host__ __cudart_builtin__ const char* CUDARTAPI cudaGetErrorName(cudaError_t error);"
    assert H.runtime_prototypes(c) == {"cudaGetErrorName": "const char* cudaGetErrorName(cudaError_t)"}
    assert H.runtime_prototypes("extern __host__ cudaError_t CUDARTAPI cudaDeviceReset(void);") == {
        "cudaDeviceReset": "cudaError_t cudaDeviceReset()"}


def test_runtime_abi_changes_12_9_to_13_0(include: dict[str, Path]) -> None:
    changes = H.runtime_abi_changes(include["12.9"], include["13.0"])
    old, new = changes["cudaMemcpyBatchAsync"]
    assert old.count(",") == 8
    assert "size_t*, cudaStream_t)" in old
    assert new.count(",") == 7  # 8 params
    # The other CUDA 13 breaks: edge data in graph APIs, cudaMemLocation in advise/prefetch,
    # no failIdx in the 3D batch copy.
    assert {"cudaMemcpy3DBatchAsync", "cudaMemPrefetchAsync", "cudaMemAdvise",
            "cudaGraphAddNode", "cudaStreamGetCaptureInfo"} <= changes.keys()
    assert H.runtime_abi_changes(include["12.8"], include["12.9"]) == {}
    assert H.runtime_abi_changes(include["13.0"], include["13.5"]) == {}

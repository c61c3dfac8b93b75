"""Runtime entries of a matrix: environment runtimes and where each entry was written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cumatrix.core.errors import ConfigError
from cumatrix.front.fetch import needs, platform_tags
from cumatrix.load import matrix as M
from cumatrix.provision import runtimes as R

ENV = "runtimes:\n  env: {requirements: [cuda-bindings==12.9.*, nvidia-cuda-runtime-cu12==12.9.79]}\ndrivers: [host]\n"


def test_an_environment_runtime_is_parsed_with_its_place(tmp_path: Path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(ENV)
    rt = M.load(f).runtime("env")
    assert rt.requirements == ("cuda-bindings==12.9.*", "nvidia-cuda-runtime-cu12==12.9.79")
    assert rt.requirement is None
    assert not rt.site
    assert rt.where == f"{f}:2:23"
    assert rt.label == f"{f}:2:23: runtimes.env"


@pytest.mark.parametrize(("value", "col", "message"), [
    ("[--index-url=http://evil/simple]", 24, r"not a requirement: '--index-url=http://evil/simple'"),
    ("['-e .']", 24, r"not a requirement: '-e \.'"),
    ("['pkg @ https://example.invalid/pkg.whl']", 24, r"not a requirement: 'pkg @ https:.*no options, paths or URLs"),
    ("[./local/dir]", 24, r"not a requirement: './local/dir'"),
    ("[]", 23, r"expected a non-empty list of requirements, got a list"),
    ("cuda-bindings", 23, r"expected a non-empty list of requirements, got str 'cuda-bindings'"),
])
def test_bad_environment_requirements_point_at_their_place(tmp_path: Path, value: str, col: int, message: str,
                                                           cli: Any) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(f"runtimes:\n  env: {{requirements: {value}}}\ndrivers: [host]\n")
    with pytest.raises(ConfigError, match=rf"m\.yaml:2:{col}: runtimes\.env\.requirements(\[0\])?: {message}"):
        M.load(f)
    proc = cli("validate", f)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


def test_release_to_cuda_encoding() -> None:
    assert R.cuda_version_of_release("12.9.79") == 12090
    assert R.cuda_version_of_release("13.0.96") == 13000
    assert R.cuda_version_of_release("12.10") == 12100
    with pytest.raises(ValueError, match="not a CUDA release"):
        R.cuda_version_of_release("twelve")


def test_fetch_lists_runtime_header_and_environment_wheels(tmp_path: Path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text("runtimes:\n  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}\n"
                 "  env: {requirements: [cuda-bindings==12.9.*]}\n"
                 "drivers: [host]\nbuilds: ['12.9', '13.0']\nvariants: [loop]\n"
                 "workloads: [{name: w, direction: d2h, block_bytes: 4096, blocks: 4}]\n")
    n = needs(M.load(f))
    assert dict(n.pinned) == {"nvidia-cuda-runtime-cu12==12.9.79": "runtime cu12.9",
                              R.KNOWN_WHEELS["13.0"]: "headers 13.0"}
    assert n.environments == ((("cuda-bindings==12.9.*",), "environment runtime env"),)
    assert set(dict(needs(None, gate=True).pinned)) == set(R.KNOWN_WHEELS.values())
    (own, why), = needs(None, harness=True).environments
    assert why == "cumatrix's own dependencies"
    assert any(r.startswith("uv") for r in own)
    assert not any("extra ==" in r for r in own)


def test_platform_tags_include_older_manylinux() -> None:
    tags = platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64"
    assert "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert platform_tags("manylinux_2_34_aarch64")[-1] == "manylinux1_aarch64"
    assert platform_tags("win_amd64") == ["win_amd64"]

"""Release readiness: PyPI metadata, one version source, the release workflow's shape.

The build and ``twine check`` themselves run in .ci/package (and the last test here, which
builds the sdist and the wheel for real).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

import cumatrix

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data


def test_classifiers_are_all_known_to_pypi(project: dict[str, Any]) -> None:
    from trove_classifiers import classifiers

    listed = project["project"]["classifiers"]
    assert listed
    assert [c for c in listed if c not in classifiers] == []
    assert "Framework :: Pytest" in listed
    assert any(c.startswith("Environment :: GPU :: NVIDIA CUDA") for c in listed)


def test_urls_keywords_and_readme(project: dict[str, Any]) -> None:
    p = project["project"]
    assert {"Homepage", "Repository", "Issues"} <= set(p["urls"])
    assert all(u.startswith("https://") for u in p["urls"].values())
    assert "cuda" in p["keywords"]
    assert p["readme"] == "README.md"


def test_the_version_is_written_in_one_place(project: dict[str, Any]) -> None:
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "cumatrix.__version__"}
    assignments = [p for p in (ROOT / "src").rglob("*.py") if re.search(r"^__version__\s*=", p.read_text(), re.MULTILINE)]
    assert assignments == [ROOT / "src" / "cumatrix" / "__init__.py"]
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?", cumatrix.__version__)


def test_release_workflow_builds_checks_and_publishes_on_tags() -> None:
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    on = wf.get("on", wf.get(True))
    assert on["push"]["tags"] == ["v*"]
    build, test, publish = wf["jobs"]["build"], wf["jobs"]["test"], wf["jobs"]["publish"]
    runs = " ".join(str(s.get("run", "")) for s in build["steps"])
    assert "-m build" in runs
    assert "twine check --strict" in runs
    assert "auditwheel repair --plat manylinux_" in runs  # the glibc floor, in the tag
    assert build["container"].startswith("quay.io/pypa/manylinux_")
    tests = " ".join(str(s.get("run", "")) for s in test["steps"])
    assert "CUMATRIX_TEST_WHEEL" in tests  # the tests run against the built wheel
    assert "test_wheel_without_gcc.py" in tests
    assert test["needs"] == "build"
    assert publish["needs"] == ["build", "test"]  # nothing is published that the tests did not pass
    assert "refs/tags/v" in publish["if"]
    assert publish["permissions"] == {"id-token": "write"}  # trusted publishing, no token
    uses = [str(s.get("uses", "")) for s in publish["steps"]]
    assert any(u.startswith("pypa/gh-action-pypi-publish@") for u in uses)
    assert not any("password" in str(s.get("with", {})) for s in publish["steps"])


def _quoted(text: str) -> set[str]:
    return set(re.findall(r'"([^"]+)"', text))


def test_every_check_of_the_wheel_names_every_compiled_helper_setup_py_builds() -> None:
    # setup.py compiles into cumatrix/libexec/ what a host without a compiler observes and emulates
    # with; .ci/package and the release workflow each check the built wheel carries every one.
    from cumatrix.execute import prebuilt
    from cumatrix.provision import prebuilt_driver

    built = re.search(r"for name in \(([^)]*)\):\s*\(out / name\)\.chmod", (ROOT / "setup.py").read_text())
    assert built, "setup.py: no loop over the compiled helpers' names"
    names = _quoted(built.group(1))
    assert names == {prebuilt.SPAWN, prebuilt.AUDIT, prebuilt_driver.PREBUILT_NAME}
    package = re.search(r'for name in \(([^)]*)\):\s*assert pkg\.joinpath\("libexec"',
                        (ROOT / ".ci" / "package").read_text())
    assert package, ".ci/package: no check of the installed package's libexec/"
    assert _quoted(package.group(1)) == names
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    steps = wf["jobs"]["build"]["steps"]
    names_at = {str(s.get("name", "")): i for i, s in enumerate(steps)}
    check = steps[names_at["the wheel carries the compiled helpers"]]
    assert names_at["the wheel carries the compiled helpers"] > next(
        i for n, i in names_at.items() if n.startswith("auditwheel"))  # the repaired wheel, as published
    assert names <= _quoted(check["run"])
    assert "cumatrix/libexec/{m}" in check["run"]


def test_ci_package_runs_twine_check() -> None:
    text = (ROOT / ".ci" / "package").read_text()
    assert "twine check --strict" in text


@pytest.mark.network  # the isolated build environment installs setuptools from the index
def test_sdist_and_wheel_pass_twine_check(tmp_path: Path) -> None:
    build = subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=600, check=False)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    dists = sorted(tmp_path.iterdir(), key=lambda p: p.suffix)  # the sdist (.gz), then the wheel
    assert [p.suffix for p in dists] == [".gz", ".whl"]
    check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, dists)],
                           capture_output=True, text=True, timeout=120, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    with zipfile.ZipFile(dists[1]) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert f"\nVersion: {cumatrix.__version__}\n" in meta
    assert "\nClassifier: Framework :: Pytest\n" in meta
    assert "\nProject-URL: Repository, " in meta


def test_pull_requests_run_the_ci_test_command() -> None:
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "tests.yml").read_text())
    on = wf.get("on", wf.get(True))
    assert "pull_request" in on
    runs = [str(s.get("run", "")) for job in wf["jobs"].values() for s in job["steps"]]
    assert any(".ci/run" in r for r in runs)
    assert any(".ci/package" in r for r in runs)


def test_every_action_is_pinned_by_commit_sha() -> None:
    # A tag can be moved to other code; a commit cannot. Our own action (`./`) is the checkout.
    from cumatrix.front.init import Project, workflow_text

    texts = {p.name: p.read_text() for p in (ROOT / ".github" / "workflows").glob("*.yml")}
    texts["init"] = workflow_text(Project(name="p", module="p", found_in="--name", wheels=("dist/p.whl",), python=True))
    texts["nightly-github.md"] = (ROOT / "docs" / "nightly-github.md").read_text()
    for name, text in texts.items():
        for ref in re.findall(r"uses:\s*([^\s#]+)", text):
            if ref.startswith(("./", "OWNER/")):
                continue
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{name}: {ref} is not pinned by SHA"

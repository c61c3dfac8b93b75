"""`cumatrix plan --format k8s`: the manifests, validated against the Kubernetes API's OpenAPI
schema (strict: no field the API does not have) by kubernetes-validate, a maintained validator
that carries the schemas of each Kubernetes release (no cluster is reachable from CI).

Oldest and newest Kubernetes releases the project documents (Indexed Jobs are stable from
1.24): both must accept every document."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="the test extras install kubernetes-validate")

VERSIONS = ("1.27.0", kubernetes_validate.latest_version() + ".0")
ROOT = Path(__file__).resolve().parents[2]

MATRIX = """
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
drivers: [host, emulated-12.4]
probe: false
cases: [{name: a, argv: [true]}]
hosts:
  H200_580.x: {driver: "580.159.04"}
  a100+550: {driver: "550"}
"""
HOSTILE = ["$(CUMATRIX_SUBMISSION)", "$$(x)", "--timeout", "60", "a b'\"`;|&$(touch pwned)"]


def _plan(tmp_path: Path, cli: Callable[..., Any], matrix: str, *extra: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    (tmp_path / "m.yaml").write_text(matrix)
    proc = cli("plan", "m.yaml", "--format", "k8s", "--out", "o", *extra, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    docs = list(yaml.safe_load_all((tmp_path / "o" / "k8s" / "nightly.yaml").read_text()))
    merge = yaml.safe_load((tmp_path / "o" / "k8s" / "merge.yaml").read_text())
    return docs, merge


def _expand(word: str, env: dict[str, str]) -> str:
    """The kubelet's expansion of a command word: $(NAME) from env, $$ as $ (k8s.io/kubernetes
    third_party/forked/golang/expansion)."""
    out, i = [], 0
    while i < len(word):
        if word.startswith("$$", i):
            out.append("$")
            i += 2
        elif word.startswith("$(", i) and ")" in word[i:]:
            j = word.index(")", i)
            name = word[i + 2:j]
            out.append(env.get(name, word[i:j + 1]))
            i = j + 1
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_document_is_valid_against_the_kubernetes_openapi_schema(tmp_path: Path, cli: Callable[..., Any],
                                                                       version: str) -> None:
    docs, merge = _plan(tmp_path, cli, MATRIX, *(f"--run-arg={a}" for a in HOSTILE), "--image",
                        "registry.example/cumatrix:1", "--claim", "nightly-results")
    for doc in [*docs, merge]:
        kubernetes_validate.validate(doc, version, strict=True)
    # The validator is not a rubber stamp: a field the API does not have, or a wrong type, fails.
    bad = yaml.safe_load(yaml.safe_dump(merge))
    bad["spec"]["completionMode"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)
    bad = yaml.safe_load(yaml.safe_dump(merge))
    bad["spec"]["template"]["spec"]["containers"][0]["comand"] = ["x"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)


def test_a_job_per_host_on_its_driver_with_a_gpu_running_its_share(tmp_path: Path, cli: Callable[..., Any]) -> None:
    docs, merge = _plan(tmp_path, cli, MATRIX, *(f"--run-arg={a}" for a in HOSTILE))
    cm, *jobs = docs
    assert cm["kind"] == "ConfigMap"
    assert cm["data"]["matrix.yaml"] == MATRIX
    submission = cm["data"]["submission"]
    env = {"CUMATRIX_SUBMISSION": submission}
    by_host = {}
    for job in jobs:
        assert job["kind"] == "Job"
        spec = job["spec"]
        assert spec["completionMode"] == "Indexed"
        pod = spec["template"]["spec"]
        (c,) = pod["containers"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        argv = [_expand(w, env) for w in c["command"]]
        host = argv[argv.index("--host") + 1]
        by_host[host] = (pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                         ["nodeSelectorTerms"][0]["matchExpressions"], argv)
        # What the kubelet runs: the intended words, the hostile ones as they were given.
        assert argv == ["python3", "-m", "cumatrix", "run", "/matrix/matrix.yaml", "--host", host, "--submission",
                        submission, "--out", f"/results/{host}", *HOSTILE]
    assert set(by_host) == {"H200_580.x", "a100+550"}  # oldest driver first, as the plan orders them
    assert by_host["H200_580.x"][0] == [{"key": "nvidia.com/cuda.driver.major", "operator": "In", "values": ["580"]},
                                        {"key": "nvidia.com/cuda.driver.minor", "operator": "In", "values": ["159"]}]
    assert by_host["a100+550"][0] == [{"key": "nvidia.com/cuda.driver.major", "operator": "In", "values": ["550"]}]
    assert [j["metadata"]["name"] for j in jobs] == ["cumatrix-a100-550", "cumatrix-h200-580-x"]
    # The merge: its shell line, run by a real sh over a results tree, merges the hosts that
    # wrote results, with this submission.
    (c,) = merge["spec"]["template"]["spec"]["containers"]
    argv = [_expand(w, env) for w in c["command"]]
    assert argv[:2] == ["/bin/sh", "-c"]
    script = argv[2].replace("/results/", f"{tmp_path}/results/").replace("exec python3", "echo python3")
    (tmp_path / "results" / "a100+550").mkdir(parents=True)
    (tmp_path / "results" / "a100+550" / "results.jsonl").write_text("{}\n")
    ran = subprocess.run(["sh", "-c", script, *argv[3:]], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
                         text=True, timeout=30, check=True)
    assert shlex.split(ran.stdout) == ["python3", "-m", "cumatrix", "merge", str(tmp_path / "results" / "a100+550"),
                                       "--matrix", "/matrix/matrix.yaml", "--submission", submission, "--out",
                                       str(tmp_path / "results" / "merged")]


def test_a_control_character_in_an_argument_is_refused(tmp_path: Path, cli: Callable[..., Any]) -> None:
    (tmp_path / "m.yaml").write_text(MATRIX)
    proc = cli("plan", "m.yaml", "--format", "k8s", "--out", "o", "--image", "x\n- evil", cwd=tmp_path)
    assert proc.returncode == 2
    assert "control character" in proc.stderr
    assert not (tmp_path / "o" / "k8s").exists()


def test_the_nightly_k8s_page_shows_the_commands_this_cumatrix_writes() -> None:
    text = (ROOT / "docs" / "nightly-k8s.md").read_text()
    assert "cumatrix plan matrix.yaml --format k8s" in text
    assert "kubectl wait" in text

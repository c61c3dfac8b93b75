"""A nightly over several hosts on Kubernetes: an Indexed Job per host of the plan, placed on
nodes whose driver is that host's, and a merge Job for after them.

``cumatrix plan MATRIX --format k8s --out DIR`` writes ``DIR/k8s/nightly.yaml`` (a ConfigMap
holding the matrix and this submission's id, and one Job per host) and ``DIR/k8s/merge.yaml``
(the merge Job).  Each host's Job runs ``cumatrix run /matrix/MATRIX --host HOST --submission
ID --out /results/HOST`` on a node whose driver matches the host's, through the labels NVIDIA's
GPU feature discovery puts on GPU nodes (``nvidia.com/cuda.driver.major`` and ``.minor``), with
one ``nvidia.com/gpu``.  Results go to a PersistentVolumeClaim every Job mounts at
``/results``.  Kubernetes has no job dependencies: ``kubectl wait`` for the host Jobs, then
apply the merge (docs/nightly-k8s.md).

Every value is a YAML scalar written by the YAML emitter (no text is pasted into a document);
names that Kubernetes restricts (Job names, label values) are derived from the host name and
checked; the merge's one shell line takes host names as arguments, never as script text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cumatrix.core.errors import UsageError
from cumatrix.core.private import write_new
from cumatrix.front.plan import assign
from cumatrix.front.slurm import check_text, new_submission
from cumatrix.load import matrix as _matrix

#: GPU feature discovery's node labels for the driver version (NVIDIA k8s-device-plugin).
DRIVER_MAJOR = "nvidia.com/cuda.driver.major"
DRIVER_MINOR = "nvidia.com/cuda.driver.minor"
GPU = "nvidia.com/gpu"
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_MERGE_SH = ('dirs=""; for h in "$@"; do [ -s "/results/$h/results.jsonl" ] && dirs="$dirs /results/$h"; done; '
             '[ -n "$dirs" ] || { echo "cumatrix: merge: no host wrote results" >&2; exit 1; }; '
             'exec python3 -m cumatrix merge $dirs --matrix /matrix/matrix.yaml --submission "$CUMATRIX_SUBMISSION" '
             '--out /results/merged')


@dataclass(frozen=True, kw_only=True, slots=True)
class K8sPlan:
    """The manifests written, and the submission id they carry."""

    nightly: Path
    merge: Path
    submission: str
    jobs: tuple[str, ...]


def job_name(prefix: str, host: str) -> str:
    """A Job name (a DNS-1123 label) for ``host``: lower case, other characters as ``-``."""
    name = re.sub(r"[^a-z0-9-]+", "-", f"{prefix}-{host}".lower()).strip("-")[:63].rstrip("-")
    if not _DNS_LABEL_RE.fullmatch(name):
        raise UsageError(f"host {host!r}: no Kubernetes Job name can be made of it ({name!r})")
    return name


def documents(matrix: Path, *, image: str, claim: str, run_args: Sequence[str] = (), prefix: str = "cumatrix",
              submission: str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    """(the ConfigMap and the host Jobs, the merge Job, the submission id)."""
    m = _matrix.load(matrix)
    for value, what in ((image, "--image"), (claim, "--claim"), *((a, "--run-arg") for a in run_args)):
        check_text(value, what)
    if not _DNS_LABEL_RE.fullmatch(claim):
        raise UsageError(f"--claim {claim!r}: not a PersistentVolumeClaim name (lower-case letters, digits and -)")
    submission = submission or new_submission()
    config = f"{prefix}-matrix"
    common = {"app.kubernetes.io/name": "cumatrix", "cumatrix.io/submission": submission}
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": config, "labels": dict(common)},
          "data": {"matrix.yaml": matrix.read_text(encoding="utf-8"), "submission": submission}}
    jobs: list[dict[str, Any]] = []
    names: set[str] = set()
    hosts = [h for h, _ in assign(m, matrix)]
    for h in hosts:
        name = job_name(prefix, h.name)
        if name in names:
            raise UsageError(f"host {h.name!r}: its Job name {name!r} is another host's too; rename one of them")
        names.add(name)
        argv = ["python3", "-m", "cumatrix", "run", "/matrix/matrix.yaml", "--host", h.name,
                "--submission", "$(CUMATRIX_SUBMISSION)", "--out", f"/results/{h.name}", *map(literal, run_args)]
        jobs.append(_job(name, {**common, "cumatrix.io/host": _label_value(h.name)}, argv, config, claim, image,
                         affinity=_driver_affinity(h.driver), gpu=True))
    merge_argv = ["/bin/sh", "-c", literal(_MERGE_SH), "sh", *(h.name for h in hosts)]
    merge = _job(job_name(prefix, "merge"), dict(common), merge_argv, config, claim, image, affinity=None, gpu=False)
    return [cm, *jobs], merge, submission


def literal(word: str) -> str:
    """``word`` as a container's command word that Kubernetes passes as it is: the kubelet
    expands ``$(NAME)`` from the container's environment and reads ``$$`` as ``$``, so every
    ``$`` is doubled (an argument ``$(CUMATRIX_SUBMISSION)`` stays that text)."""
    return word.replace("$", "$$")


def _label_value(text: str) -> str:
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63].strip("-_.")
    if not _LABEL_VALUE_RE.fullmatch(value):
        raise UsageError(f"{text!r}: no Kubernetes label value can be made of it")
    return value


def _driver_affinity(driver: str) -> dict[str, Any]:
    parts = driver.split(".")
    terms = [{"key": DRIVER_MAJOR, "operator": "In", "values": [parts[0]]}]
    if len(parts) > 1:
        terms.append({"key": DRIVER_MINOR, "operator": "In", "values": [parts[1]]})
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": terms}]}}}


def _job(name: str, labels: dict[str, str], argv: list[str], config: str, claim: str, image: str, *,
         affinity: dict[str, Any] | None, gpu: bool) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "cumatrix", "image": image, "command": argv,
        "env": [{"name": "CUMATRIX_SUBMISSION", "valueFrom": {"configMapKeyRef": {"name": config, "key": "submission"}}}],
        "volumeMounts": [{"name": "matrix", "mountPath": "/matrix", "readOnly": True},
                         {"name": "results", "mountPath": "/results"}],
    }
    if gpu:
        container["resources"] = {"limits": {GPU: 1}}
    pod: dict[str, Any] = {
        "restartPolicy": "Never", "containers": [container],
        "volumes": [{"name": "matrix", "configMap": {"name": config}},
                    {"name": "results", "persistentVolumeClaim": {"claimName": claim}}],
    }
    if affinity is not None:
        pod["affinity"] = affinity
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": dict(labels)},
            "spec": {"completionMode": "Indexed", "completions": 1, "parallelism": 1, "backoffLimit": 0,
                     "template": {"metadata": {"labels": dict(labels)}, "spec": pod}}}


def write_manifests(matrix: Path, out: Path, *, image: str, claim: str, run_args: Sequence[str] = ()) -> K8sPlan:
    """Write ``out/k8s/nightly.yaml`` and ``out/k8s/merge.yaml`` (new files renamed into place)."""
    docs, merge, submission = documents(matrix.resolve(), image=image, claim=claim, run_args=run_args)
    d = out / "k8s"
    d.mkdir(parents=True, exist_ok=True)
    nightly, merge_path = d / "nightly.yaml", d / "merge.yaml"
    write_new(nightly, yaml.safe_dump_all(docs, sort_keys=False, allow_unicode=False), replace=True)
    write_new(merge_path, yaml.safe_dump(merge, sort_keys=False, allow_unicode=False), replace=True)
    return K8sPlan(nightly=nightly, merge=merge_path, submission=submission,
                   jobs=tuple(str(j["metadata"]["name"]) for j in docs[1:]))

"""Run cells: provision what each needs, run it isolated, classify, judge, record.

One :class:`Runner` per process (the pytest controller, or each xdist worker).  What it
provisions (runtime wheels, compiled variants, driver interposers) is cached on disk by
content, so workers share it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__, observe, oracle
from . import runtimes as provision
from .errors import CumatrixError
from .isolate import ChildResult, Job, classify, run_local
from .model import NO_RUNTIME, Cell, Expected, Matrix, Observed

PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)
DEFAULT_TIMEOUT = 300.0
STDERR_KEEP = 4096


def utcnow() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Runner:
    matrix: Matrix
    backend: str = "local"
    wheel_dir: Path | None = None
    timeout: float = DEFAULT_TIMEOUT
    base_image: str | None = None
    host_label: str | None = None
    _host: oracle.HostFacts | None = None
    _host_fp: dict[str, Any] | None = None
    _runtimes: dict[str, provision.ResolvedRuntime | CumatrixError] = field(default_factory=dict)
    _docker: Any = None
    _interposers: dict[str, Any] = field(default_factory=dict)
    _audit_dir: str | None = None

    # ----------------------------------------------------------------- host

    def host_fingerprint(self) -> dict[str, Any]:
        if self._host_fp is None:
            from .fingerprint import host_fingerprint

            self._host_fp = host_fingerprint()
            if self.backend == "docker":
                self._host_fp["docker"] = self.docker().fingerprint()
        return self._host_fp

    def host(self) -> oracle.HostFacts:
        if self._host is None:
            dv = self.host_fingerprint().get("driver_version")
            self._host = oracle.HostFacts(driver_version=int(dv) if dv else None, backend=self.backend)
        return self._host

    def docker(self) -> Any:
        if self._docker is None:
            from .backends.docker import DockerBackend

            self._docker = DockerBackend(self.base_image)
        return self._docker

    # ----------------------------------------------------------------- provisioning

    def runtime(self, name: str) -> provision.ResolvedRuntime:
        if name not in self._runtimes:
            try:
                self._runtimes[name] = provision.resolve(self.matrix.runtime(name), wheel_dir=self.wheel_dir)
            except CumatrixError as e:
                self._runtimes[name] = e
        got = self._runtimes[name]
        if isinstance(got, CumatrixError):
            raise got
        return got

    def runtime_version(self, cell: Cell) -> int | None:
        if cell.runtime == NO_RUNTIME:
            return None
        rt = self.matrix.runtime(cell.runtime)
        if rt.image:
            return oracle.image_runtime_version(rt.image)
        return self.runtime(cell.runtime).version

    def interposer_dir(self, cell: Cell) -> str | None:
        """Directory of the generated ``libcuda.so.1`` for an emulated driver."""
        if not cell.driver.startswith("emulated-"):
            return None
        if cell.driver not in self._interposers:
            from . import drivers, headers

            emu = self.matrix.driver(cell.driver).emulated
            if emu is None:
                raise CumatrixError(f"{cell.driver} is not an emulated driver")
            real = drivers.find_real_libcuda()
            if real is None:
                raise CumatrixError("no real libcuda.so.1 on this host to put an interposer in front of")
            found = [self.runtime(r.name).include_dir for r in self.matrix.runtimes if r.requirement]
            includes = [i for i in found if i is not None] or [provision.headers_for("13.5", wheel_dir=self.wheel_dir)]
            intro = headers.load_introductions(headers.newest_typedefs(includes))
            ip = drivers.build_interposer(emu, real_libcuda=real.path if hasattr(real, "path") else real,
                                          introductions=intro, real_driver_version=self.host().driver_version)
            self._interposers[cell.driver] = str(ip.lib_dir)
        return str(self._interposers[cell.driver])

    # ----------------------------------------------------------------- one cell

    def expected(self, cell: Cell) -> Expected:
        try:
            rv = self.runtime_version(cell)
        except CumatrixError:
            rv = None
        return oracle.expect(cell, self.host(), runtime_version=rv, matrix=self.matrix)

    def run_cell(self, cell: Cell) -> dict[str, Any]:
        """Run one cell; return its results record (never raises for a cell's own failure)."""
        started, t0 = utcnow(), time.monotonic()
        child: ChildResult | None = None
        extra_fp: dict[str, Any] = {}
        expected = self.expected(cell)
        try:
            observed, child, extra_fp = self._observe(cell, expected)
        except CumatrixError as e:
            observed = Observed(outcome="harness-error", detail=str(e))
        if "runtime_evidence" in extra_fp:  # the runtime the process really used predicts a command
            expected = oracle.expect_program(cell, self.host(), expected, runtime_version=extra_fp["runtime_version"],
                                             evidence=extra_fp["runtime_evidence"])
        observed = oracle.reconcile(cell, observed, self.host(), expected)
        status, mismatch = oracle.verdict(expected, observed)
        return self._record(cell, expected, observed, status, mismatch, child, extra_fp, started, time.monotonic() - t0)

    def _observe(self, cell: Cell, expected: Expected) -> tuple[Observed, ChildResult | None, dict[str, Any]]:
        host = self.host()
        rt = self.matrix.runtime(cell.runtime) if cell.runtime != NO_RUNTIME else None
        if rt is not None and rt.image and self.backend != "docker":
            return Observed(outcome="skipped:needs-docker", detail=f"runtime {rt.name} is the image {rt.image}; run with --backend docker"), None, {}
        gpu_needed = cell.kind in ("swap", "probe") or cell.driver.startswith("emulated-")
        if cell.kind == "swap" and host.driver_version is None:
            # Building needs no GPU: a variant that does not compile says so on any host.
            _, pre = self._swap_spec(cell, None)
            if pre is not None and pre.outcome == "build-error":
                return pre, None, {}
            return Observed(outcome="skipped:no-cuda-driver", detail="no NVIDIA driver on this host"), None, {}
        if cell.driver.startswith("emulated-") and host.driver_version is None and gpu_needed:
            return Observed(outcome="skipped:no-cuda-driver", detail="driver emulation needs a real driver underneath"), None, {}
        if expected.rule == "emulate-newer":
            return Observed(outcome="harness-error", detail=expected.reason), None, {}
        job, pre = self._job(cell)
        if pre is not None or job is None:
            return pre or Observed(outcome="harness-error", detail="no job for this cell"), None, {}
        job, audit, cell_rt = self._audited(cell, job)
        try:
            res = self.docker().run_job(job) if self.backend == "docker" else run_local(job)
            observed = classify(res, kind=cell.kind)
            fp = {k: v for k, v in res.extra.items() if k in ("image", "image_id", "daemon_version")}
            if audit is not None:
                observed = _with_audit(observe.conclude(audit, cell_rt), observed, fp)
        finally:
            if audit is not None:
                audit.log.unlink(missing_ok=True)
        return observed, res, fp

    def _audited(self, cell: Cell, job: Job) -> tuple[Job, observe.AuditPlan | None, observe.CellRuntime | None]:
        """The job with the rtld-audit that records what it maps and enforces the cell's runtime."""
        cell_rt = None
        if cell.runtime != NO_RUNTIME:
            rt = self.matrix.runtime(cell.runtime)
            version = self.runtime_version(cell)
            if self.backend != "docker":
                res = self.runtime(cell.runtime)
                cell_rt = observe.cell_runtime(res.libcudart, res.version)
            elif rt.requirement and version is not None:
                inside = self.docker().prepare_runtime(rt, self.wheel_dir).cudart
                if inside:
                    cell_rt = observe.CellRuntime(soname=os.path.basename(inside), version=version, path=inside)
        if self._audit_dir is None:
            self._audit_dir = tempfile.mkdtemp(prefix="cumatrix-audit-")
        try:
            plan = observe.audit_plan(Path(self._audit_dir) / f"{uuid.uuid4().hex}.log",
                                      enforce=observe.enforce_rules(cell_rt) if cell_rt else ())
        except observe.AuditError:
            return job, None, None  # no compiler: the cell runs unobserved, as before
        return dataclasses.replace(job, env=job.env + plan.env, mounts=job.mounts + plan.mounts,
                                   writable=job.writable + plan.writable), plan, cell_rt

    def _job(self, cell: Cell) -> tuple[Job | None, Observed | None]:
        lib_path: list[str] = []
        env: list[tuple[str, str]] = [("CUMATRIX_CELL", cell.id), ("PYTHONPATH", PACKAGE_PARENT)]
        mounts: list[str] = [PACKAGE_PARENT]
        image = None
        libcudart: str | None = None
        ip = self.interposer_dir(cell)
        if ip:
            lib_path.append(ip)
            mounts.append(ip)
        if cell.runtime != NO_RUNTIME:
            rt = self.matrix.runtime(cell.runtime)
            if self.backend == "docker":
                image = self.docker().prepare_runtime(rt, self.wheel_dir)
            else:
                res = self.runtime(cell.runtime)
                lib_path.append(str(res.lib_dir))
                libcudart = str(res.libcudart)
                env.append(("CUMATRIX_CUDART", libcudart))
        elif self.backend == "docker":
            image = self.docker().base_image  # driver-family cells load no runtime
        python = "python3" if self.backend == "docker" else sys.executable
        timeout = self.timeout
        if cell.kind == "command":
            case = cell.need_case()
            env += list(case.env)
            argv = case.argv
            timeout = case.timeout or timeout
        elif cell.kind == "probe":
            argv = (python, "-m", "cumatrix.case", json.dumps({"kind": "probe", "libcudart": libcudart}))
        else:
            spec, pre = self._swap_spec(cell, libcudart)
            if pre is not None:
                return None, pre
            mounts += [spec["library"], spec["baseline"]]
            if cell.need_workload().kernel_image == "ptx":
                env.append(("KVSWAP_KERNEL_IMAGE", "ptx"))
            from .calibrate import default_table

            table = default_table()
            if "KVSWAP_CALIBRATION" not in os.environ and table.is_file():
                env.append(("KVSWAP_CALIBRATION", str(table)))  # what `cumatrix calibrate` measured here
                mounts.append(str(table))
            argv = (python, "-m", "cumatrix.case", json.dumps(spec))
        return Job(cell_id=cell.id, kind=cell.kind, argv=tuple(argv), env=tuple(env), lib_path=tuple(lib_path),
                   timeout=timeout, mounts=tuple(mounts), runtime_name=cell.runtime,
                   image=image if isinstance(image, str) or image is None else getattr(image, "tag", None)), None

    def _swap_spec(self, cell: Cell, libcudart: str | None) -> tuple[dict[str, Any], Observed | None]:
        from . import build

        w, b = cell.need_workload(), cell.need_build()
        if not (cell.variant and cell.family):
            raise CumatrixError(f"swap cell {cell.id} has no variant or family")
        headers = provision.headers_for(b, wheel_dir=self.wheel_dir, runtimes=self.matrix.runtimes)
        lib = build.build_variant(cell.variant, cell.family, headers)
        if not lib.ok:
            return {}, Observed(outcome="build-error", detail=lib.log.strip()[-2000:])
        base = build.build_variant("loop", cell.family, headers)
        if not base.ok:
            return {}, Observed(outcome="harness-error", detail=f"the loop baseline did not build: {base.log[-500:]}")
        spec = {"kind": "swap", "family": cell.family, "variant": cell.variant, "library": str(lib.library),
                "baseline": str(base.library), "libcudart": libcudart, "direction": w.direction,
                "block_bytes": w.block_bytes, "blocks": w.blocks, "layers": w.layers, "stream": w.stream,
                "repetitions": w.repetitions, "warmup": w.warmup}
        if cell.variant == "proc-address":  # the only variant with a path policy
            spec["policy"] = w.policy
        return spec, None

    # ----------------------------------------------------------------- records

    def _record(self, cell: Cell, expected: Expected, observed: Observed, status: str, mismatch: str | None,
                child: ChildResult | None, extra_fp: dict[str, Any], started: str, duration: float) -> dict[str, Any]:
        raw = observed.data.get("data")
        data: dict[str, Any] = dict(raw) if isinstance(raw, dict) else {}
        timings: dict[str, Any] = {"wall_s": round(child.duration_s if child else duration, 4)}
        t = observed.data.get("timings")
        if isinstance(t, dict):
            timings.update(t)
        hfp = self.host_fingerprint()
        cfp = data.pop("fingerprint", {}) if isinstance(data.get("fingerprint"), dict) else {}
        gpus = hfp.get("gpus") or [{}]
        fp: dict[str, Any] = {
            "backend": self.backend,
            "driver_version": cfp.get("driver_version", hfp.get("driver_version")),
            "driver_string": hfp.get("driver_string"),
            "gpu_name": cfp.get("gpu_name", gpus[0].get("name")),
            "compute_capability": cfp.get("compute_capability", gpus[0].get("compute_capability")),
            "forward_compat": cfp.get("forward_compat", hfp.get("forward_compat", False)),
            "libcuda_file": cfp.get("libcuda_file"),
            "runtime_file": cfp.get("runtime_file"),
            "runtime_version": data.get("runtime_version") or _nested(data, "versions", "runtime"),
            "image": extra_fp.get("image"),
            "image_id": extra_fp.get("image_id"),
        }
        if "libraries" in extra_fp:  # observed: what the process tree mapped
            fp["libraries"] = extra_fp["libraries"]
            fp["runtime_evidence"] = extra_fp["runtime_evidence"]
            fp["runtime_file"] = extra_fp["runtime_file"]
            fp["runtime_version"] = fp["runtime_version"] or extra_fp["runtime_version"]
        elif cell.runtime != NO_RUNTIME and fp["runtime_file"] is None:
            res = self._runtimes.get(cell.runtime)
            if isinstance(res, provision.ResolvedRuntime):
                fp["runtime_file"] = str(res.libcudart)
                fp["runtime_version"] = fp["runtime_version"] or res.version
        if cell.kind == "probe" and status != "fail":
            mismatch = self._check_probe(cell, data) or mismatch
            status = "fail" if mismatch else status
        return {
            "schema": 1, "type": "cell", "id": cell.id, "axes": cell.axes(), "host": self.host_label,
            "expected": {"outcomes": sorted(expected.outcomes), "reason": expected.reason, "rule": expected.rule},
            "observed": {"outcome": observed.outcome, "path": observed.path, "error_name": observed.error_name,
                         "detail": observed.detail, "exit_status": observed.exit_status, "data": data},
            "status": status, "mismatch": mismatch, "timings": timings, "fingerprint": fp,
            "stderr_tail": (child.stderr_tail[-STDERR_KEEP:] if child else ""),
            "stdout_tail": (child.stdout_tail[-STDERR_KEEP:] if child else ""),
            "started": started, "duration_s": round(duration, 4),
        }

    def _check_probe(self, cell: Cell, data: dict[str, Any]) -> str | None:
        """The probe's own facts must agree with the wheel and with FACTS section 1."""
        res = self._runtimes.get(cell.runtime)
        rv = data.get("runtime_version")
        if rv is None:
            return None
        if isinstance(res, provision.ResolvedRuntime) and rv != res.version:
            return f"the child loaded runtime {rv}, not the provisioned {res.version}: another libcudart shadows it"
        exported = data.get("batch_exported")
        if exported is not None and bool(exported) != (int(rv) >= oracle.batch_introduced()):
            return (f"runtime {rv} {'exports' if exported else 'does not export'} cudaMemcpyBatchAsync, "
                    f"against the rule that it appears in {oracle.batch_introduced()}")
        return None


def _with_audit(seen: observe.Observation, observed: Observed, fp: dict[str, Any]) -> Observed:
    """Put what the audit saw into ``fp``; a foreign runtime makes the cell skipped:runtime-not-used."""
    fp.update(seen.fingerprint())
    if seen.not_used is None or observed.outcome == "harness-error":
        return observed
    return Observed(outcome=observe.OUTCOME_NOT_USED, exit_status=observed.exit_status, data=observed.data,
                    detail=f"{seen.not_used}; the process's own outcome: {observed.outcome}")


def _nested(data: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(k)  # type: ignore[assignment]
    return data


def run_header(matrix: Matrix, cell_ids: list[str], *, backend: str, argv: list[str], host: str | None,
               fingerprint: dict[str, Any], run_id: str) -> dict[str, Any]:
    return {"schema": 1, "type": "run", "run_id": run_id, "matrix": matrix.path, "matrix_sha256": matrix.sha256,
            "started": utcnow(), "harness_version": __version__, "argv": argv, "backend": backend, "host": host,
            "host_fingerprint": fingerprint, "cells_total": len(cell_ids), "cells": cell_ids,
            "pid": os.getpid()}

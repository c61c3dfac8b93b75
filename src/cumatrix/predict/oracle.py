"""Predict what each cell should do, from NVIDIA's rules and each variant's mechanics.

Nothing here is a list of cell ids: every expectation is derived from the versions in
play (runtime, effective driver, build headers), the variant's API family and how it
picks an ABI, and the limits of driver emulation.  Each expectation carries a one-line
reason, printed next to any mismatch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cumatrix.binary.fatbin import DeviceCode
from cumatrix.binary.ptx import ptx_ceiling
from cumatrix.core.model import FAILS, Cell, CudaVersion, Expected, Matrix, Workload
from cumatrix.predict.jit import PtxProducer, jit_refusal, no_usable_code, ptx_producers, unknown_machine_code
from cumatrix.predict.rules import (
    cuda_major,
    emulation_newer_than_host,
    interposer_detected,
    major_newer_than_driver,
    rules,
)

# --------------------------------------------------------------------------- data


def error_name(code: int) -> str:
    return rules().error_name(code)


def batch_introduced() -> int:
    return rules().batch.introduced


def abi_change() -> int:
    return rules().batch.abi_change


def cuda_for_driver(driver: str) -> CudaVersion:
    """The newest CUDA a Linux driver branch supports (``580.159`` -> 13.0)."""
    return rules().cuda_for_driver(driver)


# --------------------------------------------------------------------------- host facts


@dataclass(frozen=True, kw_only=True, slots=True)
class HostFacts:
    """What the oracle needs to know about where a cell runs."""

    driver_version: int | None  # cuDriverGetVersion of the real driver; None: no driver
    backend: str = "local"


def effective_driver(cell: Cell, host: HostFacts) -> int | None:
    if host.driver_version is None:
        return None
    if cell.driver.startswith("emulated-"):
        return int(CudaVersion.parse(cell.driver[len("emulated-"):]))
    return host.driver_version


def emulate_newer_reason(emulated: int, real: int) -> str:
    """Why an emulated driver newer than the host's cannot run (:func:`emulation_newer_than_host`)."""
    return f"cannot emulate driver {_v(emulated)} on a {_v(real)} driver"


def _expect(*outcomes: str, reason: str, rule: str) -> Expected:
    return Expected(outcomes=frozenset(outcomes), reason=reason, rule=rule)


def _legacy_unguarded(error: str) -> Expected:
    return _expect("cuda-error:1", rule="legacy-unguarded",
                   reason=f"batch call on the legacy NULL stream returns {error} at index 0 (vLLM issue 46345)")


def _v(n: int) -> str:
    return str(CudaVersion.from_int(n))


def _abi(version: int) -> int:
    return 13 if version >= abi_change() else 12


# --------------------------------------------------------------------------- rules


def expect(cell: Cell, host: HostFacts, *, runtime_version: int | None, matrix: Matrix | None = None) -> Expected:
    """The expected outcome set of ``cell`` with its reason.

    ``runtime_version`` is the loaded runtime's ``cudaRuntimeGetVersion`` (None for
    driver-family cells, or where it cannot be known before the run).
    """
    if matrix is not None:
        for ov in reversed(matrix.expect):  # the last matching override wins
            if ov.selector.matches(cell):
                # Reasons are printed on one line next to a mismatch: fold a multi-line YAML reason.
                reason = " ".join(ov.reason.split()) or f"matrix override (line {ov.selector.line})"
                return Expected(outcomes=ov.outcomes, reason=reason, rule="matrix-override")
    return _derive(cell, host, runtime_version)


def build_failure(cell: Cell) -> Expected | None:
    """A variant that cannot compile against the cell's headers fails the same on any host."""
    if cell.kind != "swap" or cell.variant != "direct-link":
        return None
    build, intro = cell.need_build(), batch_introduced()
    if int(build) < intro:
        return _expect("build-error",
                        reason=f"CUDA {build} headers predate cuMemcpyBatchAsync ({_v(intro)}): the direct call does not compile",
                        rule="direct-link-old-headers")
    if int(build) >= abi_change():
        return _expect("build-error",
                        reason=f"CUDA {build} headers #define cuMemcpyBatchAsync to the 8-parameter _v2: the 9-argument call does not compile (vLLM's CUDA 13 break)",
                        rule="direct-link-cuda13-build")
    return None


def _derive(cell: Cell, host: HostFacts, rv: int | None) -> Expected:
    if cell.kind == "command":
        return _expect("ok", reason="a command passes when it exits 0 (override with expect:)",
                        rule="command-default")
    failed_build = build_failure(cell)
    if failed_build is not None:
        return failed_build
    d = effective_driver(cell, host)
    if d is None:
        return _expect("skipped:no-cuda-driver", reason="no NVIDIA driver on this host",
                        rule="no-driver")
    emulated = cell.driver.startswith("emulated-")
    if emulated and host.driver_version is not None and emulation_newer_than_host(d, host.driver_version):
        return _expect("harness-error", reason=emulate_newer_reason(d, host.driver_version), rule="emulate-newer")
    if cell.kind == "swap" and cell.family == "driver":
        return _driver_family(cell, d, emulated)
    if rv is None:
        return _expect("ok", reason="runtime version unknown before the run; any clean run passes",
                        rule="unknown-runtime")
    return _runtime_rules(cell, host, rv, d, emulated)


def _runtime_rules(cell: Cell, host: HostFacts, rv: int, d: int, emulated: bool) -> Expected:
    """A probe or runtime-family swap cell of runtime ``rv`` on (effective) driver ``d``."""
    # NVIDIA's compatibility rules first.
    if major_newer_than_driver(rv, d):
        return _expect("cuda-error:35",
                        reason=f"runtime {_v(rv)} needs a CUDA {cuda_major(rv)} driver; the driver is {_v(d)} (cudaErrorInsufficientDriver)",
                        rule="major-newer-than-driver")
    if emulated and interposer_detected(rv, d, host.driver_version):
        return _expect("cannot-emulate",
                        reason=f"a CUDA 12 runtime detects the interposer (error 103) when the emulated version {_v(d)} differs from the real driver's",
                        rule="interposer-detected")
    if cell.kind == "probe":
        minor = " (minor-version compatibility)" if rv > d else ""
        return _expect("ok:n/a", reason=f"runtime {_v(rv)} runs on driver {_v(d)}{minor}",
                        rule="probe-compatible")
    return _runtime_family(cell, rv, d)


def _driver_family(cell: Cell, d: int, emulated: bool) -> Expected:
    workload = cell.need_workload()
    intro = batch_introduced()
    legacy = workload.stream == "legacy"
    v = cell.variant
    if v == "loop":
        return _expect("ok:fallback", reason="per-block cuMemcpyAsync baseline", rule="loop")
    if v == "proc-address":
        return _proc_address(workload, d, emulated)
    if v == "direct-link":
        if d < intro:
            return _expect(f"undefined-symbol:{rules().batch.driver_symbol}",
                            reason=f"links cuMemcpyBatchAsync directly; driver {_v(d)} predates it ({_v(intro)}): the loader refuses (vLLM PR 38460)",
                            rule="direct-link-old-driver")
        if legacy:
            return _legacy_unguarded("CUDA_ERROR_INVALID_VALUE")
        return _expect("ok:batch", reason=f"driver {_v(d)} exports cuMemcpyBatchAsync", rule="direct-link-ok")
    return _expect("harness-error", reason=f"no rule for driver-family variant {v}", rule="none")


def _proc_address(workload: Workload, d: int, emulated: bool) -> Expected:
    """proc-address: as its copy policy says; without one, the batch entry pinned by
    cuGetProcAddress, where the driver has it."""
    intro = batch_introduced()
    legacy = workload.stream == "legacy"
    if workload.policy in ("fastest", "kernel"):
        return _kernel_policy(workload.policy, workload.kernel_image, d, legacy, emulated)
    if workload.policy == "beside-compute":
        return _beside_compute(workload.direction, d, legacy)
    if workload.policy == "loop":
        return _expect("ok:fallback", reason="policy loop: per-block copies only", rule="policy-loop")
    if legacy:
        return _expect("ok:fallback",
                        reason="legacy NULL stream: the batch call fails there (vLLM issue 46345), so the reference falls back",
                        rule="legacy-guard")
    if d < intro:
        return _expect("ok:fallback",
                        reason=f"driver {_v(d)} predates cuMemcpyBatchAsync ({_v(intro)}): cuGetProcAddress gives NULL, per-block fallback",
                        rule="proc-address-fallback")
    return _expect("ok:batch",
                    reason=f"cuGetProcAddress(cuMemcpyBatchAsync, {intro}) pins the 9-parameter entry on driver {_v(d)}",
                    rule="proc-address-batch")


def _beside_compute(direction: str, d: int, legacy: bool) -> Expected:
    """proc-address's default policy: copy engines for host transfers, a budgeted kernel for d2d."""
    if legacy:
        return _expect("ok:fallback", rule="legacy-guard",
                       reason="legacy NULL stream: every policy keeps the per-block path (vLLM issue 46345)")
    if direction == "d2d":
        return _expect("ok:kernel", "ok:fallback", rule="beside-compute-d2d",
                       reason="policy beside-compute: device-to-device copies take the SM-budgeted kernel "
                              "(per-block copies where NVRTC is missing)")
    if d < batch_introduced():
        return _expect("ok:fallback", rule="beside-compute-fallback",
                       reason=f"policy beside-compute: driver {_v(d)} predates cuMemcpyBatchAsync: per-block copies")
    return _expect("ok:batch", rule="beside-compute-batch",
                   reason="policy beside-compute: host transfers take the copy engines (batched, fanned out)")


def _kernel_policy(policy: str, image: str, d: int, legacy: bool, emulated: bool) -> Expected:
    """proc-address with the copy kernel in play (compiled at run time with NVRTC)."""
    if policy == "kernel":
        if image == "ptx" and emulated:
            # The interposer refuses PTX newer than the emulated driver's JIT, as that driver
            # does; which NVRTC the reference loads is known only once it ran (expect_jit).
            ceiling = ptx_ceiling(d)
            top = f"PTX ISA {ceiling[0]}.{ceiling[1]}" if ceiling else "no PTX ISA this table knows"
            return _expect("ok:kernel", "cuda-error:222", "skipped:no-nvrtc", rule="ptx-ceiling",
                           reason=f"policy kernel, PTX: driver {_v(d)}'s JIT compiles up to {top}; PTX from a newer NVRTC "
                                  "is refused (cudaErrorUnsupportedPtxVersion, 222), by the emulated driver as by a real one")
        how = ("PTX JIT-compiled by the driver (PTX from an NVRTC newer than the driver fails with 222)" if image == "ptx"
               else "machine code for the device's own architecture: no JIT, so the driver's PTX version does not matter")
        return _expect("ok:kernel", "skipped:no-nvrtc", reason=f"policy kernel: {how}",
                        rule=f"kernel-{image}")
    paths = {"ok:kernel", "ok:fallback"} | ({"ok:batch"} if d >= batch_introduced() and not legacy else set())
    return Expected(outcomes=frozenset(paths),
                    reason="policy fastest: the calibrated (or built-in) choice per direction and block size", rule="kernel-fastest")


def _runtime_family(cell: Cell, rv: int, d: int) -> Expected:
    workload, build = cell.need_workload(), cell.need_build()
    intro = batch_introduced()
    legacy = workload.stream == "legacy"
    v = cell.variant
    if v == "loop":
        return _expect("ok:fallback", reason="per-block cudaMemcpyAsync baseline", rule="loop")
    if v == "header-dispatch" and int(build) < intro:
        return _expect("ok:fallback",
                        reason=f"CUDA {build} headers predate the batch copy ({_v(intro)}): the batch path is compiled out",
                        rule="header-dispatch-old-headers")
    if rv < intro:
        return _expect("ok:fallback",
                        reason=f"runtime {_v(rv)} does not export cudaMemcpyBatchAsync ({_v(intro)}+): per-block fallback",
                        rule="symbol-absent")
    if d < intro and v == "runtime-dispatch":
        # The runtime has the call but the driver does not: cudaErrorCallRequiresNewerDriver (36).
        return _expect("ok:fallback",
                        reason=f"driver {_v(d)} predates the batch copy: error 36, the reference falls back",
                        rule="newer-driver-fallback")
    if v == "runtime-dispatch":
        if legacy:
            return _expect("ok:fallback",
                            reason="legacy NULL stream: the reference falls back (vLLM issue 46345)", rule="legacy-guard")
        return _expect("ok:batch",
                        reason=f"ABI from cudaRuntimeGetVersion ({_v(rv)}): the {_params(_abi(rv))}-parameter call matches",
                        rule="runtime-dispatch-batch")
    return _assumed_abi(cell, rv, d)


def _assumed_abi(cell: Cell, rv: int, d: int) -> Expected:
    """A variant that takes the batch copy's ABI from something other than the runtime (the
    driver's version, the headers'): what that assumption meets in runtime ``rv`` on driver ``d``."""
    v, build, intro = cell.variant, cell.need_build(), batch_introduced()
    actual = _abi(rv)
    if v == "driver-dispatch":
        assumed, source = _abi(d), f"cudaDriverGetVersion ({_v(d)})"
        bug = "SGLang PR 23172"
    elif v == "header-dispatch":
        assumed, source = _abi(int(build)), f"compile-time CUDA_VERSION ({build})"
        bug = "SGLang issue 36302"
    else:
        return _expect("harness-error", reason=f"no rule for runtime-family variant {v}", rule="none")
    if d < intro:
        return _before_batch_driver(d, assumed, actual)
    if assumed == 13 and actual == 12:
        return _expect("crash:SIGSEGV",
                        reason=f"ABI from {source} -> 8-parameter call into runtime {_v(rv)}'s 9-parameter function: SIGSEGV ({bug})",
                        rule="abi-8-into-9")
    if assumed == 12 and actual == 13:
        return _expect("cuda-error:400",
                        reason=f"ABI from {source} -> 9-parameter call into runtime {_v(rv)}: failIdx is taken as the stream, cudaErrorInvalidResourceHandle ({bug})",
                        rule="abi-9-into-8")
    if cell.need_workload().stream == "legacy":
        return _legacy_unguarded("cudaErrorInvalidValue")
    return _expect("ok:batch", reason=f"ABI from {source} happens to match runtime {_v(rv)}",
                    rule=f"{v}-match")


def _before_batch_driver(d: int, assumed: int, actual: int) -> Expected:
    """A runtime-family variant on driver ``d``, older than the batch copy, with the ABI it
    ``assumed`` against the runtime's ``actual`` one."""
    # Every runtime-family variant falls back on error 36 (that fallback is not the bug
    # they model).  A mismatched ABI may still fault before the runtime checks the driver:
    # not measured on a real pre-12.8 driver, so both are admitted.
    outcomes = {"ok:fallback"}
    if assumed != actual:
        outcomes.add("crash:SIGSEGV" if assumed == 13 else "cuda-error:400")
    return Expected(outcomes=frozenset(outcomes),
                    reason=f"driver {_v(d)} predates the batch copy: error 36 and the per-block fallback"
                           + (" (or the ABI mismatch first; unmeasured on such a driver)" if assumed != actual else ""),
                    rule="newer-driver-fallback")


def _params(abi: int) -> int:
    return 8 if abi == 13 else 9


_IMAGE_VERSION = re.compile(r":(\d+)\.(\d+)")


def image_runtime_version(image: str) -> int | None:
    """Best guess of an image's CUDA runtime from its tag (``nvidia/cuda:12.9.1-...``)."""
    m = _IMAGE_VERSION.search(image)
    return int(CudaVersion(int(m.group(1)), int(m.group(2)))) if m else None


# --------------------------------------------------------------------------- programs


#: What a program whose CUDA runtime needs a newer driver does: NVIDIA's rule says its first
#: runtime call gets cudaErrorInsufficientDriver (35), not how the program reports it.  torch,
#: CuPy and JAX (Python) exit 1 on the uncaught exception (docs/facts.md section 8); a C
#: program exits with whatever code it chose, or dies on a signal.  So the prediction is
#: every failure (``fails``), never one exit status.
PROGRAM_REFUSED = frozenset({FAILS})


def expect_program(cell: Cell, host: HostFacts, prior: Expected, *, runtime_version: int | None,
                   evidence: str = "", driver_used: bool | None = None) -> Expected:
    """The expectation of a command cell once the runtime its processes used is observed.

    ``runtime_version`` is the observed runtime (CUDA encoding; MAJOR*1000 where only the
    major is known), ``evidence`` says where it came from.  NVIDIA's rule that a runtime needs
    a driver of its major predicts the failure of, say, torch cu130 under a 12.x driver (real
    or emulated).  A matrix override, a runtime that is not known, or any other pairing keep
    ``prior``: a failure no rule explains stays a mismatch.

    A rule about the driver holds only for a process tree that used the driver:
    ``driver_used`` False (no process mapped ``libcuda.so.1`` or the interposer standing for
    it, as the kernel reports) keeps ``prior``; such a program is judged by its exit status
    (loading a CUDA 13 runtime without initialising it runs fine on a 12.x driver).
    """
    if cell.kind != "command" or prior.rule == "matrix-override" or runtime_version is None:
        return prior
    if driver_used is False:
        return prior
    d = effective_driver(cell, host)
    if d is None:
        return prior
    seen = f" ({evidence})" if evidence else ""
    if major_newer_than_driver(runtime_version, d):
        return _program_major_newer(cuda_major(runtime_version), seen, d)
    if cell.driver.startswith("emulated-") and interposer_detected(runtime_version, d, host.driver_version):
        return Expected(outcomes=frozenset({"cannot-emulate"}),
                        reason=f"the program's CUDA 12 runtime{seen} detects the interposer (error 103) when the "
                               f"emulated version {_v(d)} differs from the real driver's",
                        rule="program-interposer-detected")
    return prior


def _program_major_newer(major: int, seen: str, d: int) -> Expected:
    """A program's CUDA ``major`` runtime on an older driver ``d``: NVIDIA's rule says it fails."""
    floor = rules().min_driver_for(CudaVersion(major, 0))
    need = f"a CUDA {major} driver" + (f" (>= {floor})" if floor else "")
    return Expected(outcomes=PROGRAM_REFUSED,
                    reason=f"the program's CUDA {major} runtime{seen} needs {need}; the driver is {_v(d)}: "
                           "its first runtime call gets cudaErrorInsufficientDriver (35), and the program fails "
                           "(NVIDIA's rule says it fails, not how it reports it: any non-zero exit or signal)",
                    rule="program-major-newer-than-driver")


def expect_jit(cell: Cell, host: HostFacts, prior: Expected,
               libraries: tuple[tuple[str | None, str | None], ...], *,
               device_code: tuple[tuple[str, tuple[DeviceCode, ...]], ...] = (),
               arch: int | None = None) -> Expected:
    """The expectation once the device code and PTX producers the cell's processes mapped are known.

    ``device_code`` holds the fat binaries of the mapped objects, ``arch`` the GPU's SM number:
    an object with no code the GPU can run on this driver
    (:func:`cumatrix.predict.jit.no_usable_code`) predicts the command's failure, naming the
    object and what it has.

    ``libraries`` are the mapped CUDA libraries as (SONAME, version).  A producer whose PTX
    is newer than the (effective) driver's JIT ceiling (:func:`cumatrix.predict.jit.jit_refusal`)
    predicts the refusal: ``cuda-error:222`` for the reference's PTX kernel, and for a command
    whose prediction rested on no rule (``command-default``) any failure (``fails``: how a
    program reports the error is its own).  nvJitLink or libNVVM of a newer major under an emulated
    driver make such a command ``cannot-emulate`` (:func:`cumatrix.predict.jit.unknown_machine_code`).
    A matrix override, or a rule already predicting a failure
    (a CUDA 13 runtime on a 12.x driver fails before any PTX is loaded), keeps ``prior``.
    """
    d = effective_driver(cell, host)
    if d is None or prior.rule == "matrix-override":
        return prior
    no_code = _no_usable_code(cell, prior, device_code, arch, d)
    if no_code is not None:
        return no_code
    producers = ptx_producers(libraries)
    why = jit_refusal(cell, d, producers)
    if why is None:
        return _jit_unknown_machine_code(cell, prior, d, producers)
    if cell.kind == "swap" and prior.rule == "ptx-ceiling":
        return _expect("cuda-error:222", reason=why, rule="jit-ptx-too-new")
    if cell.kind == "command" and prior.rule == "command-default":
        return Expected(outcomes=PROGRAM_REFUSED, reason=f"{why}; how the program reports it is its own",
                        rule="jit-ptx-too-new")
    return prior


def _no_usable_code(cell: Cell, prior: Expected, device_code: tuple[tuple[str, tuple[DeviceCode, ...]], ...],
                    arch: int | None, d: int) -> Expected | None:
    """A command that rested on no rule and mapped an object with no code GPU ``arch`` can run on
    driver ``d``: the program fails (how it reports it is its own)."""
    if cell.kind != "command" or prior.rule != "command-default" or arch is None:
        return None
    found = no_usable_code(device_code, arch, d)
    if found is None:
        return None
    return Expected(outcomes=PROGRAM_REFUSED, reason=f"{found[1]}; how the program reports it is its own",
                    rule=found[0])


def _jit_unknown_machine_code(cell: Cell, prior: Expected, d: int, producers: tuple[PtxProducer, ...]) -> Expected:
    """A command that rested on no rule, under an emulated driver, whose JIT producers make
    machine code the emulated driver's documentation does not cover: ``cannot-emulate``."""
    unknown = unknown_machine_code(d, producers) if cell.driver.startswith("emulated-") else None
    if unknown is not None and cell.kind == "command" and prior.rule == "command-default":
        return _expect("cannot-emulate", reason=unknown, rule="jit-machine-code-undocumented")
    return prior


# --------------------------------------------------------------------------- the gate's cells


def unsupported_pairing(cell: Cell, host: HostFacts, runtime_version: int | None) -> str | None:
    """Why NVIDIA does not support ``cell``'s runtime on its driver, or ``None``.

    A runtime of a newer CUDA major than the (effective) driver fails with
    ``cudaErrorInsufficientDriver`` (:func:`~cumatrix.predict.rules.major_newer_than_driver`);
    minor-version compatibility covers the rest.  With no driver, or an unknown runtime
    version, the pairing is run (a wheel must import there).
    """
    d = effective_driver(cell, host)
    if d is None or runtime_version is None or not major_newer_than_driver(runtime_version, d):
        return None
    rv, dv = CudaVersion.from_int(runtime_version), CudaVersion.from_int(d)
    return (f"runtime {rv} needs a CUDA {rv.major} driver; driver {cell.driver} is CUDA {dv}, and "
            "NVIDIA supports no runtime of a newer major than the driver "
            "(cudaErrorInsufficientDriver): not run")


def expect_gate_cell(cell: Cell, host: HostFacts, *, runtime_version: int | None, smoke: bool) -> Expected:
    """What a gate cell (a wheel installed into one pairing) must do: ``ok`` on every pairing
    NVIDIA supports; a pairing it does not support is ``skipped:unsupported-pairing``."""
    why = unsupported_pairing(cell, host, runtime_version)
    if why is not None:
        return _expect("skipped:unsupported-pairing", reason=why, rule="unsupported-pairing")
    what = "the --smoke command must exit 0" if smoke else "the wheel's top-level packages must import"
    d = effective_driver(cell, host)
    where = (f"on every pairing NVIDIA supports (driver {cell.driver}: CUDA {CudaVersion.from_int(d)})"
             if d is not None else "with no NVIDIA driver on the host too (CPU-only CI, docs builds)")
    return _expect("ok", reason=f"{what} {where}", rule="gate")


# --------------------------------------------------------------------------- harness children outside a matrix


def expect_tool(name: str) -> Expected:
    """A harness child run outside a matrix (``calibrate``'s measuring child): it passes when it
    reports ``ok`` over the verdict channel."""
    return _expect("ok", reason=f"the {name} child reports its result over the verdict channel", rule="tool")

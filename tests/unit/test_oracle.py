"""The oracle against every row of docs/facts.md sections 2, 3, 4, 6 and 7.

Test ids name the section and the row (``s2-cu12.9-driver-dispatch-h12.8``), so a
mismatch maps straight back to the measured fact it contradicts.  Pure and fast: the
oracle only needs versions, so no runtime, driver or GPU is involved.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest

from cumatrix.core.model import (
    NO_RUNTIME,
    OUTCOME_RE,
    Case,
    Cell,
    CudaVersion,
    Expected,
    Observed,
    Workload,
    is_neutral,
    outcome_kind,
)
from cumatrix.judge.verdict import Facts, decide
from cumatrix.judge.verdict import reconcile as _reconcile
from cumatrix.load import matrix as _matrix
from cumatrix.predict.oracle import HostFacts, cuda_for_driver, expect


def verdict(e: Expected, observed: Observed) -> tuple[str, str | None]:
    """The judge's status and mismatch for an observation of a plain host-driver cell."""
    cell = Cell(kind="command", runtime="cu13.0", driver="host")
    v = decide(cell, e, observed, Facts(host=HostFacts(driver_version=13000)))
    return v.status, v.mismatch


def reconcile(cell: Cell, observed: Observed, host: HostFacts, e: Expected | None = None) -> Observed:
    rv = None if cell.runtime == "none" else int(CudaVersion.parse(cell.runtime.removeprefix("cu")))
    return _reconcile(cell, observed, host, e or expect(cell, host, runtime_version=rv))

D2H = Workload(name="kv-16k-d2h", direction="d2h", block_bytes=16384, blocks=1024)
LEGACY = Workload(name="kv-16k-legacy", direction="d2h", block_bytes=16384, blocks=256, stream="legacy")

RUNTIMES = ("12.0", "12.4", "12.8", "12.9", "13.0", "13.5")
CU12 = ("12.0", "12.4", "12.8", "12.9")
CU13 = ("13.0", "13.5")
RUNTIME_VARIANTS = ("runtime-dispatch", "driver-dispatch", "header-dispatch", "loop")


def v(text: str) -> int:
    """CUDA's integer encoding of ``text`` (``12.8`` -> 12080)."""
    return int(CudaVersion.parse(text))


def on(driver: str | None) -> HostFacts:
    """A host whose real driver reports CUDA ``driver`` (None: no driver at all)."""
    return HostFacts(driver_version=v(driver) if driver else None)


def swap(variant: str, *, runtime: str | None = None, driver: str = "host", build: str = "12.8",
         workload: Workload = D2H) -> Cell:
    """A swap cell; ``runtime`` None makes a driver-family cell (which loads no runtime)."""
    family = "driver" if runtime is None else "runtime"
    return Cell(kind="swap", runtime=f"cu{runtime}" if runtime else NO_RUNTIME, driver=driver, variant=variant,
                family=family, build=CudaVersion.parse(build), workload=workload)


def probe(runtime: str, driver: str = "host") -> Cell:
    return Cell(kind="probe", runtime=f"cu{runtime}", driver=driver)


def only(e: Expected) -> str:
    """The single outcome of an expectation, checking its reason on the way."""
    assert len(e.outcomes) == 1, e
    assert e.reason, e
    assert "\n" not in e.reason, e
    return next(iter(e.outcomes))


def rt(cell: Cell, host: HostFacts, runtime: str | None = None) -> str:
    return only(expect(cell, host, runtime_version=v(runtime) if runtime else None))


# --------------------------------------------------------------------------- section 2
# Driver 13.0 in every row; the ABI follows the loaded runtime, not the driver or headers.

SECTION2: dict[tuple[str, str], dict[str, str]] = {
    # runtime-dispatch: ABI from cudaRuntimeGetVersion, correct everywhere.
    ("runtime-dispatch", "12.8"): {"12.0": "ok:fallback", "12.4": "ok:fallback", "12.8": "ok:batch",
                                   "12.9": "ok:batch", "13.0": "ok:batch", "13.5": "ok:batch"},
    # driver-dispatch: a 13.0 driver picks the 8-parameter call (SGLang PR 23172).
    ("driver-dispatch", "12.8"): {"12.0": "ok:fallback", "12.4": "ok:fallback", "12.8": "crash:SIGSEGV",
                                  "12.9": "crash:SIGSEGV", "13.0": "ok:batch", "13.5": "ok:batch"},
    # header-dispatch: 12.8 headers compile the 9-parameter call (SGLang issue 36302).
    ("header-dispatch", "12.8"): {"12.0": "ok:fallback", "12.4": "ok:fallback", "12.8": "ok:batch",
                                  "12.9": "ok:batch", "13.0": "cuda-error:400", "13.5": "cuda-error:400"},
    # header-dispatch: 13.0 headers compile the 8-parameter call.
    ("header-dispatch", "13.0"): {"12.0": "ok:fallback", "12.4": "ok:fallback", "12.8": "crash:SIGSEGV",
                                  "12.9": "crash:SIGSEGV", "13.0": "ok:batch", "13.5": "ok:batch"},
    ("loop", "12.8"): dict.fromkeys(RUNTIMES, "ok:fallback"),
}


@pytest.mark.parametrize(
    ("variant", "build", "runtime", "outcome"),
    [pytest.param(var, b, r, out, id=f"s2-cu{r}-{var}-h{b}")
     for (var, b), row in SECTION2.items() for r, out in row.items()],
)
def test_section2_abi_on_driver_13(variant: str, build: str, runtime: str, outcome: str) -> None:
    assert rt(swap(variant, runtime=runtime, build=build), on("13.0"), runtime) == outcome


@pytest.mark.parametrize("runtime", RUNTIMES, ids=[f"s2-cu{r}-probe" for r in RUNTIMES])
def test_section2_probe_runs_every_runtime_on_driver_13(runtime: str) -> None:
    assert rt(probe(runtime), on("13.0"), runtime) == "ok:n/a"


def test_section2_driver_family_loop_is_the_baseline() -> None:
    assert rt(swap("loop"), on("13.0")) == "ok:fallback"


# --------------------------------------------------------------------------- section 3
# cuGetProcAddress("cuMemcpyBatchAsync", 12080): NULL (status 2) below 12.8, the 9-param entry from it.

SECTION3 = {"12.0": "ok:fallback", "12.4": "ok:fallback", "12.8": "ok:batch", "12.9": "ok:batch", "13.0": "ok:batch"}


@pytest.mark.parametrize(("driver", "outcome"), [pytest.param(d, o, id=f"s3-emulated-{d}") for d, o in SECTION3.items()])
def test_section3_proc_address_under_emulated_driver(driver: str, outcome: str) -> None:
    assert rt(swap("proc-address", driver=f"emulated-{driver}"), on("13.0")) == outcome


@pytest.mark.parametrize(("driver", "outcome"), [pytest.param(d, o, id=f"s3-real-{d}") for d, o in SECTION3.items()])
def test_section3_proc_address_on_real_driver(driver: str, outcome: str) -> None:
    assert rt(swap("proc-address"), on(driver)) == outcome


# --------------------------------------------------------------------------- section 4
# The libcuda.so.1 interposer on a real 13.0 driver.

SECTION4_DIRECT = {"12.4": "undefined-symbol:cuMemcpyBatchAsync", "12.8": "ok:batch", "12.9": "ok:batch", "13.0": "ok:batch"}


@pytest.mark.parametrize(("driver", "outcome"),
                         [pytest.param(d, o, id=f"s4-direct-link-emulated-{d}") for d, o in SECTION4_DIRECT.items()])
def test_section4_direct_link_under_emulated_driver(driver: str, outcome: str) -> None:
    assert rt(swap("direct-link", driver=f"emulated-{driver}"), on("13.0")) == outcome


EMULATED_12 = ("12.0", "12.4", "12.8", "12.9")


@pytest.mark.parametrize(
    ("runtime", "driver", "variant"),
    [pytest.param(r, d, var, id=f"s4-cu13-cu{r}-emulated-{d}-{var}")
     for r in CU13 for d in EMULATED_12 for var in ("probe", *RUNTIME_VARIANTS)],
)
def test_section4_cu13_runtime_under_emulated_12x_is_insufficient_driver(runtime: str, driver: str, variant: str) -> None:
    cell = probe(runtime, f"emulated-{driver}") if variant == "probe" else swap(variant, runtime=runtime, driver=f"emulated-{driver}")
    assert rt(cell, on("13.0"), runtime) == "cuda-error:35"


@pytest.mark.parametrize(
    ("runtime", "driver", "variant"),
    [pytest.param(r, d, var, id=f"s4-cu12-cu{r}-emulated-{d}-{var}")
     for r in CU12 for d in ("12.4", "12.8", "12.9") for var in ("probe", *RUNTIME_VARIANTS)],
)
def test_section4_cu12_runtime_under_other_emulated_version_cannot_emulate(runtime: str, driver: str, variant: str) -> None:
    cell = probe(runtime, f"emulated-{driver}") if variant == "probe" else swap(variant, runtime=runtime, driver=f"emulated-{driver}")
    assert rt(cell, on("13.0"), runtime) == "cannot-emulate"


def test_section4_observed_error_103_is_reconciled_to_cannot_emulate() -> None:
    """A cu12 runtime answers the interposer with error 103: that cell is "cannot emulate", a skip."""
    host = on("13.0")
    cell = swap("runtime-dispatch", runtime="12.9", driver="emulated-12.4")
    seen = Observed(outcome="cuda-error:103", error_name="cudaErrorSoftwareValidityNotEstablished",
                    detail="integrity checks failed", exit_status=1)
    got = reconcile(cell, seen, host)
    assert got.outcome == "cannot-emulate"
    assert "103" in got.detail
    assert verdict(expect(cell, host, runtime_version=v("12.9")), got) == ("skip", None)


@pytest.mark.parametrize("expected", ["ok:batch", "cuda-error:103", "crash:SIGSEGV", "cannot-emulate"])
def test_section4_cannot_emulate_is_never_pass_or_fail(expected: str) -> None:
    e = Expected(outcomes=frozenset({expected}), reason="whatever the oracle said")
    assert verdict(e, Observed(outcome="cannot-emulate"))[0] == "skip"


def test_a_leaked_runtime_fails_even_where_the_pairing_cannot_be_emulated() -> None:
    """Under an emulated driver that a CUDA 12 runtime detects, a cell's own outcome does not
    count (cannot-emulate); a runtime leaked from the host is the program's fault on any driver."""
    host = on("13.0")
    cell = Cell(kind="command", runtime="cu12.9", driver="emulated-12.4", case=Case(name="ext", argv=("python3",)))
    e = Expected(outcomes=frozenset({"cannot-emulate"}), reason="a CUDA 12 runtime detects the interposer")
    leak = Observed(outcome="runtime-leak:/usr/local/cuda-13.0/lib64/libcudart.so.13", detail="found through ld.so.cache")
    assert reconcile(cell, leak, host, e) == leak
    assert reconcile(cell, Observed(outcome="ok", path="n/a"), host, e).outcome == "cannot-emulate"
    v = decide(cell, e, leak, Facts(host=host))
    assert v.status == "fail"
    assert "observed runtime-leak:/usr/local/cuda-13.0/lib64/libcudart.so.13" in str(v.mismatch)
    assert outcome_kind(leak.outcome).value == "runtime-leak"
    assert not is_neutral(leak.outcome)


def test_section4_error_103_at_the_real_drivers_version_stays_an_error() -> None:
    # Emulating the real driver's own version is not detected (docs/facts.md section 4, V = 13000): a 103 there is real.
    host = on("13.0")
    cell = probe("12.9", "emulated-13.0")
    seen = Observed(outcome="cuda-error:103", error_name="cudaErrorSoftwareValidityNotEstablished")
    assert reconcile(cell, seen, host) == seen
    assert verdict(expect(cell, host, runtime_version=v("12.9")), seen)[0] == "fail"


def test_section4_reconcile_leaves_the_real_driver_alone() -> None:
    seen = Observed(outcome="cuda-error:103")
    assert reconcile(probe("12.9"), seen, on("13.0")) == seen


@pytest.mark.parametrize(
    ("runtime", "variant", "build"),
    [pytest.param(r, var, b, id=f"s4-cu{r}-emulated-13.0-same-as-real-{var}-h{b}")
     for r in RUNTIMES for var in ("probe", *RUNTIME_VARIANTS) for b in (("12.8", "13.0") if var != "probe" else ("-",))],
)
def test_section4_emulating_the_real_version_is_as_on_the_real_driver(runtime: str, variant: str, build: str) -> None:
    host = on("13.0")
    if variant == "probe":
        emulated, real = probe(runtime, "emulated-13.0"), probe(runtime)
    else:
        emulated = swap(variant, runtime=runtime, driver="emulated-13.0", build=build)
        real = swap(variant, runtime=runtime, build=build)
    assert expect(emulated, host, runtime_version=v(runtime)).outcomes == expect(real, host, runtime_version=v(runtime)).outcomes


@pytest.mark.parametrize(
    ("real", "emulated", "cell"),
    [pytest.param("12.4", "12.8", probe("12.9", "emulated-12.8"), id="s4-newer-probe-12.8-on-12.4"),
     pytest.param("12.4", "12.8", swap("proc-address", driver="emulated-12.8"), id="s4-newer-proc-address-12.8-on-12.4"),
     pytest.param("12.9", "13.0", swap("direct-link", driver="emulated-13.0"), id="s4-newer-direct-link-13.0-on-12.9"),
     pytest.param("12.8", "12.9", swap("runtime-dispatch", runtime="13.0", driver="emulated-12.9"),
                  id="s4-newer-runtime-dispatch-12.9-on-12.8")],
)
def test_section4_emulating_a_newer_driver_is_not_runnable(real: str, emulated: str, cell: Cell) -> None:
    # The interposer can only hide what the real driver has; it cannot add entry points.
    e = expect(cell, on(real), runtime_version=v(cell.runtime[2:]) if cell.runtime != NO_RUNTIME else None)
    assert only(e) == "harness-error"
    assert f"cannot emulate driver {emulated} on a {real} driver" in e.reason


# --------------------------------------------------------------------------- section 6


def test_s6_vllm_undefined_symbol() -> None:
    """vLLM PR 38460: a direct link fails to load on a driver older than 12.8."""
    assert rt(swap("direct-link", driver="emulated-12.4"), on("13.0")) == "undefined-symbol:cuMemcpyBatchAsync"
    assert rt(swap("direct-link"), on("12.4")) == "undefined-symbol:cuMemcpyBatchAsync"


@pytest.mark.parametrize("driver", ["host", "emulated-12.4", "emulated-12.8"])
def test_s6_vllm_cuda13_build(driver: str) -> None:
    """CUDA 13 headers #define the name to the 8-parameter _v2: the 9-argument call does not compile."""
    assert rt(swap("direct-link", driver=driver, build="13.0"), on("13.0")) == "build-error"


def test_s6_sglang_driver_dispatch() -> None:
    """SGLang PR 23172: ABI from cudaDriverGetVersion crashes a 12.9 runtime on a 13.0 driver."""
    assert rt(swap("driver-dispatch", runtime="12.9"), on("13.0"), "12.9") == "crash:SIGSEGV"


def test_s6_sglang_header_dispatch_follows_section2_mechanics() -> None:
    """SGLang issue 36302, checked against docs/facts.md section 2.

    Section 6 says "SIGSEGV: built with 12.8 headers, run on a 13 runtime; error 400 the
    other way round".  Built with 12.8 headers means the 9-parameter (v12) call, and
    section 2 measured a 9-parameter call into a 13.x runtime as error 400 (failIdx taken
    as the stream), and an 8-parameter call (13.0 headers) into a 12.8/12.9 runtime as
    SIGSEGV.  Section 6's row has the two swapped; the oracle follows section 2.
    """
    host = on("13.0")
    for runtime in CU13:
        assert rt(swap("header-dispatch", runtime=runtime, build="12.8"), host, runtime) == "cuda-error:400"
    for runtime in ("12.8", "12.9"):
        assert rt(swap("header-dispatch", runtime=runtime, build="13.0"), host, runtime) == "crash:SIGSEGV"


@pytest.mark.parametrize(
    ("cell", "runtime", "outcome"),
    [pytest.param(swap("direct-link", workload=LEGACY), None, "cuda-error:1", id="s6-legacy-direct-link"),
     pytest.param(swap("proc-address", workload=LEGACY), None, "ok:fallback", id="s6-legacy-proc-address"),
     *[pytest.param(swap("runtime-dispatch", runtime=r, workload=LEGACY), r, "ok:fallback",
                    id=f"s6-legacy-runtime-dispatch-cu{r}") for r in RUNTIMES]],
)
def test_s6_legacy_stream(cell: Cell, runtime: str | None, outcome: str) -> None:
    """vLLM issue 46345: the batch call rejects the legacy NULL stream; correct code falls back."""
    assert rt(cell, on("13.0"), runtime) == outcome


@pytest.mark.parametrize("runtime", CU13)
def test_s6_v12_abi_on_cu13(runtime: str) -> None:
    """A 9-parameter call into a 13.x runtime: cudaErrorInvalidResourceHandle (400)."""
    assert rt(swap("header-dispatch", runtime=runtime, build="12.8"), on("13.0"), runtime) == "cuda-error:400"


@pytest.mark.parametrize("driver", ["host", "emulated-12.8"])
def test_s6_direct_link_headers_older_than_the_batch_copy_do_not_compile(driver: str) -> None:
    # CUDA 12.4 headers declare neither cuMemcpyBatchAsync nor CUmemcpyAttributes.
    assert rt(swap("direct-link", driver=driver, build="12.4"), on("13.0")) == "build-error"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_s6_header_dispatch_with_headers_older_than_the_batch_copy_never_batches(runtime: str) -> None:
    # CUDA_VERSION < 12080 compiles the batch path out (reference/header_dispatch.c).
    assert rt(swap("header-dispatch", runtime=runtime, build="12.4"), on("13.0"), runtime) == "ok:fallback"
    # On a 12.4 driver too, where the batch call would have returned error 36; a 13.x runtime
    # still meets the major-version rule first.
    on_old = "cuda-error:35" if runtime in CU13 else "ok:fallback"
    assert rt(swap("header-dispatch", runtime=runtime, build="12.4"), on("12.4"), runtime) == on_old


# --------------------------------------------------------------------------- section 7


@pytest.mark.parametrize(
    ("cell", "outcome"),
    [pytest.param(probe("12.9"), "ok:n/a", id="s7-minor-compat-probe"),
     pytest.param(swap("runtime-dispatch", runtime="12.9"), "ok:fallback", id="s7-minor-compat-runtime-dispatch"),
     pytest.param(swap("driver-dispatch", runtime="12.9"), "ok:fallback", id="s7-minor-compat-driver-dispatch"),
     pytest.param(swap("header-dispatch", runtime="12.9", build="12.8"), "ok:fallback",
                  id="s7-minor-compat-header-dispatch"),
     pytest.param(swap("loop", runtime="12.9"), "ok:fallback", id="s7-minor-compat-loop")],
)
def test_section7_minor_version_compatibility(cell: Cell, outcome: str) -> None:
    """A 12.9 runtime on a 12.4 driver runs; the batch copy there returns error 36 and every
    runtime-family variant falls back (the fallback is not the bug the bad variants model)."""
    e = expect(cell, on("12.4"), runtime_version=v("12.9"))
    assert only(e) == outcome
    if cell.kind == "probe":
        assert "minor-version compatibility" in e.reason
    elif cell.variant != "loop":
        assert "12.4" in e.reason


@pytest.mark.parametrize(
    ("runtime", "driver", "variant"),
    [pytest.param(r, d, var, id=f"s7-major-cu{r}-on-{d}-{var}")
     for r in CU13 for d in ("12.0", "12.4", "12.8", "12.9") for var in ("probe", *RUNTIME_VARIANTS)],
)
def test_section7_runtime_of_a_newer_major_is_insufficient_driver(runtime: str, driver: str, variant: str) -> None:
    cell = probe(runtime) if variant == "probe" else swap(variant, runtime=runtime)
    e = expect(cell, on(driver), runtime_version=v(runtime))
    assert only(e) == "cuda-error:35"
    assert "cudaErrorInsufficientDriver" in e.reason


CUDA_FOR_DRIVER = {
    "525.60.13": "12.0", "550.54.14": "12.4", "570.26": "12.8", "575.51.03": "12.9", "580.65.06": "13.0",
    "580.159.04": "13.0", "580.159": "13.0", "550.163": "12.4", "570.86": "12.8",
}


@pytest.mark.parametrize(("driver", "cuda"), [pytest.param(d, c, id=f"s7-driver-{d}") for d, c in CUDA_FOR_DRIVER.items()])
def test_section7_cuda_for_driver(driver: str, cuda: str) -> None:
    assert cuda_for_driver(driver) == CudaVersion.parse(cuda)


def test_section7_every_minimum_driver_in_the_data_maps_to_its_own_toolkit() -> None:
    table = json.loads(resources.files("cumatrix").joinpath("data/nvidia.json").read_text())["min_driver"]
    assert {"12.0": "525.60.13", "12.4": "550.54.14", "12.8": "570.26", "12.9": "575.51.03",
            "13.0": "580.65.06"}.items() <= table.items()
    for cuda, floor in table.items():
        assert cuda_for_driver(floor) == CudaVersion.parse(cuda), floor


@pytest.mark.parametrize("driver", ["525.60.12", "520.61.05", "470.82.01", "525"])
def test_section7_driver_older_than_cuda_12_is_an_error(driver: str) -> None:
    with pytest.raises(ValueError, match=r"525\.60\.13"):
        cuda_for_driver(driver)


# --------------------------------------------------------------------------- general rules


@pytest.mark.parametrize(
    "cell",
    [pytest.param(probe("12.9"), id="probe"),
     pytest.param(probe("13.0", "emulated-12.4"), id="probe-emulated"),
     pytest.param(swap("proc-address"), id="driver-family"),
     pytest.param(swap("direct-link", driver="emulated-12.4"), id="driver-family-emulated"),
     pytest.param(swap("runtime-dispatch", runtime="12.9"), id="runtime-family"),
     pytest.param(swap("loop"), id="driver-loop")],
)
def test_no_driver_skips_gpu_cells(cell: Cell) -> None:
    rv = v(cell.runtime[2:]) if cell.runtime != NO_RUNTIME else None
    assert only(expect(cell, on(None), runtime_version=rv)) == "skipped:no-cuda-driver"


def test_no_driver_still_runs_commands() -> None:
    cell = Cell(kind="command", runtime="cu12.9", driver="host", case=Case(name="smoke", argv=("true",)))
    assert only(expect(cell, on(None), runtime_version=None)) == "ok"


ALL_MATRIX = """\
version: 1
runtimes:
  cu12.0: {wheel: nvidia-cuda-runtime-cu12==12.0.146}
  cu12.4: {wheel: nvidia-cuda-runtime-cu12==12.4.127}
  cu12.8: {wheel: nvidia-cuda-runtime-cu12==12.8.90}
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
  cu13.0: {wheel: nvidia-cuda-runtime==13.0.96}
  cu13.5: {wheel: nvidia-cuda-runtime==13.5.37}
drivers: [host, emulated-12.0, emulated-12.4, emulated-12.8, emulated-12.9, emulated-13.0]
builds: ["12.4", "12.8", "13.0"]
variants: [proc-address, direct-link, loop, runtime-dispatch, driver-dispatch, header-dispatch]
workloads:
  - {name: kv-16k-d2h, direction: d2h, block_bytes: 16KiB, blocks: 1024}
  - {name: kv-16k-legacy, direction: d2h, block_bytes: 16KiB, blocks: 256, stream: legacy}
cases:
  - {name: import-smoke, argv: [python3, -c, "import ctypes"]}
"""


@pytest.mark.parametrize("driver", [None, "12.0", "12.4", "12.8", "12.9", "13.0"], ids=lambda d: f"driver-{d}")
def test_every_expectation_is_valid_with_a_one_line_reason(driver: str | None) -> None:
    m = _matrix.loads(ALL_MATRIX, "all.yaml")
    host = on(driver)
    for cell in _matrix.cells(m):
        rv = v(cell.runtime[2:]) if cell.runtime != NO_RUNTIME else None
        e = expect(cell, host, runtime_version=rv, matrix=m)
        assert e.outcomes, cell.id
        for word in e.outcomes:
            assert OUTCOME_RE.match(word), (cell.id, word)
        assert e.reason.strip(), (cell.id, e.reason)
        assert "\n" not in e.reason, (cell.id, e.reason)
        assert e.rule, (cell.id, e.rule)
        assert e.rule != "none", (cell.id, e.rule)


OVERRIDES = ALL_MATRIX + """\
expect:
  - {variant: runtime-dispatch, runtime: cu12.9, outcome: "crash:SIGSEGV"}
  - variant: runtime-dispatch
    runtime: cu12.9
    workload: kv-16k-d2h
    outcome: ["cuda-error:400", "ok:batch"]
    reason: |
      measured on a driver
      that misbehaves
"""


def test_matrix_expect_overrides_win_and_the_last_match_wins() -> None:
    m = _matrix.loads(OVERRIDES, "over.yaml")
    host = on("13.0")
    derived = expect(swap("runtime-dispatch", runtime="12.9"), host, runtime_version=v("12.9"))
    assert derived.outcomes == {"ok:batch"}

    e = expect(swap("runtime-dispatch", runtime="12.9"), host, runtime_version=v("12.9"), matrix=m)
    assert (e.outcomes, e.rule) == ({"cuda-error:400", "ok:batch"}, "matrix-override")
    assert e.reason == "measured on a driver that misbehaves"

    legacy = expect(swap("runtime-dispatch", runtime="12.9", workload=LEGACY), host, runtime_version=v("12.9"), matrix=m)
    assert legacy.outcomes == {"crash:SIGSEGV"}
    assert legacy.rule == "matrix-override"
    assert legacy.reason.strip()
    assert "\n" not in legacy.reason

    untouched = expect(swap("runtime-dispatch", runtime="13.0"), host, runtime_version=v("13.0"), matrix=m)
    assert untouched.rule != "matrix-override"


# --------------------------------------------------------------------------- verdicts


def test_verdict_pass_fail_skip() -> None:
    e = Expected(outcomes=frozenset({"ok:batch"}), reason="the batch copy runs")
    assert verdict(e, Observed(outcome="ok", path="batch")) == ("pass", None)
    status, why = verdict(e, Observed(outcome="ok", path="fallback"))
    assert status == "fail"
    assert why is not None
    assert "expected ok:batch because the batch copy runs" in why
    assert "fallback" in why
    status, why = verdict(e, Observed(outcome="crash:SIGSEGV", detail="Segmentation fault\nmore"))
    assert status == "fail"
    assert why is not None
    assert "\n" not in why
    assert "Segmentation fault" in why
    assert verdict(e, Observed(outcome="skipped:no-cuda-driver")) == ("skip", None)


# --------------------------------------------------------------------------- the copy kernel


def _kernel_cell(policy: str, image: str = "cubin", driver: str = "host", stream: str = "dedicated") -> Cell:
    w = Workload(name=f"w-{policy}-{image}", direction="d2h", block_bytes=16384, blocks=1024, stream=stream,
                 policy=policy, kernel_image=image)
    return Cell(kind="swap", runtime="none", driver=driver, variant="proc-address", family="driver",
                build=CudaVersion(13, 0), workload=w)


@pytest.mark.parametrize(
    ("policy", "image", "driver", "expected"),
    [pytest.param("kernel", "cubin", "host", {"ok:kernel", "skipped:no-nvrtc"}, id="kernel-cubin-real-driver"),
     pytest.param("kernel", "cubin", "emulated-12.4", {"ok:kernel", "skipped:no-nvrtc"}, id="kernel-cubin-needs-no-jit"),
     pytest.param("kernel", "ptx", "host", {"ok:kernel", "skipped:no-nvrtc"}, id="kernel-ptx-real-driver"),
     pytest.param("kernel", "ptx", "emulated-12.4", {"ok:kernel", "cuda-error:222", "skipped:no-nvrtc"},
                  id="kernel-ptx-under-emulation"),
     pytest.param("fastest", "cubin", "host", {"ok:kernel", "ok:batch", "ok:fallback"}, id="fastest-new-driver"),
     pytest.param("fastest", "cubin", "emulated-12.4", {"ok:kernel", "ok:fallback"}, id="fastest-old-driver"),
     pytest.param("copy-engine-only", "cubin", "host", {"ok:batch"}, id="copy-engine-only-batch"),
     pytest.param("copy-engine-only", "cubin", "emulated-12.4", {"ok:fallback"}, id="copy-engine-only-fallback")],
)
def test_kernel_path_rows(policy: str, image: str, driver: str, expected: set[str]) -> None:
    """Machine code avoids the JIT; PTX meets the driver's JIT, which the interposer cannot narrow."""
    e = expect(_kernel_cell(policy, image, driver), on("13.0"), runtime_version=None)
    assert set(e.outcomes) == expected
    assert e.reason
    assert "\n" not in e.reason


def test_ptx_under_emulation_is_judged_against_the_ceiling() -> None:
    """The interposer refuses PTX beyond the emulated driver's JIT: a run that compiled it no
    longer reads as "cannot emulate" (it was, before the ceiling); a refusal is predicted."""
    cell = _kernel_cell("kernel", "ptx", "emulated-12.4")
    host = on("13.0")
    e = expect(cell, host, runtime_version=None)
    assert e.rule == "ptx-ceiling"
    assert "PTX ISA 8.4" in e.reason
    got = reconcile(cell, Observed(outcome="cuda-error:222"), host, e)
    assert verdict(e, got)[0] == "pass"


@pytest.mark.parametrize(("direction", "driver", "stream", "expected"), [
    ("d2h", "host", "dedicated", {"ok:batch"}),
    ("h2d", "emulated-12.4", "dedicated", {"ok:fallback"}),
    ("d2d", "host", "dedicated", {"ok:kernel", "ok:fallback"}),
    ("d2h", "host", "legacy", {"ok:fallback"}),
])
def test_beside_compute_policy_rows(direction: str, driver: str, stream: str, expected: set[str]) -> None:
    w = Workload(name=f"w-{direction}", direction=direction, block_bytes=16384, blocks=1024, stream=stream,
                 policy="beside-compute")
    cell = Cell(kind="swap", runtime="none", driver=driver, variant="proc-address", family="driver",
                build=CudaVersion(13, 0), workload=w)
    assert set(expect(cell, on("13.0"), runtime_version=None).outcomes) == expected


def test_a_cell_skipped_for_want_of_a_compiler_fails_a_run_that_requires_the_gpu() -> None:
    cell = swap("direct-link")
    e = Expected(outcomes=frozenset({"ok"}), reason="r")
    skipped = Observed(outcome="skipped:no-compiler", detail="no gcc on PATH")
    assert decide(cell, e, skipped, Facts(host=HostFacts(driver_version=13000))).status == "skip"
    v = decide(cell, e, skipped, Facts(host=HostFacts(driver_version=13000), require_gpu=True))
    assert v.status == "fail"
    assert "could not be built here (no gcc on PATH)" in str(v.mismatch)

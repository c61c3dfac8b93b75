"""The bug catalog as data: it loads, validates, and each entry builds its two cells."""

from __future__ import annotations

import json
import shlex
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cumatrix.core.errors import ConfigError, UsageError
from cumatrix.core.jobs import Job
from cumatrix.core.model import OUTCOME_RE, VARIANT_FAMILIES
from cumatrix.front.repro import cli as repro
from cumatrix.load import catalog
from cumatrix.orchestrate import Orchestrator
from cumatrix.provision import runtimes
from helpers.trees import paths

IDS = ("vllm-undefined-symbol", "vllm-cuda13-build", "sglang-driver-dispatch", "sglang-header-dispatch",
       "legacy-stream", "v12-abi-on-cu13")


def _raw() -> dict:
    return json.loads(resources.files("cumatrix").joinpath("data/bugs.json").read_text())


def test_packaged_catalog_loads_every_known_failure() -> None:
    cat = repro.load_catalog()
    assert cat.schema == 1
    assert tuple(b.id for b in cat.bugs) == IDS
    for b in cat.bugs:
        assert b.refs, b.id
        assert all(OUTCOME_RE.match(o) and not o.startswith("ok") for o in b.bad.outcomes)
        assert all(o.startswith("ok") for o in b.good.outcomes)
        for c in (b.bad, b.good):
            assert c.family in VARIANT_FAMILIES[c.variant]


@pytest.mark.parametrize("bug_id", IDS)
def test_entry_matrix_holds_its_two_cells(bug_id: str) -> None:
    b = repro.load_catalog().get(bug_id)
    m = b.matrix()
    for c in (b.bad, b.good):
        cell = c.cell()
        if c.runtime is not None:
            assert m.runtime(cell.runtime).requirement == runtimes.KNOWN_WHEELS[str(c.runtime)]
        assert m.driver(cell.driver).name == cell.driver
        assert c.workload in m.workloads
        assert c.build in m.builds
        assert c.variant in m.variants


def test_signatures_match_the_facts() -> None:
    cat = repro.load_catalog()
    assert cat.get("vllm-undefined-symbol").bad.cell().id == "none/emulated-12.4/direct-link/h12.8/kv-16k-d2h"
    assert cat.get("vllm-undefined-symbol").bad.outcome == "undefined-symbol:cuMemcpyBatchAsync"
    assert cat.get("sglang-driver-dispatch").bad.cell().id == "cu12.9/host/driver-dispatch/h12.8/kv-16k-d2h"
    assert cat.get("sglang-driver-dispatch").bad.outcome == "crash:SIGSEGV"
    assert cat.get("legacy-stream").bad.workload.stream == "legacy"
    assert cat.get("v12-abi-on-cu13").bad.outcome == "cuda-error:400"
    # The correct driver-family code falls back: per block, or with the copy kernel where calibrated.
    assert cat.get("legacy-stream").good.shows("ok", "kernel", "")
    assert cat.get("legacy-stream").good.shows("ok", "fallback", "")
    assert not cat.get("legacy-stream").good.shows("ok", "batch", "")
    build = cat.get("vllm-cuda13-build")
    assert not build.needs.gpu
    assert build.needs.build_only_without_gpu
    assert build.bad.shows("build-error", None, "error: too many arguments to function")
    assert not build.bad.shows("build-error", None, "some other compiler error")


def test_unknown_bug_id_suggests_the_closest() -> None:
    with pytest.raises(UsageError, match="did you mean 'legacy-stream'"):
        repro.load_catalog().get("legacy-steam")


def test_catalog_problems_are_all_reported() -> None:
    raw = _raw()
    raw["bugs"][0]["bad"]["variant"] = "direct-lnk"
    raw["bugs"][1]["good"]["outcome"] = "crash:SIGSEGV"
    raw["bugs"][2]["bad"]["runtime"] = "11.8"
    raw["bugs"].append(dict(raw["bugs"][3]))
    with pytest.raises(ConfigError) as e:
        repro.load_catalog(json.dumps(raw), source="bugs.json")
    text = str(e.value)
    assert "bugs[0].bad.variant: 'direct-lnk' (did you mean 'direct-link'?)" in text
    assert "the good cell must pass" in text
    assert "no known wheel for CUDA 11.8" in text
    assert "duplicate id 'sglang-header-dispatch'" in text


def test_wrong_schema_and_bad_json() -> None:
    raw = _raw()
    raw["schema"] = 2
    with pytest.raises(ConfigError, match="schema: expected 1, got int 2"):
        repro.load_catalog(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"bugs.json:1:\d+: not JSON"):
        repro.load_catalog("{", source="bugs.json")


def test_family_must_fit_the_runtime_axis() -> None:
    raw = _raw()
    raw["bugs"][2]["bad"]["runtime"] = None  # driver-dispatch is a runtime-family variant
    with pytest.raises(ConfigError, match="runtime-family variant: give a runtime"):
        repro.load_catalog(json.dumps(raw))


def test_standalone_command_round_trips_through_the_shell() -> None:
    spec = json.dumps({"kind": "swap", "library": "/x y/lib.so", "note": "it's"})
    job = Job(cell_id="a/host/b", kind="swap", argv=("python3", "-m", "cumatrix.child.case", spec),
              env=(("PYTHONPATH", "/p q"),), lib_path=("/l1", "/l 2"))
    runner = Orchestrator(matrix=repro.load_catalog().get("legacy-stream").matrix())
    runner._host_fp = {"driver_version": None}  # a fingerprint without a driver: no --gpus for docker
    words = shlex.split(repro.standalone_command(runner, job))
    assert words[0] == "env"
    assert "LD_LIBRARY_PATH=/l1:/l 2" in words
    assert "PYTHONPATH=/p q" in words
    assert words[-4:] == ["python3", "-m", "cumatrix.child.case", spec]


def test_the_standalone_command_of_a_case_with_a_cwd_starts_there(tmp_path: Path) -> None:
    job = Job(cell_id="a/host/c", kind="command", argv=("cat", "notes.txt"), cwd=str(tmp_path / "d i r"))
    runner = Orchestrator(matrix=repro.load_catalog().get("legacy-stream").matrix())
    runner._host_fp = {"driver_version": None}
    words = shlex.split(repro.standalone_command(runner, job))
    assert words[:3] == ["env", "-C", str(tmp_path / "d i r")]
    runner.backend = "docker"
    words = shlex.split(repro.standalone_command(runner, job))
    assert words[words.index("-w") + 1] == str(tmp_path / "d i r")
    assert f"{tmp_path / 'd i r'}:{tmp_path / 'd i r'}:ro" in words


def test_maps_block_is_parsed() -> None:
    text = "noise\nCUMATRIX-MAPS-BEGIN\n7f00-7f01 r-xp 0 0:0 1 /a/libcudart.so.12\nCUMATRIX-MAPS-END\nFatal Python error"
    assert repro.parse_maps(text) == ("7f00-7f01 r-xp 0 0:0 1 /a/libcudart.so.12",)
    assert repro.parse_maps("no block") == ()


def test_catalog_problems_point_at_their_line_and_column() -> None:
    raw = _raw()
    raw["bugs"][4]["good"]["workload"] = "kv-16k-legacyy"
    raw["bugs"][1]["refs"][0]["kind"] = "pull"
    text = json.dumps(raw, indent=2)
    lines = text.splitlines()
    with pytest.raises(ConfigError) as e:
        catalog.load_catalog(text, source="bugs.json")
    places = {p.message.split(":")[0]: (p.line, p.col) for p in e.value.problems}
    wl_line = next(i for i, ln in enumerate(lines, 1) if '"kv-16k-legacyy"' in ln)
    kind_line = next(i for i, ln in enumerate(lines, 1) if '"pull"' in ln)
    assert places["bugs[4].good.workload"] == (wl_line, lines[wl_line - 1].index('"kv-16k-legacyy"') + 1)
    assert places["bugs[1].refs[0].kind"] == (kind_line, lines[kind_line - 1].index('"pull"') + 1)
    assert "unknown workload 'kv-16k-legacyy' (did you mean 'kv-16k-legacy'?)" in str(e.value)


def test_packaged_catalog_follows_its_shipped_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(resources.files("cumatrix").joinpath("data/bugs.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(_raw())


def test_repro_uses_the_catalog_module() -> None:
    assert repro.load_catalog is catalog.load_catalog


_leaf = st.none() | st.booleans() | st.integers(-2, 20000) | st.text(max_size=10) | st.sampled_from(
    ["12.8", "13.0", "11.8", "host", "emulated-12.4", "loop", "ok", "crash:SIGSEGV", "kv-16k-d2h", "PR"])
_any = st.recursive(_leaf, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids,
                                                                                    max_size=3), max_leaves=6)


@settings(max_examples=300, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzzed_catalog_is_a_catalog_or_a_located_error(data: st.DataObject) -> None:
    raw = _raw()
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths(raw)))
        if not path:
            continue
        parent = raw
        for p in path[:-1]:
            parent = parent[p]
        if data.draw(st.booleans()):
            parent[path[-1]] = data.draw(_any)
        else:
            del parent[path[-1]]
    text = json.dumps(raw, indent=data.draw(st.sampled_from([None, 1, 2])))
    try:
        catalog.load_catalog(text, source="bugs.json")
    except ConfigError as e:
        _check_refusal(e)


def _check_refusal(e: ConfigError) -> None:
    """A refusal names at least one problem, each placed in the file."""
    assert e.problems, str(e)
    assert all(p.line >= 1 and p.col >= 1 and p.file == "bugs.json" for p in e.problems), str(e)


HOSTILE_SCALARS = [None, True, 0, -1, 7, 12, 13.0, 100.5, 1e308, "", "\0", "a\n", "12", "99.0", [], {}, ["ok"]]


def test_every_value_replaced_by_every_hostile_scalar() -> None:
    """Exhaustive over two entries: each value swapped for each hostile value."""
    base = _raw()
    base["bugs"] = base["bugs"][:2]
    for path in paths(base)[1:]:
        for value in HOSTILE_SCALARS:
            raw = json.loads(json.dumps(base))
            parent = raw
            for p in path[:-1]:
                parent = parent[p]
            parent[path[-1]] = value
            try:
                catalog.load_catalog(json.dumps(raw), source="bugs.json")
            except ConfigError as e:
                _check_placed(e, (path, value))


def _check_placed(e: ConfigError, what: tuple[object, ...]) -> None:
    assert e.problems, (*what, str(e))
    assert all(p.line >= 1 for p in e.problems), (*what, str(e))

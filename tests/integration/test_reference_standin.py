"""Drive the driver-family reference swap and the swap cell through a STAND-IN libcuda.so.1.

There is no NVIDIA driver on the machines these tests run on, so ``standin_libcuda.c``
(next to this file) stands in for ``libcuda.so.1``: host memcpy for every copy, fake
streams and events.  These tests prove the C logic (entry points from cuGetProcAddress,
the 12080 version gate, fallback, the legacy-stream guard, argument checks, chunking,
error reporting) and the cell's byte check; they prove nothing about CUDA's behaviour.
That is ``tests/gpu/test_reference_gpu.py``'s job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cumatrix
from cumatrix.provision.build import build_variant
from cumatrix.provision.runtimes import headers_for

STANDIN_SRC = Path(__file__).with_name("standin_libcuda.c")
SRC_ROOT = str(Path(cumatrix.__file__).resolve().parents[1])


def _gcc_standin(out_dir: Path, *defines: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-Wall", "-Werror", "-fvisibility=hidden", *defines,
                    "-Wl,-soname,libcuda.so.1", "-o", str(out_dir / "libcuda.so.1"), str(STANDIN_SRC)],
                   check=True, capture_output=True, text=True)
    return out_dir


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _gcc_standin(tmp_path_factory.mktemp("standin"))


@pytest.fixture(scope="module")
def old_standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _gcc_standin(tmp_path_factory.mktemp("standin-old"), "-DSTANDIN_OLD_DRIVER")


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cache = tmp_path_factory.mktemp("builds")
    out = {}
    for h in ("12.8", "13.0"):
        for variant in ("proc-address", "loop", "direct-link"):
            r = build_variant(variant, "driver", headers_for(h), cache=cache)
            if r.ok:
                assert r.library is not None
                out[f"{variant}/h{h}"] = str(r.library)
    return out


# Runs in a child so that LD_LIBRARY_PATH decides which libcuda.so.1 dlopen() finds.
_CHILD = r"""
import ctypes, json, os, sys
job = json.loads(sys.argv[1])
if job["kind"] == "cell":
    from cumatrix.child import swapcell
    print(json.dumps(swapcell.run(job["spec"])))
    sys.exit(0)
standin = ctypes.CDLL("libcudart.so.13" if job.get("runtime") else "libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
standin.standin_count.restype = ctypes.c_ulong
lib = ctypes.CDLL(job["library"])
if job.get("policy") is not None:
    assert lib.kvswap_set_policy(job["policy"]) == 0
if job.get("streams") is not None:
    assert lib.kvswap_set_copy_streams(job["streams"]) == 0
class St(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("failed_index", ctypes.c_long), ("error_name", ctypes.c_char_p),
                ("message", ctypes.c_char * 256)]
if job.get("chunk"):
    lib.kvswap_set_chunk_limit(ctypes.c_size_t(job["chunk"]))
n, size = job["n"], job["size"]
srcb = [ctypes.create_string_buffer(os.urandom(size), size) for _ in range(max(n, 1))]
dstb = [ctypes.create_string_buffer(size) for _ in range(max(n, 1))]
src = (ctypes.c_void_p * max(n, 1))(*[ctypes.addressof(b) for b in srcb])
dst = (ctypes.c_void_p * max(n, 1))(*[ctypes.addressof(b) for b in dstb])
sizes = (ctypes.c_size_t * max(n, 1))(*([size] * max(n, 1)))
if job.get("null_src_at") is not None:
    src[job["null_src_at"]] = None
if job.get("zero_size_at") is not None:
    sizes[job["zero_size_at"]] = 0
path, st = ctypes.c_int(-1), St()
lib.kvswap_swap_blocks.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_size_t, ctypes.c_void_p,
                                   ctypes.POINTER(ctypes.c_int), ctypes.POINTER(St)]
rc = lib.kvswap_swap_blocks(None if job.get("null_array") else src, dst, sizes, n, job["stream"],
                            ctypes.byref(path), ctypes.byref(st))
extra = {}
if job.get("recreate"):
    # The context is destroyed and a new one made at the same address: its streams must be made again.
    extra["streams_made_first"] = standin.standin_count(3)
    lib.kvswap_swap_blocks(src, dst, sizes, n, job["stream"], ctypes.byref(path), ctypes.byref(st))
    extra["streams_made_same"] = standin.standin_count(3)
    standin.standin_new_context()
    rc = lib.kvswap_swap_blocks(src, dst, sizes, n, job["stream"], ctypes.byref(path), ctypes.byref(st))
    extra["streams_made_after"] = standin.standin_count(3)
if not job.get("runtime"):
    extra |= {"streams_made": standin.standin_count(3), "batch_streams": standin.standin_count(4),
              "waits": standin.standin_count(5)}
print(json.dumps(extra | {"rc": rc, "path": path.value, "code": st.code, "failed_index": st.failed_index,
                  "error_name": st.error_name.decode() if st.error_name else None,
                  "message": st.message.decode(),
                  "equal": rc == 0 and all(s.raw == d.raw for s, d in zip(srcb, dstb)),
                  "memcpy_calls": standin.standin_count(0), "batch_calls": standin.standin_count(1),
                  "max_batch": standin.standin_count(2)}))
"""


def child(job: dict[str, object], driver_dir: Path, **env: str) -> dict[str, object]:
    e = {k: v for k, v in os.environ.items() if k != "STANDIN_HIDE_BATCH"}
    e.update(LD_LIBRARY_PATH=str(driver_dir), PYTHONPATH=SRC_ROOT, **env)
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(job)], env=e, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


DEDICATED = 0x1000  # the stand-in's stream handle


@pytest.mark.parametrize("headers", ["12.8", "13.0"])
def test_proc_address_takes_the_batch_path(standin: Path, libs: dict[str, str], headers: str) -> None:
    r = child({"kind": "swap", "library": libs[f"proc-address/h{headers}"], "n": 64, "size": 4096,
               "stream": DEDICATED}, standin)
    assert (r["rc"], r["path"], r["equal"]) == (0, 1, True)
    # The copy-engine path issues calls of 32 descriptors (the driver's host time per descriptor
    # grows with the call's size): 64 blocks, 2 calls.
    assert (r["batch_calls"], r["memcpy_calls"]) == (2, 0)


@pytest.mark.parametrize(("chunk", "calls"), [("1", 64), ("48", 2), ("64", 1), ("4096", 1)])
def test_copy_engine_calls_follow_kvswap_ce_chunk(standin: Path, libs: dict[str, str], chunk: str,
                                                   calls: int) -> None:
    r = child({"kind": "swap", "library": libs["proc-address/h13.0"], "n": 64, "size": 4096,
               "stream": DEDICATED}, standin, KVSWAP_CE_CHUNK=chunk)
    assert (r["rc"], r["path"], r["equal"]) == (0, 1, True)
    assert (r["batch_calls"], r["memcpy_calls"]) == (calls, 0)


def test_hidden_batch_entry_falls_back(standin: Path, libs: dict[str, str]) -> None:
    r = child({"kind": "swap", "library": libs["proc-address/h12.8"], "n": 64, "size": 4096,
               "stream": DEDICATED}, standin, STANDIN_HIDE_BATCH="1")
    assert (r["rc"], r["path"], r["equal"]) == (0, 2, True)
    assert (r["batch_calls"], r["memcpy_calls"]) == (0, 64)


@pytest.mark.parametrize("stream", [None, 1])
def test_legacy_stream_falls_back(standin: Path, libs: dict[str, str], stream: int | None) -> None:
    r = child({"kind": "swap", "library": libs["proc-address/h12.8"], "n": 16, "size": 512, "stream": stream},
              standin)
    assert (r["rc"], r["path"], r["equal"], r["batch_calls"]) == (0, 2, True, 0)


def test_direct_link_on_legacy_stream_is_invalid_value_at_0(standin: Path, libs: dict[str, str]) -> None:
    r = child({"kind": "swap", "library": libs["direct-link/h12.8"], "n": 16, "size": 512, "stream": None},
              standin)
    assert (r["rc"], r["failed_index"], r["error_name"]) == (1, 0, "CUDA_ERROR_INVALID_VALUE")


@pytest.mark.parametrize(("job", "index", "words"), [
    ({"n": 0}, -1, "n is 0"),
    ({"n": 4, "null_array": True}, -1, "src array is NULL"),
    ({"n": 4, "null_src_at": 2}, 2, "block 2: source pointer is NULL"),
    ({"n": 4, "zero_size_at": 3}, 3, "block 3: size is 0"),
])
def test_bad_arguments_are_errors_not_crashes(standin: Path, libs: dict[str, str], job: dict[str, object],
                                              index: int, words: str) -> None:
    for name in ("proc-address/h12.8", "loop/h12.8", "direct-link/h12.8"):
        r = child({"kind": "swap", "library": libs[name], "size": 64, "stream": DEDICATED, **job}, standin)
        assert (r["rc"], r["code"], r["failed_index"], r["path"]) == (-1, -1, index, 0), name
        assert words in str(r["message"])
        assert r["error_name"] == "KVSWAP_E_INVALID_ARGUMENT"
        assert (r["batch_calls"], r["memcpy_calls"]) == (0, 0)


def test_large_batches_are_chunked(standin: Path, libs: dict[str, str]) -> None:
    r = child({"kind": "swap", "library": libs["proc-address/h12.8"], "n": 50, "size": 256, "stream": DEDICATED,
               "chunk": 7}, standin)
    assert (r["rc"], r["path"], r["equal"]) == (0, 1, True)
    assert (r["batch_calls"], r["max_batch"]) == (8, 7)


def test_old_driver(old_standin: Path, libs: dict[str, str]) -> None:
    # vLLM PR 38460: a direct link fails at load on a driver without the symbol; PR 38919 falls back.
    r = child({"kind": "swap", "library": libs["proc-address/h12.8"], "n": 32, "size": 1024, "stream": DEDICATED},
              old_standin)
    assert (r["rc"], r["path"], r["equal"]) == (0, 2, True)
    spec = {"family": "driver", "variant": "direct-link", "library": libs["direct-link/h12.8"],
            "baseline": libs["loop/h12.8"], "direction": "d2h", "block_bytes": 1024, "blocks": 8, "layers": 1,
            "stream": "dedicated", "repetitions": 20, "warmup": 1}
    v = child({"kind": "cell", "spec": spec}, old_standin)
    assert v["outcome"] == "undefined-symbol:cuMemcpyBatchAsync"


@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
@pytest.mark.parametrize(("variant", "stream", "outcome", "path"), [
    ("proc-address", "dedicated", "ok", "batch"),
    ("proc-address", "per-thread", "ok", "batch"),
    ("proc-address", "legacy", "ok", "fallback"),
    ("loop", "dedicated", "ok", "fallback"),
    ("direct-link", "dedicated", "ok", "batch"),
    ("direct-link", "legacy", "cuda-error:1", "batch"),
])
def test_swap_cell_verdicts(standin: Path, libs: dict[str, str], direction: str, variant: str, stream: str,
                            outcome: str, path: str) -> None:
    spec = {"family": "driver", "variant": variant, "library": libs[f"{variant}/h12.8"],
            "baseline": libs["loop/h12.8"], "direction": direction, "block_bytes": 4096, "blocks": 32,
            "layers": 2, "stream": stream, "repetitions": 20, "warmup": 1, "seed": 7}
    v = child({"kind": "cell", "spec": spec}, standin)
    assert (v["outcome"], v["path"]) == (outcome, path), v["detail"]
    assert set(v) == {"outcome", "path", "error_name", "detail", "timings", "data"}
    if outcome == "ok":
        assert v["data"]["verified_bytes"] == 4096 * 32 * 2  # type: ignore[index]
        t = v["timings"]
        assert isinstance(t, dict)
        assert t["repetitions"] == 20
        assert t["bytes"] == 4096 * 64
        assert t["gbps"] > 0
        assert t["loop_gbps"] > 0
        assert set(t["spread"]["variant_ms"]) >= {"min", "p10", "p90", "max"}
    else:
        assert v["error_name"] == "CUDA_ERROR_INVALID_VALUE"
        assert "block 0" in str(v["detail"])


def test_swap_cell_without_a_driver(tmp_path: Path) -> None:
    spec = {"family": "driver", "variant": "proc-address", "library": "x", "baseline": "x", "direction": "d2h",
            "block_bytes": 16, "blocks": 2, "stream": "dedicated"}
    v = child({"kind": "cell", "spec": spec}, tmp_path)  # no libcuda.so.1 anywhere on this machine
    if "skipped" not in str(v["outcome"]):
        pytest.skip("this machine has a real libcuda.so.1")
    assert v["outcome"] == "skipped:no-cuda-driver"


POLICY = {"fastest": 0, "copy-engine-only": 1, "kernel": 2, "batch": 3, "loop": 4, "beside-compute": 5}


def test_copy_engine_fanout_every_byte(standin: Path, libs: dict[str, str]) -> None:
    # 50 descriptors over 4 streams (13, 13, 12, 12), each part chunked at 7: 8 batch calls on 4
    # distinct streams, each stream joined after the caller's start event and back into it.
    r = child({"kind": "swap", "library": libs["proc-address/h12.8"], "n": 50, "size": 256, "stream": DEDICATED,
               "chunk": 7, "policy": POLICY["copy-engine-only"], "streams": 4}, standin)
    assert (r["rc"], r["path"], r["equal"]) == (0, 1, True), r
    assert (r["batch_calls"], r["max_batch"], r["batch_streams"], r["memcpy_calls"]) == (8, 7, 4, 0), r
    assert r["waits"] == 8  # 4 streams wait for the caller's start, the caller waits for each
    assert r["streams_made"] == 9  # 8 copy-engine streams and 1 priority stream, once per context


@pytest.mark.parametrize("policy", list(POLICY))
def test_every_policy_copies_every_byte(standin: Path, libs: dict[str, str], policy: str) -> None:
    # No kernel can load on the stand-in: each policy ends on the copy engines (loop: per block),
    # and every byte arrives.
    r = child({"kind": "swap", "library": libs["proc-address/h13.0"], "n": 33, "size": 4096 + 16,
               "stream": DEDICATED, "policy": POLICY[policy], "streams": 3}, standin)
    want = 2 if policy == "loop" else 1
    assert (r["rc"], r["path"], r["equal"]) == (0, want, True), r
    if policy not in {"loop", "batch"}:
        assert r["batch_streams"] == 3, r  # the fan-out (batch forces the caller's stream alone)


def test_fanout_keeps_the_legacy_stream_on_the_per_block_path(standin: Path, libs: dict[str, str]) -> None:
    r = child({"kind": "swap", "library": libs["proc-address/h12.8"], "n": 16, "size": 512, "stream": None,
               "policy": POLICY["copy-engine-only"], "streams": 4}, standin)
    assert (r["rc"], r["path"], r["equal"], r["batch_calls"]) == (0, 2, True, 0), r


def test_a_new_context_at_the_same_address_gets_new_streams(standin: Path, libs: dict[str, str]) -> None:
    # The per-context cache is keyed by cuCtxGetId, not the context's address alone: streams made
    # for a destroyed context are not reused by the next one the driver puts at the same address.
    r = child({"kind": "swap", "library": libs["proc-address/h12.8"], "n": 8, "size": 256, "stream": DEDICATED,
               "policy": POLICY["copy-engine-only"], "streams": 2, "recreate": True}, standin)
    assert r["rc"] == 0, r
    assert r["equal"], r
    assert (r["streams_made_first"], r["streams_made_same"], r["streams_made_after"]) == (9, 9, 18), r


@pytest.fixture(scope="module")
def cudart_standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cudart-standin")
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-Wall", "-Werror", "-fvisibility=hidden",
                    "-Wl,-soname,libcudart.so.13", "-o", str(out / "libcudart.so.13"),
                    str(Path(__file__).parents[1] / "stand_ins" / "libcudart_stand_in.c")],
                   check=True, capture_output=True, text=True)
    return out


def test_runtime_batch_refused_part_way_copies_the_rest_once(cudart_standin: Path,
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    # kv_rt_loop takes (first, count) as kv_drv_loop does: the first chunk of 7 goes batched, the
    # runtime then says cudaErrorNotSupported, and the other 43 blocks go one copy each, once.
    built = build_variant("runtime-dispatch", "runtime", headers_for("13.0"), cache=tmp_path_factory.mktemp("b"))
    assert built.ok, built.log
    assert built.library is not None, built.log
    r = child({"kind": "swap", "runtime": True, "library": str(built.library), "n": 50, "size": 300,
               "stream": DEDICATED, "chunk": 7}, cudart_standin, STANDIN_BATCH_OK="1")
    assert (r["rc"], r["path"], r["equal"]) == (0, 2, True), r
    assert (r["batch_calls"], r["memcpy_calls"]) == (1, 43), r

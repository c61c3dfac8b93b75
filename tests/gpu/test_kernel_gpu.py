"""The copy-kernel path of proc-address on a real GPU: every byte, stream order, path choice.

Each case runs in its own child (the kernel is compiled once per process, and a fault in it
must not take the test run down).  The source of each swap is written on the same stream
immediately before the swap (cuMemsetD8Async, or a device->host copy for h2d), so a kernel
that did not wait for it would read stale bytes.  Needs a GPU and NVRTC (libnvrtc.so.13/.12
on the library path, or KVSWAP_NVRTC); skipped with the reason otherwise
(``CUMATRIX_REQUIRE_GPU=1`` turns the skip into a failure).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import cumatrix
from cumatrix.provision.build import build_variant
from cumatrix.provision.runtimes import headers_for
from helpers.gpu import gpu_reason

pytestmark = pytest.mark.gpu
SRC_ROOT = str(Path(cumatrix.__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def library() -> str:
    reason = gpu_reason()
    if reason:
        if os.environ.get("CUMATRIX_REQUIRE_GPU") == "1":
            pytest.fail(f"CUMATRIX_REQUIRE_GPU=1 but {reason}")
        pytest.skip(reason)
    built = build_variant("proc-address", "driver", headers_for("13.0"))
    assert built.ok, built.log
    assert built.library, built.log
    return str(built.library)


# The child: a driver context (as a driver-family cell makes one), scattered blocks, the source
# rewritten on the stream right before the swap, then every destination byte compared.
_CHILD = r'''
import ctypes, json, os, random, sys
from cumatrix.child import swapcell
spec = json.loads(sys.argv[1])
api = swapcell._Driver()
lib = api.lib
lib.cuMemsetD8Async.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p]
lib.cuMemcpyAsync.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
swap = swapcell._Swap(spec["library"])
swap.set_policy(spec["policy"])
if spec.get("streams") is not None:
    swap.set_copy_streams(spec["streams"])
if spec.get("budget") is not None:
    swap.set_sm_budget(spec["budget"])
if spec.get("beside_host") is not None:
    swap.set_beside_compute_host_path(spec["beside_host"])
d = spec["direction"]
sizes_l, offsets = spec["sizes"], spec["offsets"]
n = len(sizes_l)
total = max(o + s for o, s in zip(offsets, sizes_l)) + 64 + 32 * n
rng = random.Random(7)
payload = rng.randbytes(total)
pageable = spec.get("pageable_host", False)
keep = []
def host(size):
    if pageable:
        buf = ctypes.create_string_buffer(size); keep.append(buf); return ctypes.addressof(buf)
    return api.alloc_host(size)
src = api.alloc_device(total) if d in ("d2h", "d2d") else host(total)
dst = api.alloc_device(total) if d in ("h2d", "d2d") else host(total)
if d in ("d2h", "d2d"):
    api.upload(src, payload)
else:
    ctypes.memmove(src, payload, total)
api.zero(dst, total, host=d == "d2h")
stream = api.stream("dedicated")
api.sync()
# Stream order: the first half of the source becomes 0xC3 on the stream, immediately before the swap.
half = total // 2
if d == "h2d":
    scratch = api.alloc_device(half)
    lib.cuMemsetD8Async(scratch, 0xC3, half, stream)
    lib.cuMemcpyAsync(src, scratch, half, stream)
else:
    lib.cuMemsetD8Async(src, 0xC3, half, stream)
expect_src = b"\xc3" * half + payload[half:]
perm = list(range(n)); rng.shuffle(perm)
dst_off = []
pos = 0
for i in range(n):
    dst_off.append(None)
order = sorted(range(n), key=lambda i: perm[i])
for i in order:
    pos = (pos + 15) // 16 * 16 + (offsets[i] % 16)
    dst_off[i] = pos
    pos += sizes_l[i]
assert pos <= total, "layout"
S = (ctypes.c_void_p * n)(*[src + offsets[i] for i in range(n)])
D = (ctypes.c_void_p * n)(*[dst + dst_off[i] for i in range(n)])
Z = (ctypes.c_size_t * n)(*sizes_l)
if spec.get("explicit_direction"):
    fn = swap.lib.kvswap_swap_blocks_dir
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int,
                   ctypes.POINTER(ctypes.c_int), ctypes.POINTER(swapcell.KvStatus)]
    rc = fn(S, D, Z, n, stream, {"d2h": 1, "h2d": 2, "d2d": 3}[d], ctypes.byref(swap.path), ctypes.byref(swap.status))
else:
    rc = swap((S, D, Z, n), stream)
if rc != 0:
    f = swap.failure()
    print(json.dumps({"rc": rc, "detail": f.detail, "kernel_info": swap.kernel_info()})); sys.exit(0)
api.sync()
got = bytes(api.download(dst, total)) if d in ("h2d", "d2d") else ctypes.string_at(dst, total)
bad = [i for i in range(n) if got[dst_off[i]:dst_off[i] + sizes_l[i]] != expect_src[offsets[i]:offsets[i] + sizes_l[i]]]
print(json.dumps({"rc": 0, "path": swapcell._PATHS[swap.path.value], "bad": bad[:5], "nbad": len(bad),
                  "bytes": sum(sizes_l), "kernel_info": swap.kernel_info()}))
'''


def uniform(block: int, blocks: int) -> tuple[list[int], list[int]]:
    return [block] * blocks, [i * block for i in range(blocks)]


def ragged() -> tuple[list[int], list[int]]:
    """Sizes and source offsets that hit the 16-byte, 8-byte and byte paths and a split block."""
    sizes = [16384, 4096, 24, 8, 1, 4097, 65536 + 8, 3 << 20, 333, 16, 2048 + 3, 7, 40960]
    offsets, pos = [], 0
    for i, s in enumerate(sizes):
        pos = (pos + 15) // 16 * 16 + (0 if i % 3 == 0 else 8 if i % 3 == 1 else 5)
        offsets.append(pos)
        pos += s
    return sizes, offsets


def child_json(source: str, *argv: str, env: dict[str, str] | None = None, timeout: float = 300) -> Any:
    """Run ``source`` in a child Python (a fault there must not take the test run down); the
    JSON of its last line of output."""
    proc = subprocess.run([sys.executable, "-c", source, *argv], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=SRC_ROOT, **(env or {})), check=False)
    assert proc.returncode == 0, f"child exit {proc.returncode}: {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_child(library: str, env: dict[str, str] | None = None, **spec: object) -> dict[str, object]:
    result: dict[str, object] = child_json(_CHILD, json.dumps(dict(spec, library=library)), env=env)
    return result


def _kernel_or_skip(result: dict[str, object]) -> None:
    if result["rc"] != 0 and "no NVRTC" in str(result.get("kernel_info")):
        if os.environ.get("CUMATRIX_REQUIRE_GPU") == "1":
            pytest.fail(f"no NVRTC on a GPU host: {result}")
        pytest.skip(f"kernel path unavailable: {result['kernel_info']}")


# Up to 2040 blocks of one size travel in the kernel's parameters; more blocks, or blocks of
# several sizes, are uploaded to device memory first: both routes, every byte.
LAYOUTS = {"16k-x1024": uniform(16384, 1024), "4k-x1024": uniform(4096, 1024), "2m-x8": uniform(2 << 20, 8),
           "4k-x2040": uniform(4096, 2040), "4k-x2041": uniform(4096, 2041), "ragged": ragged()}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
def test_kernel_path_every_byte(library: str, direction: str, layout: str) -> None:
    sizes, offsets = LAYOUTS[layout]
    r = run_child(library, direction=direction, policy="kernel", sizes=sizes, offsets=offsets)
    _kernel_or_skip(r)
    assert r["rc"] == 0, r
    assert r["path"] == "kernel", r
    assert r["nbad"] == 0, f"{r['nbad']} of {len(sizes)} blocks wrong, first {r['bad']}"
    assert str(r["kernel_info"]).startswith("cubin sm_"), r["kernel_info"]


_STAGED_CHILD = r'''
import ctypes, json, random, sys
from cumatrix.child import swapcell
api = swapcell._Driver()
lib = api.lib
lib.cuMemsetD8Async.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p]
swap = swapcell._Swap(sys.argv[1])
swap.set_policy("kernel")
n, block, rounds = 8192, 4096, 7
src = api.alloc_device(n * block)
api.upload(src, random.Random(3).randbytes(n * block))
dsts = [api.alloc_device(n * block) for _ in range(rounds)]
busy = api.alloc_device(1 << 31)
stream = api.stream("dedicated")
api.sync()
# The GPU is kept busy first, so every call below is enqueued while the earlier ones still wait:
# the pinned descriptor buffers are all in flight and later calls must not overwrite them.
lib.cuMemsetD8Async(busy, 1, 1 << 31, stream)
lib.cuMemsetD8Async(busy, 2, 1 << 31, stream)
perms = []
for r in range(rounds):
    perm = list(range(n)); random.Random(100 + r).shuffle(perm); perms.append(perm)
    S = (ctypes.c_void_p * n)(*[src + i * block for i in range(n)])
    D = (ctypes.c_void_p * n)(*[dsts[r] + perm[i] * block for i in range(n)])
    Z = (ctypes.c_size_t * n)(*([block] * n))
    rc = swap((S, D, Z, n), stream)
    if rc != 0:
        print(json.dumps({"rc": rc, "detail": swap.failure().detail})); sys.exit(0)
api.sync()
want = bytes(api.download(src, n * block))
bad = []
for r in range(rounds):
    got = bytes(api.download(dsts[r], n * block))
    bad += [(r, i) for i in range(n) if got[perms[r][i] * block:(perms[r][i] + 1) * block] != want[i * block:(i + 1) * block]]
print(json.dumps({"rc": 0, "path": swapcell._PATHS[swap.path.value], "nbad": len(bad), "bad": bad[:5]}))
'''


def test_staged_descriptors_back_to_back(library: str) -> None:
    # Seven calls of 8192 blocks enqueued while the GPU is still busy: the four pinned descriptor
    # buffers are all in flight, so later calls take a free one or upload from pageable memory;
    # none may overwrite descriptors a queued upload has not read yet.
    r = child_json(_STAGED_CHILD, library)
    _kernel_or_skip(r)
    assert (r["rc"], r["path"], r["nbad"]) == (0, "kernel", 0), r


def test_descriptors_in_parameters_where_driver_and_nvrtc_allow(library: str) -> None:
    # Parameters over 4 KiB need a 12.1+ driver and NVRTC: there the kernel is built with the
    # descriptors-in-parameters entry, and a call of 1024 uniform blocks takes it (every byte).
    r = run_child(library, direction="h2d", policy="kernel", sizes=uniform(4096, 1024)[0],
                  offsets=uniform(4096, 1024)[1])
    _kernel_or_skip(r)
    assert (r["rc"], r["path"], r["nbad"]) == (0, "kernel", 0), r
    info = str(r["kernel_info"])
    m = re.search(r"NVRTC (\d+)\.(\d+)", info)
    assert m, info
    drv = ctypes.c_int()
    ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(drv))
    if (int(m.group(1)), int(m.group(2))) >= (12, 1) and drv.value >= 12010:
        assert "in the kernel's parameters" in info, info
    else:
        assert "parameters" not in info, info


@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
def test_explicit_direction(library: str, direction: str) -> None:
    sizes, offsets = uniform(16384, 256)
    r = run_child(library, direction=direction, policy="kernel", sizes=sizes, offsets=offsets,
                  explicit_direction=True)
    _kernel_or_skip(r)
    assert (r["rc"], r["path"], r["nbad"]) == (0, "kernel", 0), r


@pytest.mark.parametrize("direction", ["d2h", "h2d"])
def test_copy_engine_only_never_launches(library: str, direction: str) -> None:
    sizes, offsets = uniform(16384, 1024)
    r = run_child(library, direction=direction, policy="copy-engine-only", sizes=sizes, offsets=offsets)
    assert (r["rc"], r["path"], r["nbad"]) == (0, "batch", 0), r


POLICY_RUNS = {
    # policy, knobs, the path it must take for (d2h/h2d, d2d)
    "copy-engine-only x2": ("copy-engine-only", {"streams": 2}, ("batch", "batch")),
    "copy-engine-only x8": ("copy-engine-only", {"streams": 8}, ("batch", "batch")),
    "beside-compute ce": ("beside-compute", {"budget": 2, "beside_host": "batch"}, ("batch", "kernel")),
    "beside-compute kernel": ("beside-compute", {"budget": 2, "beside_host": "kernel"}, ("kernel", "kernel")),
    "fastest": ("fastest", {}, (None, "kernel")),
    "batch": ("batch", {}, ("batch", "batch")),
    "loop": ("loop", {}, ("fallback", "fallback")),
}


@pytest.mark.parametrize("layout", ["16k-x1024", "ragged"])
@pytest.mark.parametrize("run", list(POLICY_RUNS))
@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
def test_every_policy_every_byte(library: str, direction: str, run: str, layout: str) -> None:
    # Each policy and its knobs (copy-engine fan-out over 2 and 8 streams, the budgeted kernel on
    # 2 CTAs): every byte, in stream order after the source was rewritten on the caller's stream.
    policy, knobs, paths = POLICY_RUNS[run]
    sizes, offsets = LAYOUTS[layout]
    r = run_child(library, direction=direction, policy=policy, sizes=sizes, offsets=offsets, **knobs)
    _kernel_or_skip(r)
    assert r["rc"] == 0, r
    want = paths[1] if direction == "d2d" else paths[0]
    assert want is None or r["path"] == want, r
    assert r["nbad"] == 0, f"{r['nbad']} of {len(sizes)} blocks wrong, first {r['bad']}"


_RECREATE_CHILD = r'''
import ctypes, json, os, sys
from cumatrix.child import cudaapi
lib = ctypes.CDLL("libcuda.so.1")
assert lib.cuInit(0) == 0
swap = cudaapi.KvSwapLibrary(sys.argv[1])
swap.set_policy("kernel")
dev = ctypes.c_int()
lib.cuDeviceGet(ctypes.byref(dev), 0)
lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
lib.cuCtxDestroy_v2.argtypes = [ctypes.c_void_p]
out = []
for round_ in range(3):
    ctx = ctypes.c_void_p()
    assert lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
    n, block = 64, 4096
    src, dst = ctypes.c_uint64(), ctypes.c_uint64()
    lib.cuMemAlloc_v2(ctypes.byref(src), n * block)
    lib.cuMemAlloc_v2(ctypes.byref(dst), n * block)
    payload = os.urandom(n * block)
    lib.cuMemcpyHtoD_v2(src, payload, n * block)
    S = (ctypes.c_void_p * n)(*[src.value + i * block for i in range(n)])
    D = (ctypes.c_void_p * n)(*[dst.value + (n - 1 - i) * block for i in range(n)])
    Z = (ctypes.c_size_t * n)(*([block] * n))
    stream = ctypes.c_void_p()
    lib.cuStreamCreate(ctypes.byref(stream), 0)
    rc = swap((S, D, Z, n), stream.value)
    lib.cuCtxSynchronize()
    got = ctypes.create_string_buffer(n * block)
    lib.cuMemcpyDtoH_v2(got, dst, n * block)
    ok = all(got.raw[(n - 1 - i) * block:(n - i) * block] == payload[i * block:(i + 1) * block] for i in range(n))
    out.append({"ctx": ctx.value, "rc": rc, "path": cudaapi.PATHS[swap.path.value], "ok": ok,
                "detail": swap.status.message.decode(), "info": swap.kernel_info()})
    lib.cuCtxDestroy_v2(ctx)
print(json.dumps(out))
'''


def test_kernel_survives_a_context_destroyed_and_recreated(library: str) -> None:
    # The per-context module and pool die with their context; a new context (the driver often hands
    # out the same address again) must get its own, not the dead one's (cached by address alone,
    # this failed with an invalid-handle error or wrong bytes).
    rounds = child_json(_RECREATE_CHILD, library, timeout=120)
    print(rounds)
    if "no NVRTC" in str(rounds[0]["info"]):
        pytest.skip(f"kernel path unavailable: {rounds[0]['info']}")
    assert [(r["rc"], r["path"], r["ok"]) for r in rounds] == [(0, "kernel", True)] * 3, rounds


def test_pageable_host_memory_stays_on_copy_engines(library: str) -> None:
    # Pageable memory is not mapped for the device: the direction is unknown and the kernel
    # must not touch it, even when forced.
    sizes, offsets = uniform(16384, 64)
    r = run_child(library, direction="d2h", policy="kernel", sizes=sizes, offsets=offsets, pageable_host=True)
    assert r["rc"] == 0, r
    assert r["path"] in ("batch", "fallback"), r
    assert r["nbad"] == 0, r


def test_fastest_builtin_takes_the_kernel_for_small_blocks(library: str) -> None:
    sizes, offsets = uniform(16384, 1024)
    r = run_child(library, direction="d2d", policy="fastest", sizes=sizes, offsets=offsets)
    _kernel_or_skip(r)
    assert (r["rc"], r["path"], r["nbad"]) == (0, "kernel", 0), r


def test_ptx_image_through_the_driver_jit(library: str) -> None:
    # The JIT path the matrix uses to meet an older driver: same bytes, image "ptx compute_XY".
    sizes, offsets = ragged()
    r = run_child(library, env={"KVSWAP_KERNEL_IMAGE": "ptx"}, direction="d2d", policy="kernel", sizes=sizes,
                  offsets=offsets)
    _kernel_or_skip(r)
    assert (r["rc"], r["path"], r["nbad"]) == (0, "kernel", 0), r
    assert str(r["kernel_info"]).startswith("ptx compute_"), r["kernel_info"]


_PTX_CHILD = r'''
import ctypes, json, os, re
from cumatrix.child import swapcell
api = swapcell._Driver()
nv = ctypes.CDLL(os.environ.get("KVSWAP_NVRTC") or "libnvrtc.so.13")
cc = [ctypes.c_int(), ctypes.c_int()]
api.lib.cuDeviceGetAttribute(ctypes.byref(cc[0]), 75, api.dev)
api.lib.cuDeviceGetAttribute(ctypes.byref(cc[1]), 76, api.dev)
prog = ctypes.c_void_p()
nv.nvrtcCreateProgram(ctypes.byref(prog), b'extern "C" __global__ void k(int *p) { *p = 1; }', b"k.cu", 0, None, None)
opts = (ctypes.c_char_p * 1)(f"--gpu-architecture=compute_{cc[0].value}{cc[1].value}".encode())
assert nv.nvrtcCompileProgram(prog, 1, opts) == 0
size = ctypes.c_size_t()
nv.nvrtcGetPTXSize(prog, ctypes.byref(size))
buf = ctypes.create_string_buffer(size.value)
nv.nvrtcGetPTX(prog, buf)
ptx = buf.value
mod = ctypes.c_void_p()
same = api.lib.cuModuleLoadData(ctypes.byref(mod), ptx)
newer_ptx = re.sub(rb"\.version \d+\.\d+", b".version 99.9", ptx)
newer = api.lib.cuModuleLoadData(ctypes.byref(mod), newer_ptx)
print(json.dumps({"version": re.search(rb"\.version (\S+)", ptx).group(1).decode(), "same": same, "newer": newer,
                  "newer_name": api.error_name(newer)}))
'''


def test_ptx_newer_than_the_driver_is_222(library: str) -> None:
    # What a runtime-compiled kernel meets on an older driver, reproduced by raising the PTX ISA
    # version: the driver's JIT refuses it with CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222).
    try:
        ctypes.CDLL(os.environ.get("KVSWAP_NVRTC") or "libnvrtc.so.13")
    except OSError as e:
        pytest.skip(f"no NVRTC: {e}")
    r = child_json(_PTX_CHILD, timeout=120)
    print(r)
    assert r["same"] == 0, r
    assert (r["newer"], r["newer_name"]) == (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"), r

"""Benchmark: static audit of a large wheel (targets: under 10 s, under 500 MB peak memory).

Builds a wheel of at least 300 MB from real gcc-built ELF files (two of them carrying
120 MB of random bytes in .rodata, pulled in with ``.incbin``, with a ``dlsym`` name placed
after the padding) plus an incompressible data file and a few dozen small extensions;
members are stored and deflated.  Then a fresh child process imports cumatrix, audits the
wheel and reports its wall time and peak resident memory (``ru_maxrss`` of that child,
which does nothing else).

    python benchmarks/gate_audit.py [--pad-mb 120] [--work DIR] [--wheel-dir DIR]
                                    [--compare-zipfile]

``--wheel-dir`` points at already-downloaded CUDA runtime wheels (the headers the audit
reads); without it they are fetched into the cache first, outside the timed part.
``--compare-zipfile`` also times the naive approach (pyelftools over ``ZipFile.open``
streams) on the same wheel, for comparison, with a 120 s cap.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

TARGET_SECONDS = 10.0
TARGET_MB = 500.0

BIG_SOURCE = r"""
#include <dlfcn.h>
/* {pad} MB of random bytes in .rodata, then a name looked up at run time. */
__asm__(".section .rodata\n.global big_pad\n.type big_pad, @object\n.p2align 4\n"
        "big_pad:\n.incbin \"{padfile}\"\n.size big_pad, .-big_pad\n.previous\n");
extern const unsigned char big_pad[];
static const char name[] = "cudaMemcpyBatchAsync";
const unsigned char *pad_at(int i) {{ return big_pad + i; }}
void *entry(void) {{
    void *h = dlopen("libcudart.so.12", RTLD_NOW);
    return h ? dlsym(h, name) : 0;
}}
"""

SMALL_SOURCE = """
#include <stddef.h>
extern int cuMemcpyBatchAsync(unsigned long long *, unsigned long long *, size_t *, size_t,
                              void *, size_t *, size_t, size_t *, void *);
int swap_{i}(void) {{ return cuMemcpyBatchAsync(0, 0, 0, 0, 0, 0, 0, 0, 0); }}
"""

# Build-time link stub, like the toolkit's stubs/libcuda.so (no driver on a build machine).
STUB_SOURCE = "int cuMemcpyBatchAsync(void) { return 0; }\n"

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from cumatrix.audit import audit_wheel, load_audit_data
from cumatrix.model import CudaVersion
wheel_dir = Path(sys.argv[2]) if sys.argv[2] else None
t0 = time.perf_counter()
data = load_audit_data(wheel_dir=wheel_dir)
t1 = time.perf_counter()
audit = audit_wheel(Path(sys.argv[1]), min_driver=CudaVersion(12, 4), runtimes=(12,),
                    strict=False, optional=(), introductions=data.introductions,
                    abi_changed=data.abi_changes)
t2 = time.perf_counter()
print(json.dumps({
    "headers_s": t1 - t0, "audit_s": t2 - t1, "elves": len(audit.elves),
    "errors": audit.errors, "warnings": audit.warnings,
    "codes": sorted({(f.file, f.code, f.subject) for f in audit.findings}),
    "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
}))
"""

NAIVE_CHILD = r"""
import json, resource, sys, time, zipfile
from elftools.elf.elffile import ELFFile
from cumatrix.elf import elf_needed, elf_strings, elf_undefined_symbols
t0 = time.perf_counter()
n = 0
with zipfile.ZipFile(sys.argv[1]) as zf:
    for info in zf.infolist():
        with zf.open(info) as f:
            if f.read(4) != b"\x7fELF":
                continue
            f.seek(0)
            elf = ELFFile(f)
            list(elf_needed(elf)); list(elf_undefined_symbols(elf)); elf_strings(elf, "cuda")
            n += 1
print(json.dumps({"audit_s": time.perf_counter() - t0, "elves": n,
                  "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def _gcc(cwd: Path, out: str, source: str, *args: str) -> Path:
    src = cwd / (out.replace("/", "_") + ".c")
    src.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", out, src.name, *args],
                   cwd=cwd, check=True, capture_output=True)
    return cwd / out


def build_wheel(work: Path, pad_mb: int) -> Path:
    """The benchmark wheel, built under ``work``."""
    (work / "stubs").mkdir(exist_ok=True)
    _gcc(work, "stubs/libcuda.so", STUB_SOURCE, "-Wl,-soname,libcuda.so.1")
    bigs = []
    for tag in ("stored", "deflated"):
        pad = work / f"pad_{tag}.bin"
        with open(pad, "wb") as f:
            for _ in range(pad_mb):
                f.write(os.urandom(1 << 20))
        bigs.append(_gcc(work, f"_big_{tag}.so",
                         BIG_SOURCE.format(pad=pad_mb, padfile=pad.name), "-ldl"))
        pad.unlink()
    smalls = [_gcc(work, f"_small{i}.so", SMALL_SOURCE.format(i=i), "-Lstubs", "-lcuda")
              for i in range(40)]
    wheel = work / "bigdemo-1.0-cp311-cp311-linux_x86_64.whl"
    info = "bigdemo-1.0.dist-info"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr("bigdemo/__init__.py", "from . import _big_stored\n")
        zf.write(bigs[0], "bigdemo/_big_stored.so", zipfile.ZIP_STORED)
        zf.write(bigs[1], "bigdemo/_big_deflated.so", zipfile.ZIP_DEFLATED, compresslevel=1)
        with zf.open("bigdemo/data/weights.bin", "w") as f:  # deflated, incompressible
            for _ in range(pad_mb // 2):
                f.write(os.urandom(1 << 20))
        for i, so in enumerate(smalls):
            zf.write(so, f"bigdemo/ops/_small{i}.so",
                     zipfile.ZIP_DEFLATED if i % 2 else zipfile.ZIP_STORED)
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: bigdemo\nVersion: 1.0\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: cumatrix-benchmark\n"
                                     "Root-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n")
        zf.writestr(f"{info}/RECORD", "")  # the audit does not read it
    for p in [*bigs, *smalls]:
        p.unlink()
    return wheel


def _child(code: str, *argv: str, timeout: float | None = None) -> dict[str, object]:
    src = str(Path(__file__).resolve().parent.parent / "src")
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                       env=env, timeout=timeout, check=True)
    result: dict[str, object] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pad-mb", type=int, default=120, help="MB of padding per big ELF file")
    ap.add_argument("--work", type=Path, default=None, help="build directory (default: temp)")
    ap.add_argument("--wheel-dir", type=Path, default=None,
                    help="directory of already-downloaded CUDA runtime wheels")
    ap.add_argument("--compare-zipfile", action="store_true",
                    help="also time pyelftools over plain ZipFile.open streams (capped at 120 s)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        t0 = time.perf_counter()
        wheel = build_wheel(Path(tmp), args.pad_mb)
        size_mb = wheel.stat().st_size / 1e6
        print(f"built {wheel.name}: {size_mb:.0f} MB in {time.perf_counter() - t0:.1f} s")
        with zipfile.ZipFile(wheel) as zf:
            for i in zf.infolist():
                if i.file_size > 1 << 20:
                    kind = "stored" if i.compress_type == zipfile.ZIP_STORED else "deflated"
                    print(f"  {i.filename}: {i.file_size / 1e6:.0f} MB, {kind}")
        wd = str(args.wheel_dir or "")
        _child("from cumatrix.audit import load_audit_data; import sys, pathlib; "
               "load_audit_data(wheel_dir=pathlib.Path(sys.argv[1]) if sys.argv[1] else None); "
               "print('{}')",
               wd)  # warm the header cache outside the timed run
        r = _child(CHILD, str(wheel), wd)
        audit_s = float(r["audit_s"])  # type: ignore[arg-type]
        rss_mb = int(r["maxrss_kb"]) / 1024  # type: ignore[call-overload]
        print(f"audit: {r['elves']} ELF files, {r['errors']} errors, {r['warnings']} warnings")
        print(f"  wall time (audit_wheel): {audit_s:.2f} s   target < {TARGET_SECONDS:.0f} s   "
              f"{'ok' if audit_s < TARGET_SECONDS else 'MISSED'}")
        print(f"  header facts (cached):   {float(r['headers_s']):.2f} s")  # type: ignore[arg-type]
        print(f"  peak RSS of the child:   {rss_mb:.0f} MB   target < {TARGET_MB:.0f} MB   "
              f"{'ok' if rss_mb < TARGET_MB else 'MISSED'}")
        codes = {tuple(c) for c in r["codes"]}  # type: ignore[attr-defined]
        expect = {("bigdemo/_big_stored.so", "abi-lookup", "cudaMemcpyBatchAsync"),
                  ("bigdemo/_big_deflated.so", "abi-lookup", "cudaMemcpyBatchAsync"),
                  ("bigdemo/ops/_small0.so", "driver-symbol-too-new", "cuMemcpyBatchAsync")}
        if not expect <= codes:
            print(f"  WRONG FINDINGS: missing {sorted(expect - codes)}")
            return 1
        if args.compare_zipfile:
            try:
                n = _child(NAIVE_CHILD, str(wheel), timeout=120)
                print(f"naive ZipFile.open streams: {float(n['audit_s']):.2f} s, "  # type: ignore[arg-type]
                      f"peak RSS {int(n['maxrss_kb']) / 1024:.0f} MB")  # type: ignore[call-overload]
            except subprocess.TimeoutExpired:
                print("naive ZipFile.open streams: did not finish within 120 s")
        ok = audit_s < TARGET_SECONDS and rss_mb < TARGET_MB
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

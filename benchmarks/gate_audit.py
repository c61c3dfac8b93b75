"""Benchmark: static audit of a large wheel against a plain `unzip -p` of the same wheel.

Default (real): downloads vLLM 0.19.1 (433 MB, once, with `pip download` into the user
cache), then times, alternately in the same run, `unzip -p WHEEL > /dev/null` and a fresh
child process auditing the wheel with every check on, and prints the ratio of the medians
(goal: at most 0.5) and the peak resident memory: the auditing process plus its largest
worker times the number of workers (goal: under 300 MB).

    python benchmarks/gate_audit.py [--spec vllm==0.19.1] [--rounds 3] [--wheel-dir DIR]

``--kinds`` times three kinds of published wheel side by side instead (goal for each: at
most 0.5 of ``unzip -p``'s time, peak resident memory under 200 MB), rounds interleaved
(unzip, audit, for each kind in turn), medians of ``--rounds``:

- cubin-heavy: flashinfer-cubin 0.4.0 (6,562 members, half of them small cubins);
- one big member compressing poorly: nvidia-cufft-cu12 (one large ``libcufft.so``);
- framework-like: CuPy 13.6.0 for CUDA 12 (hundreds of Python files, a few large ``.so``).

    python benchmarks/gate_audit.py --kinds [--rounds 3] [--wheel-dir DIR] [--same-as REF]
                                    [--log reports/bench/gate-audit.log]

It also prints the CPU seconds of each (all of the audit's processes; those do not change with
the load of the machine, the wall times do) and the load average before each round.  ``--log``
writes the command line, everything printed and the exit status to that file as well.

``--same-as REF`` also audits each wheel once with the code of git commit ``REF`` and
requires the very same findings (file, code, subject).

``--synthetic`` runs the older benchmark instead (targets: under 10 s, under 500 MB):

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
import contextlib
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import TextIO

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
from cumatrix.audit.static import audit_wheel, load_audit_data
from cumatrix.core.model import CudaVersion
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
from cumatrix.binary.elf import elf_needed, elf_strings, elf_undefined_symbols
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
        with pad.open("wb") as f:
            f.writelines(os.urandom(1 << 20) for _ in range(pad_mb))
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


def _child(code: str, *argv: str, timeout: float | None = None,
           src: str | None = None) -> dict[str, object]:
    src = src or str(Path(__file__).resolve().parent.parent / "src")
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                       env=env, timeout=timeout, check=True)
    result: dict[str, object] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


REAL_CHILD = r"""
import json, os, resource, sys, time
from pathlib import Path
from cumatrix.audit.static import AuditSettings, audit_wheel, load_audit_data, _workers
from cumatrix.binary.fatbin import parse_arch
from cumatrix.core.model import CudaVersion
wheel_dir = Path(sys.argv[2]) if sys.argv[2] else None
data = load_audit_data(wheel_dir=wheel_dir)
runtimes = tuple(int(m) for m in (sys.argv[3] if len(sys.argv) > 3 else "12").split(","))
s = AuditSettings(min_driver=CudaVersion(12, 8), runtimes=runtimes, min_runtime=CudaVersion(12, 8),
                  arch_list=tuple(parse_arch(a) for a in "8.0 9.0 10.0 12.0".split()))
def cpu():
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))
t0, c0 = time.perf_counter(), cpu()
audit = audit_wheel(Path(sys.argv[1]), min_driver=s.min_driver, runtimes=s.runtimes,
                    strict=False, optional=(), introductions=data.introductions,
                    abi_changed=data.abi_changes, settings=s, data=data)
t1, c1 = time.perf_counter(), cpu()
print(json.dumps({
    "audit_s": t1 - t0, "cpu_s": c1 - c0, "elves": len(audit.elves), "errors": audit.errors,
    "warnings": audit.warnings, "workers": _workers(),
    "codes": sorted({(f.file, f.code, f.subject) for f in audit.findings}),
    "self_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    "child_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
}))
"""


HUGE_SOURCE = r"""
__asm__(".section .rodata\n.global pad\npad:\n.incbin \"pad.bin\"\n.previous");
extern const char pad[];
const char *name = "libcudart.so.12";
const char *get(void) { return pad; }
"""


def _huge_wheel(dest: Path) -> Path:
    """A wheel whose one ELF member inflates to over 1 GiB, built once into ``dest``."""
    wheel = dest / "hugedemo-1.0-cp311-cp311-linux_x86_64.whl"
    if wheel.is_file():
        return wheel
    import random  # only here: the one kind that builds its wheel

    rnd = random.Random(1)
    words = [bytes(rnd.choice(b"abcdefghijklmnop_") for _ in range(rnd.randint(3, 12))) for _ in range(4000)]
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        work = Path(tmp)
        with (work / "pad.bin").open("wb") as f:
            for _ in range(1100):  # text-like half, random quarter, zeros: ~3:1 deflated
                text = b" ".join(rnd.choice(words) for _ in range(70000))[: 1 << 19]
                f.write((text + os.urandom(1 << 18)).ljust(1 << 20, b"\0"))
        so = _gcc(work, "_huge.so", HUGE_SOURCE)
        part = wheel.with_suffix(".part")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
            zf.writestr("hugedemo/__init__.py", "")
            zf.write(so, "hugedemo/_huge.so")
            zf.writestr("hugedemo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: hugedemo\nVersion: 1.0\n")
            zf.writestr("hugedemo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: cumatrix-benchmark\n"
                        "Root-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n")
            zf.writestr("hugedemo-1.0.dist-info/RECORD", "")
        part.rename(wheel)
    return wheel


def _cached_wheel(spec: str) -> Path:
    """``spec``'s wheel in the user cache, downloaded once with ``pip download`` (built once,
    for ``synthetic:huge``)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    dest = base / "cumatrix" / "bench-wheels"
    dest.mkdir(parents=True, exist_ok=True)
    if spec == "synthetic:huge":
        return _huge_wheel(dest)
    name, _, version = spec.partition("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    found = sorted(dest.glob(f"{stem}*.whl"))
    if not found:  # the truth-set cache may hold it already
        found = sorted((base / "cumatrix" / "truth").glob(f"{stem}*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                        "--only-binary=:all:", "--disable-pip-version-check", "-q",
                        "-d", str(dest), spec], check=True)
        found = sorted(dest.glob(f"{stem}*.whl"))
    if not found:
        raise SystemExit(f"pip downloaded no wheel named {stem}*.whl for {spec}")
    return found[0]


#: (kind, pip requirement or ``synthetic:huge``, --runtimes) of the --kinds benchmark.
KINDS = (
    ("cubin-heavy", "flashinfer-cubin==0.4.0", "12"),
    ("one big member", "nvidia-cufft-cu12==11.4.1.4", "12"),
    ("framework-like", "cupy-cuda12x==13.6.0", "12"),
    # The two largest wheels of the truth set (tests/truth/wheels.json): PyTorch (888 MB,
    # members of 1.7 GB in all, libtorch_cuda.so 968 MiB) and cuDNN (707 MB, 1,370 modules in
    # its precompiled engines).
    ("truth set's largest", "torch==2.8.0", "12"),
    ("truth set's second largest", "nvidia-cudnn-cu12==9.10.2.21", "12"),
    # One member that inflates to 1.15 GB (gcc-built, 1100 MiB of .rodata compressing ~3:1).
    ("member over 1 GiB", "synthetic:huge", "12"),
    # CuPy for CUDA 12 gated as a CUDA 13 wheel: every extension is an error, so the
    # optional-import analysis of its Python code runs.
    ("error path", "cupy-cuda12x==13.6.0", "13"),
)
KIND_TARGET_MB = 200.0


def kinds(args: argparse.Namespace) -> int:
    """The kinds side by side (``--only``: some of them); exit 0 only when every goal is met."""
    chosen = [k for k in KINDS if not args.only or k[0] in args.only]
    wheels = [(kind, _cached_wheel(spec)) for kind, spec, _ in chosen]
    majors = {kind: rts for kind, _, rts in chosen}
    wd = str(args.wheel_dir or "")
    _child("from cumatrix.audit.static import load_audit_data; import sys, pathlib; "
           "load_audit_data(wheel_dir=pathlib.Path(sys.argv[1]) if sys.argv[1] else None); "
           "print('{}')", wd)  # warm the header cache outside the timed runs
    unzip_s: dict[str, list[float]] = {k: [] for k, _ in wheels}
    unzip_cpu: dict[str, list[float]] = {k: [] for k, _ in wheels}
    audits: dict[str, list[dict[str, object]]] = {k: [] for k, _ in wheels}
    loads: list[float] = []
    for _ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for kind, wheel in wheels:
            c0 = _children_cpu()
            unzip_s[kind].append(_unzip_seconds(wheel))
            unzip_cpu[kind].append(_children_cpu() - c0)
            audits[kind].append(_child(REAL_CHILD, str(wheel), wd, majors[kind]))
    ok = True
    if args.same_as:
        # The same wheels audited by the code of another commit: the findings must not move.
        repo = Path(__file__).resolve().parent.parent
        with tempfile.TemporaryDirectory() as base:
            archive = subprocess.run(["git", "-C", str(repo), "archive", args.same_as, "src"],
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
            for kind, wheel in wheels:
                ref = _child(REAL_CHILD, str(wheel), wd, majors[kind], src=str(Path(base) / "src"))
                same = ref["codes"] == audits[kind][-1]["codes"]
                ok = ok and same
                print(f"findings of {kind} against {args.same_as}: "
                      f"{'identical' if same else 'DIFFERENT'} ({len(ref['codes'])} "  # type: ignore[arg-type]
                      f"distinct), {float(ref['audit_s']):.2f} s there")  # type: ignore[arg-type]
    # Other work on the machine slows both; the ratio of the interleaved medians is fairer
    # than either time alone, and the CPU seconds are what the load leaves unchanged.
    print(f"cores usable: {len(os.sched_getaffinity(0))}, load average (1 min) before each "
          f"round: {' '.join(f'{x:.2f}' for x in loads)}")
    for kind, wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            infos = zf.infolist()
        size = sum(i.file_size for i in infos)
        print(f"\n[{kind}] {wheel.name}: {wheel.stat().st_size / 1e6:.0f} MB, "
              f"{len(infos)} members, {size / 1e6:.0f} MB uncompressed")
        runs = audits[kind]
        last = runs[-1]
        same = all(r["codes"] == last["codes"] for r in runs)
        workers = int(last["workers"])  # type: ignore[call-overload]
        u = statistics.median(unzip_s[kind])
        a = statistics.median(float(r["audit_s"]) for r in runs)  # type: ignore[arg-type]
        peak_mb = max(int(r["self_kb"]) + workers * int(r["child_kb"])  # type: ignore[call-overload]
                      for r in runs) / 1024
        print(f"  audit: {last['elves']} ELF files, {last['errors']} errors, "
              f"{last['warnings']} warnings, {len(last['codes'])} distinct findings "  # type: ignore[arg-type]
              f"({'the same' if same else 'DIFFERENT'} in every round), {workers} worker(s)")
        print(f"  unzip -p: {' '.join(f'{x:.2f}' for x in unzip_s[kind])} s (median {u:.2f} s)")
        times = " ".join(f"{float(r['audit_s']):.2f}" for r in runs)  # type: ignore[arg-type]
        print(f"  audit:    {times} s (median {a:.2f} s)")
        cpu = statistics.median(float(r["cpu_s"]) for r in runs)  # type: ignore[arg-type]
        print(f"  CPU seconds (median): unzip -p {statistics.median(unzip_cpu[kind]):.2f}, "
              f"audit {cpu:.2f} (all its processes)")
        ratio = a / u
        good = ratio <= 0.5 and peak_mb < KIND_TARGET_MB and same
        ok = ok and good
        print(f"  ratio audit / unzip -p: {ratio:.2f}   goal <= 0.5   "
              f"{'ok' if ratio <= 0.5 else 'MISSED'}")
        print(f"  peak RSS (process + {workers} x largest worker): {peak_mb:.0f} MB   "
              f"goal < {KIND_TARGET_MB:.0f} MB   {'ok' if peak_mb < KIND_TARGET_MB else 'MISSED'}")
    return 0 if ok else 1


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _unzip_seconds(wheel: Path) -> float:
    t0 = time.perf_counter()
    with Path(os.devnull).open("wb") as null:
        subprocess.run(["unzip", "-p", str(wheel)], stdout=null, check=True)
    return time.perf_counter() - t0


def real(args: argparse.Namespace) -> int:
    wheel = _cached_wheel(args.spec)
    print(f"{wheel.name}: {wheel.stat().st_size / 1e6:.0f} MB")
    wd = str(args.wheel_dir or "")
    _child("from cumatrix.audit.static import load_audit_data; import sys, pathlib; "
           "load_audit_data(wheel_dir=pathlib.Path(sys.argv[1]) if sys.argv[1] else None); "
           "print('{}')", wd)  # warm the header cache outside the timed runs
    unzip_s: list[float] = []
    audits: list[dict[str, object]] = []
    for _ in range(args.rounds):
        unzip_s.append(_unzip_seconds(wheel))
        audits.append(_child(REAL_CHILD, str(wheel), wd))
    audit_s = [float(a["audit_s"]) for a in audits]  # type: ignore[arg-type]
    u, a = statistics.median(unzip_s), statistics.median(audit_s)
    last = audits[-1]
    workers = int(last["workers"])  # type: ignore[call-overload]
    peak_mb = max(int(r["self_kb"]) + workers * int(r["child_kb"])  # type: ignore[call-overload]
                  for r in audits) / 1024
    print(f"audit: {last['elves']} ELF files, {last['errors']} errors, "
          f"{last['warnings']} warnings, {workers} worker(s)")
    for f in last["codes"]:  # type: ignore[attr-defined]
        print(f"  {f[0]}: {f[1]} {f[2]}")
    print(f"unzip -p:  {' '.join(f'{x:.2f}' for x in unzip_s)} s (median {u:.2f} s)")
    print(f"audit:     {' '.join(f'{x:.2f}' for x in audit_s)} s (median {a:.2f} s)")
    ratio = a / u
    print(f"ratio audit / unzip -p: {ratio:.2f}   goal <= 0.5   {'ok' if ratio <= 0.5 else 'MISSED'}")
    print(f"peak RSS (process + {workers} x largest worker): {peak_mb:.0f} MB   goal < 300 MB   "
          f"{'ok' if peak_mb < 300 else 'MISSED'}")
    return 0 if ratio <= 0.5 and peak_mb < 300 else 1


class _Tee(io.TextIOBase):
    """Standard output, copied to a log file."""

    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
            s.flush()
        return len(text)


def main() -> int:
    args = _parser().parse_args()
    if args.log is None:
        return _main(args)
    with args.log.open("w", encoding="utf-8") as log:
        log.write("$ python benchmarks/gate_audit.py " + " ".join(sys.argv[1:]) + "\n")
        with contextlib.redirect_stdout(_Tee(sys.stdout, log)):
            code = _main(args)
        log.write(f"exit {code}\n")
    return code


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synthetic", action="store_true",
                    help="the synthetic 315 MB wheel instead of a real one")
    ap.add_argument("--kinds", action="store_true",
                    help="three kinds of wheel side by side (cubin-heavy, one big member, "
                         "framework-like)")
    ap.add_argument("--only", action="append", default=[], metavar="KIND",
                    help=f"with --kinds: only this kind (repeatable; of {', '.join(k for k, _, _ in KINDS)})")
    ap.add_argument("--same-as", metavar="REF", default=None,
                    help="with --kinds: also audit each wheel once with the code of git REF "
                         "and require identical findings")
    ap.add_argument("--spec", default="vllm==0.19.1", help="the real wheel (pip requirement)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating unzip/audit rounds")
    ap.add_argument("--pad-mb", type=int, default=120, help="MB of padding per big ELF file")
    ap.add_argument("--work", type=Path, default=None, help="build directory (default: temp)")
    ap.add_argument("--wheel-dir", type=Path, default=None,
                    help="directory of already-downloaded CUDA runtime wheels")
    ap.add_argument("--compare-zipfile", action="store_true",
                    help="also time pyelftools over plain ZipFile.open streams (capped at 120 s)")
    ap.add_argument("--log", type=Path, default=None,
                    help="also write the command line, the output and the exit status here")
    return ap


def _main(args: argparse.Namespace) -> int:
    if args.kinds:
        return kinds(args)
    if not args.synthetic:
        return real(args)
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
        _child("from cumatrix.audit.static import load_audit_data; import sys, pathlib; "
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

"""The tracer sees every process of a cell's tree, and nothing a cell names stalls the harness:
each escape that once worked, tried for real against `cumatrix run` (gcc-built programs, real
runtime wheels, real FIFOs).  docs/threat-model.md names these tests."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from cumatrix.core import witness
from cumatrix.provision import runtimes as R
from helpers.build import gcc
from helpers.procs import run_unstalled
from helpers.results import read_cells_by_case

CU129 = "nvidia-cuda-runtime-cu12==12.9.79"
CU130 = "nvidia-cuda-runtime==13.0.96"

pytestmark = pytest.mark.network  # the cells provision real runtime wheels (cached after the first)


@pytest.fixture(scope="module")
def cu13(wheel_cache: Path) -> Path:
    return R.from_wheel("cu13.0", CU130).libcudart


def _run(cli_env: Any, d: Path, case: str, *, timeout: float = 300) -> dict[str, Any]:
    """One cell of ``case`` in a cu12.9 cell, run by the real harness; its record.  A harness
    that sits in a FIFO's open fails the test at once (that wait has no end)."""
    m = d / "m.yaml"
    m.write_text(textwrap.dedent(f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {case}
        """).lstrip("\n"))
    out = d / "out"
    # --no-sandbox: the tracer is the subject, and these cells reach a runtime wheel of the cache
    # and files of the test's directory by paths written into their programs (the sandbox, the
    # default, shows a cell only what its job names), or rename over them (a FIFO's attack).
    rc, err, stalled = run_unstalled([sys.executable, "-m", "cumatrix", "run", str(m), "--out", str(out), "-q",
                                      "--no-sandbox"], env=cli_env(), cwd=d, timeout=timeout)
    assert not stalled, "the harness waited on a FIFO the cell made"
    assert (out / "results.jsonl").exists(), (rc, err)
    (rec,) = read_cells_by_case(out).values()
    return rec


def _build(d: Path, name: str, source: str, *extra: str) -> Path:
    src = d / f"{name}.c"
    src.write_text(textwrap.dedent(source))
    exe = d / name
    subprocess.run([gcc(), "-O1", "-o", str(exe), str(src), *extra, "-ldl"], check=True, capture_output=True)
    return exe


def _ran_cu13(rec: dict[str, Any]) -> None:
    """The cell is judged on the CUDA 13 runtime its hidden process loaded, not passed."""
    outcome = rec["observed"]["outcome"]
    assert outcome == "skipped:runtime-not-used" or outcome.startswith("runtime-leak:"), rec["observed"]
    assert "libcudart.so.13" in rec["observed"]["detail"], rec["observed"]
    assert rec["fingerprint"]["trace"]["complete"], rec["fingerprint"]["trace"]


_LOAD = """
    static int load(const char *path) {
        void *h = dlopen(path, RTLD_NOW);
        int (*get)(int *) = h ? (int (*)(int *))dlsym(h, "cudaRuntimeGetVersion") : 0;
        int v = 0;
        if (get) get(&v);
        fprintf(stderr, "loaded CUDA runtime %d\\n", v);
        return v ? 0 : 3;
    }
"""


def test_a_clone_untraced_child_is_refused(tmp_path: Path, cli_env: Any, cu13: Path) -> None:
    """Attack: clone(CLONE_UNTRACED) a child that loads libcudart.so.13 (a real wheel's, from
    outside the cell) in a cu12.9 cell.  Before: no tracer heard of the child, and the cell
    was ``ok`` with a complete trace.  Now the tracer's seccomp filter refuses the flag
    (EPERM); the program's fallback, a plain fork, is traced and the cell is judged on it."""
    exe = _build(tmp_path, "untraced", """
        #define _GNU_SOURCE
        #include <dlfcn.h>
        #include <errno.h>
        #include <sched.h>
        #include <signal.h>
        #include <stdio.h>
        #include <string.h>
        #include <sys/wait.h>
        #include <unistd.h>
        """ + _LOAD + """
        static char stack[1 << 20];
        static int child(void *arg) { return load((const char *)arg); }
        int main(int argc, char **argv) {
            (void)argc;
            int pid = clone(child, stack + sizeof stack, CLONE_UNTRACED | SIGCHLD, argv[1]);
            if (pid < 0) {
                printf("CLONE_UNTRACED refused: %s\\n", strerror(errno));
                pid = fork();
                if (pid == 0) return load(argv[1]);
            }
            int st;
            waitpid(pid, &st, 0);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
        }
        """)
    rec = _run(cli_env, tmp_path, f"{{name: untraced, argv: [{exe}, {cu13}]}}")
    _ran_cu13(rec)


_CLONE32 = """
    .globl _start
    .text
_start:
    movl $120, %eax          /* i386 clone */
    movl $0x00800011, %ebx   /* CLONE_UNTRACED | SIGCHLD */
    xorl %ecx, %ecx          /* no new stack: fork-like */
    xorl %edx, %edx
    xorl %esi, %esi
    xorl %edi, %edi
    int $0x80
    testl %eax, %eax
    js refused
    movl $1, %eax            /* exit(0), in the child and in the parent: the clone was made */
    xorl %ebx, %ebx
    int $0x80
refused:
    movl $1, %eax            /* exit(7) */
    movl $7, %ebx
    int $0x80
"""


def test_a_32_bit_clone_untraced_ends_the_cell_as_a_harness_error(tmp_path: Path, cli_env: Any) -> None:
    """Attack: a 32-bit program (whose system call numbers the filter cannot tell apart) calls
    clone(CLONE_UNTRACED).  Before: the child ran untraced and the cell was ``ok``.  Now the
    tracer, stopped at each of its calls, kills it before the call runs, and the cell is a
    ``harness-error`` naming the attempt."""
    src = tmp_path / "clone32.S"
    src.write_text(_CLONE32)
    exe = tmp_path / "clone32"
    built = subprocess.run([gcc(), "-m32", "-nostdlib", "-static", "-o", str(exe), str(src)], capture_output=True,
                           text=True, check=False)
    if built.returncode != 0:
        pytest.skip(f"no 32-bit linking here: {built.stderr.strip()[-200:]}")
    if subprocess.run([str(exe)], check=False).returncode != 0:
        pytest.skip("this kernel runs no 32-bit programs")
    rec = _run(cli_env, tmp_path, f"{{name: clone32, argv: [{exe}]}}")
    assert rec["observed"]["outcome"] == "harness-error", rec["observed"]
    assert "clone with CLONE_UNTRACED" in rec["observed"]["detail"], rec["observed"]


def test_a_process_outliving_the_first_is_followed(tmp_path: Path, cli_env: Any, cu13: Path) -> None:
    """Attack: the first process exits at once; its child, 100 ms later, loads libcudart.so.13.
    Before: the tracer stopped with the first process, the child ran untraced, and the cell
    was ``ok`` with a complete trace.  Now it is followed to its end."""
    exe = _build(tmp_path, "outlive", """
        #include <dlfcn.h>
        #include <stdio.h>
        #include <unistd.h>
        """ + _LOAD + """
        int main(int argc, char **argv) {
            (void)argc;
            if (fork() == 0) {
                usleep(100000);
                return load(argv[1]);
            }
            return 0;
        }
        """)
    rec = _run(cli_env, tmp_path, f"{{name: outlive, argv: [{exe}, {cu13}]}}")
    _ran_cu13(rec)


def test_a_runtime_unloaded_before_exit_is_seen(tmp_path: Path, cli_env: Any, cu13: Path) -> None:
    """Attack: dlopen libcudart.so.13, call it, dlclose it, exit 0.  Before: nothing mapped it
    at any moment the maps were read (exec, exit): ``ok``, no library recorded.  Now every
    file mapped executable stops the tracer when it is mapped (the seccomp filter on ``mmap``
    with ``PROT_EXEC``), and the file is on the record."""
    exe = _build(tmp_path, "unload", """
        #include <dlfcn.h>
        #include <stdio.h>
        int main(int argc, char **argv) {
            (void)argc;
            void *h = dlopen(argv[1], RTLD_NOW);
            int (*get)(int *) = h ? (int (*)(int *))dlsym(h, "cudaRuntimeGetVersion") : 0;
            int v = 0;
            if (get) get(&v);
            fprintf(stderr, "runtime %d\\n", v);
            if (h) dlclose(h);
            return v ? 0 : 3;
        }
        """)
    rec = _run(cli_env, tmp_path, f"{{name: unload, argv: [{exe}, {cu13}]}}")
    _ran_cu13(rec)


def test_a_runtime_made_executable_by_mprotect_is_seen(tmp_path: Path, cli_env: Any, cu13: Path) -> None:
    """Attack: mmap libcudart.so.13 as data (PROT_READ, which stops nothing), make its text
    executable with mprotect, unmap it, exit 0.  Before: no mmap with PROT_EXEC, and nothing
    mapped at any moment the maps were read: ``ok``, no library recorded.  Now an mprotect that
    adds PROT_EXEC stops the tracer too, and the file backing the range is on the record."""
    exe = _build(tmp_path, "mprotect", """
        #include <elf.h>
        #include <fcntl.h>
        #include <stdio.h>
        #include <string.h>
        #include <sys/mman.h>
        #include <sys/stat.h>
        #include <unistd.h>
        int main(int argc, char **argv) {
            (void)argc;
            int fd = open(argv[1], O_RDONLY);
            struct stat st;
            if (fd < 0 || fstat(fd, &st) != 0) return 4;
            unsigned char *base = mmap(0, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
            close(fd);
            if (base == MAP_FAILED) return 5;
            const Elf64_Ehdr *eh = (const Elf64_Ehdr *)base;
            const Elf64_Phdr *ph = (const Elf64_Phdr *)(base + eh->e_phoff);
            long page = sysconf(_SC_PAGESIZE);
            int made = 0;
            for (int i = 0; i < eh->e_phnum; i++) {
                if (ph[i].p_type != PT_LOAD || !(ph[i].p_flags & PF_X)) continue;
                size_t at = ph[i].p_offset & ~(size_t)(page - 1), len = ph[i].p_offset + ph[i].p_filesz - at;
                if (mprotect(base + at, len, PROT_READ | PROT_EXEC) != 0) return 6;
                made++;
            }
            printf("text made executable: %d segment(s)\\n", made);
            munmap(base, (size_t)st.st_size);
            return made ? 0 : 7;
        }
        """)
    rec = _run(cli_env, tmp_path, f"{{name: mprotect, argv: [{exe}, {cu13}]}}")
    _ran_cu13(rec)


def test_a_runtime_loaded_from_a_memfd_is_judged_by_its_bytes(tmp_path: Path, cli_env: Any, cu13: Path) -> None:
    """Attack: copy libcudart.so.13 into a memfd and dlopen it through /proc/self/fd/N.  Before:
    the record named ``/memfd:rt (deleted)``, which the harness can neither read nor name:
    ``ok``, ``runtime_version: None``.  Now the tracer reads its SONAME from its bytes when it
    is mapped, and the cell is judged on the CUDA 13 runtime it ran; the SHA-256 of the bytes it
    ran is on the record (the same as the wheel's file)."""
    exe = _build(tmp_path, "memfd", """
        #define _GNU_SOURCE
        #include <dlfcn.h>
        #include <fcntl.h>
        #include <stdio.h>
        #include <sys/mman.h>
        #include <unistd.h>
        """ + _LOAD + """
        int main(int argc, char **argv) {
            (void)argc;
            int src = open(argv[1], O_RDONLY), mem = memfd_create("rt", 0);
            char buf[65536], path[64];
            ssize_t n;
            while ((n = read(src, buf, sizeof buf)) > 0)
                if (write(mem, buf, (size_t)n) != n) return 4;
            snprintf(path, sizeof path, "/proc/self/fd/%d", mem);
            return load(path);
        }
        """)
    rec = _run(cli_env, tmp_path, f"{{name: memfd, argv: [{exe}, {cu13}]}}")
    _ran_cu13(rec)
    assert rec["fingerprint"]["runtime_version"] == 13000, rec["fingerprint"]
    want = {"sha256": hashlib.sha256(cu13.read_bytes()).hexdigest(), "bytes": cu13.stat().st_size}
    assert [{k: f[k] for k in want} for f in rec["fingerprint"]["nameless_files"]] == [want], rec["fingerprint"]


def test_a_fifo_renamed_over_a_mapped_runtime_does_not_stall_the_harness(tmp_path: Path, cli_env: Any,
                                                                        cu13: Path) -> None:
    """Attack: load a runtime from the cell's own directory, then rename a FIFO over its path.
    Before: the harness opened the path the kernel named to read its SONAME, and waited on
    the FIFO for good.  Now the path is opened without blocking, found not to be a regular
    file, and the record says so."""
    d = tmp_path / "cell"
    d.mkdir()
    lib = d / "libcudart.so.13"
    shutil.copy(cu13, lib)
    exe = _build(tmp_path, "swap", """
        #include <dlfcn.h>
        #include <stdio.h>
        #include <stdlib.h>
        #include <sys/stat.h>
        #include <unistd.h>
        """ + _LOAD + """
        int main(int argc, char **argv) {
            (void)argc;
            int rc = load(argv[1]);
            char tmp[4096];
            snprintf(tmp, sizeof tmp, "%s.fifo", argv[1]);
            if (mkfifo(tmp, 0600) != 0 || rename(tmp, argv[1]) != 0) return 9;
            return rc;
        }
        """)
    rec = _run(cli_env, tmp_path, f"{{name: swap, argv: [{exe}, {lib}]}}")
    assert Path(lib).is_fifo()
    assert f"{lib}: not a regular file" in rec["fingerprint"]["mappings_note"], rec["fingerprint"]
    assert rec["observed"]["outcome"] == "skipped:runtime-not-used", rec["observed"]


def test_a_fifo_renamed_over_an_audit_requester_does_not_stall_the_harness(tmp_path: Path, cli_env: Any,
                                                                          cu13: Path) -> None:
    """Attack: a library whose RUNPATH ($ORIGIN/lib) found libcudart.so.13 is the audit log's
    requester; the program renames a FIFO over it.  Before: the harness opened the requester
    to read its RUNPATH (how the runtime was found), and waited on the FIFO for good.  Now the
    requester is refused as not a regular file, and the record says so."""
    d = tmp_path / "cell"
    (d / "lib").mkdir(parents=True)
    shutil.copy(cu13, d / "lib" / "libcudart.so.13")
    req = d / "libreq.so"
    (tmp_path / "req.c").write_text("int cudaRuntimeGetVersion(int *);\n"
                                    "int req_version(void) { int v = 0; cudaRuntimeGetVersion(&v); return v; }\n")
    subprocess.run([gcc(), "-shared", "-fPIC", "-o", str(req), str(tmp_path / "req.c"), str(d / "lib" / "libcudart.so.13"),
                    "-Wl,-rpath,$ORIGIN/lib"], check=True, capture_output=True)
    exe = _build(tmp_path, "requester", """
        #include <dlfcn.h>
        #include <stdio.h>
        #include <sys/stat.h>
        #include <unistd.h>
        int main(int argc, char **argv) {
            (void)argc;
            void *h = dlopen(argv[1], RTLD_NOW);
            int (*ver)(void) = h ? (int (*)(void))dlsym(h, "req_version") : 0;
            if (!ver) return 3;
            fprintf(stderr, "CUDA runtime %d\\n", ver());
            char tmp[4096];
            snprintf(tmp, sizeof tmp, "%s.fifo", argv[1]);
            if (mkfifo(tmp, 0600) != 0 || rename(tmp, argv[1]) != 0) return 9;
            return 0;
        }
        """)
    rec = _run(cli_env, tmp_path, f"{{name: requester, argv: [{exe}, {req}]}}")
    assert req.is_fifo()
    assert f"{req}: not a regular file" in rec["fingerprint"]["mappings_note"], rec["fingerprint"]
    assert rec["observed"]["outcome"] == "skipped:runtime-not-used", rec["observed"]


def test_open_cell_file_waits_on_nothing(tmp_path: Path) -> None:
    """The one way the harness opens a file a cell names: a FIFO (with no writer, whose open
    would wait), a device and a link put there are refused at once; links the loader names are
    resolved without opening anything; a slow read stops at its deadline."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(witness.UnsafeFile, match="not a regular file"):
        witness.open_cell_file(fifo, links=True)
    with pytest.raises(witness.UnsafeFile, match="not a regular file"):
        witness.read_cell_file("/dev/zero", links=True)
    (tmp_path / "to-fifo").symlink_to(fifo)
    with pytest.raises(witness.UnsafeFile, match="not a regular file"):
        witness.read_cell_file(tmp_path / "to-fifo", links=True)
    assert time.monotonic() - t0 < 5
    real = tmp_path / "libx.so.1.2"
    real.write_bytes(b"\x7fELF" + bytes(100))
    (tmp_path / "libx.so.1").symlink_to(real.name)
    assert witness.read_cell_file(tmp_path / "libx.so.1", links=True) == real.read_bytes()
    with pytest.raises(OSError):  # noqa: PT011 - the C library's ELOOP text
        witness.read_cell_file(tmp_path / "libx.so.1")
    with pytest.raises(witness.UnsafeFile, match="within"):
        witness.read_cell_file(real, seconds=-1)
    with pytest.raises(witness.UnsafeFile, match="larger"), witness.open_cell_file(real, limit=10) as f:
        f.read()

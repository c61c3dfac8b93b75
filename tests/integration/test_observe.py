"""What a cell's process tree maps, and the cell's runtime enforced over a bundled copy.

Real parts: the rtld-audit library built by gcc, real runtime wheels from PyPI, gcc-built
programs that carry their own runtime through ``DT_RPATH``, ``RUNPATH`` or a ``dlopen`` by
absolute path (the way torch, CuPy and JAX find theirs), run through the local backend.
``cudaRuntimeGetVersion`` answers without a GPU, so every test runs on a CPU host.
"""

from __future__ import annotations

import ast
import contextlib
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from cumatrix.binary.loader import loader_view
from cumatrix.core.jobs import Job
from cumatrix.core.model import Cell
from cumatrix.execute import observe as O
from cumatrix.execute.local import run_local
from cumatrix.provision import runtimes as R
from helpers.build import gcc
from helpers.results import read_cells

pytestmark = pytest.mark.network

CU124 = "nvidia-cuda-runtime-cu12==12.4.127"
CU129 = "nvidia-cuda-runtime-cu12==12.9.79"
CU130 = "nvidia-cuda-runtime==13.0.96"

NEEDED_C = """
#include <stdio.h>
int cudaRuntimeGetVersion(int *);
int main(void) { int v = 0; int rc = cudaRuntimeGetVersion(&v); printf("%d %d\\n", rc, v); return rc; }
"""

# dlopen a runtime by absolute path (argv[1]); argv[2] == "crash": SIGSEGV once it is mapped.
DLOPEN_C = """
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\\n", dlerror()); return 3; }
    if (argc > 2 && strcmp(argv[2], "crash") == 0) raise(SIGSEGV);
    int (*get)(int *) = (int (*)(int *))dlsym(h, "cudaRuntimeGetVersion");
    Dl_info info;
    dladdr((void *)get, &info);
    int v = 0;
    int rc = get(&v);
    printf("%d %d %s\\n", rc, v, info.dli_fname);
    return rc;
}
"""


@pytest.fixture(scope="module")
def rts(wheel_cache: Path) -> dict[str, R.ResolvedRuntime]:
    return {name: R.from_wheel(name, req) for name, req in
            (("cu12.4", CU124), ("cu12.9", CU129), ("cu13.0", CU130))}


@pytest.fixture(scope="module")
def audit_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gcc()
    return O.build_audit_library(cache=tmp_path_factory.mktemp("audit-cache"))


def test_the_audit_library_loads_no_second_c_library(audit_lib: Path, tmp_path: Path) -> None:
    """An audit library's dependencies are loaded again in a namespace of their own: every
    process of every cell would map a second libc.  It needs none, and still reads its
    environment (handed to its constructor by the loader) and steers a request."""
    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("the audit library makes its own system calls on x86-64 and AArch64 only")
    with audit_lib.open("rb") as f:
        view = loader_view(ELFFile(f))
    assert view is not None
    assert view.needed == (), view
    copy = tmp_path / "libz-copy.so.1"
    libz = subprocess.run([sys.executable, "-c", "import ctypes.util; print(ctypes.util.find_library('z'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    found = next(p for d in ("/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib64", "/lib64")
                 if (p := Path(d) / libz).exists())
    shutil.copy(found, copy)
    log = tmp_path / "audit.log"
    env = {"PATH": "/usr/bin:/bin", "LD_AUDIT": str(audit_lib), "CUMATRIX_AUDIT_LOG": str(log),
           "CUMATRIX_AUDIT_ENFORCE": f"{libz}={copy}"}
    subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({libz!r})"], env=env, check=True)
    lines = [ln.split("\t") for ln in log.read_text().splitlines()]
    assert ["r", libz, str(copy)] in [[ln[0], *ln[2:]] for ln in lines], lines
    assert any(ln[0] == "o" and ln[-1] == str(copy) for ln in lines), lines


def test_setup_py_builds_the_audit_library_as_a_checkout_does() -> None:
    tree = ast.parse((Path(__file__).resolve().parents[2] / "setup.py").read_text())
    flags = {t.id: tuple(ast.literal_eval(n.value)) for n in ast.walk(tree) if isinstance(n, ast.Assign)
             for t in n.targets if isinstance(t, ast.Name) and t.id in ("AUDIT_CFLAGS", "NOLIBC_CFLAGS")}
    assert flags == {"AUDIT_CFLAGS": O.AUDIT_CFLAGS, "NOLIBC_CFLAGS": O.NOLIBC_CFLAGS}


def _build(tmp: Path, name: str, source: str, *args: str) -> Path:
    src = tmp / f"{name}.c"
    src.write_text(textwrap.dedent(source))
    out = tmp / name
    proc = subprocess.run([gcc(), "-o", str(out), str(src), *args], check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def _readelf_d(path: Path) -> str:
    from elftools.elf.elffile import ELFFile

    with path.open("rb") as fh:
        dyn = ELFFile(fh).get_section_by_name(".dynamic")
        return " ".join(f"{t.entry.d_tag}={getattr(t, 'rpath', getattr(t, 'runpath', ''))}"
                        for t in dyn.iter_tags() if t.entry.d_tag in ("DT_RPATH", "DT_RUNPATH"))


def _run(argv: list[str], cell: R.ResolvedRuntime, plan: O.AuditPlan) -> tuple[str, tuple[O.MappedLibrary, ...]]:
    """Run ``argv`` as the local backend runs a cell of runtime ``cell``, audited by ``plan``."""
    job = Job(cell_id="t", kind="command", argv=tuple(argv), env=plan.env, lib_path=(str(cell.lib_dir),),
              timeout=60)
    res = run_local(job)
    assert res.returncode is not None or res.signal is not None
    return res.stdout_tail.strip() + res.stderr_tail.strip(), O.read_mapped(plan.log)


def _cell(rt: R.ResolvedRuntime) -> O.CellRuntime:
    return O.cell_runtime(rt.libcudart, rt.version)


def _runtimes(mapped: tuple[O.MappedLibrary, ...]) -> list[O.MappedLibrary]:
    return [m for m in mapped if O.is_runtime(m)]


# ------------------------------------------------------------------ building the library


def test_library_is_built_once_per_source(tmp_path: Path) -> None:
    gcc()
    first = O.build_audit_library(cache=tmp_path)
    stamp = first.stat().st_mtime_ns
    again = O.build_audit_library(cache=tmp_path)
    assert again == first
    assert again.stat().st_mtime_ns == stamp
    # Only plain libc entry points present in any glibc, so it loads in older containers.
    from elftools.elf.elffile import ELFFile

    from cumatrix.binary.elf import elf_undefined_symbols

    with first.open("rb") as fh:
        undefined = set(elf_undefined_symbols(ELFFile(fh)))
    assert undefined <= {"getenv", "open", "write", "getpid", "syscall", "strlen", "strchr", "strrchr", "strcmp",
                         "memcpy", "__errno_location", "__cxa_finalize"}, undefined


def test_the_audit_source_ships_as_package_data() -> None:
    assert "la_objopen" in O.audit_source()
    assert "la_objsearch" in O.audit_source()


# ------------------------------------------------------------------ observe


def test_a_python_cell_lists_what_it_mapped(tmp_path: Path, rts: dict[str, R.ResolvedRuntime],
                                            audit_lib: Path) -> None:
    cell = rts["cu12.9"]
    plan = O.audit_plan(tmp_path / "log", library=audit_lib)
    out, mapped = _run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libcudart.so.12')"], cell, plan)
    cuda = O.cuda_libraries(mapped)
    assert [m.path for m in cuda] == [str(cell.libcudart)], out
    rt = cuda[0]
    assert rt.soname == "libcudart.so.12"
    assert (rt.version, rt.version_from) == ("12.9.79", "wheel nvidia-cuda-runtime-cu12")
    assert any(m.soname == "libc.so.6" for m in mapped)  # not only CUDA: everything is listed
    seen = O.observed_runtime(mapped)
    assert (seen.file, seen.version) == (str(cell.libcudart), 12090)
    assert O.runtime_not_used(_cell(cell), mapped) is None


def test_the_whole_process_tree_is_observed_and_a_crash_leaves_the_list(
        tmp_path: Path, rts: dict[str, R.ResolvedRuntime], audit_lib: Path) -> None:
    prog = _build(tmp_path, "dl", DLOPEN_C, "-ldl")
    cell, other = rts["cu12.9"], rts["cu13.0"]
    plan = O.audit_plan(tmp_path / "log", library=audit_lib)
    # A shell that starts the program, which maps a runtime and then dies of SIGSEGV.
    job = Job(cell_id="t", kind="command", argv=("sh", "-c", f"'{prog}' '{other.libcudart}' crash; exit $?"),
              env=plan.env, lib_path=(str(cell.lib_dir),), timeout=60)
    res = run_local(job)
    assert res.returncode == 128 + 11, res.stderr_tail
    log = O.read_log(plan.log)
    order = list(dict.fromkeys(pid for pid, _, _ in log.opened))
    [runtime_pid] = {pid for pid, _, path in log.opened if path == str(other.libcudart)}
    assert len(order) >= 2
    assert runtime_pid != order[0]
    mapped = O.read_mapped(plan.log)
    [rt] = _runtimes(mapped)
    assert rt.soname == "libcudart.so.13"
    assert rt.version == "13.0.96"


CLOSE_ALL_C = """
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    (void)argc;
    for (int fd = 3; fd < 1024; fd++) close(fd);  /* as daemons do */
    int mine = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);  /* takes the lowest free number */
    void *h = dlopen(argv[1], RTLD_NOW);
    close(mine);
    printf("%d %s\\n", mine, h ? "loaded" : dlerror());
    return h ? 0 : 1;
}
"""


def test_a_program_that_closes_every_descriptor_keeps_its_files_clean(
        tmp_path: Path, rts: dict[str, R.ResolvedRuntime], audit_lib: Path) -> None:
    prog = _build(tmp_path, "closeall", CLOSE_ALL_C, "-ldl")
    cell = rts["cu12.9"]
    plan = O.audit_plan(tmp_path / "log", library=audit_lib)
    out, mapped = _run([str(prog), str(cell.libcudart), str(tmp_path / "its-own-file")], cell, plan)
    assert out == "3 loaded"  # its file got the number the log had
    assert (tmp_path / "its-own-file").read_bytes() == b""
    assert [m.path for m in _runtimes(mapped)] == [str(cell.libcudart)]  # the log was reopened


# ------------------------------------------------------------------ enforce, through DT_RPATH / RUNPATH / dlopen


def test_rpath_bundled_copy_wins_when_offered_and_loses_when_enforced(
        tmp_path: Path, rts: dict[str, R.ResolvedRuntime], audit_lib: Path) -> None:
    bundled, cell = rts["cu12.4"], rts["cu12.9"]
    prog = _build(tmp_path, "rpath", NEEDED_C, str(bundled.libcudart),
                  "-Wl,--disable-new-dtags", f"-Wl,-rpath,{bundled.lib_dir}")
    assert "DT_RPATH" in _readelf_d(prog)
    # Offered: DT_RPATH is searched before LD_LIBRARY_PATH, so the program runs its own 12.4.
    offered = O.audit_plan(tmp_path / "offered.log", library=audit_lib,
                           enforce=O.enforce_rules(_cell(cell), "offered"))
    out, mapped = _run([str(prog)], cell, offered)
    assert out == "0 12040"
    assert [m.path for m in _runtimes(mapped)] == [str(bundled.libcudart)]
    assert O.observed_runtime(mapped).version == 12040
    assert O.runtime_not_used(_cell(cell), mapped, mode="offered") is None
    # Enforced (the default): the cell's 12.9 answers the request for libcudart.so.12.
    enforced = O.audit_plan(tmp_path / "enforced.log", library=audit_lib, enforce=O.enforce_rules(_cell(cell)))
    out, mapped = _run([str(prog)], cell, enforced)
    assert out == "0 12090"
    assert [m.path for m in _runtimes(mapped)] == [str(cell.libcudart)]
    assert O.runtime_not_used(_cell(cell), mapped) is None
    assert O.read_log(enforced.log).redirected[0][1:] == ("libcudart.so.12", str(cell.libcudart))


def test_absolute_path_dlopen_of_a_bundled_copy_is_redirected(
        tmp_path: Path, rts: dict[str, R.ResolvedRuntime], audit_lib: Path) -> None:
    bundled, cell = rts["cu12.4"], rts["cu12.9"]
    prog = _build(tmp_path, "dl", DLOPEN_C, "-ldl")
    offered = O.audit_plan(tmp_path / "o.log", library=audit_lib)
    out, _ = _run([str(prog), str(bundled.libcudart)], cell, offered)
    assert out == f"0 12040 {bundled.libcudart}"
    enforced = O.audit_plan(tmp_path / "e.log", library=audit_lib, enforce=O.enforce_rules(_cell(cell)))
    out, mapped = _run([str(prog), str(bundled.libcudart)], cell, enforced)
    assert out == f"0 12090 {cell.libcudart}"
    assert [m.path for m in _runtimes(mapped)] == [str(cell.libcudart)]
    assert O.read_log(enforced.log).redirected[0][1:] == (str(bundled.libcudart), str(cell.libcudart))


def test_runpath_program_of_another_major_is_not_the_cells_runtime(
        tmp_path: Path, rts: dict[str, R.ResolvedRuntime], audit_lib: Path) -> None:
    bundled, cell = rts["cu13.0"], rts["cu12.9"]
    prog = _build(tmp_path, "runpath", NEEDED_C, str(bundled.libcudart),
                  "-Wl,--enable-new-dtags", f"-Wl,-rpath,{bundled.lib_dir}")
    assert "DT_RUNPATH" in _readelf_d(prog)
    plan = O.audit_plan(tmp_path / "log", library=audit_lib, enforce=O.enforce_rules(_cell(cell)))
    out, mapped = _run([str(prog)], cell, plan)
    assert out == "0 13000"  # enforcement cannot help: libcudart.so.13 is another SONAME
    why = O.runtime_not_used(_cell(cell), mapped)
    assert why is not None
    assert "libcudart.so.13 (13.0.96)" in why
    assert str(bundled.libcudart) in why
    assert "libcudart.so.12 (12.9)" in why
    assert O.observed_runtime(mapped).version == 13000


def test_runpath_program_of_the_cells_soname_gets_the_cells_runtime(
        tmp_path: Path, rts: dict[str, R.ResolvedRuntime], audit_lib: Path) -> None:
    bundled, cell = rts["cu12.4"], rts["cu12.9"]
    prog = _build(tmp_path, "runpath", NEEDED_C, str(bundled.libcudart),
                  "-Wl,--enable-new-dtags", f"-Wl,-rpath,{bundled.lib_dir}")
    plan = O.audit_plan(tmp_path / "log", library=audit_lib, enforce=O.enforce_rules(_cell(cell)))
    out, mapped = _run([str(prog)], cell, plan)
    assert out == "0 12090"
    assert O.runtime_not_used(_cell(cell), mapped) is None


# ------------------------------------------------------------------ pure functions


def _lib(path: str, soname: str, version: str | None = None) -> O.MappedLibrary:
    return O.MappedLibrary(path=path, soname=soname, version=version, version_from="file name" if version else None)


CELL = O.CellRuntime(soname="libcudart.so.12", version=12090, path="/rt/lib/libcudart.so.12")


def test_not_used_rules() -> None:
    torch = [_lib("/site/nvidia/cu13/lib/libcudart.so.13", "libcudart.so.13", "13.0.96"),
             _lib("/usr/lib/libcuda.so.1", "libcuda.so.1")]
    assert "libcudart.so.13 (13.0.96) from /site/nvidia/cu13/lib/libcudart.so.13" in str(O.runtime_not_used(CELL, torch))
    assert O.runtime_not_used(CELL, torch, mode="offered") is None
    # Same SONAME, another file, although enforced: not used either.
    other = [_lib("/elsewhere/libcudart.so.12", "libcudart.so.12", "12.4.127")]
    assert "past the enforced /rt/lib/libcudart.so.12" in str(O.runtime_not_used(CELL, other))
    # NVRTC 13 is no runtime and needs no driver of its major: it says nothing of a runtime
    # (a program compiling with NVRTC 13 through the driver API maps no libcudart at all).
    nvrtc = [_lib("/site/nvidia/cu13/lib/libnvrtc.so.13", "libnvrtc.so.13"), _lib("/usr/lib/libcuda.so.1", "libcuda.so.1")]
    assert O.runtime_not_used(CELL, nvrtc) is None
    seen = O.observed_runtime(nvrtc)
    assert (seen.file, seen.version) == (None, None)
    assert "libnvrtc.so.13 (CUDA 13)" in seen.evidence
    # The driver API only (cuda-bindings' cuDriverGetVersion): nothing contradicts the cell.
    assert O.runtime_not_used(CELL, [_lib("/usr/lib/libcuda.so.1", "libcuda.so.1")]) is None
    assert O.runtime_not_used(CELL, []) is None


def test_cuda_filter_and_versions() -> None:
    names = ["libcudart.so.12", "libcuda.so.1", "libnvrtc.so.13", "libnvrtc-builtins.so.13.0", "libcublasLt.so.13",
             "libnccl.so.2", "libcudnn_graph.so.9", "libnvJitLink.so.13", "libcufft.so.12"]
    assert all(O.is_cuda_library(n) for n in names)
    assert not any(O.is_cuda_library(n) for n in ["libc.so.6", "libcudart_static.a", "libcudaxyz.so", "libpython3.so"])
    assert O.version_from_name("/usr/local/cuda/lib64/libcudart.so.12.9.79") == "12.9.79"
    assert O.version_from_name("/x/libcudart.so.12") is None
    assert O.cuda_int("12.9.79") == 12090
    assert O.cuda_int("13.0.96") == 13000
    assert O.cuda_int("12") is None


def test_a_torn_last_line_is_dropped(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"o\t1\tlibc.so.6\t/lib/libc.so.6\no\t1\tlibcudart.so.12\t/rt/lib/libcud")
    assert [p for _, _, p in O.read_log(log).opened] == ["/lib/libc.so.6"]


def test_container_paths_are_read_through_roots(tmp_path: Path, rts: dict[str, R.ResolvedRuntime]) -> None:
    # A container's /opt/cumatrix/runtime is the unpacked wheel on this host.
    host_root = next(p for p in rts["cu13.0"].libcudart.parents if any(p.glob("*.dist-info")))
    inside = "/opt/cumatrix/runtime/" + rts["cu13.0"].libcudart.relative_to(host_root).as_posix()
    log = tmp_path / "log"
    log.write_text(f"o\t7\tlibcudart.so.13\t{inside}\n")
    [lib] = O.read_mapped(log, roots={"/opt/cumatrix/runtime": host_root})
    assert (lib.path, lib.version, lib.version_from) == (inside, "13.0.96", "wheel nvidia-cuda-runtime")
    [unknown] = O.read_mapped(log)  # without the mapping the file is not reachable: no version
    assert (unknown.soname, unknown.version) == ("libcudart.so.13", None)


def test_plan_rejects_what_the_library_cannot_carry(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="absolute"):
        O.audit_plan(tmp_path / "log", library=tmp_path / "lib.so", enforce=[("libcudart.so.12", "rel/path")])
    plan = O.audit_plan(tmp_path / "log", library=tmp_path / "lib.so", enforce=[("libcudart.so.12", "/a/b")])
    assert dict(plan.env)["CUMATRIX_AUDIT_ENFORCE"] == "libcudart.so.12=/a/b"
    assert plan.writable == (str(tmp_path / "log"),)
    assert plan.mounts == (str(tmp_path / "lib.so"),)


# ------------------------------------------------------------------ the oracle for programs


def _command(driver: str) -> Cell:
    from cumatrix.core.model import Case

    return Cell(kind="command", runtime="cu12.9", driver=driver, case=Case(name="torch", argv=("python3",)))


def test_programs_cuda13_runtime_under_a_12x_driver_is_expected_to_fail() -> None:
    """NVIDIA's rule says such a program fails, not how: the prediction is every failure
    (``fails``), with the rule and the reason, never one exit status."""
    from cumatrix.core.model import Expected
    from cumatrix.predict import oracle

    host = oracle.HostFacts(driver_version=13000)
    for driver in ("emulated-12.4", "emulated-12.8"):
        cell = _command(driver)
        prior = oracle.expect(cell, host, runtime_version=None)
        assert prior.rule == "command-default"
        e = oracle.expect_program(cell, host, prior, runtime_version=13000, evidence="mapped libcudart.so.13")
        assert e.outcomes == {"fails"}
        assert e.rule == "program-major-newer-than-driver"
        assert all(e.admits(o, None) for o in ("exit:1", "exit:2", "crash:SIGSEGV"))
        assert not any(e.admits(o, "n/a") for o in ("ok", "timeout"))
        assert "Python" not in e.reason
        assert "needs a CUDA 13 driver (>= 580.65.06)" in e.reason
        assert driver[-4:] in e.reason
        # A CUDA 12 runtime under an emulated driver other than the real one: the interposer shows.
        assert oracle.expect_program(cell, host, prior, runtime_version=12090).outcomes == {"cannot-emulate"}
    # The same program on a real 12.8 host: the same rule.
    old = oracle.HostFacts(driver_version=12080)
    cell = _command("host")
    prior = oracle.expect(cell, old, runtime_version=None)
    assert oracle.expect_program(cell, old, prior, runtime_version=13000).outcomes == {"fails"}
    # Everything else keeps the prior: a 13.0 driver, an unknown runtime, no driver, a matrix override.
    assert oracle.expect_program(cell, host, prior, runtime_version=13000) is prior
    assert oracle.expect_program(_command("emulated-12.4"), host, prior, runtime_version=None) is prior
    assert oracle.expect_program(cell, oracle.HostFacts(driver_version=None), prior, runtime_version=13000) is prior
    override = Expected(outcomes=frozenset({"ok"}), reason="mine", rule="matrix-override")
    assert oracle.expect_program(_command("emulated-12.4"), host, override, runtime_version=13000) is override
    # A rule about the driver needs a process tree that mapped it.
    cell = _command("emulated-12.4")
    prior = oracle.expect(cell, host, runtime_version=None)
    assert oracle.expect_program(cell, host, prior, runtime_version=13000, driver_used=False) is prior
    assert oracle.expect_program(cell, host, prior, runtime_version=12090, driver_used=False) is prior
    assert oracle.expect_program(cell, host, prior, runtime_version=13000,
                                 driver_used=True).rule == "program-major-newer-than-driver"


# ------------------------------------------------------------------ through `cumatrix run`


def test_run_records_what_each_cell_mapped(tmp_path: Path, rts: dict[str, R.ResolvedRuntime],
                                           write_matrix: object, cli: object) -> None:
    import json

    own12 = _build(tmp_path, "own12", NEEDED_C, str(rts["cu12.4"].libcudart),
                   "-Wl,--disable-new-dtags", f"-Wl,-rpath,{rts['cu12.4'].lib_dir}")
    own13 = _build(tmp_path, "own13", NEEDED_C, str(rts["cu13.0"].libcudart),
                   "-Wl,--enable-new-dtags", f"-Wl,-rpath,{rts['cu13.0'].lib_dir}")
    m = write_matrix(f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: own12, argv: ['{own12}']}}
          - {{name: own13, argv: ['{own13}']}}
          - {{name: no-cuda, argv: [true]}}
    """)
    # Unsandboxed (the old default): own13's RUNPATH is a runtime in the harness's cache, which a
    # sandboxed cell does not see (its loader then finds the host's libcudart.so.13).
    proc = cli("run", m, "--out", tmp_path / "out", "--no-sandbox")  # type: ignore[operator]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = read_cells(tmp_path / "out")
    cell_file = str(rts["cu12.9"].libcudart)
    # Its bundled 12.4 (DT_RPATH) lost to the cell's 12.9: it passes, and says so.
    a = recs["cu12.9/host/own12"]
    assert (a["observed"]["outcome"], a["stdout_tail"].strip()) == ("ok", "0 12090")
    assert (a["fingerprint"]["runtime_file"], a["fingerprint"]["runtime_version"]) == (cell_file, 12090)
    assert [lib["soname"] for lib in a["fingerprint"]["libraries"]] == ["libcudart.so.12"]
    # Its own CUDA 13 runtime (RUNPATH): not the cell's, so not recorded under the cell's name.
    b = recs["cu12.9/host/own13"]
    assert (b["observed"]["outcome"], b["status"]) == ("skipped:runtime-not-used", "skip")
    assert f"libcudart.so.13 (13.0.96) from {rts['cu13.0'].libcudart}" in b["observed"]["detail"]
    assert b["fingerprint"]["runtime_file"] == str(rts["cu13.0"].libcudart)
    assert b["fingerprint"]["runtime_version"] == 13000
    # No CUDA at all: nothing contradicts the cell, nothing exercised its runtime.
    c = recs["cu12.9/host/no-cuda"]
    assert (c["observed"]["outcome"], c["fingerprint"]["runtime_file"], c["fingerprint"]["libraries"]) == ("ok", None, [])
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "skipped:runtime-not-used" in summary
    from importlib import resources

    import jsonschema

    schema = json.loads(resources.files("cumatrix.report").joinpath("schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(json.loads((tmp_path / "out" / "results.json").read_text()))


# ------------------------------------------------------------------ docker


@pytest.fixture(scope="module")
def docker_backend(wheel_cache: Path) -> object:
    import os

    try:
        import docker

        with contextlib.closing(docker.from_env(timeout=30)) as client:  # closed: an open client's socket outlives the check
            client.ping()
    except Exception as e:  # noqa: BLE001 (any failure to reach the daemon means: no docker here)
        if os.environ.get("CUMATRIX_REQUIRE_DOCKER") == "1":
            pytest.fail(f"CUMATRIX_REQUIRE_DOCKER=1 but no Docker daemon answers: {e}")
        pytest.skip(f"no Docker daemon answers ({type(e).__name__}); start one with `sudo dockerd &`")
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(["bash", str(repo / "containers" / "build-base.sh")], check=False, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        pytest.skip(f"containers/build-base.sh failed: {proc.stderr.strip()[-300:]}")
    from cumatrix.execute.docker import DockerBackend

    with DockerBackend(proc.stdout.strip().splitlines()[-1]) as be:
        yield be


@pytest.mark.docker
def test_in_a_container_the_audit_sees_and_enforces_the_images_runtime(
        tmp_path: Path, rts: dict[str, R.ResolvedRuntime], audit_lib: Path, docker_backend: object) -> None:
    from cumatrix.core.model import Runtime

    be = docker_backend
    info = be.prepare_runtime(Runtime(name="cu12.9", requirement=CU129))  # type: ignore[attr-defined]
    assert info.ok, info.problem
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    shutil.copy(rts["cu12.4"].libcudart, bundle / "libcudart.so.12")  # a program's own copy, mounted
    prog = _build(bundle, "dl", DLOPEN_C, "-ldl")
    cell = O.CellRuntime(soname="libcudart.so.12", version=12090, path=info.cudart)
    plan = O.audit_plan(tmp_path / "logs" / "cell.log", library=audit_lib, enforce=O.enforce_rules(cell))
    job = Job(cell_id="cu12.9/host/dl", kind="command", argv=(str(prog), str(bundle / "libcudart.so.12")),
              env=plan.env, mounts=(str(bundle), *plan.mounts), writable=plan.writable, runtime_name="cu12.9",
              timeout=120)
    res = be.run_job(job)  # type: ignore[attr-defined]
    assert res.returncode == 0, res.stderr_tail
    assert res.stdout_tail.strip() == f"0 12090 {info.cudart}"  # the image's runtime, not the bundled copy
    seen = O.conclude(plan, cell)
    assert [lib.path for lib in seen.libraries] == [info.cudart]
    assert (seen.runtime.version, seen.not_used) == (12090, None)
    assert O.read_log(plan.log).redirected[0][2:] == (info.cudart,)


@pytest.mark.docker
def test_run_with_the_docker_backend_records_the_images_runtime(
        tmp_path: Path, docker_backend: object, write_matrix: object, cli: object) -> None:

    m = write_matrix(f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}, cu13.0: {{wheel: {CU130}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: load12, argv: [python3, -c, "import ctypes; ctypes.CDLL('libcudart.so.12')"]}}
    """)
    proc = cli("run", m, "--backend", "docker", "--base-image", docker_backend.base_image,  # type: ignore[attr-defined,operator]
               "--out", tmp_path / "out")
    recs = read_cells(tmp_path / "out")
    ok = recs["cu12.9/host/load12"]
    assert ok["observed"]["outcome"] == "ok", proc.stdout  # type: ignore[attr-defined]
    [lib] = ok["fingerprint"]["libraries"]
    assert lib["path"].startswith("/opt/cumatrix/runtime/")
    assert lib["path"].endswith("/libcudart.so.12")
    assert (lib["soname"], lib["version"]) == ("libcudart.so.12", "12.9")
    assert (ok["fingerprint"]["runtime_file"], ok["fingerprint"]["runtime_version"]) == (lib["path"], 12090)
    # The cu13.0 image has no libcudart.so.12: the command fails on its own, and nothing was mapped.
    bad = recs["cu13.0/host/load12"]
    assert (bad["observed"]["outcome"], bad["fingerprint"]["libraries"]) == ("exit:1", [])


@pytest.mark.docker
def test_a_library_another_user_planted_is_not_loaded_into_docker_cells(
        tmp_path: Path, docker_backend: object, write_matrix: object, cli: object) -> None:
    """Attack: another local user plants a library at the place where the container copy of the
    audit library goes (``$TMPDIR/cumatrix-audit-lib-<uid>-<digest>/libcumatrix_audit.so``, a
    name anyone can work out).  The harness uses that directory only when it is its own and no
    one else may write it: the planted library never runs."""
    import os
    import pwd
    import shutil
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("needs root to act as a second local user")
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not available: no second local user to plant the library as")
    user = "cumatrixpeer"
    try:
        pwd.getpwnam(user)
    except KeyError:
        made = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", user],
                              capture_output=True, text=True, check=False)
        if made.returncode not in (0, 9):
            pytest.skip(f"useradd failed: {made.stderr.strip()}")
    pw = pwd.getpwnam(user)
    built = O.build_audit_library()
    # A temporary directory of the run's own (the harness's $TMPDIR), shared as /tmp is.
    shared_tmp = Path(tempfile.mkdtemp(prefix="cumatrix-shared-tmp-"))
    shared_tmp.chmod(0o1777)
    old_place = shared_tmp / f"cumatrix-audit-lib-{os.geteuid()}-{built.parent.name}"
    src = tmp_path / "planted.c"
    src.write_text('#include <unistd.h>\nunsigned int la_version(unsigned int v) '
                   '{ (void)!write(2, "PLANTED-AUDIT-RAN\\n", 18); return v; }\n')
    planted = tmp_path / "planted.so"
    subprocess.run([gcc(), "-shared", "-fPIC", "-o", str(planted), str(src)], check=True)
    subprocess.run(["install", "-d", "-m", "0755", "-o", user, str(old_place)], check=True)
    try:
        data = planted.read_bytes()
        subprocess.run(["tee", str(old_place / built.name)], input=data, stdout=subprocess.DEVNULL, check=True,
                       user=pw.pw_uid, group=pw.pw_gid)  # written by the other user
        (old_place / built.name).chmod(0o755)  # as its owner would: readable and runnable by all
        m = write_matrix(f"""
            runtimes: {{cu12.9: {{wheel: {CU129}}}}}
            drivers: [host]
            probe: false
            cases:
              - {{name: plain, argv: ["true"]}}
        """)
        proc = cli("run", m, "--backend", "docker", "--base-image", docker_backend.base_image,  # type: ignore[attr-defined,operator]
                   "--out", tmp_path / "out", env={"TMPDIR": str(shared_tmp)})
        recs = read_cells(tmp_path / "out")
        rec = recs["cu12.9/host/plain"]
        assert rec["observed"]["outcome"] == "ok", proc.stdout  # type: ignore[attr-defined]
        assert "PLANTED-AUDIT-RAN" not in rec["stderr_tail"]
    finally:
        shutil.rmtree(shared_tmp, ignore_errors=True)

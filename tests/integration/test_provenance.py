"""Where the runtime a cell's program used came from: its own distribution, the cell, or a leak.

Real parts: gcc-built extensions (shared objects) and programs built here, loaded by
``python3 -c "import ctypes; ..."`` in command cases, real runtime wheels' ``libcudart``
(``cudaRuntimeGetVersion`` answers without a GPU), the rtld-audit library, ``cumatrix run``
in a subprocess, and for the loader-cache and host-toolkit cases the host's own
``ldconfig`` and ``/usr/local`` (root only: they skip with the reason otherwise, and put
back what they changed in ``finally``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cumatrix.execute import provenance as P
from cumatrix.provision import runtimes as R
from helpers.build import shared_library
from helpers.results import read_cells_by_case

pytestmark = pytest.mark.network

CU129 = "nvidia-cuda-runtime-cu12==12.9.79"
CU130 = "nvidia-cuda-runtime==13.0.96"

# An extension that needs the runtime (DT_NEEDED) and answers its version.
NEEDED_C = """
int cudaRuntimeGetVersion(int *);
int probe(void) { int v = 0; return cudaRuntimeGetVersion(&v) == 0 ? v : -1; }
"""

# An extension that dlopens the runtime by name (argv-free: the name is compiled in), the way
# a C extension finds "libcudart.so.13" through the loader's search.
DLOPEN_NAME_C = """
#include <dlfcn.h>
#include <stdio.h>
int probe(void) {
    void *h = dlopen(SONAME, RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\\n", dlerror()); return -1; }
    int (*get)(int *) = (int (*)(int *))dlsym(h, "cudaRuntimeGetVersion");
    int v = 0;
    return get(&v) == 0 ? v : -2;
}
"""

# An extension that dlopens the runtime by a path relative to its own file (how JAX's plugin
# and cuda-pathfinder find site-packages/nvidia/.../lib), or by the absolute path compiled in.
DLOPEN_PATH_C = """
#define _GNU_SOURCE
#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
int probe(void) {
    char path[4096];
    if (RELATIVE[0] == '/') {
        snprintf(path, sizeof path, "%s", RELATIVE);
    } else {
        Dl_info self;
        dladdr((void *)probe, &self);
        char here[4096];
        snprintf(here, sizeof here, "%s", self.dli_fname);
        snprintf(path, sizeof path, "%s/%s", dirname(here), RELATIVE);
    }
    void *h = dlopen(path, RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\\n", dlerror()); return -1; }
    int (*get)(int *) = (int (*)(int *))dlsym(h, "cudaRuntimeGetVersion");
    int v = 0;
    return get(&v) == 0 ? v : -2;
}
"""


def _copy_runtime(rt: R.ResolvedRuntime, directory: Path) -> Path:
    """A copy of a real runtime wheel's libcudart (its SONAME as the file name) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / (rt.soname or rt.libcudart.name)
    shutil.copy2(rt.libcudart.resolve(), target)
    return target


def _case(name: str, ext: Path, python: str = "python3", **extra: object) -> str:
    """A command case that loads ``ext`` with ctypes and prints its ``probe()``."""
    entry = {"name": name, "argv": [python, "-c", f"import ctypes; print(ctypes.CDLL({str(ext)!r}).probe())"],
             **extra}
    return "  - " + json.dumps(entry)


@pytest.fixture(scope="module")
def rts(wheel_cache: Path) -> dict[str, R.ResolvedRuntime]:
    return {"cu12.9": R.from_wheel("cu12.9", CU129), "cu13.0": R.from_wheel("cu13.0", CU130)}


def _run(tmp: Path, cli: Callable[..., subprocess.CompletedProcess[str]], cases: list[str], *,
         env: dict[str, str] | None = None, out: str = "out") -> tuple[int, dict[str, dict[str, object]], Path]:
    matrix = tmp / f"{out}.yaml"
    matrix.write_text(textwrap.dedent(f"""\
        version: 1
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
        """) + "\n".join(cases) + "\n")
    # Unsandboxed (the old default): the cases name their libraries inside `-c` code, which a
    # sandboxed cell (shown what argv, PATH, PYTHONPATH and LD_LIBRARY_PATH name) does not see.
    proc = cli("run", matrix, "--out", tmp / out, "--no-sandbox", env=env)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    recs = read_cells_by_case(tmp / out)
    return proc.returncode, recs, tmp / out


def _runtime_lib(rec: dict[str, object]) -> dict[str, object]:
    fp = rec["fingerprint"]
    assert isinstance(fp, dict)
    [lib] = [lib for lib in fp["libraries"] if str(lib["soname"]).startswith("libcudart")]
    return lib


def _reports_name(out: Path, path: str, how: str) -> None:
    """Every report of the run names the leaked file and how the loader found it (Markdown
    escapes underscores, HTML and XML their special characters)."""
    import html

    for name in ("summary.md", "index.html", "junit.xml", "results.json"):
        text = (out / name).read_text()
        text = html.unescape(text.replace("\\_", "_")) if name != "results.json" else text
        assert f"runtime-leak:{path}" in text, name
        assert how in text, (name, how)
    from importlib import resources

    import jsonschema

    schema = json.loads(resources.files("cumatrix.report").joinpath("schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(json.loads((out / "results.json").read_text()))


# ------------------------------------------------------------------ bundled, the cell's own, a stray entry


def test_bundled_cell_and_inherited_runtimes(tmp_path: Path, rts: dict[str, R.ResolvedRuntime],
                                             cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    cu13 = rts["cu13.0"]
    # Bundled: an extension whose DT_RPATH $ORIGIN/lib holds its own copy of the CUDA 13 runtime
    # (DT_RPATH, searched before LD_LIBRARY_PATH: the stray entry below is not reached).
    pkg = tmp_path / "mypkg"
    own = _copy_runtime(cu13, pkg / "lib")
    bundled = shared_library(pkg / "_ext.so", NEEDED_C, str(own), "-Wl,--disable-new-dtags", "-Wl,-rpath,$ORIGIN/lib")
    # The cell's own: an extension that needs libcudart.so.12 and brings none.
    plain12 = shared_library(tmp_path / "plain12" / "_ext.so", NEEDED_C, str(rts["cu12.9"].libcudart))
    # Leaked through an LD_LIBRARY_PATH entry cumatrix inherited (not a host directory: the
    # entry, not the place, makes it a leak).
    stray = tmp_path / "stray-lib"
    stray_file = _copy_runtime(cu13, stray)
    by_name = shared_library(tmp_path / "byname" / "_ext.so", DLOPEN_NAME_C, '-DSONAME="libcudart.so.13"', "-ldl")
    code, recs, out = _run(tmp_path, cli, [
        _case("bundled", bundled), _case("own", plain12), _case("own-offered", plain12, runtime="offered"),
        _case("stray", by_name)], env={"LD_LIBRARY_PATH": str(stray)})
    assert code == 1

    b = recs["bundled"]
    assert (b["observed"]["outcome"], b["status"], b["stdout_tail"].strip()) == ("skipped:runtime-not-used", "skip", "13000")
    lib = _runtime_lib(b)
    assert (lib["path"], lib["origin"], lib["found_by"]) == (str(own), "bundled", "rpath")
    assert f"DT_RPATH $ORIGIN/lib of {bundled}" in lib["how"]
    assert b["fingerprint"]["runtime_origin"]["origin"] == "bundled"

    cell_file = str(rts["cu12.9"].libcudart)
    for name, step in (("own", "enforced"), ("own-offered", "ld_library_path")):
        r = recs[name]
        assert (r["observed"]["outcome"], r["status"], r["stdout_tail"].strip()) == ("ok", "pass", "12090"), name
        lib = _runtime_lib(r)
        assert (lib["path"], lib["origin"], lib["found_by"]) == (cell_file, "cell", step), name

    s = recs["stray"]
    assert (s["observed"]["outcome"], s["status"]) == (f"runtime-leak:{stray_file}", "fail")
    lib = _runtime_lib(s)
    assert (lib["origin"], lib["found_by"]) == ("outside", "ld_library_path")
    how = f"found through LD_LIBRARY_PATH entry {stray} (inherited: set by neither the harness nor the case)"
    assert s["observed"]["detail"].startswith(how)
    assert "the process's own outcome: ok" in s["observed"]["detail"]
    assert lib["how"] == f"{how} (requested as libcudart.so.13 by {by_name})"
    _reports_name(out, str(stray_file), how)


def test_a_site_runtime_from_a_host_toolkit_is_the_cells_own(
        tmp_path: Path, rts: dict[str, R.ResolvedRuntime], cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """``site: true`` found through $CUDA_HOME (a toolkit installed on the host, used on purpose):
    its runtime is the cell's, whether the program asks for it by name or through an RPATH
    that names the toolkit (an nvcc-built extension's ``-rpath $CUDA_HOME/lib64``)."""
    lib64 = tmp_path / "toolkit" / "lib64"
    lib64.mkdir(parents=True)
    shutil.copy2(rts["cu13.0"].libcudart.resolve(), lib64 / "libcudart.so.13.0.96")
    (lib64 / "libcudart.so.13").symlink_to("libcudart.so.13.0.96")
    by_name = shared_library(tmp_path / "byname" / "_ext.so", DLOPEN_NAME_C, '-DSONAME="libcudart.so.13"', "-ldl")
    linked = shared_library(tmp_path / "nvcc-style" / "_ext.so", NEEDED_C, str(lib64 / "libcudart.so.13"),
                     "-Wl,--enable-new-dtags", f"-Wl,-rpath,{lib64}")
    matrix = tmp_path / "site.yaml"
    matrix.write_text("version: 1\nruntimes: {host-toolkit: {site: true}}\ndrivers: [host]\nprobe: false\ncases:\n"
                      + "\n".join([_case("by-name", by_name), _case("linked", linked, runtime="offered")]) + "\n")
    proc = cli("run", matrix, "--out", tmp_path / "out", "--no-sandbox",  # as _run
               env={"CUDA_HOME": str(tmp_path / "toolkit")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = read_cells_by_case(tmp_path / "out")
    for name in ("by-name", "linked"):
        r = recs[name]
        assert (r["observed"]["outcome"], r["stdout_tail"].strip()) == ("ok", "13000"), (name, r["observed"])
        assert _runtime_lib(r)["origin"] == "cell", name


# ------------------------------------------------------------------ torch, CuPy, JAX: their own CUDA 13 in a cu12.9 cell


def _venv(where: Path) -> tuple[Path, Path]:
    """A real virtual environment (no pip): its interpreter and site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    [site] = list(where.glob("lib/python*/site-packages"))
    return where / "bin" / "python", site


def test_wheel_layouts_of_torch_cupy_and_jax_are_bundled(tmp_path: Path, rts: dict[str, R.ResolvedRuntime],
                                                         cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """The layout the GPU clients matrix meets: nvidia/cu13/lib/libcudart.so.13 in site-packages,
    reached through the RUNPATH of an extension in another package directory of the same
    environment (torch/lib/libtorch_cuda.so: $ORIGIN/../../nvidia/cu13/lib), or by a path
    relative to an extension's own file (JAX's plugin, cuda-pathfinder for CuPy)."""
    cu13 = rts["cu13.0"]
    python, site = _venv(tmp_path / "env")
    libcudart = _copy_runtime(cu13, site / "nvidia" / "cu13" / "lib")
    torch = shared_library(site / "torch" / "lib" / "libtorch_cuda.so", NEEDED_C, str(libcudart),
                    "-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN/../../nvidia/cu13/lib")
    jax = shared_library(site / "jax_plugins" / "xla_cuda13" / "xla_cuda_plugin.so", DLOPEN_PATH_C,
                  '-DRELATIVE="../../nvidia/cu13/lib/libcudart.so.13"', "-ldl")
    # Another environment's copy, opened by absolute path from outside both: not the program's.
    _, other_site = _venv(tmp_path / "other-env")
    other = _copy_runtime(cu13, other_site / "nvidia" / "cu13" / "lib")
    wrong = shared_library(tmp_path / "loose" / "_ext.so", DLOPEN_PATH_C, f'-DRELATIVE="{other}"', "-ldl")
    # cuda-pathfinder (CuPy, cuda-bindings): ctypes.CDLL of the absolute path, from Python itself.
    pathfinder = json.dumps({"name": "cupy-env", "argv": [str(python), "-c", (
        "import ctypes; v = ctypes.c_int(); "
        f"ctypes.CDLL({str(libcudart)!r}).cudaRuntimeGetVersion(ctypes.byref(v)); print(v.value)")]})
    _, recs, _ = _run(tmp_path, cli, [
        _case("torch-env", torch, str(python)),   # the environment's own interpreter
        _case("torch-plain", torch),              # the host's python3: the same environment's packages still
        _case("jax-env", jax, str(python)),
        "  - " + pathfinder,
        _case("other-env", wrong, str(python))])
    for name, step in (("torch-env", "rpath"), ("torch-plain", "rpath"), ("jax-env", "path"), ("cupy-env", "path")):
        r = recs[name]
        assert (r["observed"]["outcome"], r["status"], r["stdout_tail"].strip()) == \
            ("skipped:runtime-not-used", "skip", "13000"), (name, r["observed"])
        lib = _runtime_lib(r)
        # As the loader opened it: through $ORIGIN/../../, not normalised.
        assert (os.path.normpath(str(lib["path"])), lib["origin"], lib["found_by"]) == \
            (str(libcudart), "bundled", step), name
    assert "inside the program's own environment" in _runtime_lib(recs["torch-env"])["why"]
    assert "inside the program's own environment" in _runtime_lib(recs["cupy-env"])["why"]
    assert "a package of the same environment as" in _runtime_lib(recs["torch-plain"])["why"]
    o = recs["other-env"]
    assert (o["observed"]["outcome"], o["status"]) == (f"runtime-leak:{other}", "fail")
    assert "another Python environment's packages" in _runtime_lib(o)["why"]


# ------------------------------------------------------------------ the host: loader cache, toolkit directory


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: it adds a directory to the loader cache (ldconfig) or creates /usr/local/cuda-*")
    if shutil.which("ldconfig") is None and not Path("/sbin/ldconfig").exists():
        pytest.skip("no ldconfig on this host")


def _ldconfig() -> None:
    subprocess.run([shutil.which("ldconfig") or "/sbin/ldconfig"], check=True, timeout=120)


@pytest.fixture
def cached_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory added to the loader cache through a file of /etc/ld.so.conf.d/ (named to sort
    first, so its libcudart.so.13 is the one the cache answers), removed afterwards."""
    _need_root()
    directory = tmp_path / "ldcache"
    directory.mkdir()
    conf = Path("/etc/ld.so.conf.d") / f"00-cumatrix-test-{uuid.uuid4().hex[:12]}.conf"
    try:
        conf.write_text(f"{directory}\n")
        yield directory
    finally:
        conf.unlink(missing_ok=True)
        _ldconfig()


def test_a_runtime_from_the_loader_cache_is_a_leak(tmp_path: Path, cached_dir: Path, rts: dict[str, R.ResolvedRuntime],
                                                   cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    leaked = _copy_runtime(rts["cu13.0"], cached_dir)
    _ldconfig()
    listed = subprocess.run([shutil.which("ldconfig") or "/sbin/ldconfig", "-p"], capture_output=True, text=True,
                            check=True).stdout
    first = next(line for line in listed.splitlines() if line.strip().startswith("libcudart.so.13 "))
    assert first.endswith(str(leaked)), first
    ext = shared_library(tmp_path / "ext" / "_ext.so", DLOPEN_NAME_C, '-DSONAME="libcudart.so.13"', "-ldl")
    code, recs, out = _run(tmp_path, cli, [_case("cached", ext)])
    r = recs["cached"]
    assert code == 1
    assert (r["observed"]["outcome"], r["status"], r["stdout_tail"].strip()) == (f"runtime-leak:{leaked}", "fail", "13000")
    lib = _runtime_lib(r)
    assert (lib["origin"], lib["found_by"]) == ("outside", "ld.so.cache")
    how = "found through the loader cache (ld.so.cache)"
    assert lib["how"] == f"{how} (requested as libcudart.so.13 by {ext})"
    _reports_name(out, str(leaked), how)


@pytest.fixture
def toolkit_dir() -> Iterator[Path]:
    """A /usr/local/cuda-XX.Y-style toolkit directory (lib64/), removed afterwards."""
    _need_root()
    root = Path(f"/usr/local/cuda-0.{uuid.uuid4().int % 1000}-cumatrix-test-{uuid.uuid4().hex[:8]}")
    try:
        (root / "lib64").mkdir(parents=True)
        yield root / "lib64"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_host_toolkit_on_the_cases_own_search_path_is_a_leak_unless_allowed(
        tmp_path: Path, toolkit_dir: Path, rts: dict[str, R.ResolvedRuntime],
        cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    leaked = _copy_runtime(rts["cu13.0"], toolkit_dir)
    ext = shared_library(tmp_path / "ext" / "_ext.so", DLOPEN_NAME_C, '-DSONAME="libcudart.so.13"', "-ldl")
    env = {"LD_LIBRARY_PATH": str(toolkit_dir)}
    code, recs, out = _run(tmp_path, cli, [
        _case("toolkit", ext, env=env),
        _case("toolkit-allowed", ext, env=env, allow_runtime=[f"{toolkit_dir.parent.parent}/cuda-*/lib64/libcudart.so.13"])])
    assert code == 1
    r = recs["toolkit"]
    assert (r["observed"]["outcome"], r["status"]) == (f"runtime-leak:{leaked}", "fail")
    lib = _runtime_lib(r)
    assert (lib["origin"], lib["found_by"]) == ("outside", "ld_library_path")
    how = f"found through LD_LIBRARY_PATH entry {toolkit_dir} (set by the case)"
    assert how in lib["how"]
    assert "host toolkit" in lib["why"]
    _reports_name(out, str(leaked), how)
    # Allowed by the case: the host runtime is used on purpose; of another SONAME than the
    # cell's, so the cell still did not test it under its name.
    a = recs["toolkit-allowed"]
    assert (a["observed"]["outcome"], a["status"]) == ("skipped:runtime-not-used", "skip")
    assert _runtime_lib(a)["origin"] == "allowed"


def test_an_rpath_is_the_programs_own_when_relative_to_its_file_wherever_it_is_installed(
        tmp_path: Path, toolkit_dir: Path) -> None:
    """A program installed under /usr/local/lib with its runtime beside it ($ORIGIN) brings its
    own; one whose RUNPATH names a toolkit directory by its absolute path uses the host's."""
    app = Path(f"/usr/local/lib/cumatrix-test-{uuid.uuid4().hex[:8]}")
    try:
        ext = shared_library(app / "ext.so", NEEDED_C, "-Wl,--unresolved-symbols=ignore-all", "-Wl,--enable-new-dtags",
                      "-Wl,-rpath,$ORIGIN/lib")
        nvcc = shared_library(app / "nvcc.so", NEEDED_C, "-Wl,--unresolved-symbols=ignore-all", "-Wl,--enable-new-dtags",
                       f"-Wl,-rpath,{toolkit_dir}")
        own, host = f"{app}/lib/libcudart.so.13", f"{toolkit_dir}/libcudart.so.13"
        lib = {own: P.Found(path=own, step="rpath", request="libcudart.so.13", requester=str(ext)),
               host: P.Found(path=host, step="rpath", request="libcudart.so.13", requester=str(nvcc))}

        class M:
            def __init__(self, path: str) -> None:
                self.path, self.name = path, "libcudart.so.13"

        a, b = P.trace([M(own), M(host)], lib, P.Setting(cell_file="/rt/libcudart.so.12"))
        assert (a.origin, a.how) == ("bundled", f"found through DT_RUNPATH $ORIGIN/lib of {ext} (requested as libcudart.so.13)")
        assert (b.origin, b.why) == ("outside", "the program's RPATH/RUNPATH names a host toolkit or system directory")
    finally:
        shutil.rmtree(app, ignore_errors=True)


# ------------------------------------------------------------------ the rules on their own


def test_search_lines_say_which_step_found_each_object() -> None:
    lines = ["q\t7\t/x/ext.so\tlibcudart.so.13",
             "s\t7\tld_library_path\t/a/libcudart.so.13",
             "s\t7\tld.so.cache\t/usr/local/cuda-13.0/lib/libcudart.so.13",
             "o\t7\tlibcudart.so.13\t/usr/local/cuda-13.0/lib/libcudart.so.13",
             "q\t8\t\t/site/nvidia/cu13/lib/libcudart.so.13",
             "o\t8\tlibcudart.so.13\t/site/nvidia/cu13/lib/libcudart.so.13",
             "r\t9\tlibcudart.so.12\t/rt/libcudart.so.12",
             "o\t9\tlibcudart.so.12\t/rt/libcudart.so.12",
             "o\t9\t\t/lib/libc.so.6"]
    got = P.parse_searches(lines)
    assert got["/usr/local/cuda-13.0/lib/libcudart.so.13"] == P.Found(
        path="/usr/local/cuda-13.0/lib/libcudart.so.13", step="ld.so.cache", request="libcudart.so.13",
        requester="/x/ext.so")
    assert got["/site/nvidia/cu13/lib/libcudart.so.13"].step == "path"
    assert got["/rt/libcudart.so.12"].step == "enforced"
    assert got["/lib/libc.so.6"].step == "unknown"


def test_locations() -> None:
    assert P.host_location("/usr/local/cuda-13.0/lib64/libcudart.so.13")
    assert P.host_location("/usr/local/cuda/lib64/libcudart.so.12")
    assert P.host_location("/usr/lib/x86_64-linux-gnu/x.so")
    assert not P.host_location("/usr/local/lib/python3.12/dist-packages/nvidia/cu13/lib/libcudart.so.13")
    assert not P.host_location("/home/u/proj/lib/libcudart.so.13")
    assert not P.host_location("/library/x.so")
    assert P.package_tree("/e/lib/python3.11/site-packages/nvidia/cu13/lib/libcudart.so.13") == \
        "/e/lib/python3.11/site-packages"
    assert P.allowed_by("/usr/local/cuda-13.0/lib64/libcudart.so.13", ["/usr/local/cuda-*/lib64/libcudart.so.*"])
    assert P.allowed_by("/usr/local/cuda-13.0/lib64/libcudart.so.13", ["/usr/local/cuda-12.*/lib64/*"]) is None

#!/usr/bin/env python3
"""Write docs/tutorial-runtimes.md by running what it shows.

Builds three small C extensions with gcc (one bringing its own CUDA 13 runtime through
``$ORIGIN``, one that asks the loader for ``libcudart.so.13`` by name, one that needs the
cell's ``libcudart.so.12``), runs them as command cases of a cu12.9 cell with ``cumatrix run``,
and writes the page from the run's ``results.jsonl``: every outcome, detail and search step
shown there comes from this run.  Paths under the demo directory are shown as ``$DEMO``.

    python scripts/tutorial-runtimes.py [--out docs/tutorial-runtimes.md] [--demo DIR]

The leaked extension finds whatever ``libcudart.so.13`` this host's loader finds by name:
on a host whose loader cache lists a CUDA 13 toolkit (``ldconfig -p | grep libcudart.so.13``)
that one; elsewhere the script puts a copy on an ``LD_LIBRARY_PATH`` entry of the shell that
runs cumatrix (an entry the harness did not set), and the page says which it was.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from cumatrix.provision import runtimes as R  # noqa: E402

CU129 = "nvidia-cuda-runtime-cu12==12.9.79"
CU130 = "nvidia-cuda-runtime==13.0.96"

NEEDED_C = """\
/* needs the runtime (DT_NEEDED); where it comes from is the link's business */
int cudaRuntimeGetVersion(int *);
int probe(void) { int v = 0; return cudaRuntimeGetVersion(&v) == 0 ? v : -1; }
"""

BY_NAME_C = """\
/* asks the loader for libcudart.so.13 by name, as a C extension that dlopens "the" runtime does */
#include <dlfcn.h>
int probe(void) {
    void *h = dlopen("libcudart.so.13", RTLD_NOW);
    int (*get)(int *) = h ? (int (*)(int *))dlsym(h, "cudaRuntimeGetVersion") : 0;
    int v = 0;
    return get && get(&v) == 0 ? v : -1;
}
"""


def _sh(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)  # type: ignore[call-overload]


def _cached_cudart13() -> str | None:
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        listed = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return None
    for line in listed.splitlines():
        if line.strip().startswith("libcudart.so.13 ") and "=>" in line:
            return line.split("=>", 1)[1].strip()
    return None


def _wheel_root(lib: Path) -> Path:
    """The directory an unpacked runtime wheel was unpacked into (the one holding its .dist-info)."""
    for parent in lib.parents:
        if any(parent.glob("*.dist-info")):
            return parent
    return lib.parent


def build(demo: Path) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The extensions, and the gcc command of each (as shown)."""
    cu12 = R.from_wheel("cu12.9", CU129)
    cu13 = R.from_wheel("cu13.0", CU130)
    cmds: dict[str, list[str]] = {}
    srcs: dict[str, str] = {}
    for name, src in (("bundled", NEEDED_C), ("leaked", BY_NAME_C), ("own", NEEDED_C)):
        (demo / name).mkdir(parents=True, exist_ok=True)
        (demo / name / "ext.c").write_text(src)
        srcs[name] = src
    (demo / "bundled" / "lib").mkdir(exist_ok=True)
    shutil.copy2(cu13.libcudart.resolve(), demo / "bundled" / "lib" / "libcudart.so.13")
    cmds["bundled"] = ["cp", "$CU13_WHEEL/" + cu13.libcudart.relative_to(_wheel_root(cu13.libcudart)).as_posix(),
                       "bundled/lib/",
                       "&&", "gcc", "-shared", "-fPIC", "-o", "bundled/_ext.so", "bundled/ext.c",
                       "bundled/lib/libcudart.so.13", "-Wl,--enable-new-dtags", "-Wl,-rpath,'$ORIGIN/lib'"]
    _sh(["gcc", "-shared", "-fPIC", "-o", "bundled/_ext.so", "bundled/ext.c", "bundled/lib/libcudart.so.13",
         "-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN/lib"], cwd=demo)
    cmds["leaked"] = ["gcc", "-shared", "-fPIC", "-o", "leaked/_ext.so", "leaked/ext.c", "-ldl"]
    _sh(cmds["leaked"], cwd=demo)
    shutil.copy2(cu12.libcudart.resolve(), demo / "own" / "libcudart.so.12")  # only to link against
    cmds["own"] = ["gcc", "-shared", "-fPIC", "-o", "own/_ext.so", "own/ext.c",
                   "$CU12_WHEEL/" + cu12.libcudart.relative_to(_wheel_root(cu12.libcudart)).as_posix()]
    _sh(["gcc", "-shared", "-fPIC", "-o", "own/_ext.so", "own/ext.c", "own/libcudart.so.12"], cwd=demo)
    (demo / "own" / "libcudart.so.12").unlink()  # the extension brings none: the cell's answers
    return cmds, srcs


def run(demo: Path, allow: str | None) -> tuple[subprocess.CompletedProcess[str], dict[str, dict[str, object]], str]:
    cases = []
    for name in ("bundled", "leaked", "own"):
        ext = demo / name / "_ext.so"
        cases.append({"name": name, "argv": ["python3", "-c", f"import ctypes; print(ctypes.CDLL('{ext}').probe())"]})
    if allow:
        cases.append({**cases[1], "name": "leaked-allowed", "allow_runtime": [allow]})
    matrix = "version: 1\nruntimes: {cu12.9: {wheel: %s}}\ndrivers: [host]\nprobe: false\ncases:\n%s" % (
        CU129, "".join(f"  - {json.dumps(c)}\n" for c in cases))
    (demo / "matrix.yaml").write_text(matrix)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    proc = subprocess.run([sys.executable, "-m", "cumatrix", "run", "matrix.yaml", "--out", "out"], cwd=demo, env=env,
                          capture_output=True, text=True, timeout=600)
    recs = {r["id"].split("/")[-1]: r for r in map(json.loads, (demo / "out" / "results.jsonl").read_text().splitlines())
            if r.get("type") == "cell"}
    return proc, recs, matrix


def page(demo: Path, cmds: dict[str, list[str]], srcs: dict[str, str], matrix: str,
         proc: subprocess.CompletedProcess[str], recs: dict[str, dict[str, object]], route: str) -> str:
    wheels = {"$CU12_WHEEL": _wheel_root(R.from_wheel("cu12.9", CU129).libcudart),
              "$CU13_WHEEL": _wheel_root(R.from_wheel("cu13.0", CU130).libcudart)}

    def show(text: object) -> str:
        out = str(text).replace(str(demo), "$DEMO")
        for name, root in wheels.items():
            out = out.replace(str(root), name)
        return out

    def lib(name: str) -> dict[str, object]:
        fp = recs[name]["fingerprint"]
        assert isinstance(fp, dict)
        return next(x for x in fp["libraries"] if str(x["soname"]).startswith("libcudart"))

    def outcome(name: str) -> str:
        r = recs[name]
        o = r["observed"]
        assert isinstance(o, dict)
        l = lib(name)
        return textwrap.dedent(f"""\
            ```
            outcome   {show(o["outcome"])}   (status: {r["status"]})
            stdout    {show(str(r["stdout_tail"]).strip())}
            library   {show(l["path"])}
            origin    {l["origin"]}   found_by {l["found_by"]}
            how       {show(l["how"])}
            why       {show(l["why"])}
            ```
            """) + (f"\nThe detail of the outcome:\n\n```\n{show(o['detail'])}\n```\n" if o.get("detail") else "")

    tail = [ln for ln in proc.stdout.splitlines() if ln.startswith("cumatrix:")]
    sections = {
        "bundled": ("Bundled: the extension brings its own runtime",
                    "The extension carries a copy of the CUDA 13 runtime beside it and finds it through its own "
                    "`DT_RUNPATH` (`$ORIGIN/lib`), as torch, JAX and CuPy find the runtime inside their wheels. "
                    "In a cu12.9 cell it did not run on the cell's runtime, by design: the cell is skipped, "
                    "not failed."),
        "leaked": ("Leaked: the host's runtime, found by accident",
                   "The extension asks the loader for `libcudart.so.13` by name and brings none. " + route +
                   " That runtime is neither the cell's nor the program's: the program works here only "
                   "because of this host, so the cell fails, naming the file and the search step that found it."),
        "own": ("The cell's own: the extension uses the runtime it is given",
                "The extension needs `libcudart.so.12` and brings none: the cell's runtime answers "
                "(the harness enforces it over any other copy of the same SONAME)."),
    }
    parts = [textwrap.dedent("""\
        # Where the runtime came from

        A cell offers a CUDA runtime (`runtimes:` of the matrix), but the program decides what it
        loads. Every cell records, for each CUDA library its process tree mapped, where it came from
        (`origin`) and how the dynamic loader found it (`found_by`, the search step the rtld-audit
        library saw: `rpath`, `ld_library_path`, `ld.so.cache`, `default`, `path`, `enforced`), in
        `fingerprint.libraries` of `results.jsonl` and `results.json`:

        | origin | what it means | the cell |
        |---|---|---|
        | `cell` | the cell's runtime (or a directory the harness put first on `LD_LIBRARY_PATH`) | judged as usual |
        | `bundled` | inside the program's own distribution: found through the `DT_RPATH`/`RUNPATH` (`$ORIGIN`) of one of its objects, or under the package directories of the program's own Python environment | another SONAME than the cell's: `skipped:runtime-not-used` |
        | `allowed` | outside, but named by the case's `allow_runtime` (paths or globs) | as `bundled` |
        | `outside` | neither: a host toolkit (`/usr/local/cuda*`, `/usr/lib*`), the loader cache, an `LD_LIBRARY_PATH` entry the harness did not set, another environment's wheel | **fails**: `runtime-leak:PATH` |

        Below, three small extensions, each loaded with `ctypes` by a command case of a cu12.9 cell.
        Everything shown under "what the cell got" was produced by running them:
        `python scripts/tutorial-runtimes.py` rebuilds the extensions, runs the matrix and rewrites
        this page (paths under its scratch directory read `$DEMO`; `$CU12_WHEEL` and `$CU13_WHEEL`
        are the unpacked runtime wheels).

        The matrix (`$DEMO/matrix.yaml`):
        """), f"```yaml\n{show(matrix)}```\n", "```sh\ncumatrix run matrix.yaml --out out\n```\n",
        "It ends with:\n", "```\n" + show("\n".join(tail)) + "\n```\n"]
    for name in ("bundled", "leaked", "own"):
        title, text = sections[name]
        parts += [f"## {title}\n", text + "\n", f"```c\n{srcs[name]}```\n",
                  "```sh\n" + " ".join(cmds[name]) + "\n```\n", "What the cell got:\n", outcome(name)]
    if "leaked-allowed" in recs:
        case = recs["leaked-allowed"]
        parts += ["## Allowing a host runtime\n",
                  "A program meant to use the host's runtime says so in its case. The last case of the matrix "
                  "above, `leaked-allowed`, is the leaked extension with the file it found allowed "
                  f"(`allow_runtime: [{show(lib('leaked')['path'])}]`). What the cell got:\n",
                  outcome("leaked-allowed"),
                  "Allowed, the runtime counts as the program's own: of another SONAME than the cell's, "
                  "the cell is skipped as `skipped:runtime-not-used`. Globs "
                  "(`/usr/local/cuda-*/lib64/libcudart.so.*`) are accepted; relative paths and directories are "
                  "refused by `cumatrix validate` with `file:line:col`.\n"]
        assert case["status"] != "fail", case
    parts += [textwrap.dedent("""\
        ## torch, JAX and CuPy

        They are `bundled`: torch's `libtorch_global_deps.so` and JAX's CUDA plugin reach
        `site-packages/nvidia/cu13/lib/libcudart.so.13` through their `RUNPATH`
        (`$ORIGIN/../../nvidia/cu13/lib`), inside the interpreter's own environment; CuPy maps no
        libcudart (its runtime is linked statically). `tests/unit/test_provenance_gpu_logs.py` holds
        the rtld-audit logs of the three on an NVIDIA H200 host whose loader cache also lists a CUDA 13
        toolkit, and checks that verdict; `tests/integration/test_provenance.py` builds the same
        layouts with gcc on any host.

        ## In the reports

        `runtime-leak:PATH` is a mismatch like any other: `summary.md` lists it under Mismatches with
        the detail (how the loader found the file, first), `junit.xml` carries it as the failure's
        type and message, `index.html` shows it in the grid and the cell's panel (with
        `fingerprint.libraries`), and `results.json` holds the outcome, the detail and each
        library's `origin`, `found_by` and `how`.
        """)]
    return "\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "tutorial-runtimes.md")
    ap.add_argument("--demo", type=Path, default=None, help="scratch directory (default: a new temporary one)")
    args = ap.parse_args()
    demo = (args.demo or Path(tempfile.mkdtemp(prefix="cumatrix-tutorial-"))).resolve()
    demo.mkdir(parents=True, exist_ok=True)
    cmds, srcs = build(demo)
    cached = _cached_cudart13()
    if cached:
        route = (f"On the host that made this page the loader cache lists a CUDA 13 toolkit's "
                 f"`{cached}`, so that is what it got.")
    else:
        stray = demo / "stray-lib"
        stray.mkdir(exist_ok=True)
        shutil.copy2(R.from_wheel("cu13.0", CU130).libcudart.resolve(), stray / "libcudart.so.13")
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
            [str(stray), *([os.environ["LD_LIBRARY_PATH"]] if os.environ.get("LD_LIBRARY_PATH") else [])])
        route = ("The host that made this page has no CUDA 13 runtime in its loader cache, so the script "
                 "put one on an `LD_LIBRARY_PATH` entry of the shell that ran cumatrix (`$DEMO/stray-lib`), "
                 "as a stray entry in a user's environment would.")
    proc, recs, matrix = run(demo, None)
    leaked = recs["leaked"]["fingerprint"]
    assert isinstance(leaked, dict)
    found = next((x["path"] for x in leaked["libraries"] if str(x["soname"]).startswith("libcudart")), None)
    if found:
        proc, recs, matrix = run(demo, str(found))
    args.out.write_text(page(demo, cmds, srcs, matrix, proc, recs, route))
    print(f"wrote {args.out} (demo in {demo}; cumatrix exited {proc.returncode})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

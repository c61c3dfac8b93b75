"""Where each CUDA library a cell's processes mapped came from, and whether that was allowed.

A program may bring its own runtime by design: torch, JAX and CuPy load the copy inside
their own wheels, found through the ``DT_RPATH``/``RUNPATH`` (often ``$ORIGIN/...``) of one
of their objects or by a path under their own package tree.  Such a runtime is *bundled*:
a cell of another runtime did not test the program under its name, and says so
(``skipped:runtime-not-used``).  A runtime that came from neither the program's own
distribution nor the cell (the host's toolkit under ``/usr/local/cuda*``, ``/usr/lib*``,
the loader cache, an ``LD_LIBRARY_PATH`` entry the harness did not set, another Python
environment's wheel) is a *leak*: the program works here only by accident of this host,
and the cell fails with ``runtime-leak:PATH``.

The evidence is what the rtld-audit library (``csrc/audit.c``) logs for CUDA library names:
``q`` (a request, and the object it was made on behalf of), ``s`` (each candidate the
loader tried, with the search step: ``rpath``, ``ld_library_path``, ``ld.so.cache``,
``default``), ``r`` (a request the harness redirected to the cell's runtime) and ``o`` (the
object mapped).  :func:`read_searches` turns them into one :class:`Found` per mapped path;
:func:`trace` takes the mapped libraries, those findings and the cell's :class:`Setting`
and gives each library its :class:`Provenance`.  Both only read: the list of mapped paths
may come from the audit log or from any other view of the process tree's mappings.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import site
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal, Protocol

from cumatrix.core.witness import open_cell_file, read_cell_file

#: How the loader found an object: one of the search steps the audit logs, ``path`` (it was
#: requested by a path, e.g. a ``dlopen`` of an absolute path: no search), ``enforced`` (the
#: harness answered the request with the cell's runtime), ``unknown`` (no search was logged).
Step = Literal["rpath", "ld_library_path", "ld.so.cache", "default", "secure", "path", "enforced", "unknown"]
#: ``cell``: the cell's own runtime (or a directory the harness put first);
#: ``bundled``: inside the program's own distribution; ``allowed``: outside, but named by
#: the case's ``allow_runtime``; ``driver``: the host's driver (``libcuda``, ``libnvidia-*``),
#: which every cell runs on; ``outside``: none of these, a leak.
Origin = Literal["cell", "bundled", "allowed", "driver", "outside"]
_DRIVER = re.compile(r"^lib(?:cuda\.so|nvidia-)")

OUTCOME_PREFIX = "runtime-leak:"

_STEPS = {"rpath", "ld_library_path", "ld.so.cache", "default", "secure"}
_STEP_WORDS = {
    "rpath": "DT_RPATH/DT_RUNPATH",
    "ld_library_path": "LD_LIBRARY_PATH",
    "ld.so.cache": "the loader cache (ld.so.cache)",
    "default": "the loader's default directories",
    "secure": "the loader's secure directories",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Found:
    """How the loader came to map one path (the first time any process of the cell did)."""

    path: str
    step: Step
    request: str = ""  # the name asked for (``libcudart.so.13``, or a path)
    requester: str = ""  # the object the request was made on behalf of ("" is the main program)


def parse_searches(lines: Iterable[str]) -> dict[str, Found]:
    """:class:`Found` per mapped path, from audit log lines (``kind\\tpid\\tfield\\tpath``)."""
    # A process's requests are searched one at a time (the loader holds its lock), so the
    # candidates that follow a request, and the object mapped next, belong to it.
    current: dict[str, tuple[str, str, list[tuple[str, str]]]] = {}
    redirected: dict[str, dict[str, str]] = {}  # pid -> {given path: request}
    out: dict[str, Found] = {}
    for line in lines:
        parts = line.split("\t", 3)
        if len(parts) != 4 or not parts[1].isdigit():
            continue
        _take(parts, current, redirected, out)
    return out


def _take(parts: list[str], current: dict[str, tuple[str, str, list[tuple[str, str]]]],
          redirected: dict[str, dict[str, str]], out: dict[str, Found]) -> None:
    """One log line of :func:`parse_searches` (its four fields): a request (``q``), a candidate
    of it (``s``), a request the harness answered (``r``), or an object mapped (``o``)."""
    kind, pid, fld, path = parts
    if kind == "q":
        current[pid] = (fld, path, [])
    elif kind == "s" and pid in current and fld in _STEPS:
        current[pid][2].append((fld, path))
    elif kind == "r":
        redirected.setdefault(pid, {})[path] = fld
    elif kind == "o" and "/" in path and path not in out:
        out[path] = _found(path, current.get(pid), redirected.get(pid, {}))


def _found(path: str, request: tuple[str, str, list[tuple[str, str]]] | None, redirected: Mapping[str, str]) -> Found:
    if path in redirected:
        return Found(path=path, step="enforced", request=redirected[path])
    if request is None:
        return Found(path=path, step="unknown")
    requester, name, tried = request
    for step, candidate in reversed(tried):
        if candidate == path:
            return Found(path=path, step=step, request=name, requester=requester)  # type: ignore[arg-type]
    if "/" in name:
        return Found(path=path, step="path", request=name, requester=requester)
    return Found(path=path, step="unknown", request=name, requester=requester)


def read_searches(log: Path) -> dict[str, Found]:
    """:func:`parse_searches` of an audit log file; a torn last line is dropped."""
    try:
        # The cell's processes write this log (and can replace it): never block on a FIFO,
        # never follow a link, read a regular file only.
        text = read_cell_file(log).decode(errors="replace")
    except OSError:
        return {}
    return parse_searches(text.split("\n")[:-1])


# --------------------------------------------------------------------------- the cell's setting


@dataclass(frozen=True, kw_only=True, slots=True)
class Setting:
    """What a cell intended: its runtime, the directories it put on the search path, the
    program's own environment, and the host runtimes its case allows."""

    cell_file: str | None = None  # the cell's libcudart (None: the cell offers none)
    harness_dirs: tuple[str, ...] = ()  # LD_LIBRARY_PATH entries the harness set
    case_dirs: tuple[str, ...] = ()  # LD_LIBRARY_PATH entries the case's own env sets
    package_dirs: tuple[str, ...] = ()  # site-packages of the program's interpreter (empty: unknown)
    allow: tuple[str, ...] = ()  # the case's allow_runtime: absolute paths or globs


class Mapped(Protocol):
    """A mapped object as :func:`trace` needs it (``observe.MappedLibrary`` is one)."""

    @property
    def path(self) -> str: ...
    @property
    def name(self) -> str: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Provenance:
    """Where one mapped library came from."""

    path: str
    name: str
    origin: Origin
    step: Step
    how: str  # how the loader found it, one clause ("found through DT_RUNPATH $ORIGIN/../lib of /x/ext.so")
    why: str  # why that origin, one clause
    requester: str = ""

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "origin": self.origin, "found_by": self.step, "how": self.how, "why": self.why}

    @property
    def is_runtime(self) -> bool:
        return self.name.startswith("libcudart.so")


# --------------------------------------------------------------------------- locations

_PACKAGE_TREE = re.compile(r"^(.*?/(?:site|dist)-packages)(?:/|$)")
_TOOLKIT = re.compile(r"^/(?:usr/local|opt)/cuda[^/]*(?:/|$)")
_HOST_DIRS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32", "/usr/local/lib",
              "/usr/local/lib64", "/opt/nvidia", "/usr/local/nvidia")


def package_tree(path: str) -> str | None:
    """The ``.../site-packages`` (or ``dist-packages``) directory ``path`` lies in, if any."""
    m = _PACKAGE_TREE.match(os.path.normpath(path))
    return m.group(1) if m else None


def host_location(path: str) -> bool:
    """Whether ``path`` is the host's: a CUDA toolkit (``/usr/local/cuda*``, ``/opt/cuda*``) or a
    system library directory.  A Python package tree is never the host's, wherever it lies:
    whose it is depends on the program's environment."""
    p = os.path.normpath(path)
    if package_tree(p) is not None:
        return False
    return bool(_TOOLKIT.match(p)) or any(p == d or p.startswith(d + "/") for d in _HOST_DIRS)


def _under(path: str, dirs: Iterable[str]) -> str | None:
    p = os.path.normpath(path)
    for d in dirs:
        n = os.path.normpath(d)
        if p == n or p.startswith(n.rstrip("/") + "/"):
            return d
    return None


def _dirname(path: str) -> str:
    """The directory part of a path as the loader wrote it, as text: ``os.path.dirname``, because
    ``Path.parent`` rewrites the name (``a/./b``, ``x`` -> ``.``) and these are compared as written."""
    return os.path.dirname(path)  # noqa: PTH120


def _real(path: str) -> str:
    try:
        return os.path.realpath(path)
    except OSError:
        return path


def same_file(a: str, b: str) -> bool:
    """The same path, or two names of one file (links, bind mounts)."""
    if os.path.normpath(a) == os.path.normpath(b):
        return True
    try:
        return Path(a).samefile(b)
    except OSError:
        return False


def allowed_by(path: str, allow: Sequence[str]) -> str | None:
    """The ``allow_runtime`` entry (path or glob) that names ``path`` (or the file it links to)."""
    for pattern in allow:
        for p in dict.fromkeys([os.path.normpath(path), _real(path)]):
            if fnmatch.fnmatchcase(p, pattern) or p == os.path.normpath(pattern):
                return pattern
    return None


# --------------------------------------------------------------------------- RPATH attribution


@lru_cache(maxsize=1024)
def _search_paths(obj: str) -> tuple[tuple[str, str, str], ...]:
    """(tag, entry as written, directory) of ``obj``'s DT_RPATH and DT_RUNPATH, ``$ORIGIN`` expanded."""
    # deferred: pyelftools costs ~65 ms to import; only RPATH attribution reads ELF headers, and
    # execute.observe imports this module for every run
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    out: list[tuple[str, str, str]] = []
    try:
        # The requester is named by the cell's audit log: opened as a cell's file (no FIFO
        # waited on, no device opened), so a FIFO renamed over it is a fact, not a wait.
        with open_cell_file(obj, links=True) as fh:
            for sec in ELFFile(fh).iter_sections():
                if not isinstance(sec, DynamicSection):
                    continue
                for tag in sec.iter_tags():
                    kind = tag.entry.d_tag
                    if kind not in ("DT_RPATH", "DT_RUNPATH"):
                        continue
                    text = str(getattr(tag, "rpath" if kind == "DT_RPATH" else "runpath"))
                    for entry in text.split(":"):
                        d = entry.replace("${ORIGIN}", "$ORIGIN").replace("$ORIGIN", _dirname(obj))
                        out.append((kind, entry, os.path.normpath(d)))
    except (OSError, ELFError, ValueError):
        return ()
    return tuple(out)


def _rpath_entry(found: Found) -> tuple[str, str] | None:
    """(tag, entry as written) of the requester's DT_RPATH/DT_RUNPATH entry that found it, if
    the requester's own (the loader also searches the DT_RPATH of the objects that loaded it)."""
    directory = os.path.normpath(_dirname(found.path))
    if found.requester:
        for tag, entry, d in _search_paths(found.requester):
            if d == directory or same_file(d, directory):
                return tag, entry
    return None


def _rpath_clause(found: Found) -> str:
    hit = _rpath_entry(found)
    if hit is not None:
        return f"found through {hit[0]} {hit[1]} of {found.requester}"
    return f"found through DT_RPATH/DT_RUNPATH (searched for {found.requester or 'the program'})"


# --------------------------------------------------------------------------- the verdict


def trace(mapped: Sequence[Mapped], found: Mapping[str, Found], setting: Setting) -> tuple[Provenance, ...]:
    """The provenance of each of ``mapped`` (paths as the loader opened them)."""
    return tuple(_one(m, found.get(m.path) or Found(path=m.path, step="unknown"), setting) for m in mapped)


def _one(m: Mapped, f: Found, s: Setting) -> Provenance:
    origin, why = _origin(m.path, f, s)
    return Provenance(path=m.path, name=m.name, origin=origin, step=f.step, how=_how(f, s), why=why,
                      requester=f.requester)


def _origin(path: str, f: Found, s: Setting) -> tuple[Origin, str]:
    """The rules, in order: the cell's file; what the case allows; what the harness put first;
    a Python package tree (whose environment it is decides); the host's directories and the
    search steps that only reach them; what the program's own RPATH or its own paths name."""
    named = _cells_own(path, f, s)
    if named is not None:
        return named
    real = _real(path)
    if _dirname(real) != _real(_dirname(path)):
        # The name is a link to a file elsewhere (a link in the program's own directory to the
        # host's toolkit): the origin is the file's, decided where it really lies; what the
        # loader searched to reach the link says nothing of it.
        origin, why = _origin(real, Found(path=real, step="unknown", request=f.request, requester=f.requester), s)
        return origin, f"{path} is a link to {real}: {why}"
    inherited = f.step == "ld_library_path" and _under(_dirname(path), s.case_dirs) is None
    tree = package_tree(path)
    if tree is not None:
        in_tree = _in_package_tree(f, s, tree)
        if in_tree is not None:
            return in_tree
    return _by_place(path, f, tree, inherited)


def _by_place(path: str, f: Found, tree: str | None, inherited: bool) -> tuple[Origin, str]:
    """:func:`_origin`'s last rules, for a file that is not the cell's and no package tree's
    environment decides: the host's directories and the search steps that only reach them, what
    the program's own RPATH or its own paths name."""
    if f.step in ("ld.so.cache", "default", "secure"):
        return "outside", "a host library directory"
    if inherited:
        return "outside", "an LD_LIBRARY_PATH entry inherited from the environment cumatrix ran in"
    relative = _origin_relative(path, f)
    if relative is not None:
        return relative
    if host_location(path):
        return _in_host_place(f)
    return _in_own_place(f, tree)


def _origin_relative(path: str, f: Found) -> tuple[Origin, str] | None:
    """A file outside the host's toolkits an RPATH entry names relative to its requester: the
    program's own (None: it is not)."""
    if f.step == "rpath" and not _TOOLKIT.match(os.path.normpath(path)):
        entry = _rpath_entry(f)
        if entry is not None and "ORIGIN" in entry[1]:
            # Relative to the requester's own file: a program installed under /usr or /opt
            # with its runtime beside it still brings its own.
            return "bundled", f"the program's own {entry[0]} names it relative to {f.requester}"
    return None


def _in_host_place(f: Found) -> tuple[Origin, str]:
    """A file in a host toolkit or system directory: from outside, however it was reached."""
    if f.step == "ld_library_path":
        return "outside", "the case's LD_LIBRARY_PATH names a host toolkit or system directory"
    if f.step == "rpath":
        return "outside", "the program's RPATH/RUNPATH names a host toolkit or system directory"
    return "outside", "a host toolkit or system directory"


def _in_own_place(f: Found, tree: str | None) -> tuple[Origin, str]:
    """A file outside the host's directories: the program's own, by how it was reached."""
    if tree is not None:
        return "bundled", f"a Python package tree ({tree}) the program reached by itself"
    if f.step == "ld_library_path":
        return "bundled", "a directory the case's own LD_LIBRARY_PATH names"
    if f.step == "rpath":
        return "bundled", "the program's own RPATH/RUNPATH names it"
    return "bundled", "the program named the file itself, outside the host's directories"


def _cells_own(path: str, f: Found, s: Setting) -> tuple[Origin, str] | None:
    """The first rules: the cell's file, what the case allows, what the harness put first, the driver."""
    if s.cell_file and same_file(path, s.cell_file):
        return "cell", "the cell's runtime"
    hit = allowed_by(path, s.allow)
    if hit is not None:
        return "allowed", f"named by the case's allow_runtime ({hit})"
    if f.step == "enforced":
        return "cell", "the harness's enforcement of the cell's runtime"
    # The cell's runtime directory (a wheel's, a site runtime's toolkit lib64) or the driver
    # interposer's: what lies there is the cell's, however it was reached.
    harness_dir = _under(_dirname(path), s.harness_dirs)
    if harness_dir is not None:
        return "cell", f"a directory the harness put on LD_LIBRARY_PATH for the cell ({harness_dir})"
    if _DRIVER.match(Path(path).name):
        return "driver", "the host's driver, which every cell runs on"
    return None


def _in_package_tree(f: Found, s: Setting, tree: str) -> tuple[Origin, str] | None:
    """Inside a Python package tree: whose environment it is decides (None: the program's is unknown)."""
    own = _under(tree, s.package_dirs) or next((d for d in s.package_dirs if same_file(d, tree)), None)
    if own is not None:
        return "bundled", f"inside the program's own environment ({tree})"
    if f.step in ("rpath", "path") and f.requester and package_tree(f.requester) == tree:
        return "bundled", f"a package of the same environment as {f.requester} ({tree})"
    if s.package_dirs:
        return "outside", (f"another Python environment's packages ({tree}), not the program's "
                           f"({', '.join(s.package_dirs)})")
    return None


def _how(f: Found, s: Setting) -> str:
    asked = f" (requested as {f.request} by {f.requester or 'the program'})" if f.request else ""
    if f.step == "rpath":
        return _how_rpath(f, asked)
    if f.step == "ld_library_path":
        return _how_ld_library_path(f, s, asked)
    if f.step in ("ld.so.cache", "default", "secure"):
        return f"found through {_STEP_WORDS[f.step]}{asked}"
    if f.step == "path":
        return "opened by its path" + (f" on behalf of {f.requester}" if f.requester else "")
    if f.step == "enforced":
        return f"the harness answered the request for {f.request} with it"
    return "no search was logged for it"


def _how_rpath(f: Found, asked: str) -> str:
    """:func:`_how` of a file found through an RPATH/RUNPATH entry."""
    clause = _rpath_clause(f)
    # The RPATH's holder is named already when it is the requester.
    return clause + (f" (requested as {f.request})" if f.requester and clause.endswith(f.requester) else asked)


def _how_ld_library_path(f: Found, s: Setting, asked: str) -> str:
    """:func:`_how` of a file found through an LD_LIBRARY_PATH entry, with who set the entry."""
    entry = _dirname(f.path)
    who = ("set by the harness" if _under(entry, s.harness_dirs) else
           "set by the case" if _under(entry, s.case_dirs) else "inherited: set by neither the harness nor the case")
    return f"found through LD_LIBRARY_PATH entry {entry} ({who}){asked}"


def leaked(provs: Iterable[Provenance]) -> Provenance | None:
    """The first runtime (libcudart) from outside both the program and the cell, if any."""
    return next((p for p in provs if p.is_runtime and p.origin == "outside"), None)


def leak_detail(leak: Provenance, version: str | None) -> str:
    """One line for the ``runtime-leak`` outcome's detail (the outcome names the path): how the
    loader found it first, since reports cut long lines, then why that is a leak."""
    return (f"{leak.how}: {leak.why}; this {leak.name} ({version or 'version unknown'}) is neither the cell's "
            "runtime nor inside the program's own distribution (a case may allow a host runtime with allow_runtime)")


# --------------------------------------------------------------------------- the program's environment


_PYTHON_NAME = re.compile(r"^python[0-9.]*$")
_ASK = ("import json, site, sys; d = list(getattr(site, 'getsitepackages', lambda: [])()); "
        "u = getattr(site, 'getusersitepackages', lambda: None)(); d += [u] if u else []; "
        "d += [p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))]; print(json.dumps(d))")


def program_package_dirs(argv0: str, *, path: str | None = None, pythonpath: str | None = None) -> tuple[str, ...]:
    """The package directories of the Python environment a command runs in, or ``()``.

    ``argv0`` is resolved on ``path`` (the cell's ``PATH``); only an interpreter named
    ``python*`` is asked (once per interpreter and process: ``site.getsitepackages()``,
    the user site, ``sys.path``'s package directories).  Entries of the cell's
    ``PYTHONPATH`` are the program's too.
    """
    exe = argv0 if "/" in argv0 else shutil.which(argv0, path=path if path is not None else os.environ.get("PATH"))
    if exe is None or not _PYTHON_NAME.match(Path(exe).name):
        return ()
    # Made absolute, never resolved: a virtual environment's python is a link to the base interpreter,
    # and only its own name makes it start in the environment.
    dirs = list(_ask_interpreter(os.path.abspath(exe)))  # noqa: PTH100
    if pythonpath:
        dirs += [d for d in pythonpath.split(os.pathsep) if d]
    return tuple(dict.fromkeys(dirs))


@lru_cache(maxsize=64)
def _ask_interpreter(exe: str) -> tuple[str, ...]:
    try:
        out = subprocess.run([exe, "-E", "-c", _ASK], check=False, capture_output=True, text=True, timeout=30,
                             env={"PATH": os.environ.get("PATH", os.defpath), "HOME": os.environ.get("HOME", "/")})
        got = json.loads(out.stdout) if out.returncode == 0 else []
    except (OSError, subprocess.SubprocessError, ValueError):
        return ()
    return tuple(str(d) for d in got if isinstance(d, str))


def setting(*, cell_file: str | None, lib_path: Sequence[str], job_env: Sequence[tuple[str, str]] = (),
            argv0: str | None = None, allow: Sequence[str] = (), extra_package_dirs: Sequence[str] = ()) -> Setting:
    """The :class:`Setting` of a job.  ``lib_path`` is what the harness prepends to
    ``LD_LIBRARY_PATH``; ``job_env`` the job's own variables (a case's ``LD_LIBRARY_PATH``
    among them: the harness never sets that variable there); ``argv0`` the command, whose
    Python environment, if it is an interpreter, is the program's own."""
    env = dict(job_env)
    case_dirs = tuple(d for d in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d)
    dirs: tuple[str, ...] = tuple(extra_package_dirs)
    if argv0:
        dirs += program_package_dirs(argv0, path=env.get("PATH"), pythonpath=env.get("PYTHONPATH"))
    return Setting(cell_file=cell_file, harness_dirs=tuple(lib_path), case_dirs=case_dirs,
                   package_dirs=tuple(dict.fromkeys(dirs)), allow=tuple(allow))


def this_environment() -> tuple[str, ...]:
    """The package directories of the Python running cumatrix (a ``site: true`` runtime's)."""
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    return tuple(dict.fromkeys(dirs))

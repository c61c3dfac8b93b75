"""Checks across the ELF files of one wheel: what each file loads from the wheel itself.

Wheels repaired by auditwheel, and many framework wheels, carry their CUDA libraries beside
the extension under hashed names (``demo.libs/libcudart-3f2a9c1e.so.13``), named in the
extension's ``DT_NEEDED`` and found through ``DT_RUNPATH``/``DT_RPATH`` ``$ORIGIN/...``
(auditwheel's ``repair``: pypa/auditwheel ``repair.py`` renames each grafted library and
rewrites the ``DT_NEEDED`` entries that name it).  A file's own checks cannot see what such a
library is; here each ``DT_NEEDED`` entry is resolved the way the loader resolves it inside the
wheel, and:

- a CUDA runtime found that way, recognised by its content (not its name), is judged for every
  file that loads it, directly or through another library of the wheel;
- undefined driver (``cu*``) and runtime (``cuda*``) symbols that a library of the wheel the
  file binds to defines (a stub that ``dlopen``\\ s the driver itself, a vendored runtime) are
  not "undefined at import".
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from cumatrix.audit.checks import runtime_major_findings, underlinked_finding
from cumatrix.audit.findings import AuditSettings, Finding, Linkage

# The loader expands both spellings (ld.so(8), "Dynamic string tokens").
_ORIGIN_RE = re.compile(r"^\$(?:ORIGIN|\{ORIGIN\})(?=/|$)")


def search_dirs(member: str, paths: Iterable[str]) -> list[str]:
    """The directories inside the wheel that ``DT_RPATH``/``DT_RUNPATH`` entries ``paths`` of
    ``member`` name: ``$ORIGIN`` is ``member``'s directory; absolute entries lie outside the
    wheel, and so do ``$ORIGIN`` entries that climb out of it."""
    here = posixpath.dirname(member)
    out: list[str] = []
    for p in paths:
        if not _ORIGIN_RE.match(p):
            continue
        d = posixpath.normpath(posixpath.join(here, _ORIGIN_RE.sub("", p).lstrip("/")) or ".")
        if d != ".." and not d.startswith("../") and d not in out:
            out.append(d)
    return out


def resolve(member: str, link: Linkage, files: Mapping[str, Linkage]) -> list[tuple[str, str]]:
    """(``DT_NEEDED`` entry, member of the wheel) for each library of ``member`` that the
    loader finds inside the wheel through its search path."""
    dirs = search_dirs(member, link.search_paths)
    out: list[tuple[str, str]] = []
    for name in link.needed:
        for d in dirs:
            cand = posixpath.normpath(posixpath.join(d, name))
            if cand in files and cand != member:
                out.append((name, cand))
                break
    return out


def reach(member: str, files: Mapping[str, Linkage]) -> dict[str, list[str]]:
    """Every library of the wheel that loading ``member`` loads, with the chain of
    ``DT_NEEDED`` entries that leads to it (breadth first: the shortest chain)."""
    seen: dict[str, list[str]] = {}
    todo: list[tuple[str, list[str]]] = [(member, [])]
    while todo:
        cur, chain = todo.pop(0)
        for name, lib in resolve(cur, files[cur], files):
            if lib not in seen and lib != member:
                seen[lib] = [*chain, f"{name} ({lib})"]
                todo.append((lib, seen[lib]))
    return seen


def _via(chain: Sequence[str]) -> str:
    return "DT_NEEDED " + " -> DT_NEEDED ".join(chain)


def _attributed(member: str, link: Linkage, reached: Mapping[str, list[str]],
                files: Mapping[str, Linkage], s: AuditSettings) -> list[Finding]:
    out: list[Finding] = []
    done = set(link.judged)
    for lib, chain in sorted(reached.items(), key=lambda x: (len(x[1]), x[0])):
        major = files[lib].runtime_major
        if major is None or major in done:
            continue
        done.add(major)
        what = "a CUDA runtime" if files[lib].runtime_is_shared else "a library that carries a CUDA runtime"
        how = (f"{_via(chain)}: {what} inside the wheel, CUDA {major} by its content")
        out += runtime_major_findings(member, major, posixpath.basename(lib), how, "error", s)
    return out


def _bound(findings: list[Finding], defined: Mapping[str, str]) -> list[Finding]:
    """One file's own findings, less what the wheel's libraries that it loads define."""
    out: list[Finding] = []
    for f in findings:
        lib = defined.get(f.subject)
        if f.code == "runtime-symbol-too-new" and lib is not None:
            continue  # the runtime it binds to is the wheel's own copy, which has it
        if f.code == "driver-symbol-too-new" and lib is not None:
            # The import works (the wheel's library defines the symbol); what that library
            # does on an older driver is a run-time question, its own file's findings say more.
            out.append(replace(
                f, severity="warning",
                message=(f"{f.message.split(': on drivers', 1)[0]}; it binds to {lib} inside the "
                         "wheel, which defines it: the import works, and a call on an older "
                         "driver works only if that library falls back when the driver lacks it"),
                fix=f"check that {lib} resolves {f.subject} with cuGetProcAddress and falls back"))
            continue
        out.append(f)
    return out


def wheel_checks(files: Mapping[str, Linkage], findings: Sequence[Finding],
                 s: AuditSettings) -> list[Finding]:
    """``findings`` of the files of one wheel, corrected and completed by what each file loads
    from the wheel itself (see the module's docstring)."""
    by_file: dict[str, list[Finding]] = {}
    for f in findings:
        by_file.setdefault(f.file, []).append(f)
    added: dict[str, list[Finding]] = {}
    for member, link in files.items():
        reached = reach(member, files)
        if not reached:
            continue
        added[member] = _attributed(member, link, reached, files, s)
        own = _rebound(member, link, reached, files, by_file.get(member, []))
        if own is not None:
            by_file[member] = own
    out: list[Finding] = []
    seen: set[str] = set()
    for f in findings:  # the files in their order, each file's own findings, then the added
        if f.file in seen:
            continue
        seen.add(f.file)
        out += by_file.get(f.file, [])
        out += added.pop(f.file, [])
    for extra in added.values():
        out += extra
    return out


def _rebound(member: str, link: Linkage, reached: Mapping[str, list[str]], files: Mapping[str, Linkage],
             own: list[Finding]) -> list[Finding] | None:
    """``own`` (the findings of ``member``) with the symbols that the wheel's libraries it
    loads (``reached``) define bound to them; ``None`` where those bind none it needs."""
    defined = _defined_by(reached, files)
    if not any(sym in defined for sym in link.driver_undefined) and not any(
            f.code == "runtime-symbol-too-new" for f in own):
        return None
    own = _bound(own, defined)
    if any(f.code == "underlinked-libcuda" for f in own):
        own = _underlinked_again(member, link, own, defined)
    return own


def _defined_by(reached: Mapping[str, list[str]], files: Mapping[str, Linkage]) -> dict[str, str]:
    """Symbol -> the first library of ``reached`` (the wheel's, loaded) that defines it."""
    defined: dict[str, str] = {}
    for lib in reached:
        for sym in files[lib].exported:
            defined.setdefault(sym, lib)
    return defined


def _underlinked_again(member: str, link: Linkage, own: list[Finding],
                       defined: Mapping[str, str]) -> list[Finding]:
    """``own`` with its ``underlinked-libcuda`` finding naming only the driver symbols no
    library of the wheel defines (none where they define them all)."""
    missing = [sym for sym in link.driver_undefined if sym not in defined]
    own = [f for f in own if f.code != "underlinked-libcuda"]
    if missing:
        own.append(underlinked_finding(member, missing))
    return own

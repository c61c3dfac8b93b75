"""Facts read from the text of real CUDA headers: symbol introduction versions and ABI changes.

Nothing here is typed in by hand: the driver's symbol introduction versions come from the
``PFN_<name>_v<NNNNN>`` typedefs of ``cudaTypedefs.h``, the runtime's prototypes from
``cuda_runtime_api.h``, both shipped in every runtime wheel.

How a ``PFN_<base>_v<N>[_ptds|_ptsz]`` typedef names the symbol ``libcuda.so.1`` exports
(checked against the ``#define cuX cuX_vK`` lines and prototypes of ``cuda.h`` for 12.0 to
13.5, see ``tests/unit/test_headers.py``):

* The plain typedefs of one base, the legacy ones in the ``__CUDA_API_VERSION_INTERNAL`` block
  included, sorted by version, are the successive ABIs of that entry point. The first is
  exported under the base name, the k-th (k >= 2) as ``<base>_v<k>``:
  ``PFN_cuMemcpyBatchAsync_v12080`` is ``cuMemcpyBatchAsync``, ``PFN_cuMemcpyBatchAsync_v13000``
  is ``cuMemcpyBatchAsync_v2``; ``PFN_cuCtxCreate_v2000/v3020/v11040/v12050`` are
  ``cuCtxCreate``, ``cuCtxCreate_v2``, ``_v3``, ``_v4``. The ``_v<k>`` of an export is an ABI
  ordinal, not a version.
* A per-thread typedef ``PFN_<base>_v<N>_ptds`` (or ``_ptsz``) is the per-thread-stream twin of
  the newest plain ABI of that base not newer than ``N``, exported with the suffix appended:
  ``PFN_cuMemcpyHtoD_v7000_ptds`` is ``cuMemcpyHtoD_v2_ptds`` (the per-thread flavour came in
  7.0 with the 3.2 ABI), ``PFN_cuMemcpyBatchAsync_v13000_ptsz`` is ``cuMemcpyBatchAsync_v2_ptsz``.
  Its introduction version is ``N``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from cumatrix.core.errors import ConfigError

_PFN_RE = re.compile(
    r"typedef\s+[\w\s\*]+?\(\s*CUDAAPI\s*\*\s*PFN_(?P<base>cu\w+?)_v(?P<ver>\d{4,6})"
    r"(?:_(?P<pt>ptds|ptsz))?\s*\)\s*\((?P<params>[^;]*)\)\s*;"
)
_CUDA_VERSION_RE = re.compile(r"^\s*#\s*define\s+CUDA_VERSION\s+(\d+)", re.MULTILINE)


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", " ", text)


def pfn_typedefs(typedefs_text: str) -> list[tuple[str, int, str | None, str]]:
    """Every ``PFN_`` typedef as ``(base, version, "ptds"|"ptsz"|None, parameter text)``."""
    text = _strip_comments(typedefs_text)
    return [(m["base"], int(m["ver"]), m["pt"], " ".join(m["params"].split()))
            for m in _PFN_RE.finditer(text)]


def pfn_exports(typedefs_text: str) -> dict[tuple[str, int, str | None], str]:
    """Map each typedef ``(base, version, per-thread suffix)`` to the symbol libcuda exports.

    The rule is in the module docstring.
    """
    entries = pfn_typedefs(typedefs_text)
    plain: dict[str, list[int]] = {}
    for base, ver, pt, _ in entries:
        if pt is None:
            plain.setdefault(base, []).append(ver)
    ordinal_name = _ordinal_names(plain)
    out: dict[tuple[str, int, str | None], str] = {}
    for base, ver, pt, _ in entries:
        if pt is None:
            out[(base, ver, None)] = ordinal_name[(base, ver)]
            continue
        older = [v for v in plain.get(base, ()) if v <= ver]
        # A per-thread twin with no plain typedef at or below its version (none in 12.0-13.5)
        # is named after the base alone.
        stem = ordinal_name[(base, max(older))] if older else base
        out[(base, ver, pt)] = f"{stem}_{pt}"
    return out


def _ordinal_names(plain: dict[str, list[int]]) -> dict[tuple[str, int], str]:
    """``{(base, version): exported name}`` of the plain typedefs: the k-th distinct version of a
    base is exported as ``base_vk`` (the first as ``base``)."""
    ordinal_name: dict[tuple[str, int], str] = {}
    for base, versions in plain.items():
        for k, ver in enumerate(sorted(set(versions)), start=1):
            ordinal_name[(base, ver)] = base if k == 1 else f"{base}_v{k}"
    return ordinal_name


def pfn_introductions(typedefs_text: str) -> dict[str, int]:
    """Exported driver symbol -> the CUDA version (e.g. 12080) that introduced it."""
    out: dict[str, int] = {}
    for (_, ver, _), name in pfn_exports(typedefs_text).items():
        out[name] = min(ver, out.get(name, ver))
    return out


def base_introductions(typedefs_text: str) -> dict[str, int]:
    """Base name as given to ``cuGetProcAddress`` -> the lowest version that has it."""
    out: dict[str, int] = {}
    for base, ver, _, _ in pfn_typedefs(typedefs_text):
        out[base] = min(ver, out.get(base, ver))
    return out


@lru_cache(maxsize=32)
def _introductions_for_digest(digest: str, text: str) -> tuple[tuple[str, int], ...]:
    del digest  # the cache key; the text rides along
    return tuple(sorted(pfn_introductions(text).items()))


def _typedefs_path(include_dir: Path) -> Path:
    path = Path(include_dir) / "cudaTypedefs.h"
    if not path.is_file():
        raise ConfigError(
            f"headers at {include_dir} have no cudaTypedefs.h; cumatrix reads symbol introduction "
            "versions from it: use a runtime wheel of CUDA >= 12.0"
        )
    return path


def load_introductions(include_dir: Path) -> dict[str, int]:
    """:func:`pfn_introductions` of ``include_dir/cudaTypedefs.h``, cached by content hash.

    Raises :class:`ConfigError` when the file is missing or holds no ``PFN_`` typedef.
    """
    path = _typedefs_path(include_dir)
    text = path.read_text(errors="replace")
    digest = hashlib.sha256(text.encode()).hexdigest()
    result = dict(_introductions_for_digest(digest, text))
    if not result:
        raise ConfigError(
            f"{path}: holds no PFN_<name>_v<NNNNN> typedef; cumatrix reads symbol introduction "
            "versions from them: use a runtime wheel of CUDA >= 12.0"
        )
    return result


def load_base_introductions(include_dir: Path) -> dict[str, int]:
    """:func:`base_introductions` of ``include_dir/cudaTypedefs.h``."""
    return base_introductions(_typedefs_path(include_dir).read_text(errors="replace"))


def header_cuda_version(include_dir: Path) -> int:
    """``CUDA_VERSION`` from ``include_dir/cuda.h`` (e.g. 13050)."""
    path = Path(include_dir) / "cuda.h"
    if not path.is_file():
        raise ConfigError(f"headers at {include_dir} have no cuda.h: not a CUDA include directory")
    m = _CUDA_VERSION_RE.search(path.read_text(errors="replace"))
    if not m:
        raise ConfigError(f"{path}: no `#define CUDA_VERSION` line")
    return int(m.group(1))


def newest_typedefs(include_dirs: Iterable[Path]) -> Path:
    """The include directory, among ``include_dirs``, with the newest ``CUDA_VERSION``
    that has a ``cudaTypedefs.h``."""
    candidates = [(header_cuda_version(d), str(d), Path(d)) for d in include_dirs
                  if (Path(d) / "cudaTypedefs.h").is_file()]
    if not candidates:
        raise ConfigError(
            "none of the runtime headers has a cudaTypedefs.h; cumatrix reads symbol introduction "
            "versions from it: use a runtime wheel of CUDA >= 12.0"
        )
    return max(candidates)[2]


# ------------------------------------------------------------------ runtime prototypes

_RT_DECL_RE = re.compile(
    r"\bextern\s+(?P<head>[^;{}()]*?)\bCUDARTAPI\s+(?P<name>cuda\w+)\s*\((?P<params>[^;{}]*)\)\s*;"
)
_QUALIFIER_RE = re.compile(r"^(?:__\w+__|__\w+|CUDART_\w+|CUDARTAPI|extern)$")
_DV_RE = re.compile(r"__dv\s*\([^()]*\)")


def _active_text(text: str) -> str:
    """Drop the ``#if defined(__CUDA_API_VERSION_INTERNAL)`` branches (the runtime's own build
    re-declares legacy ABIs there); keep everything else."""
    out: list[str] = []
    stack: list[bool] = []  # True while in the first branch of an INTERNAL-only #if
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#") and _conditional(s[1:].strip(), stack):
            continue
        if any(stack):
            continue
        out.append(line)
    return "\n".join(out)


def _conditional(directive: str, stack: list[bool]) -> bool:
    """Follow a preprocessor conditional in ``stack`` (see :func:`_active_text`); True when
    ``directive`` is one (``#if``, ``#elif``, ``#else``, ``#endif``: the line itself is dropped)."""
    if directive.startswith(("if ", "ifdef", "ifndef", "if(")):
        stack.append("VERSION_INTERNAL" in directive and "!" not in directive and not directive.startswith("ifndef"))
        return True
    if directive.startswith(("elif", "else")):
        if stack:
            stack[-1] = False
        return True
    if directive.startswith("endif"):
        if stack:
            stack.pop()
        return True
    return False


def _split_params(params: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in params:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _param_type(param: str) -> str:
    """``const size_t *sizes`` -> ``const size_t*``; the parameter name is dropped."""
    p = _DV_RE.sub("", param)
    p = re.sub(r"\[[^\]]*\]", "*", p)  # an array parameter is a pointer
    tokens = re.findall(r"[A-Za-z_]\w*|\*|&|\(|\)", p)
    if len(tokens) >= 2 and re.match(r"[A-Za-z_]\w*$", tokens[-1]) and tokens[-1] not in (
            "int", "char", "long", "short", "unsigned", "signed", "float", "double", "void"):
        tokens = tokens[:-1]
    text = " ".join(t for t in tokens if not _QUALIFIER_RE.match(t))
    return re.sub(r"\s*\*\s*", "*", text).replace("*const", "* const").strip()


def _norm_type(head: str) -> str:
    tokens = re.findall(r"[A-Za-z_]\w*|\*", head)
    text = " ".join(t for t in tokens if not _QUALIFIER_RE.match(t))
    return re.sub(r"\s*\*\s*", "*", text).strip()


def runtime_prototypes(cuda_runtime_api_text: str) -> dict[str, str]:
    """``cudaX`` -> ``"ret cudaX(type, type, ...)"`` from ``extern ... CUDARTAPI cudaX(...);``.

    Comments, whitespace, parameter names, ``__dv`` defaults and ``__host__``-style qualifiers
    do not count; the first declaration outside the runtime's internal-build block wins.
    """
    text = _active_text(_strip_comments(cuda_runtime_api_text))
    out: dict[str, str] = {}
    for m in _RT_DECL_RE.finditer(text):
        name = m["name"]
        if name in out:
            continue
        params = [_param_type(p) for p in _split_params(m["params"])]
        if params == ["void"]:
            params = []
        out[name] = f"{_norm_type(m['head'])} {name}({', '.join(params)})"
    return out


def runtime_abi_changes(old_include: Path, new_include: Path) -> dict[str, tuple[str, str]]:
    """Runtime functions declared in both header sets whose prototypes differ: name -> (old, new)."""
    def load(d: Path) -> dict[str, str]:
        path = Path(d) / "cuda_runtime_api.h"
        if not path.is_file():
            raise ConfigError(f"headers at {d} have no cuda_runtime_api.h: not a CUDA runtime include directory")
        return runtime_prototypes(path.read_text(errors="replace"))

    old, new = load(old_include), load(new_include)
    return {name: (old[name], new[name]) for name in sorted(old.keys() & new.keys())
            if old[name] != new[name]}

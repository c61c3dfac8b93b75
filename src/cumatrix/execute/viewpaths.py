"""Where a cell's paths lead, and what of the host it may not see: the harness's own files
(the signing key, the history, the cache, every run's ``--out``), the host's socket and state
directories, and the bind points a job's paths need, each judged by where its links lead
(a link into a hidden place is refused, naming the link).  :mod:`.sandbox` writes the view
from these; the docker backend checks its mounts with :func:`host_mount`."""

# Paths stay strings here on purpose (ruff's PTH rules off for this module): they are what
# bwrap's argv, /proc and the kernel take, and this runs for every cell.
# ruff: noqa: PTH100, PTH101, PTH110, PTH111, PTH112, PTH113, PTH114, PTH115, PTH116, PTH118, PTH119, PTH120

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from cumatrix.core.cache import cache_location
from cumatrix.core.errors import HarnessError


def kept_paths() -> list[str]:
    """What the harness keeps of its own that no cell may reach: the ``--resume`` signing key
    (:mod:`cumatrix.results.recordkey`), the history (:mod:`cumatrix.results.history`) and the
    cache (:func:`cumatrix.core.cache.cache_location`; the pieces a job names stay visible);
    the ``--out`` directories of its runs are :func:`earlier_outs`.
    The same variables as those modules read, here because execute sits below them."""
    env = os.environ
    home = os.path.expanduser("~")
    state = env.get("XDG_STATE_HOME") or os.path.join(home, ".local", "state")
    data = env.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
    out = [os.path.join(state, "cumatrix"), os.path.join(data, "cumatrix"), str(cache_location())]
    if env.get("CUMATRIX_HISTORY"):  # a file anywhere: it and SQLite's files beside it
        out += [env["CUMATRIX_HISTORY"] + tail for tail in ("", "-journal", "-wal", "-shm")]
    return [os.path.abspath(p) for p in out]


def earlier_outs() -> tuple[str, ...]:
    """The ``--out`` directories of the harness's runs, this one's included (listed by
    :mod:`cumatrix.results.store` in its state directory, :data:`~cumatrix.results.store.OUTS`):
    what a run wrote in each (:data:`RUN_FILES`) is masked from every cell wherever it lies."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return _earlier_outs(os.path.join(state, "cumatrix", "outs"))


_OUTS_READ: dict[str, tuple[tuple[int, int], tuple[str, ...]]] = {}


def _earlier_outs(path: str) -> tuple[str, ...]:
    """The ``--out`` directories the harness's runs wrote (listed by :mod:`cumatrix.results.store`
    in its state directory), read again only when the list changed: every cell asks."""
    try:
        st = os.stat(path)
    except OSError:
        return ()
    seen = (st.st_mtime_ns, st.st_size)
    hit = _OUTS_READ.get(path)
    if hit is not None and hit[0] == seen:
        return hit[1]
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        outs = tuple(ln for ln in text.splitlines() if ln.startswith("/"))
    except OSError:
        return ()
    _OUTS_READ[path] = (seen, outs)
    return outs


#: Host directories every sandboxed cell reads (programs, their libraries, configuration, the
#: GPU's sysfs): bound read-only, a symbolic link (``/bin`` -> ``usr/bin``) recreated as one.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys")
#: Never visible in the sandbox, even under a directory a job names: the host's sockets
#: (``docker.sock``, D-Bus, systemd) and container runtimes' state.
HIDDEN_ALWAYS = ("/run", "/var/run", "/var/lock", "/var/lib/docker", "/var/lib/containerd", "/proc", "/dev")


def gpu_nodes(dev: Path = Path("/dev")) -> list[str]:
    """The GPU's device nodes: ``/dev/nvidia*``, ``/dev/nvidia-caps/*``, ``/dev/dri``."""
    try:
        with os.scandir(dev) as it:  # listed at each cell: the driver makes nvidia-uvm at first use
            out = sorted(e.path for e in it if e.name.startswith("nvidia") and not e.is_dir())
    except OSError:
        out = []
    caps = dev / "nvidia-caps"
    if caps.is_dir():
        out.append(str(caps))
    if (dev / "dri").is_dir():
        out.append(str(dev / "dri"))
    return out


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _bind_points(paths: Iterable[str], masks: Iterable[str] = ()) -> list[str]:
    """Directories to bind so that every path is visible (a file: its directory), each once,
    outermost first (one under another only where one of ``masks`` lies between them); none
    under what the system directories already show, none that is or holds a host socket
    directory, never ``/``."""
    return _outermost({d for d in map(_bind_dir, paths) if d is not None}, masks)


def _outermost(dirs: set[str], masks: Iterable[str] = ()) -> list[str]:
    """:func:`_bind_points` of directories already found."""
    hidden = list(masks)
    out: list[str] = []
    for d in sorted(dirs):
        # Shown by an outer point already, unless a mask between them hides it.
        if not any(_under(d, o) and not any(_under(d, m) and _under(m, o) for m in hidden) for o in out):
            out.append(d)
    return out


#: The cell's own writable places (a private tmpfs each): never covered by a bind of the host's.
PRIVATE_DIRS = ("/tmp", "/dev/shm")


def _bind_dir(p: str) -> str | None:
    """The directory to bind for ``p`` (a file: its directory; a file directly in ``/tmp``: the
    file alone, since the host's ``/tmp`` would cover the cell's private one); None where none
    is bound (nothing of the host's ``/dev`` but the GPU's nodes: the fork server builds the
    cell's root on ``/dev/shm``).  Decided on the path as written: where
    it leads is :func:`_refusal`'s to judge."""
    if not p or not p.startswith("/") or not os.path.exists(p):
        return None
    p = os.path.normpath(p)
    d = p if os.path.isdir(p) else os.path.dirname(p)
    if d == "/tmp" or os.path.realpath(d) == "/tmp":
        return p if p != d else None
    return None if _never_bound(d) else d


def _never_bound(d: str) -> bool:
    """Whether directory ``d`` is never bound: the root, the host's hidden places, its ``/dev``
    but the GPU's nodes, and what the system directories show already."""
    if d == "/" or any(_under(d, h) for h in HIDDEN_ALWAYS if h not in ("/dev",)):
        return True
    if d.startswith("/dev/") and not d.startswith("/dev/nvidia"):
        return True
    return any(_under(d, s) for s in _system_dirs())  # shown already (a path under /bin, a link to usr/bin, too)


def _hidden_roots() -> tuple[str, ...]:
    """Where no cell may look, as the host resolves it: :data:`HIDDEN_ALWAYS` (``/dev`` but for
    the GPU's nodes) with where each leads (``/var/run`` is ``/run``), and the directory of the
    Docker daemon's socket where ``$DOCKER_HOST`` puts it elsewhere."""
    return _hidden_roots_for(os.environ.get("DOCKER_HOST", ""))


@functools.lru_cache(maxsize=4)
def _hidden_roots_for(docker_host: str) -> tuple[str, ...]:
    out = {h for h in HIDDEN_ALWAYS if h != "/dev"}
    out |= {os.path.realpath(h) for h in out}
    if docker_host.startswith("unix://"):
        sock_dir = os.path.dirname(os.path.realpath(docker_host[len("unix://"):]))
        if sock_dir != "/":
            out.add(sock_dir)
    return tuple(sorted(out))


def _forbidden(real: str, written: str, kept: Iterable[tuple[str, str]]) -> str | None:
    """Why no cell may see ``real`` (a resolved path) reached as ``written``; None: it may.
    ``kept``: what the harness keeps, (as written, resolved)."""
    if real == "/":
        return "the host's root"
    if _under(real, "/dev") and not real.startswith("/dev/nvidia"):
        return "the host's /dev"
    for h in _hidden_roots():
        if _under(real, h):
            return f"{h}, where the host keeps its sockets and daemons' state"
    for k, rk in kept:
        # The pieces of the cache a job names (as written, or as resolved) stay visible; a link
        # from elsewhere into what the harness keeps does not.
        if _under(real, rk) and not (_under(written, k) or _under(written, rk)):
            return f"{k}, which the harness keeps (its key, history, cache or a run's results)"
    return None


def _refusal(point: str, kept: Iterable[tuple[str, str]], named: str | None = None) -> str | None:
    """Why the sandbox refuses to bind ``point`` (for the path ``named``): it leads, through a
    symbolic link, where no cell may look (the host's ``/run``, its root or devices, what the
    harness keeps), naming the link and where it leads; None where it does not.  Decided on
    where the path leads, since a bind follows its source's links on the host."""
    written = os.path.normpath(point)
    real = os.path.realpath(written)
    if real == written:
        return None
    why = _forbidden(real, written, kept)
    if why is None:
        return None
    parts = written.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        prefix = "/" + "/".join(parts[:i])
        if os.path.islink(prefix) and _forbidden(os.path.realpath(prefix), prefix, kept) is not None:
            return (f"{named or point} leads through the symbolic link {prefix} (-> {os.readlink(prefix)}) to "
                    f"{real}: the sandbox shows no cell anything of {why}; name a path that does not lead there, "
                    "or remove the link")
    # No link on the way: the same place written another way (``//run``: POSIX keeps two leading slashes).
    return (f"{named or point} is {real}: the sandbox shows no cell anything of {why}; name a path that does "
            "not lead there")


def host_mount(path: str, hidden: Iterable[str] = ()) -> tuple[str, list[tuple[str, str]]]:
    """For a backend that binds host paths itself (docker, at the same path): the source to bind
    for ``path`` (where it leads, checked) and the kept paths that bind would show, to mask
    (path in the container, path on the host: :func:`kept_paths` and ``hidden``, e.g. the run's
    ``--out``).  :class:`Refused`, naming the link, where ``path`` is or leads into a place no
    cell may see (the host's ``/run`` and sockets, its root or ``/dev``, what the harness keeps)."""
    written = os.path.normpath(path)
    outs = earlier_outs()
    kept = [(os.path.normpath(k), os.path.realpath(k)) for k in (*kept_paths(), *hidden, *outs)]
    real = os.path.realpath(written)
    why = _refusal(written, kept) if real != written else None
    if why is None and real == written and written != "/" and not written.startswith("/dev/nvidia"):
        where = _forbidden(real, written, kept)
        if where is not None:
            why = f"{path} is in {where}: no cell is shown anything there"
    if why is not None:
        raise Refused(why)
    return real, _masks([*kept_paths(), *hidden, *_run_files(outs, [real])], {written: real})


class Refused(HarnessError):
    """A path a cell's view would bind leads where no cell may look (:func:`_refusal` says how)."""


@functools.lru_cache(maxsize=1)
def _system_dirs() -> tuple[str, ...]:
    """The :data:`SYSTEM_DIRS` this host has (looked up once: they do not come and go)."""
    return tuple(s for s in SYSTEM_DIRS if os.path.lexists(s))


def _searchable(points: Iterable[str]) -> None:
    """Bind points inside the harness's own cache made readable and searchable by the cell's
    unprivileged uid: builds land there from 0700 temporary directories.  The cache itself
    stays 0700, so no one else reaches them; the sandbox binds them past it."""
    cache = str(cache_location())
    for p in points:
        if not _under(p, cache) or p == cache:
            continue
        try:
            st = os.stat(p)
            if st.st_uid == os.geteuid() and st.st_mode & 0o005 != 0o005:
                os.chmod(p, st.st_mode | 0o055)
        except OSError:
            continue


def _environments(paths: Iterable[str]) -> list[str]:
    """The Python environments (a ``pyvenv.cfg`` beside ``bin/``) that paths' programs live in:
    a venv's interpreter needs its whole tree, not only the file named."""
    out: list[str] = []
    for p in paths:
        if not p:
            continue
        if os.path.basename(p) == "shims" and os.path.isfile(os.path.join(os.path.dirname(p), "libexec", "pyenv")):
            # pyenv's shims (a `python3` on PATH) run its libexec and read its versions: the
            # whole installation, read-only (https://github.com/pyenv/pyenv#understanding-shims).
            out.append(os.path.dirname(p))
            continue
        parent = os.path.dirname(p)
        for root in (parent, os.path.dirname(parent)):
            cfg = os.path.join(root, "pyvenv.cfg")
            if os.path.isfile(cfg):
                out.append(root)
                out += _venv_base(cfg)
    return out


@functools.lru_cache(maxsize=64)
def _venv_base(cfg: str) -> tuple[str, ...]:
    """The installation a venv's interpreter comes from (``home`` in ``pyvenv.cfg``, one level
    up: its ``lib/pythonX.Y`` too), which the sandbox must show when it lies outside ``/usr``."""
    try:
        lines = Path(cfg).read_text(errors="replace").splitlines()
    except OSError:
        return ()
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip().startswith("/"):
            return (os.path.dirname(os.path.realpath(value.strip())),)
    return ()


def _enterable(path: str) -> bool:
    """Whether an unprivileged uid may enter ``path`` (a bind point keeps its host mode; the
    directories above it are the sandbox's own, searchable)."""
    try:
        return os.stat(path).st_mode & 0o001 != 0
    except OSError:
        return True  # bubblewrap says why


#: What a run writes in its ``--out`` (:mod:`cumatrix.results.store`'s ``JSONL``, ``PREVIOUS``,
#: ``LOCK`` and ``REPORTS``, the gate's ``static.json``): of an earlier run's directory, these
#: are masked, not the directory, which may be where a later matrix lives (``--out .``).
RUN_FILES = ("results.jsonl", "results.jsonl.prev", ".cumatrix.lock", "results.json", "junit.xml", "summary.md",
             "index.html", "static.json")


def _run_files(outs: Iterable[str], sources: Iterable[str]) -> list[str]:
    """The files of :data:`RUN_FILES` in the ``outs`` directories that lie under one of
    ``sources`` (bound host paths), decided on where each leads."""
    shown = list(sources)
    out: list[str] = []
    for o in outs:
        real = os.path.realpath(o)
        if any(_under(real, src) for src in shown):
            out += [os.path.join(real, name) for name in RUN_FILES]
    return out


def _masks(kept: Iterable[str], points: Mapping[str, str]) -> list[tuple[str, str]]:
    """Where the kept paths that exist show in the cell's view, as (path in the view, path on the
    host): under each bind point (path in the view -> its host source) whose source holds them,
    decided on where both lead (a project reached through a link shows its ``out/`` there too)."""
    out: list[tuple[str, str]] = []
    for path in kept:
        k = os.path.normpath(path)
        if not os.path.lexists(k):
            continue
        real = os.path.realpath(k)
        for at in _shown_at(real, points):
            if (at, real) not in out:
                out.append((at, real))
    return _outermost_masks(out)


def _shown_at(real: str, points: Mapping[str, str]) -> list[str]:
    """Where host path ``real`` shows in the cell's view: under each bind point whose source holds it."""
    return [view if real == src else os.path.join(view, os.path.relpath(real, src))
            for view, src in points.items() if _under(real, src)]


def _outermost_masks(masks: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``masks`` but those inside another masked directory, hidden already (a run's files under its --out)."""
    dirs = [at for at, real in masks if os.path.isdir(real)]
    return [(at, real) for at, real in masks if not any(_under(at, d) and at != d for d in dirs)]


@functools.lru_cache(maxsize=256)
def _private_points(points: tuple[str, ...], read: tuple[str, ...]) -> tuple[str, ...]:
    """The bind points an unprivileged uid could not pass: the point itself, or a directory
    between it and a path the job names under it, that others may not enter."""
    out = []
    for p in points:
        dirs = {p}
        for r in read:
            if not r.startswith("/"):
                continue
            d = os.path.normpath(r if os.path.isdir(r) else os.path.dirname(r))
            while _under(d, p) and d not in dirs:
                dirs.add(d)
                d = os.path.dirname(d)
        if not all(_enterable(d) for d in dirs):
            out.append(p)
    return tuple(out)


def _unseen_cwd(cwd: str) -> str | None:
    """Why a cell cannot start in ``cwd`` under the sandbox: it is (as written) in a place no
    cell sees (the host's ``/run``, ``/proc``, ``/dev``); None: it can.  One reached through a
    link is :func:`_refusal`'s, which names the link."""
    if cwd in ("/", *PRIVATE_DIRS):
        return None  # the cell's own: its root's, its private /tmp and /dev/shm
    written = os.path.normpath(cwd)
    if os.path.realpath(written) != written:
        return None
    why = _forbidden(written, written, ())
    if why is None:
        return None
    return (f"the cell's working directory {cwd} is in {why}: the sandbox shows no cell anything there; "
            "name another with cwd:, or --no-sandbox")

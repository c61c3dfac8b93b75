"""A sandboxed cell's view, in bubblewrap's words (:func:`sandbox_ops`): the system
directories, the GPU's device nodes, the host paths a job names (each bound from where it
leads, :mod:`.viewpaths` judging it), what the harness keeps masked wherever a bind shows it,
and the files the cell may write.  bubblewrap builds it per cell (:mod:`.sandbox`), the fork
server from the same list (:mod:`.forkserver`)."""

# Paths stay strings here on purpose (ruff's PTH rules off for this module): they are what
# bwrap's argv, /proc and the kernel take, and this runs for every cell.
# ruff: noqa: PTH112, PTH113, PTH114, PTH115, PTH118, PTH120

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

from cumatrix.core.options import SandboxPolicy
from cumatrix.execute import driverview
from cumatrix.execute.viewpaths import (
    SYSTEM_DIRS,
    Refused,
    _bind_dir,
    _environments,
    _hidden_roots,
    _masks,
    _outermost,
    _private_points,
    _refusal,
    _run_files,
    _searchable,
    _system_dirs,
    _under,
    earlier_outs,
    gpu_nodes,
    kept_paths,
)

if TYPE_CHECKING:
    from cumatrix.core.jobs import Job

#: A bind point's path in the view, and the host path it shows.
_Points = tuple[tuple[str, str], ...]


def _job_view(job: Job, env: dict[str, str], cwd: str, write_dirs: Iterable[str]) -> tuple[list[str], list[str]]:
    """The host paths a job's cell reads (its mounts, libraries, working directory, programs,
    search paths and their environments) and the files it may write."""
    named = [*job.mounts, *job.lib_path, cwd, *(a for a in job.argv if a.startswith("/"))]
    if cwd == "/tmp":
        named += _named_in_tmp(job, cwd)
    for var in ("PYTHONPATH", "LD_LIBRARY_PATH", "PATH"):
        named += env.get(var, "").split(os.pathsep)
    writable = [os.path.normpath(p) for p in job.writable if os.path.isfile(p)]
    writable += [os.path.normpath(d) for d in write_dirs if os.path.isdir(d)]
    return list(_reached(tuple(dict.fromkeys(named)))), writable  # each once (a PATH names some twice)


def _named_in_tmp(job: Job, cwd: str) -> list[str]:
    # The cell's /tmp is its own: of the host's, it sees what its command names there.
    return [p for p in (os.path.join(cwd, a) for a in job.argv if a and not a.startswith("/"))
            if os.path.lexists(p)]


@functools.lru_cache(maxsize=256)
def _reached(named: tuple[str, ...]) -> tuple[str, ...]:
    """The paths a cell reads for the paths its job names: those, the Python environments their
    programs live in, and what links among them lead to.  Kept per harness process (a run's
    cells name the same few sets; each look-up is some 40 stat calls): a path that appears later
    under a name already looked up is not shown, and a cell then misses it, it never gains one."""
    wanted = list(named)
    wanted += _environments(wanted)
    # What links lead to (a venv's python -> a pyenv or conda install under a private home).
    wanted += [r for r in (os.path.realpath(p) for p in wanted if p.startswith("/")) if r not in wanted]
    return tuple(wanted)


def _views(points: Mapping[str, str], masks: list[tuple[str, str]], write: Iterable[str],
           private: Iterable[str] = ()) -> list[str]:
    """bubblewrap's arguments for what the cell sees of the host beyond the system: ``points``
    (path in the view -> the host path it shows) read-only, ``masks`` (what the harness keeps,
    where a point shows it: path in the view, path on the host) empty, the files in ``write``
    writable, and the host's socket directories hidden under a point.  Every source is the
    resolved path that was checked (:func:`_refusal`), never a link the bind would follow."""
    dir_mask = frozenset(view for view, real in masks if os.path.isdir(real))
    ops, made_by_points, shown = _point_views(tuple(points.items()), tuple(masks), dir_mask, tuple(private))
    out, made = list(ops), set(made_by_points)
    out += _hidden_under(points)
    for f in write:  # the file alone, never its directory (a directory only where named)
        out += _dirs_above(f, shown, made)
        out += ["--bind", os.path.realpath(f), f]
    for m in sorted(dir_mask):
        out += ["--remount-ro", m]
    return out


@functools.lru_cache(maxsize=64)
def _point_views(points: _Points, masks: _Points, dir_mask: frozenset[str], private: tuple[str, ...]
                 ) -> tuple[tuple[str, ...], frozenset[str], _Shown]:
    """The ops of :func:`_views` for its points and masks, with the directories they made and
    what they show: the same for every cell of a run that names the same paths (a pure
    function of its arguments; what the host holds is read before, in ``dir_mask``)."""
    out: list[str] = []
    made = {"/tmp"}
    at_mask = {view for view, _ in masks}
    by_view = dict(points)
    shown = _Shown(by_view, at_mask)
    # A mask is an empty tmpfs over a directory, /dev/null over a file, mounted before what
    # the job names inside it (sorted: a directory comes before what it holds), read-only last.
    for p in sorted({*by_view, *at_mask}):
        out += _dirs_above(p, shown, made)
        out += _point_ops(p, by_view, at_mask, dir_mask, private)
    return tuple(out), frozenset(made), shown


def _above(d: str) -> list[str]:
    """``d`` and every directory above it, up to ``/`` (``d`` normalized)."""
    out = [os.path.normpath(d)]
    while out[-1] != "/":
        out.append(os.path.dirname(out[-1]))
    return out


class _Shown:
    """Which directories a view's points already show: a look-up along a directory's few
    ancestors, not a pass over every point and mask for each (a run that kept many ``--out``
    directories masks each of them, in every cell)."""

    def __init__(self, points: Iterable[str], at_mask: Iterable[str]) -> None:
        self.points: dict[str, set[str]] = {}  # a point, normalized -> the points written so
        for q in points:
            self.points.setdefault(os.path.normpath(q), set()).add(q)
        self.masks = {os.path.normpath(m) for m in at_mask}

    def by_another(self, d: str, p: str) -> bool:
        """Whether a point other than ``p`` shows ``d`` (``d`` is it or lies under it), and no
        mask lies above ``d`` (its inside is the mask's, empty)."""
        chain = _above(d)
        if any(m in self.masks for m in chain[1:]):
            return False
        return any(self.points.get(a, set()) - {p} for a in chain)


def _dirs_above(p: str, shown: _Shown, made: set[str]) -> list[str]:
    """The directories above a bind point ``p`` not yet ``made`` (added to it): made searchable
    (bubblewrap makes them 0700, which an unprivileged cell could not pass), and nothing of the
    host's in them; those inside a mask are the mask's (empty) and made too."""
    out: list[str] = []
    parts = p.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:i])
        if d not in made and not shown.by_another(d, p):
            out.extend(["--perms", "0755", "--dir", d])
            made.add(d)
    return out


def _point_ops(p: str, points: Mapping[str, str], at_mask: AbstractSet[str], dir_mask: AbstractSet[str],
               private: Iterable[str]) -> list[str]:
    """One point of the view: a masked directory (an empty tmpfs), a masked file (/dev/null),
    or the host path it shows, read-only (idmapped where it is ``private``)."""
    if p in dir_mask:
        return ["--perms", "0755", "--size", "4096", "--tmpfs", p]
    if p in at_mask:
        return ["--ro-bind", "/dev/null", p]
    return ["--ro-bind-idmap" if p in private else "--ro-bind", points[p], p]


def _hidden_under(points: Mapping[str, str]) -> list[str]:
    """The host's socket and state directories under a bound one, each a real directory (not
    a link to /run), hidden under an empty read-only tmpfs."""
    out: list[str] = []
    for view, src in points.items():
        for hide in _hidden_roots():
            if _under(hide, src) and hide != src and os.path.isdir(hide) and not os.path.islink(hide):
                at = os.path.join(view, os.path.relpath(hide, src))
                out += ["--perms", "0555", "--size", "4096", "--tmpfs", at, "--remount-ro", at]
    return out


def sandbox_ops(*, cwd: str, policy: SandboxPolicy, read: Iterable[str] = (), write: Iterable[str] = (),
                job: Job | None = None, idmap: bool = False) -> list[str]:
    """What the cell sees, in bubblewrap's words: the system directories, the GPU's device nodes
    and ``read`` read-only (``/proc/sys`` and ``/sys`` too); no ``/run``, ``/var/run`` or other
    host socket; a private ``/tmp`` and ``/dev/shm`` of ``policy.write_limit`` bytes each; the
    files in ``write`` (which must exist) the only writable host paths; ``cwd`` its directory.
    bubblewrap builds it per cell, the fork server from the same list; ``job``'s driver: :mod:`.driverview`.
    ``idmap`` (the fork server of a root harness, whose cells have uids of their own): a bind
    point the cell's uid could not enter (a 0700 project, pytest's ``tmp_path``) is bound as
    ``--ro-bind-idmap``, an idmapped mount showing the harness's files there as the cell's."""
    out = _system_ops(str(policy.write_limit))
    # What the harness keeps, with whether each exists now: one made since the last look (the
    # key, the history) is masked from the next cell on.
    kept = tuple((k, os.path.lexists(k)) for k in (*kept_paths(), *policy.hidden))
    points, masks = _checked_view(tuple(read), kept)
    _check_writes(write, kept)
    private = _private_points(tuple(p for p, _ in points), tuple(read)) if idmap else ()
    out += _views(dict(points), list(masks), write, private)
    out += driverview.job_ops(job, functools.partial(_visible, points=points))
    return [*out, "--chdir", cwd]


def _system_ops(size: str) -> list[str]:
    """The system directories read-only, a fresh ``/dev`` with the GPU's nodes, ``/proc``, and
    a private ``/tmp`` and ``/dev/shm`` of ``size`` bytes each."""
    out: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            out += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            out += ["--ro-bind", d, d]
    out += ["--dev", "/dev"]
    for node in gpu_nodes():
        out += ["--dev-bind", node, node]
    return [*out, "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
            "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys",
            "--perms", "1777", "--size", size, "--tmpfs", "/tmp"]


def _checked_view(read: tuple[str, ...], kept: tuple[tuple[str, bool], ...]) -> tuple[_Points, _Points]:
    """The bind points and masks of :func:`_points_and_masks` for ``read``; raises
    :class:`Refused` where a path leads somewhere no cell may see."""
    # The runs' --out directories existed when listed: looked at again only where they are
    # masked (a mask over one removed since would have nothing to go on).
    outs = earlier_outs()
    points, masks, refused = _points_and_masks(read, kept, outs)
    if any(not os.path.lexists(real) for _, real in masks):
        points, masks, refused = _points_and_masks.__wrapped__(read, kept, outs)
    if refused is not None:
        raise Refused(refused)
    return points, masks


def _check_writes(write: Iterable[str], kept: tuple[tuple[str, bool], ...]) -> None:
    """Refuse a writable file that leads where no cell may write."""
    for f in write:  # the harness's own files (a cell's audit log): through a link only where it was planted
        if os.path.realpath(f) != os.path.normpath(f):
            why = _refusal(f, [(os.path.normpath(k), os.path.realpath(k)) for k, _ in kept])
            if why is not None:
                raise Refused(why)


def _visible(f: str, *, points: _Points) -> bool:
    """Whether the view shows host path ``f``: under a system directory or a bind point."""
    return any(_under(f, d) for d in (*_system_dirs(), *(p for p, _ in points)))


@functools.lru_cache(maxsize=256)
def _points_and_masks(read: tuple[str, ...], kept: tuple[tuple[str, bool], ...], outs: tuple[str, ...] = ()
                      ) -> tuple[_Points, _Points, str | None]:
    """The directories to bind for ``read`` (path in the view, the host path it shows: where
    it leads), the kept paths (and runs' ``outs``) they would show (to mask: path in the view,
    path on the host), and why the view is refused (None: it is not), once per harness process
    for the same paths and kept paths present (as :func:`_reached`)."""
    source, why = _sources(read, _known(kept, outs))
    if why is not None:
        return (), (), why
    outer = {p: source[p] for p in _outermost(set(source))}
    masks = _masks([*(k for k, _ in kept), *_run_files(outs, outer.values())], outer)
    at_mask = [view for view, _ in masks]
    # What a mask would hide of a job's own paths, bound again; a kept directory itself never.
    points = [p for p in _outermost(set(source), at_mask) if p not in at_mask]
    if os.geteuid() == 0:
        _searchable([source[p] for p in points])
    return tuple((p, source[p]) for p in points), tuple(masks), None


def _known(kept: tuple[tuple[str, bool], ...], outs: tuple[str, ...]) -> list[tuple[str, str]]:
    """Each kept path and run's ``--out`` as written and where it leads."""
    return [(os.path.normpath(k), os.path.realpath(k)) for k in (*(k for k, _ in kept), *outs)]


def _sources(read: Iterable[str], known: list[tuple[str, str]]) -> tuple[dict[str, str], str | None]:
    """The directory to bind for each path in ``read`` and where it leads, or why one is refused."""
    source: dict[str, str] = {}
    for n in read:
        d = _bind_dir(n)
        if d is None or d in source:
            continue
        why = _refusal(d, known, named=n)
        if why is not None:
            return source, why
        source[d] = os.path.realpath(d)
    return source, None

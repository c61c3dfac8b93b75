"""``cumatrix clean``: remove what cumatrix made, and nothing else.

- by default (and with ``--cache``): the cache directory (runtime wheels, unpacked runtimes,
  built libraries) and the temporary directories of cumatrix runs that are gone
  (``cumatrix-*`` in ``$TMPDIR`` whose process is dead, see :func:`stale_temp_dirs`);
- ``--images``: runtime images (label ``cumatrix``), base images from
  ``containers/build-base.sh`` (label ``cumatrix.base``) and the untagged build stages both
  leave behind; never an image a container uses, running or stopped (it is listed as kept).
  The images are listed first and removed only after a yes (``--yes``, or an answer on a
  terminal); without a terminal and without ``--yes`` the list is printed and nothing goes
  (exit 2).

``--dry-run`` lists what would go.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors

from cumatrix.core.cache import cache_root
from cumatrix.core.errors import DaemonUnavailable, UsageError
from cumatrix.core.private import cache_exclusive
from cumatrix.execute.docker import BASE_LABEL, RUNTIME_LABEL


@dataclass(kw_only=True, slots=True)
class Cleaned:
    """What was removed (or would be, in a dry run), and what could not be."""

    containers: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    cache: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # "what: why"


def _image_name(img: Any) -> str:
    return str(img.tags[0]) if img.tags else str(img.short_id)


def _remove_image(client: Any, img: Any, done: Cleaned, dry_run: bool) -> None:
    name = _image_name(img)
    if dry_run:
        done.images.append(name)
        return
    try:
        # Tag by tag, never forced: a forced removal would untag an image a container (even a
        # stopped one, created since the listing) uses; the last tag removed takes the image.
        for ref in img.tags or [img.id]:
            client.images.remove(ref, force=False, noprune=False)
        done.images.append(name)
    except docker.errors.NotFound:
        pass  # gone with a child removed before it
    except docker.errors.APIError as e:
        done.kept.append(f"{name}: {e.explanation or e}")


def remove_build_stages(client: Any, *, label: str = BASE_LABEL, dry_run: bool = False) -> list[str]:
    """Remove untagged images labelled ``label`` (build stages of runtime images); return their ids."""
    stages = client.images.list(filters={"dangling": True, "label": label})
    if dry_run:
        return [str(i.short_id).removeprefix("sha256:") for i in stages]
    removed: list[str] = []
    # Pruning repeats until nothing is left: removing a stage can leave its parent dangling.
    while True:
        res = client.images.prune(filters={"dangling": True, "label": label})
        gone = [d.get("Deleted") for d in res.get("ImagesDeleted") or [] if d.get("Deleted")]
        if not gone:
            return removed
        removed += [str(g).removeprefix("sha256:")[:12] for g in gone]


def images_in_use(client: Any) -> dict[str, str]:
    """Image id -> the first container (any state) that uses it: such an image is never removed."""
    used: dict[str, str] = {}
    for c in client.containers.list(all=True, sparse=True):
        a = c.attrs
        image_id = str(a.get("ImageID") or "")
        names = a.get("Names") or [c.id[:12]]
        if image_id:
            used.setdefault(image_id, f"{str(names[0]).lstrip('/')} ({a.get('State') or 'unknown'})")
    return used


def planned_images(client: Any) -> tuple[list[Any], list[str]]:
    """cumatrix's images that may go, and ``"name: why"`` of those kept (a container uses them)."""
    runtime = client.images.list(filters={"label": f"{RUNTIME_LABEL}=1"})
    base = [i for i in client.images.list(filters={"label": BASE_LABEL})
            if i.tags and RUNTIME_LABEL not in (i.labels or {})]
    used = images_in_use(client)
    go: list[Any] = []
    kept: list[str] = []
    seen: set[str] = set()
    for img in [*runtime, *base]:
        if img.id in seen:
            continue
        seen.add(img.id)
        if img.id in used:
            kept.append(f"image {_image_name(img)}: used by container {used[img.id]}")
        else:
            go.append(img)
    return go, kept


def clean_images(client: Any, images: list[Any], *, dry_run: bool = False, stages: bool = True) -> Cleaned:
    """Remove ``images`` (from :func:`planned_images`) and, with ``stages``, the dangling build stages."""
    done = Cleaned()
    for img in images:
        _remove_image(client, img, done, dry_run)
    if stages:
        done.images += remove_build_stages(client, dry_run=dry_run)
    return done


def clean_cache(*, dry_run: bool = False) -> Cleaned:
    """Remove the cache directory."""
    done = Cleaned()
    root = cache_root()
    if root.exists():
        if not dry_run:
            with cache_exclusive(root):  # refused while a run holds the cache
                shutil.rmtree(root)
        done.cache.append(str(root))
    return done


#: Names of cumatrix's temporary directories: the pid of the process that made them comes first.
TEMP_RE = re.compile(r"^cumatrix-[a-z]+(?:-[a-z]+)*-(\d+)-[A-Za-z0-9_]+$")
#: A temporary directory of cumatrix's without a pid in its name (an older cumatrix's) is
#: stale once it is this old (seconds).
LEGACY_AGE = 24 * 3600


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def stale_temp_dirs(tmp: Path | None = None) -> list[Path]:
    """cumatrix's temporary directories in ``tmp`` (default: the temporary directory) whose
    process is gone: a run killed before it could remove its own."""
    root = Path(tmp or tempfile.gettempdir())
    stale = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    now = time.time()
    for p in entries:
        if not p.name.startswith("cumatrix-") or not p.is_dir() or p.is_symlink():
            continue
        try:
            if _is_stale(p, now):
                stale.append(p)
        except OSError:
            continue
    return sorted(stale)


def _is_stale(p: Path, now: float) -> bool:
    """Whether cumatrix's temporary directory ``p`` outlived its run: its process is gone, or
    (a name without a pid) it is older than :data:`LEGACY_AGE`."""
    m = TEMP_RE.match(p.name)
    if m is not None:
        return not _alive(int(m.group(1)))
    return now - p.stat().st_mtime > LEGACY_AGE


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _confirm(count: int, yes: bool) -> bool:
    """Whether to remove ``count`` listed images: ``--yes``, or a yes typed on a terminal."""
    if yes:
        return True
    if not sys.stdin.isatty():
        raise UsageError(f"not removing {count} image{'s' if count != 1 else ''} without --yes (stdin is not a "
                         "terminal to ask on): re-run with --yes to remove the images listed above")
    answer = input(f"remove these {count} image{'s' if count != 1 else ''}? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def cmd_clean(*, images: bool, cache: bool, dry_run: bool, yes: bool = False) -> int:
    """``cumatrix clean``: exit 0; 1 when something could not be removed; 2 when images were
    listed but not confirmed on a non-interactive stdin."""
    if not images:
        cache = True  # the default; images only when asked for
    verb = "would remove" if dry_run else "removed"
    for d in stale_temp_dirs():
        if not dry_run:
            shutil.rmtree(d, ignore_errors=True)
        print(f"cumatrix: {verb} the temporary directory {d} (its run is gone)")
    if cache:
        _clean_cache_dir(verb, dry_run=dry_run)
    kept = _clean_docker_images(dry_run=dry_run, yes=yes) if images else []
    return 1 if kept else 0


def _clean_cache_dir(verb: str, *, dry_run: bool) -> None:
    root = cache_root()
    size = _du(root) if root.is_dir() else 0
    gone = clean_cache(dry_run=dry_run).cache
    for p in gone:
        print(f"cumatrix: {verb} the cache {p} ({size / 2**20:.0f} MiB)")
    if not gone:
        print(f"cumatrix: no cache at {root}")


def _clean_docker_images(*, dry_run: bool, yes: bool) -> list[str]:
    """List (and unless ``dry_run``, after confirmation, remove) our images; what could not be
    removed though it should have been."""
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as e:  # no daemon: nothing of ours can be there to remove
        raise DaemonUnavailable(f"--images: no Docker daemon answers ({e}); start one, or run "
                                "`cumatrix clean` for the cache alone") from e
    try:
        kept = _list_and_remove(client, dry_run=dry_run, yes=yes)
    finally:
        client.close()
    for k in kept:
        if not k.startswith("image ") or ": used by container" not in k:
            print(f"cumatrix: kept {k}")
    return [k for k in kept if ": used by container" not in k]


def _print_plan(go: list[Any], stages: list[str]) -> None:
    """The images and untagged build stages that removal would take, one line each."""
    for img in go:
        print(f"  image {_image_name(img)}")
    if stages:
        print(f"  {len(stages)} untagged build stage{'s' if len(stages) != 1 else ''}")


def _list_and_remove(client: Any, *, dry_run: bool, yes: bool) -> list[str]:
    go, kept = planned_images(client)
    stages = remove_build_stages(client, dry_run=True)
    for k in kept:
        print(f"cumatrix: keeping {k}")
    if not go and not stages:
        print("cumatrix: no cumatrix images to remove")
        return kept
    _print_plan(go, stages)
    if dry_run:
        for img in go:
            print(f"cumatrix: would remove image {_image_name(img)}")
        return kept
    if not _confirm(len(go) + len(stages), yes):
        print("cumatrix: nothing removed")
        return []
    done = clean_images(client, go)
    for i in done.images:
        print(f"cumatrix: removed image {i}")
    return done.kept

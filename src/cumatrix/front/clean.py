"""``cumatrix clean``: remove what cumatrix made, and nothing else.

- ``--images``: containers labelled ``cumatrix`` whose run is gone, runtime images
  (label ``cumatrix``), base images from ``containers/build-base.sh`` (label
  ``cumatrix.base``) and the untagged build stages both leave behind (they inherit the base
  image's label, which is how they are found);
- ``--cache``: the cache directory (runtime wheels, unpacked runtimes, built libraries).

With neither flag, both.  ``--dry-run`` lists what would go.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    import docker.errors

    name = _image_name(img)
    if dry_run:
        done.images.append(name)
        return
    try:
        # By id with force: one image tagged twice goes at once; a container using it keeps it.
        client.images.remove(img.id, force=True, noprune=False)
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


def clean_images(client: Any, *, dry_run: bool = False) -> Cleaned:
    """Remove cumatrix's stopped containers, runtime images, base images and build stages."""
    import docker.errors

    done = Cleaned()
    from cumatrix.execute.docker import listed

    for c, _, name, state in listed(client, f"{RUNTIME_LABEL}=1"):
        if state == "running":
            done.kept.append(f"container {name}: running (a live run's; stop it first)")
            continue
        if not dry_run:
            try:
                c.remove(force=True)
            except docker.errors.NotFound:
                continue
        done.containers.append(name)
    runtime = client.images.list(filters={"label": f"{RUNTIME_LABEL}=1"})
    base = [i for i in client.images.list(filters={"label": BASE_LABEL})
            if i.tags and RUNTIME_LABEL not in (i.labels or {})]
    for img in [*runtime, *base]:
        _remove_image(client, img, done, dry_run)
    done.images += remove_build_stages(client, dry_run=dry_run)
    return done


def clean_cache(*, dry_run: bool = False) -> Cleaned:
    """Remove the cache directory."""
    from cumatrix.core.cache import cache_root

    from cumatrix.core.private import cache_exclusive

    done = Cleaned()
    root = cache_root()
    if root.exists():
        if not dry_run:
            with cache_exclusive(root):  # refused while a run holds the cache
                shutil.rmtree(root)
        done.cache.append(str(root))
    return done


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def cmd_clean(*, images: bool, cache: bool, dry_run: bool) -> int:
    """``cumatrix clean``: exit 0, or 1 when something could not be removed."""
    from cumatrix.core.cache import cache_root
    from cumatrix.core.errors import DaemonUnavailable

    if not images and not cache:
        images = cache = True
    verb = "would remove" if dry_run else "removed"
    kept: list[str] = []
    if cache:
        root = cache_root()
        size = _du(root) if root.is_dir() else 0
        for p in clean_cache(dry_run=dry_run).cache:
            print(f"cumatrix: {verb} the cache {p} ({size / 2**20:.0f} MiB)")
    if images:
        import docker

        try:
            client = docker.from_env(timeout=60)
            client.ping()
        except Exception as e:  # no daemon: nothing of ours can be there to remove
            raise DaemonUnavailable(f"--images: no Docker daemon answers ({e}); start one, or run `cumatrix clean --cache`") from e
        try:
            done = clean_images(client, dry_run=dry_run)
        finally:
            client.close()
        for c in done.containers:
            print(f"cumatrix: {verb} container {c}")
        for i in done.images:
            print(f"cumatrix: {verb} image {i}")
        if not done.containers and not done.images:
            print("cumatrix: no cumatrix images or containers")
        kept = done.kept
    for k in kept:
        print(f"cumatrix: kept {k}")
    return 1 if kept else 0

"""A host that is not shared: the harness's own directories belong to its user alone, the files
it creates are new files (never a link someone planted), and its cache is not removed under a run.

- :func:`private_dir` creates a directory 0700, or accepts an existing one only when this user
  owns it, it is a real directory (not a link) and no one else may write it; anything else is
  :class:`SharedDirectory` (exit 3), before the harness reads or runs a byte from it.  A cache
  that another user created first (``CUMATRIX_CACHE=/tmp/shared``) could hold a spawn helper of
  theirs that the harness would execute.
- :func:`create_new` opens a file that must not exist yet (``O_EXCL``) without following a
  link (``O_NOFOLLOW``); :func:`open_nofollow` opens one that may exist, never through a link.
- :func:`hold_cache` takes a shared ``flock`` on the cache for the life of the process (every
  run, gate and pytest worker); ``cumatrix clean --cache`` takes it exclusively, without
  waiting, and refuses while a run holds it (:class:`CacheBusy`, exit 3).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from cumatrix.core.errors import EnvironmentProblem

#: The lock file in the cache root: shared by runs, exclusive for ``clean --cache``.
CACHE_LOCK = ".cumatrix-cache.lock"

_CHECKED: dict[str, Path] = {}
_HELD: dict[str, int] = {}
_MUTEX = threading.Lock()


class SharedDirectory(EnvironmentProblem):
    """A directory the harness keeps its own files in is not this user's alone (exit 3)."""


class CacheBusy(EnvironmentProblem):
    """``clean --cache`` while a run uses the cache (exit 3)."""


def private_dir(path: Path, *, what: str = "cache") -> Path:
    """``path`` as a directory only this user can write (created 0700 where missing).

    Parents are made with the default mode (``~/.cache`` is the user's already); the directory
    itself must be owned by this user, not be a symbolic link, and not be writable by group or
    others.  Checked once per path and process.
    """
    key = os.fspath(path)
    hit = _CHECKED.get(key)
    if hit is not None:
        return hit
    path = Path(key)
    if not path.is_absolute():
        path = Path.cwd() / path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir(0o700)
        st = os.lstat(path)
    except OSError as e:
        raise SharedDirectory(f"{path}: cannot create the {what} directory: {e.strerror}") from None
    me = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        raise SharedDirectory(f"{path}: the {what} directory is a symbolic link (to {path.readlink()}); "
                              f"cumatrix keeps its {what} only in a directory of its user's own") from None
    if not stat.S_ISDIR(st.st_mode):
        raise SharedDirectory(f"{path}: the {what} directory is not a directory")
    if st.st_uid != me:
        raise SharedDirectory(f"{path}: the {what} directory belongs to uid {st.st_uid}, not to this user "
                              f"(uid {me}): another user could have planted programs in it; use a directory "
                              f"of your own (unset CUMATRIX_CACHE / XDG_CACHE_HOME, or point it elsewhere)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SharedDirectory(f"{path}: the {what} directory is writable by others (mode "
                              f"{stat.S_IMODE(st.st_mode):04o}); run `chmod 700 {path}` or use another one")
    _CHECKED[key] = path
    return path


def create_new(path: Path, mode: int = 0o644) -> int:
    """A descriptor of a new file at ``path``: fails if anything (a file, a link) is there."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def replace_new(path: Path, mode: int = 0o644) -> int:
    """A descriptor of a new, empty file at ``path``, whatever was there (a planted link is
    removed, never followed)."""
    with contextlib.suppress(FileNotFoundError):
        Path(path).unlink()
    return create_new(path, mode)


def write_new(path: Path, text: str, *, replace: bool = False, mode: int = 0o644) -> None:
    """Write ``text`` to a file created at ``path``, never through a link: without ``replace``
    only where nothing is (``O_EXCL``: a file, or a link, dangling or not, is FileExistsError);
    with it, into a new file beside ``path`` renamed over it (a link there is replaced, its
    target untouched)."""
    dest = Path(path)
    target = dest.with_name(f".{dest.name}.{secrets.token_hex(6)}.tmp") if replace else dest
    fd = create_new(target, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if replace:
            target.replace(dest)
    except BaseException:
        if replace:
            with contextlib.suppress(OSError):
                target.unlink()
        raise


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that refuses a symbolic link at ``path`` (ELOOP) instead of following it."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def hold_cache(root: Path) -> None:
    """Hold a shared lock on the cache ``root`` until this process ends (idempotent)."""
    key = os.fspath(root)
    with _MUTEX:
        if key in _HELD:
            return
        try:
            fd = open_nofollow(root / CACHE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError:
            return  # a read-only cache: nothing can remove it under us either
        _HELD[key] = fd


@contextlib.contextmanager
def cache_exclusive(root: Path) -> Iterator[None]:
    """The cache ``root`` to remove: :class:`CacheBusy` while a run holds it."""
    try:
        fd = open_nofollow(root / CACHE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    except FileNotFoundError:
        yield
        return
    except OSError as e:
        raise CacheBusy(f"{root}: cannot lock the cache: {e.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CacheBusy(f"{root}: a cumatrix run is using this cache; `clean --cache` waits until it has "
                            "finished (run it again then)") from None
        yield
    finally:
        os.close(fd)

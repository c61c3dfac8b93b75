"""The harness's signature on the records it writes, so that ``--resume`` keeps only those.

A record edited by hand (a ``fail`` turned into ``pass``) or written by anything else carries
no valid signature and is run again.  The key is the user's own: 32 random bytes in
``$XDG_STATE_HOME/cumatrix/key`` (``~/.local/state/cumatrix/key``), mode 0600, made on first
use, outside any ``--out`` directory (a results file travels; its key does not).  Records
signed on another machine or by another user are therefore run again here, not trusted.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cumatrix.core.errors import CumatrixError

FIELD = "mac"
KEY_BYTES = 32


class KeyProblem(CumatrixError):
    """The signing key exists but is not this user's private file (exit 2)."""


def key_path() -> Path:
    """Where the key lives: ``$XDG_STATE_HOME/cumatrix/key``, else ``~/.local/state/cumatrix/key``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "cumatrix" / "key"


_KEYS: dict[str, bytes] = {}


def record_key() -> bytes:
    """The user's signing key, made on first use; refused when another user could read or replace it."""
    path = key_path()
    hit = _KEYS.get(str(path))
    if hit is not None:
        return hit
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        key = _read_private(path)
    else:
        key = os.urandom(KEY_BYTES)
        try:
            os.write(fd, key)
            os.fsync(fd)
        finally:
            os.close(fd)
    _KEYS[str(path)] = key
    return key


def _read_private(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise KeyProblem(f"{path}: cannot read the record signing key ({e.strerror}); remove it to make a new one") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise KeyProblem(f"{path}: the record signing key must be a regular file of this user with mode 0600 "
                             f"(it is {stat.filemode(st.st_mode)}, uid {st.st_uid}); remove it to make a new one")
        key = os.read(fd, 4096)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise KeyProblem(f"{path}: the record signing key is {len(key)} bytes, not {KEY_BYTES}; remove it to make a new one")
    return key


def _body(record: Mapping[str, Any]) -> bytes:
    from cumatrix.results.store import dumps  # deferred: import circle, results.store imports this module

    return dumps({k: v for k, v in record.items() if k != FIELD}).encode()


def sign(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with its signature (HMAC-SHA256 of its canonical JSON, without the signature)."""
    return {**record, FIELD: hmac.new(record_key(), _body(record), hashlib.sha256).hexdigest()}


def signed(record: Mapping[str, Any]) -> bool:
    """Whether ``record`` carries this user's valid signature."""
    mac = record.get(FIELD)
    if not isinstance(mac, str):
        return False
    want = hmac.new(record_key(), _body(record), hashlib.sha256).hexdigest()
    return hmac.compare_digest(mac, want)

"""The harness's signature on the records it writes: ``--resume`` keeps only those, and a run's
reports, headline and exit status refuse a cell record that does not carry it.

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
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cumatrix.core.errors import CumatrixError, EnvironmentProblem
from cumatrix.results.digests import dumps

FIELD = "mac"
KEY_BYTES = 32


class KeyProblem(CumatrixError):
    """The signing key exists but is not this user's private file (exit 2)."""


class KeyUnavailable(EnvironmentProblem):
    """This host gives no place for the signing key (exit 3): found before any cell runs."""


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
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        if not path.parent.is_dir():
            raise KeyUnavailable(f"{path.parent}: cannot hold the record signing key: a part of it is a file, "
                                 "not a directory (XDG_STATE_HOME, else ~/.local/state)") from None
        key = _read_private(path)
    except OSError as e:
        raise KeyUnavailable(f"{path}: cannot make the record signing key: {e.strerror or e} (XDG_STATE_HOME, "
                             "else ~/.local/state, must be a writable directory)") from None
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
    return dumps({k: v for k, v in record.items() if k != FIELD}).encode()


#: The member naming the key a record was sealed with (:func:`key_id`), inside what the seal covers.
KEY_ID_FIELD = "key_id"
#: How a key id reads: 16 hex digits.
KEY_ID_RE = re.compile(r"[0-9a-f]{16}")


def key_id(key: bytes | None = None) -> str:
    """The public name of a signing key (this user's by default): 16 hex digits of a hash that
    says which key sealed a record without telling anything of the key.  ``cumatrix merge``
    verifies the records sealed with a key it holds, and names the hosts whose records it cannot."""
    return hashlib.sha256(b"cumatrix record key id\0" + (record_key() if key is None else key)).hexdigest()[:16]


def sign(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with the id of the key that seals it and its signature (HMAC-SHA256 of its
    canonical JSON, the key id included, without the signature)."""
    body = {**record, KEY_ID_FIELD: key_id()}
    return {**body, FIELD: hmac.new(record_key(), _body(body), hashlib.sha256).hexdigest()}


def signed(record: Mapping[str, Any]) -> bool:
    """Whether ``record`` carries this user's valid signature."""
    mac = record.get(FIELD)
    if not isinstance(mac, str):
        return False
    want = hmac.new(record_key(), _body(record), hashlib.sha256).hexdigest()
    return hmac.compare_digest(mac, want)


#: Why a record is refused: it carries no signature, or one that does not match its bytes.
UNSEALED = "it carries no seal of this harness (written by something other than cumatrix)"
MISMATCHED = ("its seal does not match its content (edited after cumatrix wrote it, or sealed by another "
              "user or machine)")


def line_problem(line: bytes, record: Mapping[str, Any]) -> str | None:
    """Why the record ``line`` of a results file holds (``record``, as parsed) does not carry
    this user's signature, or None when it does.

    Checked on the line's bytes: the signature is over the record's one encoding without its
    ``mac`` member, which is the line with that member taken out (the encoding sorts keys, and
    ``mac`` never comes first).  A line that is not the harness's encoding of its content (a
    record re-encoded, reordered or edited) is refused, as is a ``mac`` moved into a nested
    object: what is left then still holds a top-level ``mac``, which no signed body does.
    About 4 us a record, against 80 us to re-encode it."""
    mac = record.get(FIELD)
    if not isinstance(mac, str):
        return UNSEALED
    member = f',"{FIELD}":{dumps(mac)}'.encode()
    at = line.find(member)
    if at < 0:
        return MISMATCHED
    body = line[:at] + line[at + len(member):]
    want = hmac.new(record_key(), body, hashlib.sha256).hexdigest()
    return None if hmac.compare_digest(mac.encode(), want.encode()) else MISMATCHED

"""What a run is asked to do, parsed once: :class:`RunOptions` and its :class:`SandboxPolicy`.

Every front end (``cumatrix run`` and ``gate``, ``repro``, ``calibrate``, ``pytest
matrix.yaml``) turns what it was given into one frozen :class:`RunOptions` through one
constructor, :meth:`RunOptions.build`: :meth:`RunOptions.from_cli` reads an argparse
namespace, :meth:`RunOptions.from_pytest` a pytest config, :meth:`RunOptions.from_env` the
environment alone.  The environment's knobs (``CUMATRIX_WHEEL_DIR``, ``CUMATRIX_REQUIRE_GPU``,
``CUMATRIX_SANDBOX``, ``CUMATRIX_SANDBOX_WRITE_LIMIT``, ``CUMATRIX_SANDBOX_UID``) are read in
that constructor only, and every default is written here once.  The sandbox policy travels
inside the options to the stage that spawns a cell; no process-wide setting holds it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from cumatrix.core.errors import UsageError
from cumatrix.core.planned import Selection, parse_selection

#: The matrix file a command reads when none is named (``run``, ``gate``, ``repro``) and ``init`` writes.
DEFAULT_MATRIX = "matrix.yaml"
#: Seconds before a cell's process tree is killed (``--timeout``, ``--cumatrix-timeout``).
DEFAULT_TIMEOUT = 300.0
#: Where ``cumatrix run`` (and ``pytest matrix.yaml``) write results and reports.
DEFAULT_OUT = "out"
#: ``--backend``: a child process per cell, or a container per cell.
BACKENDS = ("local", "docker")
DEFAULT_BACKEND = "local"
#: ``--sandbox``: ``off``; ``auto`` (bubblewrap where it runs, else without, and the result
#: says so); ``on`` (a cell fails with a harness error where bubblewrap cannot run).
SANDBOX_MODES = ("off", "auto", "on")
#: What ``cumatrix run``, ``gate`` and ``pytest matrix.yaml`` do when neither an option, the
#: environment nor the matrix says: every local cell sandboxed where bubblewrap runs.  A cell
#: of the harness's own user could otherwise read the ``--resume`` key, rewrite the history
#: and edit the run's records.
RUN_SANDBOX_DEFAULT = "auto"
#: What a sandboxed cell may write by default (``--sandbox-write-limit``).
WRITE_LIMIT = 1 << 30
#: The range ``--sandbox-write-limit`` accepts: a page to a tebibyte.
WRITE_LIMIT_RANGE = (4096, 1 << 40)
#: The host id a root harness's sandboxed cells run as (``nobody``; ``$CUMATRIX_SANDBOX_UID``).
NOBODY = 65534
_UID_MAX = 2**32 - 2
#: The host uids (and gids) a root harness's cells take under the fork server, one per cell
#: alive (``$CUMATRIX_SANDBOX_UIDS`` = ``BASE:COUNT`` names another range): 2,000,000,000 and
#: the 65,535 after it, inside the block systemd leaves unused (above the containers' ranges,
#: 524288-1879048191, below 2^31, which some tools read as negative).  A cell is ``nobody``
#: (:data:`NOBODY`) inside a user namespace of its own, and one of these outside, so that no
#: two cells alive share what the kernel keeps per uid.
CELL_UIDS = (2_000_000_000, 65536)


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxPolicy:
    """How much of the host a cell sees.

    ``sandbox``: one of :data:`SANDBOX_MODES`.  ``pass_env``: names (or ``fnmatch``
    patterns) of the harness's variables the cell gets beyond the allowlist.  ``limits``:
    resource limits on the cell.  ``write_limit``: bytes a sandboxed cell may write (the
    size of each of its tmpfs, ``/tmp`` and ``/dev/shm``, and the largest file it may write
    on the host).  ``uid``: the host uid and gid a sandboxed cell runs as when the harness
    runs as root.  Built from options and the environment by :func:`sandbox_policy`.
    """

    sandbox: str = "off"
    pass_env: tuple[str, ...] = ()
    limits: bool = True
    write_limit: int = WRITE_LIMIT
    uid: int = NOBODY
    #: Host paths the harness keeps (the run's ``--out``) that a sandboxed cell must not
    #: reach even under a directory it is shown; the harness's own state (key, history,
    #: cache) is hidden always.
    hidden: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.sandbox not in SANDBOX_MODES:
            raise ValueError(f"sandbox must be off, auto or on, not {self.sandbox!r}")


def parse_size(text: str) -> int:
    """Bytes from ``1073741824``, ``512M``, ``1G``, ``1GiB`` (binary units); ValueError otherwise."""
    m = re.fullmatch(r"\s*(\d{1,16})\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (bytes, or a number with K, M, G or T)")
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2).upper() or " "))


def check_write_limit(text: str) -> int:
    """``--sandbox-write-limit``: a size within :data:`WRITE_LIMIT_RANGE`; ValueError otherwise."""
    value = parse_size(text)
    low, high = WRITE_LIMIT_RANGE
    if not low <= value <= high:
        raise ValueError(f"{text}: expected from 4K to 1T, got {value} bytes")
    return value


def _env_size(environ: Mapping[str, str], name: str, default: int, high: int) -> int:
    """An integer knob from the environment; a value that is not one in range is ignored."""
    raw = environ.get(name, "").strip()
    try:
        value = parse_size(raw) if raw else default
    except ValueError:
        return default
    return value if 0 < value <= high else default


def env_sandbox(value: str | None, default: str = "off") -> str:
    """``$CUMATRIX_SANDBOX``: unset: ``default``; 0/off: off; auto: where bubblewrap runs;
    anything else: on."""
    v = (value or "").strip().lower()
    if not v:
        return default
    if v in ("0", "off", "no", "false"):
        return "off"
    return "auto" if v == "auto" else "on"


def matrix_sandbox(value: object) -> str | None:
    """A matrix file's ``sandbox:`` (``false``, ``true``/``auto``, ``required``; the schema
    checked it; YAML reads a bare ``on``/``off`` as a boolean) as a mode; None: the file does
    not say."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "auto" if value else "off"
    return "on" if value == "required" else str(value)


def sandbox_policy(*, sandbox: str | None = None, pass_env: Iterable[str] | None = (),
                   write_limit: int | None = None, limits: bool = True,
                   environ: Mapping[str, str] | None = None, default: str = "off",
                   hidden: Iterable[str] = ()) -> SandboxPolicy:
    """A :class:`SandboxPolicy` from option values; an option left None takes the
    environment's value (``$CUMATRIX_SANDBOX``, ``$CUMATRIX_SANDBOX_WRITE_LIMIT``), else the
    default (``default``: the front end's, e.g. :data:`RUN_SANDBOX_DEFAULT`).  The uid always
    comes from ``$CUMATRIX_SANDBOX_UID`` (no flag sets it)."""
    env = os.environ if environ is None else environ
    return SandboxPolicy(
        sandbox=sandbox if sandbox is not None else env_sandbox(env.get("CUMATRIX_SANDBOX"), default),
        pass_env=tuple(pass_env or ()), limits=limits, hidden=tuple(hidden),
        write_limit=write_limit if write_limit is not None
        else _env_size(env, "CUMATRIX_SANDBOX_WRITE_LIMIT", WRITE_LIMIT, WRITE_LIMIT_RANGE[1]),
        uid=_env_size(env, "CUMATRIX_SANDBOX_UID", NOBODY, _UID_MAX))


def uid_range(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """The cells' host uid range (:data:`CELL_UIDS`, or ``$CUMATRIX_SANDBOX_UIDS``, ``BASE:COUNT``,
    ignored unless it lies within 1..2^32-2 and holds at least one uid)."""
    env = os.environ if environ is None else environ
    base, _, count = env.get("CUMATRIX_SANDBOX_UIDS", "").strip().partition(":")
    if base.isdigit() and count.isdigit() and int(base) > 0 and int(count) > 0 \
            and int(base) + int(count) - 1 <= _UID_MAX:
        return int(base), int(count)
    return CELL_UIDS


class _PytestConfig(Protocol):
    """What :meth:`RunOptions.from_pytest` reads of a ``pytest.Config`` (core does not import pytest)."""

    def getoption(self, name: str, default: object = ..., skip: bool = ...) -> object: ...


#: pytest option (dest) -> RunOptions field.
_PYTEST_NAMES = {
    "cumatrix_out": "out", "cumatrix_resume": "resume", "cumatrix_wheel_dir": "wheel_dir",
    "cumatrix_backend": "backend", "cumatrix_timeout": "timeout", "cumatrix_base_image": "base_image",
    "cumatrix_host": "host", "cumatrix_submission": "submission", "cumatrix_require_gpu": "require_gpu", "cumatrix_keyword": "keyword",
    "cumatrix_only": "only", "cumatrix_first": "first", "cumatrix_reports_after": "reports_after",
    "cumatrix_sandbox": "sandbox", "cumatrix_pass_env": "pass_env",
    "cumatrix_sandbox_write_limit": "sandbox_write_limit",
    "cumatrix_cover": "cover", "cumatrix_seed": "seed", "cumatrix_rotate": "rotate", "cumatrix_night": "night",
}
#: argparse dest -> RunOptions field (the CLI's subcommands share these names).
_CLI_NAMES = {
    "out": "out", "resume": "resume", "wheel_dir": "wheel_dir", "backend": "backend", "timeout": "timeout",
    "base_image": "base_image", "host": "host", "submission": "submission", "require_gpu": "require_gpu", "keyword": "keyword",
    "sandbox": "sandbox", "pass_env": "pass_env", "sandbox_write_limit": "sandbox_write_limit",
    "cover": "cover", "seed": "seed", "rotate": "rotate", "night": "night",
}


def _path(value: object) -> Path | None:
    return Path(str(value)) if value not in (None, "") else None


def _whole(value: object) -> int | None:
    return int(str(value)) if value not in (None, "") else None


def _text(value: object) -> str | None:
    return str(value) if value not in (None, "") else None


@dataclass(frozen=True, kw_only=True, slots=True)
class RunOptions:
    """Every option of a run of cells, whichever front end it came through.

    ``out``: results and reports (None: nowhere, e.g. ``pytest`` of no matrix file);
    ``only``/``first``: files of cell ids (``--lf``/``--ff``); ``reports_after``: the caller
    writes the reports once pytest has returned (``cumatrix run``).
    """

    out: Path | None = None
    resume: bool = False
    wheel_dir: Path | None = None
    backend: str = DEFAULT_BACKEND
    timeout: float = DEFAULT_TIMEOUT
    base_image: str | None = None
    host: str | None = None
    #: The submission of a plan this run is one host of (recorded in the run header).
    submission: str | None = None
    require_gpu: bool = False
    keyword: str | None = None
    only: Path | None = None
    first: Path | None = None
    reports_after: bool = False
    policy: SandboxPolicy = field(default_factory=SandboxPolicy)
    #: An option or ``$CUMATRIX_SANDBOX`` chose the sandbox (a matrix's ``sandbox:`` then
    #: does not override it, see :meth:`for_matrix`).
    sandbox_chosen: bool = False
    #: Which cells of the matrix run: every one, a covering plan, a night of a rotation
    #: (``--cover``, ``--seed``, ``--rotate``, ``--night``).
    selection: Selection = field(default_factory=Selection)

    def for_matrix(self, setting: object) -> SandboxPolicy:
        """The policy for a matrix file's cells: its ``sandbox:`` where neither an option nor
        the environment chose, else this run's."""
        mode = matrix_sandbox(setting)
        if mode is None or self.sandbox_chosen:
            return self.policy
        return replace(self.policy, sandbox=mode)

    @classmethod
    def build(cls, values: Mapping[str, object], environ: Mapping[str, str] | None = None, *,
              sandbox_default: str = "off") -> RunOptions:
        """The one constructor: option values by field name (a value of None or a missing
        key: not given) and the environment for what was not given; ``sandbox_default``: the
        front end's sandbox where neither says (:data:`RUN_SANDBOX_DEFAULT` for a run)."""
        env = os.environ if environ is None else environ
        get = values.get
        try:
            selection = parse_selection(_text(get("cover")), _whole(get("seed")), _whole(get("rotate")),
                                        _whole(get("night")))
        except ValueError as e:
            raise UsageError(str(e)) from None
        limit = get("sandbox_write_limit")
        timeout = get("timeout")
        return cls(
            out=_path(get("out")), resume=bool(get("resume")),
            wheel_dir=_path(get("wheel_dir") or env.get("CUMATRIX_WHEEL_DIR")),
            backend=str(get("backend") or DEFAULT_BACKEND),
            timeout=float(str(timeout)) if timeout else DEFAULT_TIMEOUT,
            base_image=_text(get("base_image")), host=_text(get("host")),
            submission=_text(get("submission")),
            require_gpu=bool(get("require_gpu")) or env.get("CUMATRIX_REQUIRE_GPU", "") == "1",
            keyword=_text(get("keyword")), only=_path(get("only")), first=_path(get("first")),
            reports_after=bool(get("reports_after")),
            policy=sandbox_policy(sandbox=_text(get("sandbox")), pass_env=_strings(get("pass_env")),
                                  write_limit=int(str(limit)) if limit is not None else None, environ=env,
                                  default=sandbox_default,
                                  hidden=[str(Path(str(get("out"))).absolute())] if get("out") else ()),
            sandbox_chosen=_text(get("sandbox")) is not None or bool(env.get("CUMATRIX_SANDBOX", "").strip()),
            selection=selection)

    @classmethod
    def from_cli(cls, args: object, environ: Mapping[str, str] | None = None, *,
                 sandbox_default: str = "off") -> RunOptions:
        """From a subcommand's argparse namespace (options it lacks are not given)."""
        return cls.build({name: getattr(args, dest, None) for dest, name in _CLI_NAMES.items()}, environ,
                         sandbox_default=sandbox_default)

    @classmethod
    def from_pytest(cls, config: _PytestConfig, environ: Mapping[str, str] | None = None) -> RunOptions:
        """From a pytest session's ``--cumatrix-*`` options: a run of cells, sandboxed by default."""
        return cls.build({name: config.getoption(dest, None) for dest, name in _PYTEST_NAMES.items()}, environ,
                         sandbox_default=RUN_SANDBOX_DEFAULT)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RunOptions:
        """No option given: the environment's knobs and the defaults."""
        return cls.build({}, environ)


def _strings(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Iterable):
        return tuple(str(v) for v in value)
    return (str(value),)



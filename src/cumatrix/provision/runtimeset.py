"""A run's runtimes, each provisioned once: from the matrix's runtime entry to all a cell needs of it.

The orchestrator asks :meth:`RuntimeSet.for_cell` once per cell, before the cell's first stage,
and hands what it gets (a :class:`ProvisionedRuntime`) to every stage after: the oracle predicts
from its version, the provisioner puts its library (and an environment's variables) in the job,
the audit enforces it.  The first cell of a runtime provisions it (a wheel fetched, checked
against its pin and unpacked, its library's version read as data; an environment built; this
Python's found); every later cell of the run finds it done.  An image runtime is the docker
backend's: here only its version is known, from its tag.  A runtime that cannot be provisioned
is kept as the error that says why, raised where a job needs the runtime.

The wheel requirements are read once, by the loader's parser, when the set is made
(:func:`~cumatrix.load.requirements.wheel_pins`): provisioning is handed the pin, not the text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cumatrix.core.errors import CumatrixError
from cumatrix.core.model import NO_RUNTIME, Cell, Matrix, Runtime
from cumatrix.load.requirements import WheelPin, wheel_pins
from cumatrix.predict.oracle import image_runtime_version
from cumatrix.provision import runtimes as _runtimes
from cumatrix.provision.runtimes import ResolvedRuntime


@dataclass(frozen=True, kw_only=True, slots=True)
class ProvisionedRuntime:
    """One runtime entry of a matrix, as the run provisioned it (once)."""

    entry: Runtime
    #: The runtime on this host (the wheel, its checked metadata, the unpacked library and its
    #: version facts: :class:`~cumatrix.provision.runtimes.ResolvedRuntime`), or why there is none.
    resolved: ResolvedRuntime | CumatrixError
    #: ``cudaRuntimeGetVersion`` as known before the run, what the oracle predicts from: the
    #: resolved library's, an image's by its tag; None where neither is known.
    version: int | None

    def need(self) -> ResolvedRuntime:
        """The runtime resolved on this host; where it could not be, the error that says why."""
        if isinstance(self.resolved, CumatrixError):
            raise self.resolved
        return self.resolved

    def known_version(self) -> int | None:
        """:attr:`version`, where the runtime's failure to resolve is raised rather than unknown
        (an image's version is its tag's: nothing is resolved here for it)."""
        return self.version if self.entry.image else self.need().version

    def wheel(self) -> Path | CumatrixError | None:
        """A wheel runtime's wheel, fetched and checked against its pin once for the run; the
        error that kept it from being resolved; None for any other runtime."""
        if isinstance(self.resolved, CumatrixError):
            return self.resolved
        return self.resolved.wheel

    @property
    def ok(self) -> ResolvedRuntime | None:
        """The resolved runtime, or None where it could not be resolved."""
        return None if isinstance(self.resolved, CumatrixError) else self.resolved


@dataclass
class RuntimeSet:
    """The runtimes of one run's matrix, each provisioned the first time a cell asks for it."""

    matrix: Matrix
    wheel_dir: Path | None = None
    _pins: dict[str, WheelPin | ValueError] = field(init=False, repr=False)
    _done: dict[str, ProvisionedRuntime] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._pins = wheel_pins(self.matrix.runtimes)

    def for_cell(self, cell: Cell) -> ProvisionedRuntime | None:
        """The runtime ``cell`` loads, provisioned (None: a driver-family cell loads none)."""
        if cell.runtime == NO_RUNTIME:
            return None
        return self.provisioned(cell.runtime)

    def provisioned(self, name: str) -> ProvisionedRuntime:
        """Runtime ``name`` of the matrix, provisioned once for the run (a failure is kept)."""
        got = self._done.get(name)
        if got is None:
            got = self._done[name] = self._provision(self.matrix.runtime(name))
        return got

    def resolved(self, name: str) -> ResolvedRuntime | None:
        """Runtime ``name`` if it was resolved already, without error; nothing is provisioned."""
        got = self._done.get(name)
        return got.ok if got is not None else None

    def _provision(self, entry: Runtime) -> ProvisionedRuntime:
        resolved: ResolvedRuntime | CumatrixError
        try:
            resolved = self._resolve(entry)
        except CumatrixError as e:
            resolved = e
        if entry.image:  # the docker backend's: only its tag says its version here
            return ProvisionedRuntime(entry=entry, resolved=resolved, version=image_runtime_version(entry.image))
        version = None if isinstance(resolved, CumatrixError) else resolved.version
        return ProvisionedRuntime(entry=entry, resolved=resolved, version=version)

    def _resolve(self, entry: Runtime) -> ResolvedRuntime:
        pin = self._pins.get(entry.name)
        if isinstance(pin, ValueError):
            raise pin  # a matrix made in code, which the loader never checked
        if pin is not None:
            return _runtimes.from_pin(entry.name, pin, wheel_dir=self.wheel_dir, where=entry.where)
        return _runtimes.resolve_installed(entry, wheel_dir=self.wheel_dir)

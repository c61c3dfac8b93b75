"""Ask a ``libcuda.so.1`` its version, in a harness child spawned like any cell's.

Provisioning builds an emulated driver for a real one whose version it is given; asking the
real one is running code (the driver's own), so it happens here, through
:func:`cumatrix.execute.local.run_local`: the child's environment, limits, containment and
sandbox are those of every cell, and its answer comes over the private verdict channel.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cumatrix.core.jobs import Job
from cumatrix.execute.local import run_local
from cumatrix.provision.cell import PACKAGE_PARENT
from cumatrix.provision.drivers import InterposerError

# A version query: a harness child, so its answer comes over the private verdict channel.
_VERSION_SNIPPET = (
    "import ctypes,sys\n"
    "from cumatrix.child import channel as protocol\n"
    "lib=ctypes.CDLL(sys.argv[1])\n"
    "v=ctypes.c_int(0)\n"
    "rc=lib.cuDriverGetVersion(ctypes.byref(v))\n"
    "protocol.emit({'outcome': 'ok' if rc == 0 else 'cuda-error:%d' % rc, 'data': {'driver_version': v.value}})\n"
)


def read_driver_version(libcuda: Path, *, timeout: float = 60.0) -> int:
    """``cuDriverGetVersion`` of ``libcuda`` (e.g. 13000), asked in a throwaway harness child."""
    job = Job(cell_id="driver-version", kind="probe", reports_verdict=True, timeout=timeout,
              argv=(sys.executable, "-c", _VERSION_SNIPPET, str(libcuda)),
              env=(("PYTHONPATH", PACKAGE_PARENT),), mounts=(PACKAGE_PARENT, str(Path(libcuda).parent)))
    res = run_local(job)
    verdict = res.verdict
    version = verdict.data.get("driver_version") if verdict is not None and verdict.outcome == "ok" else None
    if not isinstance(version, int) or res.signal is not None:
        why = res.verdict_error or (verdict.outcome if verdict else "") or res.stderr_tail.strip()[-300:]
        raise InterposerError(f"{libcuda}: cuDriverGetVersion failed: {why}")
    return version

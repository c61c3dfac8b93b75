"""The gate's static audit against a hand-checked truth set of published wheels.

    python tests/truth/truth.py [--wheel-dir DIR] [-v]

``wheels.json`` beside this file lists published wheels (``name==version``, file name, sha256)
and, per set of gate options, the findings a person established for them from ``readelf``,
``strings`` and ``cuobjdump`` (the evidence is beside each check).  The wheels are downloaded
once (``pip download --no-deps --only-binary=:all:``: no package code runs) into
``$XDG_CACHE_HOME/cumatrix/truth`` (or ``--wheel-dir``) and their sha256 checked; each check
is then compared with what :func:`cumatrix.audit.audit_wheel` finds.  Prints each check that
disagrees and the agreement figure, ``agreed/total``; exit 1 when any disagrees, 3 when a
wheel cannot be had.

A check is one of:

* ``"expect": "error runtime-needs-newer-driver static libcudart 13"``: a finding of that
  severity, code and subject in ``file``;
* ``"expect": "none runtime-major"``: no finding of that code in ``file`` (``"none"``: no
  error or warning at all in it);
* ``"device": {"sass": [...], "ptx": [...]}``: the SASS and PTX architectures of ``file``;
* ``"exit": N``: the gate's exit status for the whole wheel (0 pass, 1 an error finding).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRUTH = HERE / "wheels.json"
_PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_24_x86_64",
              "manylinux_2_27_x86_64", "manylinux_2_28_x86_64", "manylinux2010_x86_64",
              "manylinux_2_12_x86_64")


class Unavailable(Exception):
    """A truth-set wheel that cannot be downloaded here (no network, index unreachable)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    wheel: str
    args: str
    check: str
    agreed: bool
    got: str


def load() -> list[dict[str, Any]]:
    """The truth set's wheels, as written in ``wheels.json``."""
    data = json.loads(TRUTH.read_text())
    if data.get("schema") != 1:
        raise ValueError(f"{TRUTH}: unsupported schema")
    return list(data["wheels"])


def cache() -> Path:
    sys.path.insert(0, str(HERE.parent.parent / "src"))
    from cumatrix.core.cache import cache_dir

    return cache_dir("truth")


def fetch(entry: Mapping[str, Any], dest: Path) -> Path:
    """The wheel of ``entry`` in ``dest`` (downloaded there once), its sha256 checked."""
    path = dest / entry["file"]
    if not path.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "--python-version", "3.11", "-d", str(dest)]
        for p in _PLATFORMS:
            cmd += ["--platform", p]
        proc = subprocess.run([*cmd, entry["requirement"]], capture_output=True, text=True,
                              timeout=900, check=False)
        if proc.returncode != 0 or not path.is_file():
            tail = " / ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])
            raise Unavailable(f"{entry['requirement']}: pip could not download {entry['file']}"
                              f" ({tail or 'no such file'})")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != entry["sha256"]:
        raise ValueError(f"{path}: sha256 {digest}, the truth set says {entry['sha256']}")
    return path


def _settings(args: Mapping[str, Any]) -> Any:
    from cumatrix.audit.static import AuditSettings
    from cumatrix.binary.fatbin import parse_arch
    from cumatrix.core.model import CudaVersion

    rts = tuple(int(r) for r in args["runtimes"]) if "runtimes" in args else None
    min_driver = CudaVersion.parse(args.get("min_driver", f"{min(rts)}.0" if rts else "12.0"))
    min_runtime = CudaVersion.parse(args["min_runtime"]) if "min_runtime" in args else min_driver
    arch = (tuple(parse_arch(a) for a in args["arch_list"].split()) if "arch_list" in args
            else None)
    return AuditSettings(min_driver=min_driver, runtimes=rts, min_runtime=min_runtime,
                         arch_list=arch, forward_compat=bool(args.get("forward_compat")))


def evaluate(entry: Mapping[str, Any], wheel: Path, data: Any) -> Iterator[Outcome]:
    """Each check of ``entry`` against the gate's audit of ``wheel``."""
    from cumatrix.audit.static import audit_wheel

    for run in entry["runs"]:
        s = _settings(run["args"])
        audit = audit_wheel(wheel, min_driver=s.min_driver, runtimes=s.runtimes, strict=False,
                            optional=(), introductions=data.introductions,
                            abi_changed=data.abi_changes, settings=s, data=data)
        label = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in run["args"].items())
        for check in run["checks"]:
            yield _compare(entry["requirement"], label, check, audit)


def _compare(wheel: str, label: str, check: Mapping[str, Any], audit: Any) -> Outcome:
    if "exit" in check:
        got = 1 if audit.errors else 0
        return Outcome(wheel=wheel, args=label, check=f"exit {check['exit']}",
                       agreed=got == check["exit"], got=f"exit {got}")
    file = check["file"]
    found = [f for f in audit.findings if f.file == file]
    if file not in audit.elves:
        return Outcome(wheel=wheel, args=label, check=f"{file}: present", agreed=False,
                       got=f"{file} is not an ELF member of the wheel")
    if "device" in check:
        dev = next((d for d in audit.device if d.file == file), None)
        sass = list(dev.sass) if dev else []
        ptx = sorted({c.name for c in dev.codes if c.kind == "ptx"}) if dev else []
        want = check["device"]
        return Outcome(wheel=wheel, args=label, check=f"{file}: device {want}",
                       agreed=(sass == want["sass"] and ptx == sorted(want["ptx"])),
                       got=f"sass {sass} ptx {ptx}")
    words = check["expect"].split(" ", 2)
    text = "; ".join(f"{f.severity} {f.code} {f.subject}" for f in found) or "no finding"
    if words[0] == "none":
        if len(words) == 1:
            ok = not any(f.severity in ("error", "warning") for f in found)
        else:
            ok = not any(f.code == words[1] for f in found)
        return Outcome(wheel=wheel, args=label, check=f"{file}: {check['expect']}", agreed=ok,
                       got=text)
    severity, code, subject = words
    ok = any(f.severity == severity and f.code == code and f.subject == subject for f in found)
    return Outcome(wheel=wheel, args=label, check=f"{file}: {check['expect']}", agreed=ok,
                   got=text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel-dir", type=Path, default=None,
                    help="where the truth-set wheels are (downloaded there when missing)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every check")
    args = ap.parse_args()
    dest = args.wheel_dir or cache()
    from cumatrix.audit.static import load_audit_data

    data = load_audit_data()
    outcomes: list[Outcome] = []
    for entry in load():
        try:
            wheel = fetch(entry, dest)
        except Unavailable as e:
            print(f"cannot check: {e}", file=sys.stderr)
            return 3
        outcomes.extend(evaluate(entry, wheel, data))
    for o in outcomes:
        if args.verbose or not o.agreed:
            print(f"{'agree' if o.agreed else 'DISAGREE'}: {o.wheel} [{o.args}] {o.check} "
                  f"(gate: {o.got})")
    agreed = sum(o.agreed for o in outcomes)
    wheels = len({o.wheel for o in outcomes})
    print(f"truth set: {agreed}/{len(outcomes)} checks agreed on {wheels} wheels")
    return 0 if agreed == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())

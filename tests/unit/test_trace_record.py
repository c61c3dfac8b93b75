"""The tracer's record as the harness reads it: complete only with its last line, the maps' order kept,
and a cell whose record does not cover its whole tree never a pass on what was seen."""

from __future__ import annotations

from cumatrix.core.model import Observed
from cumatrix.core.witness import parse_trace
from cumatrix.execute.observe import Observation, ObservedRuntime
from cumatrix.judge.classify import with_audit

_NONE = ObservedRuntime(file=None, soname=None, version=None, evidence="no libcudart mapped")


def _seen(incomplete: str | None) -> Observation:
    return Observation(libraries=(), runtime=_NONE, not_used=None, source="kernel", incomplete=incomplete)


def test_an_incomplete_trace_turns_a_pass_into_a_harness_error() -> None:
    got = with_audit(Observed(outcome="ok", path="n/a", exit_status=0), _seen("the tracer's record is incomplete"))
    assert got.outcome == "harness-error"
    assert "the process's own outcome: ok" in got.detail


def test_an_incomplete_trace_leaves_a_failure_and_a_complete_one_a_pass() -> None:
    failed = Observed(outcome="exit:3", exit_status=3)
    assert with_audit(failed, _seen("the tracer's record is incomplete")) == failed
    passed = Observed(outcome="ok", path="n/a", exit_status=0)
    assert with_audit(passed, _seen(None)) == passed


def test_a_record_is_complete_only_with_its_last_line() -> None:
    """``z`` comes once every traced process has ended (``l``: only the first has)."""
    head = b"t\t1\ne\t2\t/bin/sh\nx\t2\t0\t/bin/sh\nl\t0\n"
    assert not parse_trace(head).complete
    assert parse_trace(head + b"z\t0\n").complete


def test_the_maps_order_is_kept_and_what_only_an_mmap_saw_follows() -> None:
    """The maps' lines give the objects' order (the first static runtime, the first libcudart
    are taken in it, as before the mmap stops); a file only an mmap stop saw comes last."""
    raw = (b"t\t1\n"
           b"M\t2\tfe:00\t7\t/gone/libcudart.so.13\n"
           b"M\t2\tfe:00\t5\t/lib/libc.so.6\n"
           b"m\t2\tfe:00\t9\t/bin/prog\n"
           b"m\t2\tfe:00\t5\t/lib/libc.so.6\n"
           b"x\t2\t0\t/bin/prog\nl\t0\t0\nz\t0\n")
    got = parse_trace(raw)
    assert [o.path for o in got.objects] == ["/bin/prog", "/lib/libc.so.6", "/gone/libcudart.so.13"]
    assert got.objects[2].pids == (2,)


def test_a_nameless_file_carries_its_soname_and_digest_into_the_fingerprint() -> None:
    """A memfd mapped executable: the tracer read its SONAME and the SHA-256 of its bytes when it
    was mapped (``s``, ``h``); both reach the object, and the digest the record's fingerprint."""
    digest = "ab" * 32
    raw = (b"t\t1\n"
           b"M\t2\t00:01\t40\t/memfd:rt (deleted)\n"
           b"s\t00:01\t40\tlibcudart.so.13\n"
           b"h\t00:01\t40\t" + digest.encode() + b"\t123456\n"
           b"x\t2\t0\t/bin/prog\nz\t0\n")
    (obj,) = parse_trace(raw).objects
    assert (obj.soname, obj.digest) == ("libcudart.so.13", (digest, 123456))
    seen = Observation(libraries=(), runtime=_NONE, not_used=None, source="kernel",
                       nameless=((obj.path, digest, 123456),))
    assert seen.fingerprint()["nameless_files"] == [{"path": "/memfd:rt (deleted)", "sha256": digest,
                                                     "bytes": 123456}]

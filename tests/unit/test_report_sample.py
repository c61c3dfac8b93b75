"""The sample run the report tests read is what they need: passes, failures, skips, timings."""

from __future__ import annotations

from helpers.sample_run import sample_records


def test_sample_has_passes_failures_skips_and_timings() -> None:
    recs = sample_records()
    statuses = {r.get("status") for r in recs if r["type"] == "cell"}
    assert statuses == {"pass", "fail", "skip"}
    assert any(r.get("timings", {}).get("gbps") for r in recs if r["type"] == "cell")  # type: ignore[union-attr]

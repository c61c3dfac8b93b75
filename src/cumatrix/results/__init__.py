"""Results: the per-cell store of a run (``results.jsonl``), appended and flushed as cells finish."""

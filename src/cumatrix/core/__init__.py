"""The types that cross stages: cells, outcomes, jobs, records, errors, and where things are kept."""

"""Stage five, judge: a finished child classified into an observed outcome, then the one verdict."""

"""Stage four, execute: one contained process (or container) per cell, and what it really mapped."""

"""Stage three, provision: runtimes (wheels, environments, images), compiled variants and driver
interposers, turned into the job a cell's child runs."""

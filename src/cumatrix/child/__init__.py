"""What runs inside a cell: the standard library and ctypes only, nothing else of the harness."""

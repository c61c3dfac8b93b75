"""What several test modules share: gcc builds, wheels, results files, process states.

The tests import it as ``helpers`` (``tests/`` is on ``sys.path`` through its ``conftest.py``).
"""

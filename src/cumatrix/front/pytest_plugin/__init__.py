"""The pytest plugin: ``pytest matrix.yaml`` collects one item per cell.

Its entry point (pytest11 in pyproject.toml, ``-p`` for ``cumatrix run``) is :mod:`.hooks`: the
collector, the cell items and the hooks.  :mod:`.selection` picks the cells a session runs
(``--cell``, ``-k``, reuse of finished ones); :mod:`.session` owns the run's store, seal and
reports.  The arrows run hooks to session to selection, never back.  This module imports
nothing, so loading the plugin costs only :mod:`.hooks`.
"""

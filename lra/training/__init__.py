"""One ``run.py`` job (checked before any work by :mod:`lra.checks`): the Lightning run (``train``),
resume (``resume``), profiling callbacks (``profiling``), time forecasts, the CPU thread setting and the Hydra callbacks that guard a sweep (``hydra_callbacks``).

May import: :mod:`lra.data`, the top-level ``lra`` modules, ``models`` and ``attention``. Never bench or report.
"""

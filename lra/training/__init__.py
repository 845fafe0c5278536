"""One ``run.py`` job: the command line checked before any work (``validate``), the Lightning run
(``train``), resume (``resume``), profiling callbacks (``profiling``), time forecasts, the CPU thread
setting and the Hydra callbacks that guard a sweep (``hydra_callbacks``).

May import: :mod:`lra.data`, the top-level ``lra`` modules, ``models`` and ``attention``. Never bench or report.
"""

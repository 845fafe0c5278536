"""Efficiency measurements: the harness (``harness``: ``run.py mode=bench`` and ``python -m lra.bench``),
the race against the public implementations (``peers``: ``python -m lra.bench --protocol peers``) and
Memformer's memory-replay comparison (``mrbp``: ``python -m lra.bench.mrbp``).

May import: the top-level ``lra`` modules, ``models`` and ``attention``. Never data, training or the
report: a bench reads no data (token ids are drawn) and writes run records the report reads.
"""

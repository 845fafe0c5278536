"""The benchmark around the models: task data, training runs, the efficiency harness and the report.

Five layers, each a subpackage; imports point only down this list (``tests/test_layers.py`` checks it):

* :mod:`lra.checks` - ``run.py``'s checks before any work, one module per stage (command line,
  config, build); only ``run.py`` imports it.
* :mod:`lra.report` - tables, plots, SMAT, statistics, published numbers, W&B push. Reads run
  records; never imports training, bench or data code, so a report can be built from records alone.
* :mod:`lra.bench` - the efficiency harness (speed and peak memory side by side, the race against
  peer libraries, Memformer's MRBP). Builds models; writes run records.
* :mod:`lra.training` - one ``run.py`` job: the Lightning run, resume, profiling callbacks, Hydra
  callbacks.
* :mod:`lra.data` - one module per task plus the shared DataModule, cache and readers. Knows nothing
  of models, training or reports.

The few modules at the top are shared by every layer and import no layer: ``badinput`` (user errors),
``files`` (crash-safe writes, writable directories), ``records`` (the run record: the contract between
the runs that write it and the report that reads it), ``stamp`` (machine and code stamp of a record)
and ``footprint`` (peak memory and parameter counts, for profiling and bench); this file holds
the repository's ``ROOT`` and ``CONF_DIR``.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "conf"  # the run's Hydra config (attention/registry.py keeps its own: attention sits below lra)

"""The user-facing checks of ``run.py``: a run's whole configuration is checked before any work, so
a mistake costs seconds, not a data build. Three stages, cheapest first, one module each, named for
what it needs; each raises :class:`lra.badinput.UserError` (one paragraph naming the setting, the bad
value and the fix), which :func:`lra.badinput.exit_user_error` prints:

1. :mod:`~lra.checks.overrides` - the command line, before Hydra composes it (Hydra's parser only).
2. :mod:`~lra.checks.config` - the composed config (OmegaConf only, no torch).
3. :mod:`~lra.checks.build` - train/test: what the run will build, minus the data (torch, Lightning).

``run.py`` runs them in this order: stage 1 in ``cli`` (also for ``mode=fetch``), stages 2 and 3 in
``checked_dispatch``; between them, for every mode that builds the attention (train, test, bench,
check), :mod:`~lra.checks.variant_settings`: the variant's settings against its class's signature
(type hints and defaults, so a variant brings its rules with it). Checks that need what only one part of the suite knows stay with it and run
from here or from that part: the attention variants' (``Mixer.setting_problems``/``setting_warnings``,
from stage 3), the devices' (:mod:`lra.training.devices`), the report's, which need the run records
(:mod:`lra.report.arguments`, first thing in ``mode=report``), bench's protocol and lengths
(:mod:`lra.bench.harness`).

``python run.py mode=check attention=<name>`` is the check of a variant's code rather than of a run's
settings: :mod:`~lra.checks.variant` runs the attention contract's properties
(:mod:`~lra.checks.contract`, :mod:`~lra.checks.precision`; the contract tests call the same code) on
one variant and prints a table.

Layer: above ``training``, ``data`` and ``report``; only ``run.py`` imports it. Nothing here is imported
by the package itself, so stage 1 and 2 import no torch.
"""

"""Bugs in what issue 63 built (a variant's check, its settings, SMAT's needs, the W&B run, where
records go, the forecast): each must fail the tests named."""
from tests.mutants import Mutant

MUTANTS = [
    Mutant("issue63-check-padding-compares-nothing", "lra/checks/contract.py",
           "    diff = difference(at_real(out2, mask), at_real(out, mask))\n    if diff is not None:\n        return (f\"padding leaks",
           "    diff = difference(at_real(out, mask), at_real(out, mask))\n    if diff is not None:\n        return (f\"padding leaks",
           "the variant check's padding property compares an output with itself: a variant that ignores the "
           "key mask passes it",
           ("tests/checks/test_variant_check.py::test_a_variant_that_ignores_the_key_mask_fails_on_padding",)),
    Mutant("issue63-variant-settings-skip-lists", "lra/checks/variant_settings.py",
           "    if origin in SEQUENCES or hint in SEQUENCES:",
           "    if False:",
           "a list setting of a variant is not checked: attention.rates=0.5 fails later as a raw TypeError",
           ("tests/checks/test_variant_settings.py",)),
    Mutant("issue63-smat-mixes-backbones", "lra/report/efficiency.py",
           "    if not bench or not other:",
           "    if True:",
           "SMAT combines speed measured on one backbone with accuracy from another",
           ("tests/report/test_smat_needs.py",)),
    Mutant("issue63-wandb-id-not-derived", "lra/training/wandb_run.py",
           '    derived = {"id": wandb_id(run_id), ',
           '    derived = {"id": None, ',
           "the W&B run id is W&B's random one: a resumed run starts a second W&B run",
           ("tests/training/test_wandb_run.py",)),
    Mutant("issue63-approximation-records-in-the-repository", "lra/bench/approximation.py",
           '    p.add_argument("--results-dir", default=str(default_dir("results_dir")),',
           '    p.add_argument("--results-dir", default=str(ROOT / "results"),',
           "python -m lra.bench --protocol approximation writes to the repository's results/, ignoring $LRA_RESULTS_DIR",
           ("tests/bench/test_results_home.py",)),
    Mutant("issue63-forecast-step-without-loading", "lra/training/forecast.py",
           "        if self._t0 is None:  # the first step of a stretch: from its own start\n            self._t0 = time.perf_counter()",
           "        if True:\n            self._t0 = time.perf_counter()",
           "a step is timed from its own start again: data loading between steps is left out and the forecast "
           "says half the time the run takes",
           ("tests/training/test_quiet.py::test_a_step_costs_what_it_costs_the_run",)),
]

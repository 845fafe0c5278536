"""Bugs of what a run knows about its code (issue 63): the behavioural fingerprint, its comparison,
and the resume and pooling decisions that read it."""
from tests.mutants import Mutant

FAST = ("tests/training/test_fingerprint.py",)
RUNS = ("tests/training/test_fingerprint_runs.py",)
REPORT = ("tests/report/test_fingerprint_pooling.py",)
MUTANTS = [
    Mutant("fp-no-steps", "lra/training/fingerprint.py",
           "            opt.step()\n", "            pass\n",
           "the optimiser steps are skipped: a wrong or detached gradient leaves the fingerprint as it was", FAST),
    Mutant("fp-unpadded-batch", "lra/training/fingerprint.py",
           "    mask[1, -1, max(1, int(KEEP * max_len)):] = False\n", "",
           "the canonical batch has no padding: a variant that attends to padded keys fingerprints as a correct one", FAST),
    Mutant("fp-run-seed", "lra/training/fingerprint.py",
           "        copy.seed = SEED\n", "        pass\n",
           "the fingerprint is built from the run's seed: seeds of one experiment never pool", FAST),
    Mutant("fp-tolerance-ignored", "lra/identity.py",
           "            if not abs(x - y) <= BEHAVIOUR_ATOL + BEHAVIOUR_RTOL * max(abs(x), abs(y)):",
           "            if abs(x - y) > 1.0:",
           "fingerprints agree whatever the code does: an edited variant resumes and pools with the old", FAST),
    Mutant("fp-resume-ignores-behaviour", "lra/training/train.py",
           "    unfinished, finished = find_previous(cfg.paths.results_dir, key, behaviour)\n",
           "    unfinished, finished = find_previous(cfg.paths.results_dir, key)\n",
           "resume and skip ignore the code: 'already finished' after an edit, a killed run continued by other code", RUNS),
    Mutant("fp-report-pools-any-behaviour", "lra/report/cells.py",
           "        home = next((g for g in groups if behaviour_difference(run.behaviour, g[0].behaviour) is None), None)",
           "        home = next(iter(groups), None)",
           "the report pools runs of code that behaves differently into one cell", REPORT),
    Mutant("fp-report-start-commit-only", "lra/report/screening.py",
           "        return sorted({code_label(s) for s in segments} or {code_label(self.rec.get(\"stamp\") or {})})",
           "        return [code_label(self.rec.get(\"stamp\") or {})]",
           "a cell lists only its runs' starting commits, not the commits their later stretches ran on", REPORT),
]

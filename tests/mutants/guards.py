"""Five behaviours no test protected (issue 63 item 8): each bug was planted and every test of its
area, slow ones included, still passed. Each now has a fast test that fails when it breaks."""
from tests.mutants import Mutant

MUTANTS = [
    Mutant("guard-save-now-keeps-the-clock", "lra/training/checkpoints.py",
           "        self.saved_step, self.pending = trainer.global_step, False\n        self._last_time = time.monotonic()\n",
           "        self.saved_step, self.pending = trainer.global_step, False\n",
           "a save (timed or forced by a stop) does not restart the every-minutes clock: after the first "
           "timed save, a checkpoint is written at every step",
           ("tests/training/test_checkpoints.py::test_every_minutes_counts_from_the_last_save_whoever_made_it",)),
    Mutant("guard-unreadable-schedule-means-no-validation", "lra/training/checkpoints.py",
           "    except AttributeError:\n        return True\n",
           "    except AttributeError:\n        return False\n",
           "when Lightning's validation schedule cannot be read, validates_next answers 'no validation "
           "follows': a checkpoint is saved before a validation and a resumed run skips it",
           ("tests/training/test_checkpoints.py::test_an_unreadable_validation_schedule_defers_the_save",)),
    Mutant("guard-resume-finds-the-oldest", "lra/training/resume.py",
           "    return (unfinished[-1] if unfinished else None), (finished[-1] if finished else None)",
           "    return (unfinished[0] if unfinished else None), (finished[-1] if finished else None)",
           "the resume continues the oldest unfinished record of an identity instead of the newest",
           ("tests/training/test_find_previous.py",)),
    Mutant("guard-compile-limit-zero-is-the-default", "lra/training/compile.py",
           "CompileNetwork(32 if limit is None else int(limit))",
           "CompileNetwork(int(limit) or 32 if limit is not None else 32)",
           "trainer.compile_limit=0 is read as the default 32 instead of being refused (by the callback)",
           ("tests/training/test_compile_limit.py",)),
    Mutant("guard-compile-limit-zero-passes-the-check", "lra/checks/config.py",
           'Rule("trainer.compile_limit", "int", 1,',
           'Rule("trainer.compile_limit", "int", 0,',
           "trainer.compile_limit=0 passes the config check before any work",
           ("tests/training/test_compile_limit.py",)),
    Mutant("guard-ranking-holm-per-task", "lra/report/comparisons.py",
           "    tests = _holm([c for rows in per_task.values() for c in rows])",
           "    tests = [c for rows in per_task.values() for c in _holm(rows)]",
           "the ranking tests behind bold and underline are Holm-corrected per task instead of over the "
           "table's family",
           ("tests/report/test_ranking_family.py",)),
]

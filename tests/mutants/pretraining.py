"""Bugs of self-pretraining (issue 64): what the loss is over, how masks are drawn, what carries into
the fine-tune, the causal mask, and how the stage is shared and resumed."""
from tests.mutants import Mutant

FAST = ("tests/training/test_pretraining.py",)
RUNS = "tests/training/test_pretraining_runs.py"
MUTANTS = [
    Mutant("pretrain-masks-padding", "models/pretraining.py",
           "    return (u.to(mask.device) < ratio) & mask\n", "    return u.to(mask.device) < ratio\n",
           "padded positions are masked and predicted: the loss counts padding", FAST),
    Mutant("pretrain-mask-is-pad-token", "models/pretraining.py",
           "return ids.masked_fill(selected, self.mask_id), ", "return ids.masked_fill(selected, 0), ",
           "masked tokens are replaced by the padding id instead of the mask token", FAST),
    Mutant("pretrain-masks-ignore-step", "models/pretraining.py",
           "[int(seed), _STAGES[stage], int(count)]", "[int(seed), _STAGES[stage]]",
           "every step masks the same positions", FAST),
    Mutant("pretrain-head-carried", "lra/training/pretrained.py",
           'NOT_CARRIED = ("head.",)', "NOT_CARRIED = ()",
           "the untrained classification head of the pretraining network replaces the fine-tune's fresh one", FAST),
    Mutant("pretrain-encoder-not-loaded", "lra/training/pretrained.py",
           "    missing, unexpected = module.network.load_state_dict(state, strict=False)\n",
           "    missing, unexpected = [], []\n",
           "the fine-tune names its pretraining but starts from scratch", FAST),
    Mutant("pretrain-causal-sees-next", "attention/softmax.py",
           "torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)",
           "torch.ones(n, n, dtype=torch.bool, device=q.device).triu(2)",
           "the causal mask lets position t see token t+1, the one it predicts", FAST),
    Mutant("pretrain-no-lock", "lra/training/resume.py",
           'LOCKED_MODES = ("train", "pretrain")', 'LOCKED_MODES = ("train",)',
           "two jobs that need one pretraining both pretrain", (f"{RUNS}::test_two_fine_tunes_started_together_pretrain_once",)),
    Mutant("pretrain-restarts-instead-of-resuming", "lra/training/resume.py",
           "        return record, str(last)\n", "        return record, None\n",
           "a killed pretraining starts again from step 0 (same numbers, the work redone)",
           (f"{RUNS}::test_killed_while_pretraining_the_same_command_resumes_it_then_fine_tunes",)),
]

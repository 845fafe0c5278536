"""Bugs of length-sorted, cut evaluation batches (issue 25): predictions must be those of full batches."""
from tests.mutants import Mutant

EVAL = ("tests/training/test_eval_batches.py",)
MUTANTS = [
    Mutant("eval-cut-one-token-short", "lra/data/datamodule.py",
           "return min(-(-max(longest, 1) // multiple) * multiple, full)",
           "return min(-(-max(longest - 1, 1) // multiple) * multiple, full)",
           "the batch is cut before its longest example's last token: that example loses it", EVAL),
    Mutant("eval-limit-after-sorting", "lra/data/datamodule.py",
           "order = np.arange(len(dataset))[: self._eval_examples(split, len(dataset))]",
           "order = np.arange(len(dataset))",
           "limit_val_batches keeps the longest examples instead of the split's first ones", EVAL),
    Mutant("eval-predictions-in-batch-order", "models/module.py",
           'order = np.argsort(index, kind="stable")', "order = np.arange(len(index))",
           "prediction files in length-sorted order: paired tests compare different examples", EVAL),
    Mutant("eval-dual-cut-by-first-document", "lra/data/datamodule.py",
           "return lengths.max(axis=tuple(range(1, lengths.ndim)))", "return lengths[:, 0]",
           "retrieval batches sorted by the first document only (the cut itself stays safe)", EVAL),
    Mutant("eval-loader-draws-global-rng", "lra/data/datamodule.py",
           "                          generator=torch.Generator().manual_seed(self.seed))  # see _loader: no global draw",
           "                          )",
           "each validation draws a seed from the global RNG: the validation cadence changes the training", EVAL),
    Mutant("eval-fraction-of-a-fraction", "lra/data/datamodule.py",
           "            setattr(self.trainer, name, len(batches))", "            pass",
           "limit_val_batches=0.5 evaluates a quarter of the split: Lightning cuts the cut loader again", EVAL),
    Mutant("eval-share-ignores-the-cut", "lra/data/datamodule.py",
           "cut_width(int(lengths[b].max()), self.eval_width_multiple, eval_full)", "eval_full",
           "the forecast counts full-width validation batches: ListOps validations estimated at 3x", EVAL),
]

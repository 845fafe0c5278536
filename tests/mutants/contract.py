"""Bugs only the stronger contract tests catch: train-mode padding leaks and state updates, padded
length and pooling reach, and bfloat16 dtype."""
from tests.mutants import Mutant

CONTRACT = "tests/test_attention_contract.py"
REACH = "tests/test_pooling_reach.py"
BF16_CAST = "tests/test_attention_bf16.py::test_cast_bf16_matches_float32"

MUTANTS = [
    Mutant("contract-shell-train-unmasked", "attention/shell.py",
           "out = self.mixer(q, k, v, mask, x)", "out = self.mixer(q, k, v, mask | self.training, x)",
           "the shell drops the padding mask in training only (eval-only tests pass)", (REACH,)),
    Mutant("contract-cls-pool-last", "models/pooling.py",
           "    return h[:, 0]", "    return h[:, -1]",
           "CLS pooling reads the last position (padding in short rows) instead of the CLS slot", (REACH,)),
    Mutant("contract-cls-padded", "models/pooling.py",
           "mask = torch.cat([mask.new_ones(b, 1), mask], dim=1)", "mask = torch.cat([mask.new_zeros(b, 1), mask], dim=1)",
           "the prepended CLS token is marked as padding, so it reads nothing", (REACH,)),
    Mutant("contract-mean-pool-unmasked", "models/pooling.py",
           "m = mask.to(h.dtype).unsqueeze(-1)", "m = torch.ones_like(mask, dtype=h.dtype).unsqueeze(-1)",
           "mean pooling averages padded positions in", (REACH,)),
    Mutant("contract-zero-padded-float32", "attention/masking.py",
           "return out * mask[:, None, :, None].to(out.dtype)", "return out * mask[:, None, :, None].float()",
           "a mixer returns float32 from bfloat16 inputs (type promotion in the padding mask)", (BF16_CAST,)),
    Mutant("contract-routing-ema-sees-padding", "attention/routing.py",
           "onehot = F.one_hot(s.argmax(dim=2), c).to(u.dtype) * real[..., None]",
           "onehot = F.one_hot(s.argmax(dim=2), c).to(u.dtype)",
           "the training-only centroid update averages padded tokens in (a state update, not an output)",
           (f"{CONTRACT}::test_padding_invariance",)),
    Mutant("contract-routing-commitment-sees-padding", "attention/routing.py",
           "commit = sum(((2 - 2 * s.amax(dim=2)) * real).sum() for s in (sim_q, sim_k)) / n_real",
           "commit = sum((2 - 2 * s.amax(dim=2)).sum() for s in (sim_q, sim_k)) / n_real",
           "the training-only aux loss counts padded tokens", (f"{CONTRACT}::test_padding_invariance",)),
    Mutant("contract-nystrom-segments-by-padded-length", "attention/nystromformer.py",
           "n_real = mask.long().sum(dim=-1, keepdim=True).clamp_min(1)",
           "n_real = torch.full_like(mask.long()[:, :1], mask.shape[-1])",
           "landmark segments cut by the padded length, so the output follows how far a batch is padded",
           (f"{CONTRACT}::test_padded_length_invariance_eval",)),
    Mutant("contract-nystrom-segments-by-batch-longest", "attention/nystromformer.py",
           "n_real = mask.long().sum(dim=-1, keepdim=True).clamp_min(1)",
           "n_real = mask.long().sum(dim=-1, keepdim=True).amax().clamp_min(1)",
           "landmark segments cut by the longest row of the batch, so a row's output depends on its batch mates",
           (f"{CONTRACT}::test_batch_independence",)),
]

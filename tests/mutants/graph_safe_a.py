"""Bugs in the graph-safe branches of linear, ABC_RD and AdaMRA (issue 25): each plants its bug only
where ``graph_safe_active()`` holds, so the eager runs of the reference tests stay green and only
their ``graph_safe`` runs (the ``attention_mode`` fixture) can kill it."""
from tests.mutants import Mutant

LINEAR = ("tests/attention/test_reference_baselines.py::test_linear_equals_reference",)  # the file has other variants
ABC = ("tests/attention/test_reference_abc.py",)
ADAMRA = ("tests/attention/test_reference_adamra.py",)
MUTANTS = [
    Mutant("graph-safe-linear-padded-keys-in-normaliser", "attention/linear.py",
           "    phi_k = elu_feature_map(k, keep)                                      # padded keys",
           "    phi_k = elu_feature_map(k)                                            # padded keys",
           "the graph-safe linear attention forgets the key mask: padded keys enter the numerator "
           "and the normaliser", LINEAR),
    Mutant("graph-safe-abc-rd-slot-bound-off-by-one", "attention/abc.py",
           "            table = (u * self.memory_size).long().clamp_max(self.memory_size - 1)",
           "            table = (u * (self.memory_size - 1)).long()",
           "ABC_RD's graph-safe slot draw floor((n - 1) u) never picks the last slot", ABC),
    Mutant("graph-safe-adamra-padded-queries-routed", "attention/adamra.py",
           "            here = ((routed == h) & mask)[:, None, :, None]",
           "            here = (routed == h)[:, None, :, None]",
           "the static-shape dispatch keeps the routed head's read at padded queries (non-zero output "
           "there, and their gradient flows into the projections and the router)", ADAMRA),
    Mutant("graph-safe-adamra-random-router-subheads-bound", "attention/adamra.py",
           "            table = (u * self.n_routed).long().clamp_max(self.n_routed - 1)",
           "            table = (u * self.n_heads).long().clamp_max(self.n_routed - 1)",
           "the graph-safe random router draws among the shell's heads (the subheads S) instead of the "
           "AdaMRA heads H: with S < H the coarsest heads never get a query", ADAMRA),
]

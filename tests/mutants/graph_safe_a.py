"""Bugs in the graph-safe branches of ABC_RD and AdaMRA (issue 25; ABC_RD's and AdaMRA's draws
are :meth:`Mixer.randint`'s since issue 35): each plants its bug only where ``graph_safe_active()`` holds, so the eager runs of the reference tests stay green and only
their ``graph_safe`` runs (the ``attention_mode`` fixture) can kill it."""
from tests.mutants import Mutant

ABC = ("tests/attention/test_reference_abc.py",)
ADAMRA = ("tests/attention/test_reference_adamra.py",)
MUTANTS = [
    Mutant("graph-safe-abc-rd-slot-bound-off-by-one", "attention/base.py",
           "        return (u * high).long().clamp_max(high - 1)",
           "        return (u * (high - 1)).long()",
           "Mixer.randint floor((n - 1) u) never draws n - 1: ABC_RD never picks its "
           "last slot", ABC),
    Mutant("graph-safe-adamra-padded-queries-routed", "attention/adamra.py",
           "            out = out * mask.view(b, n, 1, 1).to(out.dtype)\n",
           "            out = out\n",
           "padded queries keep their routed head's read (non-zero output there, and their gradient "
           "flows into the projections and the router)", ADAMRA),
    Mutant("graph-safe-adamra-random-router-subheads-bound", "attention/base.py",
           "        return (u * high).long().clamp_max(high - 1)",
           "        return (u * self.n_heads).long().clamp_max(high - 1)",
           "Mixer.randint draws among the shell's heads (the subheads S) instead of its "
           "bound: AdaMRA's random router, with S < H, never sends a query to the coarsest heads", ADAMRA),
]

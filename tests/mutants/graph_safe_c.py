"""Bugs in the graph-safe branches of BigBird and clustered attention, and in the graph-safe switch
and draws every variant shares (issue 25). Most BigBird ones live in code only graph-safe runs take,
so only the ``graph_safe`` runs of the reference tests (the ``attention_mode`` fixture) can kill
them; the random candidates and (since issue 35) the key-block tables are shared with the eager
plan, so both modes see those."""
from tests.mutants import Mutant

BIGBIRD = ("tests/attention/test_reference_baselines.py::test_bigbird_equals_reference",
           "tests/attention/test_reference_grid.py::test_bigbird_grid")
CLUSTERED = ("tests/attention/test_reference_clustered.py",)
GRAPH_SAFE = ("tests/attention/test_graph_safe.py", "tests/attention/test_counter_random.py")
MUTANTS = [
    Mutant("graph-safe-bigbird-window-reads-the-last-block", "attention/bigbird.py",
           "        win_valid = (win > 0) & (win < lst)  ",
           "        win_valid = (win > 0) & (win <= lst) ",
           "a sample's window slot also reads its last (global) block, which its global slot reads "
           "already: that block counts twice in the softmax", BIGBIRD),
    Mutant("graph-safe-bigbird-random-past-the-sample", "attention/bigbird.py",
           "| (c == 0) | (c >= last[..., None, None])",
           "| (c == 0) | (c > last[..., None, None])",
           "random blocks may be the sample's last block (global already) instead of another", BIGBIRD),
    Mutant("graph-safe-bigbird-batch-plan-for-every-sample", "attention/bigbird.py",
           "        last = torch.div((pos * mask).amax(dim=-1) + bs - 1, bs, rounding_mode=\"floor\").sub(1).clamp_min(0)  # [B]",
           "        last = torch.full((q.shape[0],), -(-n // bs) - 1, device=dev)  # [B]",
           "every sample gets the padded batch's plan (a padding block global, random blocks moved): "
           "the known port defect the eager grouping avoids", BIGBIRD),
    Mutant("graph-safe-clustered-planes-from-a-fixed-draw", "attention/base.py",
           "        self.draws = self.draws + 1\n",
           "        self.draws = self.draws + 0\n",
           "graph-safe training draws never advance: the same planes, features and noise every step",
           CLUSTERED + ("tests/attention/test_graph_safe.py::test_counter_draws_advance_in_training_and_repeat_in_eval",)),
    Mutant("padding-read-as-unpadded", "attention/padding.py",
           "            any = not bool(mask.all())", "            any = False",
           "a mask read on the host is taken for an unpadded batch: padded keys get weight on the fast path",
           ("tests/attention/test_host_syncs.py::test_padding_is_read_once_when_unstated_and_believed_when_stated",
            "tests/attention/test_reference_baselines.py::test_softmax_equals_reference")),
    Mutant("padding-tail-segment-unpadded", "attention/padding.py",
           "self.any or (t + 1) * size > n", "self.any",
           "an unpadded batch's last Memformer segment, right-padded to the segment length, is taken for unpadded",
           ("tests/attention/test_padding.py",)),
    Mutant("graph-safe-uniform-reaches-one", "attention/counter_random.py",
           "    u = ((bits >> 9).to(torch.float64 if dtype == torch.float64 else torch.float32) + 0.5) * 2.0 ** -23\n",
           "    u = ((bits >> 8).to(torch.float64 if dtype == torch.float64 else torch.float32) + 0.5) * 2.0 ** -24\n",
           "24 hash bits in float32: the top value rounds to 1.0 (log(1 - u) = -inf in Gumbel noise)",
           ("tests/attention/test_counter_random.py",)),
]

STATE = "tests/attention/test_reference_baselines_state.py"
MUTANTS += [
    Mutant("graph-safe-performer-first-call-keeps-the-construction-draw", "attention/performer.py",
           "        due = self.calls == 0\n",
           "        due = self.calls < 0\n",
           "Performer skips the redraw of the first training call (the schedule starts late)",
           (f"{STATE}::test_performer_features_redrawn_every_interval_training_steps_never_at_eval",
            "tests/attention/test_reference_grid.py::test_performer_grid")),
    Mutant("graph-safe-sinkhorn-sorted-rows-not-normalised", "attention/sinkhorn.py",
           "    out[..., bs:, :].copy_(mix * inv[..., None])",
           "    out[..., bs:, :].copy_(mix)",
           "Sinkhorn uses the sorted mixture sum, not its conditional mean",
           ("tests/attention/test_reference_baselines.py::test_sinkhorn_equals_reference",)),
    Mutant("graph-safe-nystromformer-conv-frame-shifted", "attention/nystromformer.py",
           "    body = buf[:, :, 1:-1].view(b, h, d, (nb + 1) * block)[..., :n]",
           "    body = buf[:, :, 2:].view(b, h, d, (nb + 1) * block)[..., :n]",
           "Nystromformer's skip convolution reads its blocks one block off",
           ("tests/attention/test_reference_baselines.py::test_nystromformer_equals_reference",)),
]

"""Bugs in what the variants build from their counter-based draws (issue 38). The draws themselves
are right in all of them (``test_counter_random.py`` passes); each changes the *distribution* of
what a variant builds (slots, heads, random blocks, buckets, hash bits, features, Gumbel noise),
so only a distribution test of that object can kill it."""
from tests.mutants import Mutant

DIST = "tests/attention/test_graph_safe_distributions.py"
ABC = (f"{DIST}::test_abc_rd_slot_frequencies_uniform",)
ADAMRA = (f"{DIST}::test_adamra_random_router_head_choice_uniform",)
BIGBIRD = (f"{DIST}::test_bigbird_random_blocks_per_row_uniform_over_the_candidates",)
REFORMER = (f"{DIST}::test_reformer_bucket_occupancy_uniform",)
CLUSTERED = (f"{DIST}::test_clustered_hash_bits_follow_the_angle",)
PERFORMER = (f"{DIST}::test_performer_features_orthogonal_with_chi_norms_and_uniform_directions",)
SINKHORN = (f"{DIST}::test_sinkhorn_gumbel_noise_is_standard_gumbel",)
MUTANTS = [
    Mutant("graph-safe-d-abc-rd-slots-rounded", "attention/base.py",
           "        return (u * high).long().clamp_max(high - 1)",
           "        return torch.round(u * (high - 1)).long()",
           "ABC_RD's slot (Mixer.randint) round((m - 1) u) instead of floor(m u): both end "
           "slots are drawn half as often as the others", ABC),
    Mutant("graph-safe-d-adamra-router-rounded", "attention/base.py",
           "        return (u * high).long().clamp_max(high - 1)",
           "        return (u * high).round().long().clamp_max(high - 1)",
           "the random router (Mixer.randint) rounds H u: the first head gets half its queries, the last "
           "one and a half times", ADAMRA),
    Mutant("graph-safe-d-bigbird-window-exclusion-off-by-one", "attention/bigbird.py",
           "        excluded = ((a - c).abs() <= w) | (c == 0)",
           "        excluded = ((a - c).abs() < w) | (c == 0)",
           "random blocks may be a row's window neighbours (read already by the window slots), "
           "in the graph-safe per-sample tables and the eager plan alike", BIGBIRD),
    Mutant("graph-safe-d-bigbird-per-sample-plan-stops-a-block-early", "attention/bigbird.py",
           "        ridx, rvalid = self._random_candidates(1, nb, last)",
           "        ridx, rvalid = self._random_candidates(1, nb, last - 1)",
           "the graph-safe per-sample plan excludes the block before the sample's last: it is never "
           "a random block", BIGBIRD),
    Mutant("graph-safe-d-reformer-rotation-negative-half-dropped", "attention/reformer.py",
           "            ids = torch.cat([proj, -proj], dim=-1).argmax(-1)",
           "            ids = torch.cat([proj, proj], dim=-1).argmax(-1)",
           "h(x) = argmax([xR; xR]): the negative half of the rotation is dropped and only the first "
           "n_buckets / 2 buckets are ever used", REFORMER),
    Mutant("graph-safe-d-normal-one-uniform-twice", "attention/counter_random.py",
           "    z = torch.sqrt(-2.0 * torch.log(u[0])) * torch.cos(2.0 * math.pi * u[1])",
           "    z = torch.sqrt(-2.0 * torch.log(u[0])) * torch.cos(2.0 * math.pi * u[0])",
           "graph-safe Box-Muller takes radius and angle from one uniform: normals with mean 0.06 "
           "and std 1.06, so rotations, hash planes and features lose their isotropy",
           REFORMER + CLUSTERED + PERFORMER),
    Mutant("graph-safe-d-normal-half-variance", "attention/counter_random.py",
           "    z = torch.sqrt(-2.0 * torch.log(u[0])) * torch.cos(2.0 * math.pi * u[1])",
           "    z = torch.sqrt(-torch.log(u[0])) * torch.cos(2.0 * math.pi * u[1])",
           "graph-safe normals of variance 1/2: Performer's row norms are chi_d / sqrt(2) (the "
           "sign hashes do not see a scale)", PERFORMER),
    Mutant("graph-safe-d-clustered-planes-uniform", "attention/clustered.py",
           "        return self.randn((h, d, self.bits), device)",
           "        return self.rand((h, d, self.bits), device)",
           "SimHash planes drawn from the uniform stream: every plane in the positive orthant, so "
           "bits follow the queries' coordinate sums, not their angle", CLUSTERED),
    Mutant("graph-safe-d-performer-orthogonality-dropped", "attention/performer.py",
           "lambda shape, dtype: self.randn(shape, device, dtype), self.orthogonal)",
           "lambda shape, dtype: self.randn(shape, device, dtype), False)",
           "orthogonal: true draws i.i.d. Gaussian features (the orthogonal random features dropped)",
           PERFORMER),
    Mutant("graph-safe-d-performer-qr-sign-fix-dropped", "attention/performer.py",
           "    qmat = qmat * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)",
           "    qmat = qmat",
           "Householder QR without the sign fix: the first row of every block points into one "
           "half-space (Q[0, 0] < 0 always)", PERFORMER),
    Mutant("graph-safe-d-sinkhorn-gumbel-mirrored", "attention/sinkhorn.py",
           "            logits = logits - torch.log(-torch.log(u.clamp(1e-6, 1 - 1e-6))).to(logits.dtype)",
           "            logits = logits + torch.log(-torch.log(u.clamp(1e-6, 1 - 1e-6))).to(logits.dtype)",
           "Gumbel noise with the wrong sign: log(-log u) is the mirrored Gumbel (a long left tail)",
           SINKHORN),
]

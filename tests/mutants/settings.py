"""Off-default bugs: each changes results only at settings a config's defaults never use (two routed
heads, a kernel wider than its block, decay 0, non-nested rates, a self penalty other than 1e5,
three layers, a removed range guard), so the defaults-only tests pass with it planted (``passes``:
the family's reference and unit tests) and only the settings grid (tests/attention/
test_reference_grid.py), the range tests of the config fuzz or the random-plan tests catch it."""
from __future__ import annotations

from tests.mutants import Mutant

GRID = "tests/attention/test_reference_grid.py::test_{}_grid"
BASE = "tests/attention/test_reference_baselines.py::test_{}_equals_reference"
RANGE = "tests/attention/test_settings_fuzz.py::test_ranges_are_what_the_validation_accepts[{}]"
ROU, NYS = "attention/routing.py", "attention/nystromformer.py"
PERF, ADA = "attention/performer.py", "attention/adamra.py"
ROUTING = ("tests/attention/test_reference_routing.py", "tests/attention/test_attention_routing.py")
ADAMRA = ("tests/attention/test_reference_adamra.py", "tests/attention/test_attention_adamra.py")
CLUSTERED = ("tests/attention/test_reference_clustered.py", "tests/attention/test_attention_clustered.py")
NYSTROM = (BASE.format("nystromformer"), "tests/attention/test_attention_projection.py")
PERFORMER = (BASE.format("performer"), "tests/attention/test_attention_kernels.py")
REFORMER = (BASE.format("reformer"), "tests/attention/test_attention_lsh.py")
SPARSE = (BASE.format("sparse"), "tests/attention/test_attention_blocksparse.py")
SINKHORN = (BASE.format("sinkhorn"), "tests/attention/test_attention_synthesizer_sinkhorn.py")
ABC = ("tests/attention/test_reference_abc.py", "tests/attention/test_attention_abc.py")
MEMFORMER = ("tests/attention/test_attention_memformer.py",)

MUTANTS = [
    Mutant('settings-routing-centroid-rows-of-one-head',
           ROU,
           'rows = (nearest + torch.arange(0, h * c, c, device=qks.device).view(h, 1)).view(-1)',
           'rows = (nearest + torch.arange(0, h, device=qks.device).view(h, 1)).view(-1)',
           "EMA statistics indexed with a row offset of 1 per routed head instead of n_clusters: shows only "
           "with two or more routed heads (model.n_heads=4)",
           (GRID.format("routing"),),
           ROUTING),
    Mutant('settings-routing-empty-cluster-zeroed-at-decay-0',
           ROU,
           'mu.copy_(torch.where(counts > 0, moved, mu))',
           'mu.copy_(moved)',
           "a centroid no vector chose is kept only by lambda * mu: at decay 0 it becomes the zero vector",
           (GRID.format("routing"),),
           ROUTING),
    Mutant("settings-nystrom-conv-block-narrower-than-kernel", NYS,
           "block = max(CONV_BLOCK, kernel // 2)", "block = CONV_BLOCK",
           "banded skip conv on blocks of 16 whatever the kernel: taps beyond 16 positions are lost when "
           "conv_kernel > 33", (GRID.format("nystromformer"),), NYSTROM),
    Mutant("settings-performer-relu-zero-normaliser", PERF,
           "den = torch.where(den > 0, den, torch.ones_like(den))",
           "den = torch.where(mask.any(dim=-1)[:, None, None, None], den, torch.ones_like(den))",
           "a ReLU-kernel query whose features miss every key's (eps: 0) divides 0 by 0: NaN rows",
           (GRID.format("performer"),), PERFORMER),
    Mutant("settings-reformer-self-penalty-ignored", "attention/reformer.py",
           "penalty = min(self.self_penalty, torch.finfo(q.dtype).max / 8)",
           "penalty = min(1e5, torch.finfo(q.dtype).max / 8)",
           "self_penalty setting ignored: the default 1e5 always (a small penalty lets a token read itself)",
           (GRID.format("reformer"),), REFORMER),
    Mutant("settings-adamra-segment-size-truncated", ADA,
           "self.segment_sizes = [max(1, round(1.0 / r)) for r in rates]",
           "self.segment_sizes = [max(1, int(1.0 / r)) for r in rates]",
           "segment size int(1 / rate) instead of round(1 / rate): equal for the papers' 1/2^k rates only",
           (GRID.format("adamra"),), ADAMRA),
    Mutant("settings-adamra-levels-assume-nesting", ADA,
           "base = max(p for p in levels if size % p == 0)", "base = max(p for p in levels if p <= size)",
           "coarse segment sums built from the next finer level even when the sizes do not nest (rates 0.6, 0.35)",
           (GRID.format("adamra"),), ADAMRA),
    Mutant('settings-clustered-zero-iterations-run-one',
           "attention/clustered.py",
           '        for it in range(iters):',
           '        for it in range(max(1, iters)):',
           "iterations: 0 (queries assigned to their seeds) still runs one Lloyd step",
           (GRID.format("clustered"),),
           CLUSTERED),
    Mutant("settings-memformer-readers-for-two-layers", "attention/memformer.py",
           "self.readers = nn.ModuleList(MemoryCrossAttention(d, n_heads) for _ in range(n_layers))",
           "self.readers = nn.ModuleList(MemoryCrossAttention(d, n_heads) for _ in range(min(n_layers, 2)))",
           "memory readers built for two layers: zip() silently skips every later layer of the encoder",
           (GRID.format("memformer"),), MEMFORMER),
    Mutant("settings-routing-decay-ends-refused", ROU,
           "if not 0.0 <= decay <= 1.0 or commitment < 0:", "if not 0.0 < decay < 1.0 or commitment < 0:",
           "decay range checked with strict bounds: the valid ends 0 (centroid = batch mean) and 1 (frozen) refused",
           (GRID.format("routing"),), ROUTING),
    Mutant("settings-performer-orthogonal-ignored", PERF,
           "lambda shape, dtype: self.randn(shape, device, dtype), self.orthogonal)",
           "lambda shape, dtype: self.randn(shape, device, dtype))",
           "orthogonal: false ignored: the features stay orthogonal blocks instead of i.i.d. Gaussian rows",
           (GRID.format("performer"),
            "tests/attention/test_reference_baselines_state.py::test_performer_orthogonal_setting_decides_the_feature_rows"),
           PERFORMER),
    Mutant("settings-reformer-odd-bucket-count", "attention/reformer.py",
           "return 1 if nb <= 1 else nb + nb % 2", "return 1 if nb <= 1 else nb",
           "an odd bucket count not rounded up to even: argmax([xR; -xR]) then has one bucket fewer",
           (GRID.format("reformer"), "tests/attention/test_random_plans.py::"
                                     "test_lsh_one_bucket_per_token_and_round_padding_its_own"), REFORMER),
    # guards the range tests found missing (tests/attention/test_settings_fuzz.py)
    Mutant("settings-performer-negative-eps-accepted", PERF,
           "        require_non_negative(eps=self.eps, hint=\"null = the kernel's default\")\n", "",
           "a negative eps accepted: features can cancel and the normaliser change sign",
           (RANGE.format("performer-eps"),), PERFORMER),
    Mutant("settings-adamra-zero-eps-accepted", ADA,
           "        require_positive(eps=eps, hint=\"the floor of eq. 7's normaliser: 0 gives NaN rows\")\n", "",
           "eps <= 0 accepted: a ReLU query missing every landmark divides 0 by 0 (NaN rows)",
           (RANGE.format("adamra-eps"),), ADAMRA),
    Mutant("settings-nystrom-negative-kernel-accepted", NYS,
           "if conv_kernel % 2 == 0 or conv_kernel < 0:", "if conv_kernel % 2 == 0:",
           "a negative conv_kernel passes the check and fails later without naming the setting",
           (RANGE.format("nystromformer-conv_kernel"),), NYSTROM),
    Mutant("settings-synthesizer-zero-hidden-accepted", "attention/synthesizer.py",
           "        if hidden is not None:\n            require_positive(hidden=hidden, hint=\"or null for the head dim\")\n",
           "", "hidden: 0 silently read as null (the head dim), a negative width fails inside nn.Linear",
           (RANGE.format("synthesizer_dense-hidden"),),
           (BASE.format("synthesizer"), "tests/attention/test_attention_synthesizer_sinkhorn.py")),
]

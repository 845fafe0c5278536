"""Plausible bugs in the baseline attention variants (softmax, linear, performer, linformer,
nystromformer, reformer, bigbird, local, longformer, sparse, sinkhorn, synthesizer), including every
known port defect of /work/shared/lra-facts.md that applies. The float64 paper references and the
state tests must catch each one."""
from __future__ import annotations

from tests.mutants import Mutant

STATE = "tests/test_reference_baselines_state.py::"
PADDING = STATE + "test_padding_to_twice_the_length_changes_nothing"
REDRAW = STATE + "test_performer_features_redrawn_every_interval_training_steps_never_at_eval"
LAYERS = STATE + "test_linformer_every_layer_owns_its_projections"
ROTATIONS = STATE + "test_reformer_rotations_fresh_per_training_step_fixed_at_eval"
BFLOAT16 = STATE + "test_bigbird_plan_unchanged_by_bfloat16_cast"


def ref(family: str, *more: str) -> tuple[str, ...]:
    """The family's reference test (values and gradients), plus any further targets."""
    return (f"tests/test_reference_baselines.py::test_{family}_equals_reference", *more)


MUTANTS = [
    # ------------------------------------------------------------------ shared
    Mutant("baselines-fully-padded-row-nan", "attention/masking.py",
           "return torch.finfo(dtype).min / 2", 'return float("-inf")',
           "softmax over an all -inf row: a fully padded row gives NaN", ref("local")),
    Mutant("baselines-window-table-wraps", "attention/blocks.py",
           "return raw.clamp(0, nb - 1), valid", "return raw % nb, torch.ones_like(valid)",
           "sliding block window wraps around the sequence ends", ref("local")),
    Mutant("baselines-softmax-padded-keys", "attention/softmax.py",
           "bias = None if bool(mask.all()) else key_bias(mask, q.dtype)", "bias = None",
           "mask left out: padded keys receive weight", ref("softmax")),
    # ------------------------------------------------------------------ linear
    Mutant("baselines-linear-no-normaliser", "attention/linear.py",
           "row = keep_row / den ", "row = keep_row + 0 * den ",
           "known port defect: phi(Q)(phi(K)^T V) never divided by its normaliser", ref("linear")),
    Mutant("baselines-linear-padded-keys", "attention/linear.py",
           "phi_k = elu_feature_map(k, keep)", "phi_k = elu_feature_map(k)",
           "padded keys enter the sums (and the normaliser)", ref("linear")),
    Mutant("baselines-linear-feature-sign", "attention/linear.py",
           "elu = F.elu(x)", "elu = F.elu(-x)",
           "sign flip in the feature map", ref("linear")),
    # ------------------------------------------------------------------ performer
    Mutant("baselines-performer-padded-keys-in-normaliser", "attention/performer.py",
           "vm = torch.cat([v * m, m.expand(*v.shape[:3], 1)], dim=-1)",
           "vm = torch.cat([v * m, torch.ones_like(m).expand(*v.shape[:3], 1)], dim=-1)",
           "known port defect: V zeroed at padding but padded keys still in the normaliser D", ref("performer")),
    Mutant("baselines-performer-relu-runs-softmax-kernel", "attention/performer.py",
           '        if self.kernel == "relu":\n            return F.relu(proj), self.eps',
           '        if False:\n            return F.relu(proj), self.eps',
           "known port defect: kernel=relu silently runs the softmax kernel", ref("performer")),
    Mutant("baselines-performer-double-scaling", "attention/performer.py",
           "scale = self.head_dim ** -0.25 * (ratio", "scale = self.head_dim ** -0.5 * (ratio",
           "known port defect: q and k scaled twice (d^-1/2 each instead of d^-1/4)", ref("performer")),
    Mutant("baselines-performer-redraw-at-eval", "attention/performer.py",
           "        if self.training:\n            if self.training_calls == 0",
           "        if True:\n            if self.training_calls == 0",
           "known port defect: features redrawn at eval", (REDRAW,)),
    Mutant("baselines-performer-redraw-off-by-one", "attention/performer.py",
           "self.training_calls % self.redraw_interval == 0", "self.training_calls % (self.redraw_interval + 1) == 0",
           "redraw schedule off by one step", (REDRAW,)),
    Mutant("baselines-performer-key-shift-over-padding", "attention/performer.py",
           'per_key = per_key.masked_fill(~mask[:, None, :], float("-inf"))', "per_key = per_key",
           "stabiliser taken over padded keys: output depends on padding content", ref("performer", PADDING)),
    Mutant("baselines-performer-key-norm-detached", "attention/performer.py",
           "sq = 0.5 * x.pow(2).sum(-1)", "sq = 0.5 * x.pow(2).sum(-1).detach()",
           "detached term: |x|^2/2 of the feature map gets no gradient", ref("performer")),
    # ------------------------------------------------------------------ linformer
    Mutant("baselines-linformer-shared-projection", "attention/linformer.py",
           "self.proj_k = nn.Parameter(torch.randn(max_len, self.k) * std)",
           "if not hasattr(LinformerAttention, '_shared'):\n"
           "            LinformerAttention._shared = nn.Parameter(torch.randn(max_len, self.k) * std)\n"
           "        self.proj_k = LinformerAttention._shared",
           "known port defect: one projection shared by every layer (class attribute)", (LAYERS,)),
    Mutant("baselines-linformer-value-projection-detached", "attention/linformer.py",
           "v_proj = ((v * keep).transpose(-1, -2) @ f).transpose(-1, -2)",
           "v_proj = ((v * keep).transpose(-1, -2) @ f.detach()).transpose(-1, -2)",
           "detached term: F receives no gradient", ref("linformer")),
    # ------------------------------------------------------------------ nystromformer
    Mutant("baselines-nystrom-pinv-global-max", "attention/nystromformer.py",
           "norm_1 = a.abs().sum(dim=-2).amax(dim=-1)", "norm_1 = a.abs().sum(dim=-2).amax()",
           "known port defect: pinv init scaled by a max over the whole batch and all heads", ref("nystromformer")),
    Mutant("baselines-nystrom-padded-in-landmarks", "attention/nystromformer.py",
           "return seg.masked_fill(~mask, m)", "return seg",
           "known port defect: padded tokens counted in landmark means", ref("nystromformer", PADDING)),
    Mutant("baselines-nystrom-conv-sees-padding", "attention/nystromformer.py",
           "conv = self.conv_skip(v, keep)", "conv = self.conv_skip(v, torch.ones_like(keep))",
           "mask left out of the convolution skip", ref("nystromformer")),
    Mutant("baselines-nystrom-kernel3-unscaled", "attention/nystromformer.py",
           "kernel_3 = torch.softmax((q_land * scale) @ k.transpose(-1, -2) + key_bias, dim=-1)",
           "kernel_3 = torch.softmax(q_land @ k.transpose(-1, -2) + key_bias, dim=-1)",
           "dropped 1/sqrt(d) scale in one kernel", ref("nystromformer")),
    # ------------------------------------------------------------------ reformer
    Mutant("baselines-reformer-logits-times-sqrt-d", "attention/reformer.py",
           "qs = pad_to_multiple(q * (1.0 / math.sqrt(d)), m, dim=2)",
           "qs = pad_to_multiple(q * math.sqrt(d), m, dim=2)",
           "known port defect (LRA JAX): logits multiplied by sqrt(d) instead of divided", ref("reformer")),
    Mutant("baselines-reformer-lookback-wraps", "attention/reformer.py",
           "prev = torch.cat([torch.full_like(t[:, :, :, :1], fill), t[:, :, :, :-1]], dim=3)",
           "prev = torch.roll(t, 1, dims=3)",
           "look-back: the first chunk attends to the last one (wrap-around)", ref("reformer")),
    Mutant("baselines-reformer-padding-in-real-buckets", "attention/reformer.py",
           "return ids.masked_fill(~mask[:, None, None, :], n_buckets)", "return ids",
           "known port defect: no padding handling in hashing (padding moves real tokens between chunks)",
           ref("reformer", PADDING)),
    Mutant("baselines-reformer-buckets-from-padded-length", "attention/reformer.py",
           "nbk = self.n_buckets", "nbk = max(2, 2 * math.ceil(n / (2 * self.bucket_size)))",
           "bucket count follows the padded batch length", ref("reformer", PADDING)),
    Mutant("baselines-reformer-no-duplicate-correction", "attention/reformer.py",
           "code.mul_(count)", "code.mul_(1)",
           "log N_ij left out: pairs found by several rounds over-weighted", ref("reformer")),
    Mutant("baselines-reformer-self-not-penalised", "attention/reformer.py",
           "(-penalty - math.log(r)) * rounds.new_ones(1)", "(0.0 - math.log(r)) * rounds.new_ones(1)",
           "shared-QK self-attention not masked", ref("reformer")),
    Mutant("baselines-reformer-fixed-hash-key", "attention/reformer.py",
           "torch.randn(shape, generator=self.generator(device), device=device)",
           "torch.randn(shape, generator=torch.Generator(device=device).manual_seed(0), device=device)",
           "known port defect: a fixed hashing key (no fresh rotations in training)", (ROTATIONS,)),
    # ------------------------------------------------------------------ bigbird
    Mutant("baselines-bigbird-new-plan-every-call", "attention/bigbird.py",
           "pri = self.rand_priority[:, :nb, :nb].masked_fill(excluded, -1)",
           "pri = torch.randint(0, 1 << 30, self.rand_priority[:, :nb, :nb].shape, device=dev)"
           ".masked_fill(excluded, -1)",
           "known port defect: a new random plan every call", ref("bigbird")),
    Mutant("baselines-bigbird-float-priorities", "attention/bigbird.py",
           "ranks = torch.rand(n_heads, nb_max, nb_max, generator=g).argsort(dim=-1).argsort(dim=-1)",
           "ranks = torch.rand(n_heads, nb_max, nb_max, generator=g)",
           "float plan: a bfloat16 cast rounds priorities into ties and changes the plan", (BFLOAT16,)),
    Mutant("baselines-bigbird-plan-of-padded-length", "attention/bigbird.py",
           "if groups == [math.ceil(n / bs)]:", "if True:",
           "plan (last global block, random candidates) follows the padded batch length", ref("bigbird", PADDING)),
    Mutant("baselines-bigbird-random-from-first-blocks", "attention/bigbird.py",
           "excluded = ((a[:, None] - a[None, :]).abs() <= w) | (a[None, :] == 0) | (a[None, :] == nb - 1)",
           "excluded = ((a[:, None] - a[None, :]).abs() <= w) | (a[None, :] == 0) | (a[None, :] == nb - 1)"
           " | (a[None, :] >= 4)",
           "known port defect: random blocks drawn only from the first blocks", ref("bigbird")),
    Mutant("baselines-bigbird-last-block-not-global", "attention/bigbird.py",
           "glob = torch.tensor([0, nb - 1], device=dev)", "glob = torch.tensor([0, 0], device=dev)",
           "the last block is not read as a global block", ref("bigbird")),
    # ------------------------------------------------------------------ local / longformer / sparse
    Mutant("baselines-local-window-off-by-one", "attention/local.py",
           "idx, valid = window_table(nb, min(self.window, nb - 1), q.device)",
           "idx, valid = window_table(nb, min(self.window + 1, nb - 1), q.device)",
           "off-by-one window", ref("local")),
    Mutant("baselines-longformer-band-off-by-one", "attention/longformer.py",
           "band = ((pos[:, :, None] - kpos).abs() <= half) & (kpos > 0)",
           "band = ((pos[:, :, None] - kpos).abs() < half) & (kpos > 0)",
           "off-by-one window", ref("longformer")),
    Mutant("baselines-longformer-global-counted-twice", "attention/longformer.py",
           "band = ((pos[:, :, None] - kpos).abs() <= half) & (kpos > 0)",
           "band = ((pos[:, :, None] - kpos).abs() <= half)",
           "token 0 read both in the band and as the global column (double weight)", ref("longformer")),
    Mutant("baselines-sparse-strided-far-residues", "attention/sparse.py",
           "far = (blk[:, None] - blk[None, :]).abs() > 1", "far = (blk[:, None] - blk[None, :]).abs() > 2",
           "strided A(2) misses the residue keys two blocks away", ref("sparse")),
    Mutant("baselines-sparse-fixed-own-block-unmasked", "attention/sparse.py",
           "a_own = mb[:, None, :, None, :]", "a_own = torch.ones_like(mb)[:, None, :, None, :]",
           "mask left out: padded keys of the own block receive weight", ref("sparse")),
    # ------------------------------------------------------------------ sinkhorn
    Mutant("baselines-sinkhorn-temperature-ignored", "attention/sinkhorn.py",
           "logits = logits / self.temperature", "logits = logits",
           "Sinkhorn temperature ignored", ref("sinkhorn")),
    Mutant("baselines-sinkhorn-no-log-mass-bias", "attention/sinkhorn.py",
           "sorted_bias = torch.where(has_mass, torch.log(mass.clamp_min(min_mass)), torch.full_like(mass, neg))",
           "sorted_bias = torch.where(has_mass, torch.zeros_like(mass), torch.full_like(mass, neg))",
           "half-padded sorted slots counted as whole (log-mass bias left out)", ref("sinkhorn")),
    Mutant("baselines-sinkhorn-rows-only", "attention/sinkhorn.py",
           "log_alpha = log_alpha - torch.logsumexp(log_alpha, dim=-2, keepdim=True)", "log_alpha = log_alpha",
           "wrong normaliser: columns never balanced (not doubly stochastic)", ref("sinkhorn")),
    Mutant("baselines-sinkhorn-noise-at-eval", "attention/sinkhorn.py",
           "if self.training and self.gumbel_noise:", "if self.gumbel_noise:",
           "Gumbel noise at eval (non-deterministic evaluation)", ref("sinkhorn")),
    # ------------------------------------------------------------------ synthesizer
    Mutant("baselines-synthesizer-dense-no-output-bias", "attention/synthesizer.py",
           "+ self.b2[None, :, None, :n]", "+ 0 * self.b2[None, :, None, :n].detach()",
           "dropped term: b2 (zero at init, so only its gradient shows it)", ref("synthesizer")),
    Mutant("baselines-synthesizer-random-transposed", "attention/synthesizer.py",
           "return self.r[None, :, :n, :n]", "return self.r[None, :, :n, :n].transpose(-1, -2)",
           "random logits indexed (key, query) instead of (query, key)", ref("synthesizer")),
]

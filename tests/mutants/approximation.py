"""Scaling and masking bugs the approximation map's closed-form checks must catch
(tests/bench/test_approximation.py: exactness at full budget, padded and unpadded, and Performer's
1/sqrt(m) slope). One per variant family."""
from __future__ import annotations

from tests.mutants import Mutant

T = ("tests/bench/test_approximation.py",)

MUTANTS = [
    Mutant("approximation-nystrom-padded-keys", "attention/nystromformer.py",
           "masked_fill(~mask, neg)[:, None, None, :]", "masked_fill(~mask, 0.0)[:, None, None, :]",
           "padded keys take weight in the landmark-to-key kernel (Xiong et al. eq. 14, third factor)", T),
    Mutant("approximation-local-unscaled", "attention/local.py", "2 * w + 1, 1.0 / math.sqrt(d))",
           "2 * w + 1, 1.0 / d)", "logits scaled by 1/d instead of 1/sqrt(d)", T),
    Mutant("approximation-longformer-unscaled", "attention/longformer.py",
           "qs = q * (1.0 / math.sqrt(q.shape[-1]))", "qs = q * (1.0 / q.shape[-1])",
           "logits scaled by 1/d instead of 1/sqrt(d)", T),
    Mutant("approximation-bigbird-window-sees-padding", "attention/bigbird.py",
           "allow = keys & valid.repeat_interleave(bs, dim=-1)",
           "allow = torch.ones_like(keys) & valid.repeat_interleave(bs, dim=-1)",
           "the middle (window + random) blocks attend padded keys", T),
    Mutant("approximation-clustered-unscaled", "attention/clustered.py",
           "vc = F.scaled_dot_product_attention(centroids, k, v, attn_mask=bias)",
           "vc = F.scaled_dot_product_attention(centroids, k, v, attn_mask=bias, scale=1.0)",
           "centroid attention without 1/sqrt(D) (eq. 4)", T),
    Mutant("approximation-linformer-unscaled", "attention/linformer.py", ".mul_(d ** -0.5)", ".mul_(d ** -0.25)",
           "projected keys scaled by d^-1/4 instead of d^-1/2", T),
    Mutant("approximation-performer-data-scale", "attention/performer.py",
           "scale = self.head_dim ** -0.25 * (ratio", "scale = self.head_dim ** -0.2 * (ratio",
           "FAVOR+ input scaled by d^-1/5: the features estimate another kernel, a bias no m removes", T),
    Mutant("approximation-adamra-softmax-unscaled", "attention/adamra.py", "/ math.sqrt(self.head_dim) + bias", "+ bias",
           "AdaMRA's softmax ablation without 1/sqrt(d_k): not exact at full resolution", T),
]

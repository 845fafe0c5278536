"""Bugs the paper-reference tests must catch: AdaMRA, ABC, clustered / improved clustered, routing
(tests/test_reference_*.py against the float64 references in tests/reference/)."""
from __future__ import annotations

from tests.mutants import Mutant

ADAMRA, ABC, CLU, ROU = "attention/adamra.py", "attention/abc.py", "attention/clustered.py", "attention/routing.py"
T_ADAMRA = "tests/test_reference_adamra.py"
T_ADAMRA_REF = "tests/test_reference_adamra.py::test_forward_matches_reference"
T_ABC, T_CLU, T_ROU = "tests/test_reference_abc.py", "tests/test_reference_clustered.py", "tests/test_reference_routing.py"

MUTANTS = [
    # AdaMRA
    Mutant("papers-adamra-router-grad-sign", ADAMRA, "scale = p_sel / p_sel.detach()",
           "scale = 2.0 - p_sel / p_sel.detach()", "router gradient with its sign flipped (forward unchanged)",
           (T_ADAMRA_REF,)),
    Mutant("papers-adamra-router-grad-zero", ADAMRA, "scale = p_sel / p_sel.detach()",
           "scale = p_sel.detach() / p_sel.detach()", "router gets no gradient (forward unchanged)", (T_ADAMRA_REF,)),
    Mutant("papers-adamra-elu-plus-two", ADAMRA, "F.elu(t) + 1.0", "F.elu(t) + 2.0",
           "elu(x) + 2 instead of Table 5's elu(x) + 1", (T_ADAMRA_REF,)),
    Mutant("papers-adamra-softmax-unscaled", ADAMRA, "/ math.sqrt(dh) + bias[i]", "+ bias[i]",
           "softmax ablation without 1/sqrt(d_k)", (T_ADAMRA_REF,)),
    Mutant("papers-adamra-eps-added", ADAMRA, "den.clamp_min(self.eps)", "(den + self.eps)",
           "eps misplaced: added to every normaliser instead of clamping the zero one", (T_ADAMRA_REF,)),
    Mutant("papers-adamra-segment-off-by-one", ADAMRA, "max(1, round(1.0 / r)) for r in rates",
           "max(1, round(1.0 / r)) + 1 for r in rates", "segment boundaries off by one", (T_ADAMRA_REF,)),
    Mutant("papers-adamra-padding-in-means", ADAMRA, "levels = {1: (t * w[..., None] if padded else t, w)}",
           "levels = {1: (t, w)}", "padded tokens summed into the landmarks", (T_ADAMRA_REF,)),
    Mutant("papers-adamra-fused-key-bias", ADAMRA, "self._head_map(k_proj.weight.t(), k_proj.bias, h, 1)",
           "self._head_map(k_proj.weight.t(), None, h, 1)", "fused path drops the key bias of the shell",
           (f"{T_ADAMRA}::test_fused_shell_path_matches_reference",)),
    Mutant("papers-adamra-random-eval-by-batch", ADAMRA, "return table[:n].expand(b, n)",
           "return torch.randint(0, self.n_routed, (b, n), generator=g, device=mask.device)",
           "eval routing drawn by batch shape: a sequence's output depends on its batch",
           (f"{T_ADAMRA}::test_eval_output_of_a_sequence_does_not_depend_on_the_batch",)),
    # ABC
    Mutant("papers-abc-mlp-normalised-over-slots", ABC, "return torch.softmax(logits, dim=2) * real",
           "return torch.softmax(logits, dim=3) * real", "eq. 12 normalised over slots, not over the sequence",
           (T_ABC,)),
    Mutant("papers-abc-rd-sums-not-means", ABC, "phi = phi / phi.sum(2, keepdim=True).clamp_min(1.0)", "phi = phi",
           "normalize=true ignored: slots hold sums", (T_ABC,)),
    Mutant("papers-abc-unscaled", ABC, "scale=1.0 / math.sqrt(self.head_dim)", "scale=1.0",
           "memory read without 1/sqrt(d)", (T_ABC,)),
    Mutant("papers-abc-empty-slots-attended", ABC, "used = (phi != 0).any(2)", "used = (phi == phi).any(2)",
           "empty slots (zero keys) take softmax weight", (T_ABC,)),
    Mutant("papers-abc-rd-eval-by-batch", ABC, "return table[:, :n].expand(b, self.n_heads, n)",
           "return torch.randint(0, self.memory_size, (b, self.n_heads, n), generator=g, device=device)",
           "eval slots drawn by batch shape: a sequence's output depends on its batch", (T_ABC,)),
    # clustered / improved clustered
    Mutant("papers-iclustered-mass-detached", CLU, "mass = top_mass.sum(-1)", "mass = top_mass.sum(-1).detach()",
           "no gradient through eq. 9's top-k mass", (T_CLU,)),
    Mutant("papers-clustered-centroids-detached", CLU, "centroids = (sums / counts.clamp(min=1.0)[..., None])[:, :, :c]",
           "centroids = (sums / counts.clamp(min=1.0)[..., None])[:, :, :c].detach()",
           "no gradient through the centroids (eq. 3)", (T_CLU,)),
    Mutant("papers-clustered-labels-one-head", CLU, "lab = labels.clamp(max=c - 1)",
           "lab = labels[:, :1].expand_as(labels).clamp(max=c - 1)", "head 0's clustering used by every head",
           (T_CLU,)),
    Mutant("papers-iclustered-keymask-one-head", CLU, "real_key = mask[:, None, :].expand(b, h, n).gather(2, keys.flatten(2))",
           "real_key = mask[:, None, :].expand(b, h, n).gather(2, keys[:, :1].expand_as(keys).flatten(2))",
           "i_clustered key mask taken from head 0's top-k set for every head", (T_CLU,)),
    Mutant("papers-iclustered-topk-double-counted", CLU, "rest = ac.scatter(-1, top_idx, 0.0) @ v", "rest = ac @ v",
           "eq. 10: top-k keys counted in both the clustered and the exact part", (T_CLU,)),
    Mutant("papers-clustered-seeds-not-spread", CLU,
           "ranks = (torch.arange(c, device=mask.device)[None, :] * lengths[:, None]) // c",
           "ranks = torch.arange(c, device=mask.device)[None, :].expand(b, c)",
           "K-means seeded with the first C queries instead of evenly spaced ones", (T_CLU,)),
    # routing
    Mutant("papers-routing-ema-swapped", ROU, "self.decay * mu + (1 - self.decay) * mean.to(mu.dtype)",
           "(1 - self.decay) * mu + self.decay * mean.to(mu.dtype)", "EMA with lambda and 1 - lambda swapped", (T_ROU,)),
    Mutant("papers-routing-weights-detached", ROU, "wts = torch.exp(lse - top.gather(2, flat))",
           "wts = torch.exp(lse - top.gather(2, flat)).detach()", "cluster-combination weights carry no gradient",
           (T_ROU,)),
    Mutant("papers-routing-untaken-zero", ROU, "out = torch.where(taken[..., None], routed, fallback)", "out = routed",
           "tokens chosen by no cluster get a zero output", (T_ROU,)),
    Mutant("papers-routing-update-in-eval", ROU, "if self.training:\n            self._train_step(",
           "if True:\n            self._train_step(", "centroids updated in eval", (T_ROU,)),
    Mutant("papers-routing-commitment-unset", ROU, "self.aux_loss = self.commitment * commit", "pass",
           "commitment loss never set", (T_ROU,)),
    Mutant("papers-routing-ddp-not-reduced", ROU, "dist.all_reduce(sums)\n                dist.all_reduce(counts)",
           "pass", "under DDP each rank keeps its own centroid update",
           (f"{T_ROU}::test_ddp_centroid_update_uses_every_rank",)),
    Mutant("papers-routing-padding-moves-centroids", ROU, "onehot = F.one_hot(s.argmax(dim=2), c).to(u.dtype) * real[..., None]",
           "onehot = F.one_hot(s.argmax(dim=2), c).to(u.dtype)", "padded tokens move the centroids", (T_ROU,)),
    Mutant("papers-routing-window-off-by-one", ROU, "window = min(self.window, n)", "window = min(self.window + 1, n)",
           "local block boundaries off by one", (T_ROU,)),
    Mutant("papers-routing-cluster-size-floor", ROU, "w = min(n, -(-n // self.n_clusters))",
           "w = min(n, max(1, n // self.n_clusters))", "cluster size floor(N/k) instead of ceil(N/k)", (T_ROU,)),
]

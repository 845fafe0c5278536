"""Bugs that only a GPU or a cluster would show: CUDA autocast's dtypes, DDP, host syncs (issue 26),
and the bench's dispatch counts, which say why a small step is slow on a GPU.

The CUDA-autocast emulation (``lra/checks/cuda_autocast.py``), the two-process DDP comparison and the
host-sync counts (``tests/host_syncs.py``) must each catch theirs."""
from __future__ import annotations

from tests.mutants import Mutant

CUDA = "tests/attention/test_attention_cuda_autocast.py::test_training_under_cuda_autocast_matches_float32"
DDP = "tests/attention/test_attention_ddp.py::test_ddp_equals_one_process_on_the_global_batch"
SYNCS = "tests/attention/test_host_syncs.py::test_host_syncs_per_training_step"
ENC = "models/memory_encoder.py"
DISPATCH = "tests/bench/test_bench.py::test_dispatch_counts_are_recorded_and_tell_launch_bound_variants_apart"

MUTANTS = [
    # ------------------------------------------------------------------ CUDA autocast
    Mutant('gpu-i_clustered-backward-float32-sum',
           "attention/clustered.py",
           'index_add_(0, chunk_rows, _as(d_parts.sum(1), d_out.dtype))',
           'index_add_(0, chunk_rows, d_parts.sum(1))',
           "i_clustered's backward adds a float32 reduction (CUDA autocast) into a bfloat16 buffer: crash",
           (f"{CUDA}[i_clustered-bf16]",)),
    Mutant("gpu-backward-autocast-not-replayed", "attention/base.py",
           "return torch.autocast(dev, dtype=dtype, enabled=enabled)",
           "return torch.autocast(dev, dtype=dtype, enabled=False)",
           "custom backwards run without the forward's autocast: dtype mismatches (linear, reformer, i_clustered)",
           (f"{CUDA}[linear-bf16]",)),
    Mutant("gpu-adamra-float16-normaliser", "attention/adamra.py",
           'return self.feature_map != "softmax" and torch.float16 in (',
           'return False and torch.float16 in (',
           "AdaMRA's kernel normaliser in float16: 1/eps overflows, NaN gradients under 16-mixed",
           (f"{CUDA}[adamra-fp16]", f"{CUDA}[adamra_elu-fp16]")),
    # ------------------------------------------------------------------ DDP
    Mutant("gpu-mrbp-reentrant-checkpoint", ENC,
           "use_reentrant=False)", "use_reentrant=True)",
           "MRBP's reentrant checkpoint: DDP sees each parameter ready twice (crash)",
           (f"{DDP}[memformer-mrbp]",)),
    Mutant('gpu-routing-commitment-not-scaled-by-world',
           "attention/routing.py",
           "                world = dist.get_world_size()               # DDP averages the ranks' gradients",
           '                pass',
           "routing's commitment loss not scaled by the world size: DDP's averaging leaves it 1/world of the global mean",
           (f"{DDP}[routing]",)),
    # ------------------------------------------------------------------ host syncs
    Mutant("gpu-network-reads-stated-padding", "models/network.py",
           "return self.encoder(x, Padding.of(mask, padded)), mask", "return self.encoder(x, Padding.of(mask)), mask",
           "the network reads the padding from the device although the module stated it (a host sync per step)",
           (f"{SYNCS}[softmax]",)),
    Mutant("gpu-memformer-segments-read-padding", ENC,
           "for xt, pt in zip(xs, pad.segments(self.segment_len)):",
           "for xt, pt in zip(xs, [Padding.of(p.mask) for p in pad.segments(self.segment_len)]):",
           "each Memformer segment (and MRBP replay) reads its padding from the device instead of keeping the batch's",
           (f"{SYNCS}[memformer-mrbp]",)),
    Mutant("gpu-module-padding-inverted", "models/module.py",
           'batch["padded"] = not bool(batch["mask"].all())', 'batch["padded"] = bool(batch["mask"].all())',
           "the module states the wrong padding: padded keys attended on the fast path",
           ("tests/attention/test_host_syncs.py::test_the_module_reads_the_padding_on_the_host_and_the_network_believes_it",)),
    Mutant('gpu-clustered-bincount',
           "attention/clustered.py",
           'counts = q.new_zeros(b * h * (c + 1)).index_add(0, flat, q.new_ones(flat.shape))',
           'counts = torch.bincount(flat, minlength=b * h * (c + 1)).to(q.dtype)',
           "cluster sizes by bincount (two host syncs on CUDA)",
           (f"{SYNCS}[clustered]",)),
    Mutant('gpu-clustered-kmeans-host-read',
           "attention/clustered.py",
           '            if it:\n                rows.index_add_(0, row, x_vote)',
           '            if it and bool((row >= 0).all()):\n                rows.index_add_(0, row, x_vote)',
           'a K-means iteration reads a tensor on the host (an early-stop test): one sync per iteration on a GPU',
           (f"{SYNCS}[clustered]",)),
    Mutant('gpu-routing-taken-read',
           "attention/routing.py",
           '        return zero_padded(out, pad)                                        # untaken queries: the fallback\n',
           '        taken = taken if bool(taken.all()) else taken\n'
           '        return zero_padded(out, pad)                                        # untaken queries: the fallback\n',
           'routing reads on the host whether every query was taken (a host sync per layer)',
           (f"{SYNCS}[routing]",)),
    Mutant("gpu-adamra-padding-read-on-device", "attention/adamra.py",
           "        if pad.any:                                                         # a padded query",
           "        if bool((~mask).any()):                                             # a padded query",
           "AdaMRA asks the device whether the batch is padded instead of Padding.any (a host sync per layer)",
           (f"{SYNCS}[adamra]",)),
    Mutant("gpu-bigbird-unpadded-batch-reads", "attention/bigbird.py",
           "        first = dense_rows(qb[:, :, 0], kf, vf, mf)",
           "        first = dense_rows(qb[:, :, 0], kf, vf, mf if bool(mf.all()) else mf)",
           "BigBird reads the padding on the host (a sync per layer, as its ragged plan groups did)", (f"{SYNCS}[bigbird]",)),
    # ------------------------------------------------------------------ Memformer's declared choices
    Mutant("gpu-memformer-read-without-dropout", ENC,
           "x = block.feed_forward(x + block.dropout(reader(x, mem)))", "x = block.feed_forward(x + reader(x, mem))",
           "the memory read branch escapes the block's dropout (the other branches have it)",
           ("tests/attention/test_attention_memformer.py::test_memory_read_branch_has_the_blocks_dropout",)),
    # ------------------------------------------------------------------ dispatch counts (bench)
    Mutant("gpu-bench-profiler-failure-fails-measurement", "lra/bench/harness.py",
           'dispatches = {"error": f"{type(e).__name__}: {e}"[:200]}', "raise",
           "a profiler that fails takes the measured time and memory down with it",
           (DISPATCH,)),
    Mutant("gpu-bench-dispatches-not-counted", "lra/bench/harness.py",
           'counts: dict[str, Any] = {"outermost_aten_ops": sum(', 'counts: dict[str, Any] = {"outermost_aten_ops": 0 * sum(',
           "the dispatch count records nothing: a launch-bound variant looks like any other",
           (DISPATCH,)),
]

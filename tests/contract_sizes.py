"""Per-variant settings under which the contract tests' 37-74 tokens span several blocks, segments,
clusters, landmarks or buckets. At the defaults (blocks of 64, 100 clusters, 256 features) a short
test sequence takes every variant's exact or single-block path, where structural bugs (a global block
that follows the padding, a plan cut by the padded length) cannot show."""
from __future__ import annotations

SMALL_STRUCTURE: dict[str, dict] = {
    "abc_mlp": {"memory_size": 8},
    "abc_rd": {"memory_size": 8},
    "bigbird": {"block_size": 4},
    "clustered": {"clusters": 6},
    "i_clustered": {"clusters": 6, "topk": 8},
    "linformer": {"k": 16},
    "local": {"block_size": 8},
    "longformer": {"window": 8},
    "memformer": {"segment_len": 8, "memory_slots": 8},
    "nystromformer": {"num_landmarks": 8},
    "nystromformer_64": {"num_landmarks": 8},
    "performer": {"nb_features": 16},
    "reformer": {"bucket_size": 8, "chunk_size": 16},
    "routing": {"window": 8},
    "sinkhorn": {"block_size": 8},
    "sparse": {"stride": 8, "summary": 2},
    "sparse_strided": {"stride": 8},
}
